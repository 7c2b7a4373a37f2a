// Schedules as data: the 1F1B and GPipe lists against hand-written tables; a small independent
// executor with rendezvous (blocking) sends that runs every rank's list and finds no deadlock and
// only matched messages for 1..8 stages x 1..16 micro-batches; Optimus-CC's epilogue-only flags;
// the event simulation against the closed-form bubble and a hand-timed example.
#include "parallel/schedule.h"
#include "parallel/lowering.h"
#include "parallel/simulate.h"
#include "tests/common/testing.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <functional>
#include <sstream>
#include <thread>

namespace tl {
namespace {
using testing::error_of;

// ---- an executor with blocking rendezvous sends, independent of simulate_schedule ---------------
// Each rank walks its list. A compute action always completes. A send completes together with the
// peer's recv when the peer is at the matching recv (same kind and micro-batch): the semantics of
// Gloo's blocking send. Returns "" when every list ran to the end with every send matched, else
// a description of the deadlock or mismatch.
std::string run_blocking(const std::vector<RankSchedule>& sched, int* matched_out = nullptr) {
  const int S = static_cast<int>(sched.size());
  std::vector<size_t> pc(S, 0);
  int matched = 0, sends = 0, recvs = 0;
  for (const auto& l : sched)
    for (const auto& a : l) {
      sends += is_send(a.type);
      recvs += is_recv(a.type);
    }
  auto kind = [](ActionType t) {
    return t == ActionType::SendActivation || t == ActionType::RecvActivation ? 'A' : 'G';
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < S; ++r) {
      if (pc[r] >= sched[r].size()) continue;
      const Action& a = sched[r][pc[r]];
      if (is_compute(a.type)) {
        ++pc[r];
        progress = true;
      } else if (is_send(a.type)) {
        const int p = a.peer;
        if (p < 0 || p >= S || pc[p] >= sched[p].size()) continue;
        const Action& b = sched[p][pc[p]];
        if (!is_recv(b.type) || b.peer != r) continue;  // the peer is elsewhere: the send waits
        if (kind(b.type) != kind(a.type) || b.micro_batch != a.micro_batch || peer_stage(b) != a.stage)
          return "rank " + std::to_string(r) + " sends " + action_token(a, true) + " but rank " + std::to_string(p) +
                 " receives " + action_token(b, true);
        ++pc[r];
        ++pc[p];
        ++matched;
        progress = true;
      }
      // A recv waits for its sender's turn.
    }
  }
  std::string stuck;
  for (int r = 0; r < S; ++r)
    if (pc[r] < sched[r].size()) stuck += " rank " + std::to_string(r) + " at " + action_token(sched[r][pc[r]]);
  if (!stuck.empty()) return "deadlock:" + stuck;
  if (matched != sends || matched != recvs)
    return "unmatched messages: " + std::to_string(sends) + " sends, " + std::to_string(recvs) + " recvs, " +
           std::to_string(matched) + " matched";
  if (matched_out) *matched_out = matched;
  return "";
}

TEST(Schedule, OneFOneBTableFourStagesEightMicroBatches) {
  const auto sched = one_f_one_b_schedule(4, 8);
  const std::string table = format_schedule(sched);
  std::cout << table;
  // Warm-up of S - r - 1 forwards, steady 1F1B, cool-down (written by hand).
  const std::string expected =
      "rank 0: F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7\n"
      "rank 1: F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7\n"
      "rank 2: F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7\n"
      "rank 3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7\n";
  EXPECT_EQ(table, expected);

  const std::string full = format_schedule(sched, /*with_comm=*/true);
  std::cout << full;
  // Every message, with the next activation received before the gradient is sent in the steady
  // state, and "~" on the steady-state gradient sends that epilogue-only leaves uncompressed.
  const std::string expected_full =
      "rank 0: F0 SA0 F1 SA1 F2 SA2 F3 SA3 RG0 B0 F4 SA4 RG1 B1 F5 SA5 RG2 B2 F6 SA6 RG3 B3 F7 SA7 RG4 B4 "
      "RG5 B5 RG6 B6 RG7 B7\n"
      "rank 1: RA0 F0 SA0 RA1 F1 SA1 RA2 F2 SA2 RG0 B0 RA3 SG0~ F3 SA3 RG1 B1 RA4 SG1~ F4 SA4 RG2 B2 RA5 SG2~ "
      "F5 SA5 RG3 B3 RA6 SG3~ F6 SA6 RG4 B4 RA7 SG4~ F7 SA7 RG5 B5 SG5 RG6 B6 SG6 RG7 B7 SG7\n"
      "rank 2: RA0 F0 SA0 RA1 F1 SA1 RG0 B0 RA2 SG0~ F2 SA2 RG1 B1 RA3 SG1~ F3 SA3 RG2 B2 RA4 SG2~ "
      "F4 SA4 RG3 B3 RA5 SG3~ F5 SA5 RG4 B4 RA6 SG4~ F6 SA6 RG5 B5 RA7 SG5~ F7 SA7 RG6 B6 SG6 RG7 B7 SG7\n"
      "rank 3: RA0 F0 B0 RA1 SG0~ F1 B1 RA2 SG1~ F2 B2 RA3 SG2~ F3 B3 RA4 SG3~ F4 B4 RA5 SG4~ F5 B5 RA6 SG5~ "
      "F6 B6 RA7 SG6~ F7 B7 SG7\n";
  EXPECT_EQ(full, expected_full);
}

TEST(Schedule, GPipeTable) {
  const auto sched = gpipe_schedule(3, 3);
  EXPECT_EQ(format_schedule(sched),
            "rank 0: F0 F1 F2 B0 B1 B2\n"
            "rank 1: F0 F1 F2 B0 B1 B2\n"
            "rank 2: F0 F1 F2 B0 B1 B2\n");
  EXPECT_EQ(format_schedule(sched, true),
            "rank 0: F0 SA0 F1 SA1 F2 SA2 RG0 B0 RG1 B1 RG2 B2\n"
            "rank 1: RA0 F0 SA0 RA1 F1 SA1 RA2 F2 SA2 RG0 B0 SG0 RG1 B1 SG1 RG2 B2 SG2\n"
            "rank 2: RA0 F0 RA1 F1 RA2 F2 B0 SG0 B1 SG1 B2 SG2\n");
}

TEST(Schedule, FewerMicroBatchesThanStagesIsAllForwardThenAllBackward) {
  EXPECT_EQ(format_schedule(one_f_one_b_schedule(4, 2)),
            "rank 0: F0 F1 B0 B1\n"
            "rank 1: F0 F1 B0 B1\n"
            "rank 2: F0 F1 B0 B1\n"
            "rank 3: F0 B0 F1 B1\n");
}

TEST(Schedule, BlockingSendsNeverDeadlockAndEveryMessageMatches) {
  for (int S = 1; S <= 8; ++S) {
    for (int M = 1; M <= 16; ++M) {
      for (const char* name : {"gpipe", "1f1b"}) {
        SCOPED_TRACE(std::string(name) + " stages " + std::to_string(S) + " micro-batches " + std::to_string(M));
        const auto sched = make_schedule(name, S, M);
        ASSERT_NO_THROW(validate_schedule(sched, M));
        int matched = 0;
        ASSERT_EQ(run_blocking(sched, &matched), "");
        EXPECT_EQ(matched, 2 * (S - 1) * M);  // one activation and one gradient per link and micro-batch
        // The library's event simulation agrees under all three send semantics.
        const SimCosts c = SimCosts::uniform(S, 1.0, 2.0);
        for (SendMode mode : {SendMode::Eager, SendMode::Rendezvous, SendMode::SendQueue})
          ASSERT_NO_THROW(simulate_schedule(sched, c, mode));
      }
    }
  }
}

// The textbook steady state (receive the next activation at the start of the next step, after
// the gradient send) deadlocks with blocking sends: both executors must see it, or they could not
// see anything.
TEST(Schedule, TextbookOneFOneBOrderDeadlocksWithBlockingSends) {
  auto sched = one_f_one_b_schedule(2, 4);
  // rank 1's steady state holds "B b, RA f+1, SG b": swap to "B b, SG b, RA f+1".
  auto& l = sched[1];
  for (size_t i = 0; i + 1 < l.size(); ++i)
    if (l[i].type == ActionType::RecvActivation && l[i + 1].type == ActionType::SendGrad) std::swap(l[i], l[i + 1]);
  ASSERT_NO_THROW(validate_schedule(sched, 4));  // structurally fine...
  const std::string r = run_blocking(sched);
  EXPECT_NE(r.find("deadlock"), std::string::npos) << r;  // ...but it hangs on Gloo
  EXPECT_THROW(simulate_schedule(sched, SimCosts::uniform(2, 1, 1), SendMode::Rendezvous), c10::Error);
  // With buffered sends (eager, or a send thread) it runs, which is why the order matters only
  // for blocking sends.
  EXPECT_NO_THROW(simulate_schedule(sched, SimCosts::uniform(2, 1, 1), SendMode::Eager));
  EXPECT_NO_THROW(simulate_schedule(sched, SimCosts::uniform(2, 1, 1), SendMode::SendQueue));
}

TEST(Schedule, MismatchedMessageOrderIsReported) {
  auto sched = gpipe_schedule(2, 2);
  // rank 1 receives activation 1 before activation 0.
  auto& l = sched[1];
  std::swap(l[0], l[2]);  // RA0 F0 RA1 F1 -> RA1 F0 RA0 F1 (structurally invalid too)
  EXPECT_NE(run_blocking(sched).find("receives RA1"), std::string::npos);
  try {
    simulate_schedule(sched, SimCosts::uniform(2, 1, 1), SendMode::Eager);
    FAIL() << "expected a mismatch error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("order their messages differently"), std::string::npos) << e.what();
  }
  EXPECT_THROW(validate_schedule(sched, 2), c10::Error);
}

TEST(Schedule, EpilogueOnlyFlagsMarkCooldownAndLastSteadySend) {
  const int S = 4, M = 8;
  const auto sched = one_f_one_b_schedule(S, M);
  for (int r = 1; r < S; ++r) {
    const int warmup = std::min(S - r - 1, M), steady = M - warmup;
    for (const Action& a : sched[r]) {
      if (a.type != ActionType::SendGrad) {
        EXPECT_TRUE(a.compress_backward);  // the flag only concerns gradient sends
        continue;
      }
      // Backward b runs in the steady state iff b < steady; the last steady one is b == steady - 1.
      const bool critical = a.micro_batch >= steady - 1;
      EXPECT_EQ(a.compress_backward, critical) << "rank " << r << " " << action_token(a);
    }
  }
  for (const auto& l : gpipe_schedule(S, M))
    for (const Action& a : l) EXPECT_TRUE(a.compress_backward);
}

TEST(Schedule, ValidateNamesTheBrokenRule) {
  auto sched = gpipe_schedule(2, 2);
  sched[0].pop_back();  // drop B1
  try {
    validate_schedule(sched, 2);
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 micro-batch 1: needs one forward and one backward"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(make_schedule("1F1B-interleaved", 2, 2), c10::Error);
  EXPECT_THROW(make_schedule("1f1b", StageLayout{2, 2}, 2), c10::Error);         // one stage per rank only
  EXPECT_THROW(make_schedule("interleaved", StageLayout{2, 2}, 3), c10::Error);  // M not a multiple of P
  EXPECT_THROW(StageLayout::of(6, 4), c10::Error);
  EXPECT_THROW(one_f_one_b_schedule(0, 2), c10::Error);
}

TEST(Schedule, UniformStagesTakeTheTheoreticalTime) {
  for (int S = 1; S <= 6; ++S) {
    for (int M = 1; M <= 10; ++M) {
      for (const char* name : {"gpipe", "1f1b"}) {
        for (SendMode mode : {SendMode::Eager, SendMode::Rendezvous, SendMode::SendQueue}) {
          SCOPED_TRACE(std::string(name) + " S=" + std::to_string(S) + " M=" + std::to_string(M) + " mode " +
                       std::to_string(static_cast<int>(mode)));
          const SimResult r = simulate_schedule(make_schedule(name, S, M), SimCosts::uniform(S, 1.0, 2.0), mode);
          EXPECT_DOUBLE_EQ(r.step_s, ideal_step_time(S, M, 1.0, 2.0));
          // Bubble of a uniform pipeline: (S - 1) / (M + S - 1).
          EXPECT_NEAR(r.bubble(), double(S - 1) / (M + S - 1), 1e-12);
        }
      }
    }
  }
}

TEST(Schedule, NonUniformStagesHandTimed) {
  // 2 stages, 2 micro-batches; stage 0: tf 1, tb 2; stage 1: tf 2, tb 4.
  // rank 1: F0 [1,3] B0 [3,7] F1 [7,9] B1 [9,13]; rank 0: F0 [0,1] F1 [1,2] B0 [7,9] B1 [13,15].
  SimCosts c;
  c.forward_s = {1, 2};
  c.backward_s = {2, 4};
  for (SendMode mode : {SendMode::Eager, SendMode::Rendezvous, SendMode::SendQueue}) {
    const SimResult r = simulate_schedule(one_f_one_b_schedule(2, 2), c, mode);
    EXPECT_DOUBLE_EQ(r.step_s, 15.0);
    EXPECT_DOUBLE_EQ(r.compute_s[0], 6.0);
    EXPECT_DOUBLE_EQ(r.compute_s[1], 12.0);
    EXPECT_NEAR(r.bubble(), 1.0 - 18.0 / 30.0, 1e-12);
    ASSERT_EQ(r.spans[0].size(), 4u);
    EXPECT_DOUBLE_EQ(r.spans[0][2].start_s, 7.0);  // B0 on rank 0 waits for rank 1's B0
    EXPECT_DOUBLE_EQ(r.spans[0][3].start_s, 13.0);
  }
  // Message costs delay the receiver: every activation and gradient takes 0.5 more. Activation 1
  // left rank 0 at 2 (before it waited for gradient 0), so rank 1 finds it there at 7.5:
  // rank 1: F0 [1.5,3.5] B0 [3.5,7.5] F1 [7.5,9.5] B1 [9.5,13.5]; rank 0: B0 [8,10] B1 [14,16].
  c.activation_s = c.grad_s = 0.5;
  const SimResult slow = simulate_schedule(one_f_one_b_schedule(2, 2), c, SendMode::Eager);
  EXPECT_DOUBLE_EQ(slow.step_s, 16.0);
  EXPECT_DOUBLE_EQ(slow.spans[1][2].start_s, 7.5);
}

TEST(Schedule, TimelinePrintsTheBubble) {
  const SimResult r = simulate_schedule(one_f_one_b_schedule(3, 4), SimCosts::uniform(3, 1.0, 1.0));
  const std::string timeline = format_timeline(r, 1.0);
  std::cout << timeline;
  const std::string expected =
      "rank 0: F0 F1 F2 .. .. B0 F3 B1 .. B2 .. B3\n"
      "rank 1: .. F0 F1 .. B0 F2 B1 F3 B2 .. B3 ..\n"
      "rank 2: .. .. F0 B0 F1 B1 F2 B2 F3 B3 .. ..\n";
  EXPECT_EQ(timeline, expected);
}

// Megatron's interleaved 1F1B, 2 ranks x 2 virtual stages, 4 micro-batches, by hand: rank r holds
// stages r and r + 2; forwards go round in groups of P = 2 micro-batches, chunk 0 then chunk 1;
// backwards with the chunks reversed; warm-up 2 (P - r - 1) + (v - 1) P forwards.
TEST(Schedule, InterleavedTable) {
  const auto sched = interleaved_schedule(2, 2, 4);
  EXPECT_EQ(format_schedule(sched),
            "rank 0: F0s0 F1s0 F0s2 F1s2 F2s0 B0s2 F3s0 B1s2 F2s2 B0s0 F3s2 B1s0 B2s2 B3s2 B2s0 B3s0\n"
            "rank 1: F0s1 F1s1 F0s3 B0s3 F1s3 B1s3 F2s1 B0s1 F3s1 B1s1 F2s3 B2s3 F3s3 B3s3 B2s1 B3s1\n");
  // The messages cross the ring both ways: stage 1 -> 2 goes from rank 1 back to rank 0.
  const std::string full = format_schedule(sched, true);
  std::cout << full;
  EXPECT_NE(full.find("rank 1: RA0s1 F0s1 SA0s1"), std::string::npos) << full;
  EXPECT_NE(full.find("RA0s2 F0s2"), std::string::npos) << full;
  // One virtual stage per rank is 1F1B.
  EXPECT_EQ(make_schedule("interleaved", StageLayout{4, 1}, 8), one_f_one_b_schedule(4, 8));
  // A single rank holding every stage sends nothing.
  const auto single = interleaved_schedule(1, 3, 2);
  for (const Action& a : single[0]) EXPECT_TRUE(is_compute(a.type)) << action_token(a, true);
}

TEST(Schedule, InterleavedNeverDeadlocksAndEveryMessageMatches) {
  for (int P = 1; P <= 4; ++P) {
    for (int v = 2; v <= 3; ++v) {
      for (int M = P; M <= 4 * P; M += P) {
        SCOPED_TRACE("ranks " + std::to_string(P) + " virtual " + std::to_string(v) + " micro-batches " +
                     std::to_string(M));
        const StageLayout layout{P, v};
        const auto sched = make_schedule("interleaved", layout, M);
        ASSERT_NO_THROW(validate_schedule(sched, M, layout));
        // Note [interleaving needs the send thread]: with sends queued on a thread, as the runtime
        // sends, every list runs; the messages all match.
        const SimCosts c = SimCosts::uniform(P * v, 1.0, 2.0);
        for (SendMode mode : {SendMode::Eager, SendMode::SendQueue})
          ASSERT_NO_THROW(simulate_schedule(sched, c, mode));
        int sends = 0;
        for (const auto& l : sched)
          for (const Action& a : l) sends += is_send(a.type);
        EXPECT_EQ(sends, P == 1 ? 0 : 2 * (P * v - 1) * M);  // every boundary crosses ranks when P > 1
      }
    }
  }
}

// The point of interleaving: with v stages per rank, each 1/v of the work, the bubble is v times
// smaller: (M v + P - 1) slots of one stage's (tf + tb) instead of (M + P - 1) slots of v of them.
// Without the send thread two ranks can sit in a send to each other: with P = 2 both neighbours
// of a rank are the same rank, and stage 1 (rank 1) sends its activation to stage 2 (rank 0) while
// rank 0 still sends the next micro-batch to stage 1.
TEST(Schedule, InterleavedNeedsTheSendThreadOnGloo) {
  const auto sched = interleaved_schedule(2, 2, 2);
  EXPECT_NE(run_blocking(sched).find("deadlock"), std::string::npos);
  EXPECT_THROW(simulate_schedule(sched, SimCosts::uniform(4, 1, 1), SendMode::Rendezvous), c10::Error);
  EXPECT_NO_THROW(simulate_schedule(sched, SimCosts::uniform(4, 1, 1), SendMode::SendQueue));
}

TEST(Schedule, InterleavedShrinksTheBubbleByTheVirtualStages) {
  for (int P = 2; P <= 4; ++P) {
    for (int v = 1; v <= 3; ++v) {
      const int M = 2 * P;
      const SimResult r = simulate_schedule(make_schedule("interleaved", StageLayout{P, v}, M),
                                            SimCosts::uniform(P * v, 1.0 / v, 2.0 / v), SendMode::Eager);
      SCOPED_TRACE("P=" + std::to_string(P) + " v=" + std::to_string(v));
      EXPECT_NEAR(r.step_s, ideal_step_time(P, M, 1.0 / v, 2.0 / v, v), 1e-9);
      EXPECT_NEAR(r.bubble(), double(P - 1) / (M * v + P - 1), 1e-9);
    }
  }
}

TEST(Schedule, ValidateCatchesAStageOnTheWrongRankAndALocalOrder) {
  auto sched = interleaved_schedule(2, 2, 2);
  // Move rank 0's first action (F0s0) behind F0s2: stage 2's input would not exist yet. With
  // P = 2 stage 1 lies between them on rank 1, so use a single rank: stages 0 and 1 on rank 0.
  auto one = interleaved_schedule(1, 2, 1);
  std::swap(one[0][0], one[0][1]);  // F0s1 before F0s0
  EXPECT_THROW(validate_schedule(one, 1, StageLayout{1, 2}), c10::Error);
  sched[1][0].stage = 0;  // a rank-0 stage in rank 1's list
  EXPECT_THROW(validate_schedule(sched, 2, StageLayout{2, 2}), c10::Error);
}

// ---- ZB-H1 (Note [ZB-H1] in parallel/schedule_generators.cpp) ----------------------------------

TEST(Schedule, ZeroBubbleH1Table) {
  // 1F1B's lists with each B_k split into I_k and W_{k - r}; the last r W's after the last I.
  EXPECT_EQ(format_schedule(zbh1_schedule(2, 4)),
            "rank 0: F0 F1 I0 W0 F2 I1 W1 F3 I2 W2 I3 W3\n"
            "rank 1: F0 I0 F1 I1 W0 F2 I2 W1 F3 I3 W2 W3\n");
  // W has no messages; I sends and receives the gradients as B does. The activation the next
  // forward needs comes before the gradient sent to the same rank, unless a W runs in between
  // (Note [ZB-H1 needs the send thread]).
  const std::string full = format_schedule(zbh1_schedule(3, 4), true);
  EXPECT_NE(full.find("rank 1: RA0 F0 SA0 RA1 F1 SA1 RG0 I0 RA2 SG0~ F2 SA2 RG1 I1 SG1~ W0 RA3 F3"), std::string::npos) << full;
  EXPECT_NE(full.find("RG3 I3 SG3 W2 W3"), std::string::npos) << full;
}

TEST(Schedule, ZeroBubbleH1NeverDeadlocksAndHoldsNoMoreThanOneFOneB) {
  for (int S = 1; S <= 8; ++S) {
    for (int M = 1; M <= 16; ++M) {
      SCOPED_TRACE("stages " + std::to_string(S) + " micro-batches " + std::to_string(M));
      const auto sched = zbh1_schedule(S, M);
      ASSERT_NO_THROW(validate_schedule(sched, M));
      // With sends queued on a thread, as the runtime sends, every list runs and every message matches.
      const SimCosts c = SimCosts::uniform(S, 1.0, 2.0);
      for (SendMode mode : {SendMode::Eager, SendMode::SendQueue}) ASSERT_NO_THROW(simulate_schedule(sched, c, mode));
      // Micro-batches held (forward run, W not yet): at most S on every rank, 1F1B's most.
      for (int r = 0; r < S; ++r) {
        int held = 0, most = 0;
        for (const Action& a : sched[r]) {
          held += a.type == ActionType::Forward;
          held -= a.type == ActionType::BackwardWeight;
          most = std::max(most, held);
        }
        EXPECT_LE(most, std::min(S, M)) << "rank " << r;
      }
    }
  }
}

// Note [ZB-H1 needs the send thread]: a rank that runs a W between its gradient send and its next
// forward sends that gradient before it receives the forward's activation, while its neighbour
// sends the activation first: with purely blocking sends both sit in a send.
TEST(Schedule, ZeroBubbleH1NeedsTheSendThreadOnGloo) {
  EXPECT_NE(run_blocking(zbh1_schedule(2, 4)).find("deadlock"), std::string::npos);
  EXPECT_EQ(run_blocking(zbh1_schedule(2, 1)), "") << "one micro-batch: no W between a send and a forward";
}

TEST(Schedule, ZeroBubbleH1TakesItsTextbookTimeAndBeatsOneFOneB) {
  // Uniform stages, I = W: the bubble is a third of 1F1B's once M >= P.
  for (int S = 2; S <= 8; S *= 2) {
    for (int M = S; M <= 4 * S; M += S) {
      SimCosts c = SimCosts::uniform(S, 1.0, 2.0);
      const double zb = simulate_schedule(zbh1_schedule(S, M), c).step_s;
      EXPECT_DOUBLE_EQ(zb, ideal_zbh1_step_time(S, M, 1.0, 1.0, 1.0)) << S << " x " << M;
      EXPECT_DOUBLE_EQ(zb, 3.0 * M + (S - 1));
      EXPECT_DOUBLE_EQ(simulate_schedule(one_f_one_b_schedule(S, M), c).step_s, 3.0 * (M + S - 1));
      // W a third of the backward: still below 1F1B.
      c.weight_s.assign(S, 2.0 / 3);
      EXPECT_LT(simulate_schedule(zbh1_schedule(S, M), c).step_s, 3.0 * (M + S - 1));
    }
  }
  EXPECT_NE(error_of([] { ideal_zbh1_step_time(4, 2, 1, 1, 1); }).find("micro_batches >= ranks"), std::string::npos);
}

TEST(Schedule, ValidateChecksTheSplitBackward) {
  auto sched = compute_schedule("zbh1", StageLayout{2, 1}, 2);
  // W before its I.
  auto broken = sched;
  auto& l = broken[1];
  auto w = std::find_if(l.begin(), l.end(), [](const Action& a) { return a.type == ActionType::BackwardWeight; });
  auto i = std::find_if(l.begin(), l.end(), [&](const Action& a) {
    return a.type == ActionType::BackwardInput && a.micro_batch == w->micro_batch;
  });
  std::iter_swap(w, i);
  EXPECT_NE(error_of([&] { validate_schedule(lower(broken, StageLayout{2, 1}), 2); }).find("runs W before I"),
            std::string::npos);
  // An I without its W.
  broken = sched;
  broken[0].erase(std::find_if(broken[0].begin(), broken[0].end(),
                               [](const Action& a) { return a.type == ActionType::BackwardWeight; }));
  EXPECT_NE(error_of([&] { validate_schedule(lower(broken, StageLayout{2, 1}), 2); }).find("has an I without its W"),
            std::string::npos);
}

TEST(Schedule, VPlacementRunsDownTheRanksAndBackUp) {
  const StageLayout v = StageLayout::of(8, 2, Placement::V);
  EXPECT_EQ(v.ranks, 4);
  EXPECT_EQ(v.stages_of(0), (std::vector<int>{0, 7}));
  EXPECT_EQ(v.stages_of(3), (std::vector<int>{3, 4}));
  for (int s = 0; s < 8; ++s) EXPECT_EQ(v.rank_of(s), s < 4 ? s : 7 - s) << s;
  EXPECT_NE(error_of([] { StageLayout::of(6, 3, Placement::V); }).find("pipeline.virtual_stages = 2 (got 3)"),
            std::string::npos);
  EXPECT_NE(error_of([] { compute_schedule("zbv", StageLayout{2, 2}, 4); }).find("V placement"), std::string::npos);
  EXPECT_NE(error_of([] { compute_schedule("1f1b", StageLayout{2, 2, Placement::V}, 4); }).find("round-robin"),
            std::string::npos);
  EXPECT_EQ(placement_of("zbv"), Placement::V);
  EXPECT_EQ(placement_of("interleaved"), Placement::RoundRobin);
}

TEST(Schedule, ZeroBubbleVTable) {
  // Note [ZB-V], 2 ranks x 4 micro-batches: rank 0 holds stages 0 and 3 (the loss), rank 1 the
  // middle stages 1 and 2, handed over in memory.
  EXPECT_EQ(format_schedule(zbv_schedule(2, 4)),
            "rank 0: F0s0 F1s0 F2s0 F0s3 I0s3 W0s3 F1s3 I1s3 W1s3 F3s0 I0s0 W0s0 F2s3 I2s3 W2s3 I1s0 W1s0 F3s3 "
            "I3s3 W3s3 I2s0 W2s0 I3s0 W3s0\n"
            "rank 1: F0s1 F0s2 F1s1 F1s2 I0s2 W0s2 F2s1 I0s1 W0s1 F2s2 I1s2 W1s2 F3s1 I1s1 W1s1 F3s2 I2s2 W2s2 I2s1 "
            "I3s2 I3s1 W2s1 W3s2 W3s1\n");
}

TEST(Schedule, ZeroBubbleVNeverDeadlocksWithTheSendThreadAndHoldsTwoChunksPerRank) {
  for (int P = 1; P <= 6; ++P) {
    for (int M = 1; M <= 16; ++M) {
      SCOPED_TRACE("ranks " + std::to_string(P) + " micro-batches " + std::to_string(M));
      const StageLayout layout{P, 2, Placement::V};
      const auto sched = zbv_schedule(P, M);
      ASSERT_NO_THROW(validate_schedule(sched, M, layout));
      const SimCosts c = SimCosts::uniform(2 * P, 1.0, 2.0);
      for (SendMode mode : {SendMode::Eager, SendMode::SendQueue}) ASSERT_NO_THROW(simulate_schedule(sched, c, mode));
      // Chunk-activations held (forward run, W not yet): at most 2P, the memory of 1F1B's rank 0
      // (P micro-batches of a whole stage, twice a chunk).
      for (int r = 0; r < P; ++r) {
        int held = 0, most = 0;
        for (const Action& a : sched[r]) {
          held += a.type == ActionType::Forward;
          held -= a.type == ActionType::BackwardWeight;
          most = std::max(most, held);
        }
        EXPECT_LE(most, 2 * P) << "rank " << r;
      }
    }
  }
}

TEST(Schedule, ZeroBubbleVIdlesOnlyForItsStartUp) {
  // Note [ZB-V]: chunks with F = I = W = 1, eager sends: 6M + (P - 1) once M >= 2P - 1, against
  // ZB-H1's 6M + 2 (P - 1) and 1F1B's 6 (M + P - 1) on the same model cut in P stages of 2 chunks.
  for (int P = 1; P <= 6; ++P) {
    for (int M = 2 * P - 1; M <= 4 * P; ++M) {
      const double zbv = simulate_schedule(zbv_schedule(P, M), SimCosts::uniform(2 * P, 1, 2), SendMode::Eager).step_s;
      EXPECT_DOUBLE_EQ(zbv, 6.0 * M + P - 1) << P << " x " << M;
      const SimCosts whole = SimCosts::uniform(P, 2, 4);
      EXPECT_DOUBLE_EQ(simulate_schedule(zbh1_schedule(P, M), whole, SendMode::Eager).step_s, 6.0 * M + 2 * (P - 1));
      EXPECT_DOUBLE_EQ(simulate_schedule(one_f_one_b_schedule(P, M), whole, SendMode::Eager).step_s,
                       6.0 * (M + P - 1));
    }
  }
}

TEST(Schedule, ReceivesFollowTheSendersOrderOnAVLink) {
  // Note [receive in the order sent]. Rank 0 sends activation 2 of stage 0 before gradient 0 of
  // stage 3; rank 1's I0 on stage 2 needs that gradient before its F2 on stage 1 needs the
  // activation, so it receives the activation first and keeps it.
  const std::string full = format_schedule(zbv_schedule(2, 3), true);
  EXPECT_NE(full.find("rank 0: F0s0 SA0s0 F1s0 SA1s0 F2s0 SA2s0 RA0s3 F0s3 I0s3 SG0s3"), std::string::npos) << full;
  EXPECT_NE(full.find("F1s2 SA1s2 RA2s1 RG0s2 I0s2 W0s2 F2s1"), std::string::npos) << full;
}

// Note [slack of a gradient send].
std::vector<double> slack_of_rank(const std::vector<SendSlack>& all, int rank) {
  std::vector<double> out;
  for (const SendSlack& x : all)
    if (x.rank == rank) out.push_back(x.slack_s);
  return out;
}

TEST(Schedule, GradientSendSlackOnTheDependencyGraph) {
  // By hand, 1F1B on 2 stages x 2 micro-batches, F = 1, B = 2. Rank 0: F0 F1 B0 B1; rank 1:
  // F0 B0 F1 B1. Earliest: rank 1's B0 ends at 4, its B1 at 7; rank 0's B0 runs 4-6, B1 7-9.
  // Latest start of rank 0's B0: 7 - 2 = 5, of its B1: 7. Slack of gradient 0: 5 - 4 = 1; of 1: 0.
  const SimCosts c2 = SimCosts::uniform(2, 1.0, 2.0);
  EXPECT_EQ(slack_of_rank(gradient_send_slack(one_f_one_b_schedule(2, 2), c2), 1), (std::vector<double>{1, 0}));
  // 4 x 8 (the numbers of an independent critical-path computation): 1F1B's steady state is the
  // critical chain, and the ranks' early cool-down sends have slack, where Optimus-CC's rule
  // compresses the cool-down and the last steady send. ZB-H1 moves the slack into its steady state.
  const SimCosts c4 = SimCosts::uniform(4, 1.0, 2.0);
  const auto one = gradient_send_slack(one_f_one_b_schedule(4, 8), c4);
  EXPECT_EQ(slack_of_rank(one, 1), (std::vector<double>{0, 0, 0, 0, 3, 2, 1, 0}));
  EXPECT_EQ(slack_of_rank(one, 3), (std::vector<double>{0, 0, 0, 0, 0, 0, 1, 0}));
  const auto zb = gradient_send_slack(zbh1_schedule(4, 8), c4);
  EXPECT_EQ(slack_of_rank(zb, 1), (std::vector<double>{0, 1, 1, 1, 1, 0, 0, 0}));
  EXPECT_EQ(slack_of_rank(zb, 3), (std::vector<double>{0, 0, 0, 1, 1, 1, 1, 0}));
  // Every send of every schedule is listed once, with a slack >= 0.
  for (const std::string name : {"gpipe", "1f1b", "zbh1"}) {
    const auto all = gradient_send_slack(make_schedule(name, 4, 8), c4);
    EXPECT_EQ(all.size(), 3u * 8) << name;
    for (const SendSlack& x : all) EXPECT_GE(x.slack_s, 0.0) << name << " " << action_token(x.send);
  }
  // ZB-V on 2 ranks: boundaries 0 and 2 cross between the ranks, boundary 1 stays on rank 1.
  const auto v = gradient_send_slack(zbv_schedule(2, 8), c4);
  EXPECT_EQ(v.size(), 2u * 8);
  for (const SendSlack& x : v) EXPECT_GE(x.slack_s, 0.0) << action_token(x.send, true);
}

// ---- the registry, the text form, the lowering passes and the plan cache ------------------------

// The smallest layout each record runs with `ranks` ranks (interleaved: two stages per rank).
StageLayout layout_for(const ScheduleKind& k, int ranks) {
  const int v = k.max_virtual_stages == 0 ? 2 : k.min_virtual_stages;
  return StageLayout::of(ranks * v, v, k.placement);
}

TEST(Schedule, RegistryHoldsEveryScheduleAndItsRules) {
  EXPECT_STREQ(known_schedules(), "gpipe, 1f1b, interleaved, zbh1, zbv");
  EXPECT_EQ(schedule_names(), (std::vector<std::string>{"gpipe", "1f1b", "interleaved", "zbh1", "zbv"}));
  for (const ScheduleKind& k : schedule_kinds()) {
    EXPECT_EQ(&schedule_kind(k.name), &k);
    EXPECT_EQ(placement_of(k.name), k.placement);
    EXPECT_NE(schedules_help().find(std::string(k.name) + ": " + k.help), std::string::npos) << k.name;
    EXPECT_NO_THROW(validate_schedule(make_schedule(k.name, layout_for(k, 2), 4), 4, layout_for(k, 2))) << k.name;
  }
  EXPECT_EQ(find_schedule_kind("zigzag"), nullptr);
  EXPECT_NE(error_of([] { schedule_kind("zigzag"); })
                .find("unknown pipeline schedule 'zigzag'; known: gpipe, 1f1b, interleaved, zbh1, zbv"),
            std::string::npos);
  EXPECT_EQ(schedule_kind("interleaved").virtual_stages_problem(5), "");
  EXPECT_EQ(schedule_kind("zbv").virtual_stages_problem(1),
            "pipeline.schedule = zbv places two stages on each rank in a V: it needs pipeline.virtual_stages = 2 "
            "(got 1)");
  EXPECT_EQ(schedule_kind("zbh1").virtual_stages_problem(2),
            "pipeline.virtual_stages = 2 needs pipeline.schedule = interleaved or zbv (zbh1 runs one stage per rank)");
  EXPECT_EQ(schedule_kind("1f1b").virtual_stages_problem(3),
            "pipeline.virtual_stages = 3 needs pipeline.schedule = interleaved (1f1b runs one stage per rank)");
  EXPECT_NE(error_of([] { make_schedule("gpipe", StageLayout{2, 2}, 2); }).find("gpipe runs one stage per rank"),
            std::string::npos);
}

TEST(Schedule, TextRoundTripsEveryLoweredList) {
  for (const ScheduleKind& k : schedule_kinds())
    for (int P = 1; P <= 4; ++P)
      for (int M : {1, 2, 4, 8}) {
        const StageLayout layout = layout_for(k, P);
        if (k.max_virtual_stages == 0 && M % P != 0) continue;  // interleaved: M a multiple of P
        SCOPED_TRACE(std::string(k.name) + " ranks " + std::to_string(P) + " micro-batches " + std::to_string(M));
        const auto sched = make_schedule(k.name, layout, M);
        const std::string text = schedule_text(sched);
        ASSERT_TRUE(parse_schedule(text, layout) == sched) << text;
        // format_schedule's form reads back to the same tokens (it does not print `critical`).
        const std::string shown = format_schedule(sched, true);
        EXPECT_EQ(format_schedule(parse_schedule(shown, layout), true), shown);
      }
  // 1F1B's cool-down sends with slack (GradientSendSlackOnTheDependencyGraph) carry the "+".
  const std::string one = schedule_text(one_f_one_b_schedule(2, 2));
  EXPECT_EQ(one, "rank 0: F0s0 SA0s0 F1s0 SA1s0 RG0s0 B0s0 RG1s0 B1s0\n"
                 "rank 1: RA0s1 F0s1 B0s1 RA1s1 SG0s1~+ F1s1 B1s1 SG1s1\n");
  const StageLayout two = StageLayout::of(2);
  EXPECT_EQ(parse_action("SG3s1~+", 1, two), (Action{ActionType::SendGrad, 1, 3, false, 0, false}));
  EXPECT_EQ(parse_action("RA0", 1, two), (Action{ActionType::RecvActivation, 1, 0, true, 0}));
  for (const char* bad : {"X3", "F", "F1s7", "F1x", "SA1s1"})
    EXPECT_NE(error_of([&] { parse_action(bad, 1, two); }).find(std::string("token '") + bad + "' on rank 1"),
              std::string::npos)
        << bad;
  EXPECT_NE(error_of([] { parse_action("F0", 0, StageLayout::of(4, 2)); }).find("the rank holds several"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parse_schedule("rank 1: F0\n", two); }).find("does not start with 'rank 0:'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parse_schedule("rank 0: F0\n", two); }).find("1 rows for a layout of 2 ranks"),
            std::string::npos);
}

TEST(Schedule, LoweringIsItsPassesInOrder) {
  for (const ScheduleKind& k : schedule_kinds()) {
    SCOPED_TRACE(k.name);
    const StageLayout layout = layout_for(k, 3);
    const auto compute = compute_schedule(k.name, layout, 6);
    auto lists = add_sends_and_receives(compute, layout);
    const auto placed = lists;
    order_receives_as_sent(lists);
    // Only a V placement sends both kinds of message on one direction of a link.
    if (k.placement == Placement::RoundRobin) {
      EXPECT_TRUE(lists == placed);
    }
    for (const auto& l : lists)
      for (const Action& a : l) EXPECT_TRUE(a.compress_backward && a.critical) << action_token(a, true);
    mark_epilogue_only(lists);
    mark_critical(lists, layout);
    EXPECT_TRUE(lists == lower(compute, layout));
  }
}

TEST(Schedule, CachedPlansAreBuiltOnceAndEqualMakeSchedule) {
  const StageLayout layout = StageLayout::of(4, 2);
  const std::vector<RankSchedule>& plan = cached_schedule("interleaved", layout, 4);
  EXPECT_EQ(&plan, &cached_schedule("interleaved", layout, 4));
  EXPECT_TRUE(plan == make_schedule("interleaved", layout, 4));
  EXPECT_NE(&plan, &cached_schedule("interleaved", layout, 8));
  EXPECT_NE(&plan, &cached_schedule("zbv", StageLayout::of(4, 2, Placement::V), 4));
  EXPECT_EQ(&cached_forward_only_schedule(layout), &cached_forward_only_schedule(layout));
  EXPECT_TRUE(cached_forward_only_schedule(layout) == forward_only_schedule(layout));
  // A bad key keeps nothing: it fails each time, with make_schedule's error.
  for (int i = 0; i < 2; ++i)
    EXPECT_NE(error_of([&] { cached_schedule("interleaved", layout, 3); }).find("must be a multiple of the 2"),
              std::string::npos);
  // Threads asking for one plan at once share it.
  std::vector<const std::vector<RankSchedule>*> seen(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < seen.size(); ++i)
    threads.emplace_back([&seen, i] { seen[i] = &cached_schedule("zbh1", StageLayout::of(4), 16); });
  for (auto& t : threads) t.join();
  for (const auto* p : seen) EXPECT_EQ(p, seen.front());
}

}  // namespace
}  // namespace tl
