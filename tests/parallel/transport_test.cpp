// The c10d transport with real processes on 127.0.0.1 (ranks of parallel_dist_helper): variable-size
// payloads come back byte for byte, with and without the communication thread, with rank 0 or the
// launcher's agent hosting the store, and under torchrun where it is installed; a rank killed with
// SIGKILL or a silent one makes the survivor fail within dist.timeout_s with an error naming it;
// forged headers are rejected; the emulated link never delivers early. Every process is bounded in
// time and reaped.
#include "parallel/ranks/transport.h"

#include <ATen/detail/CUDAHooksInterface.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <set>

#include "parallel/ranks/c10d_compat.h"
#include "parallel/ranks/rendezvous.h"
#include "tests/parallel/multiprocess.h"

namespace tl::ranks {
namespace {
using namespace tl::testing_mp;

#define SKIP_WITHOUT_TRANSPORT()                                                                               \
  do {                                                                                                         \
    if (!Transport::available("gloo"))                                                                         \
      GTEST_SKIP() << "tapeline was built without c10d's Gloo backend (install libgloo-dev and re-run cmake)"; \
    if (helper_path().empty()) GTEST_SKIP() << "parallel_dist_helper was not built";                           \
  } while (0)

struct RankRun {
  int status = 0;  // wait status; -1: it had to be killed
  std::string log;
};

// Runs the helper with `args` as n ranks. Ranks in `killed_after` are expected to hang (a silent
// peer): they are killed once the others are done. Every wait is bounded by limit_s.
std::vector<RankRun> run_ranks(const std::string& name, int n, const std::vector<std::string>& args, double limit_s,
                               const EnvList& extra = {}, const std::set<int>& killed_after = {}) {
  const int port = find_free_port();
  ProcessGroupGuard guard;
  std::vector<RankRun> out(n);
  std::vector<std::string> logs(n);
  for (int r = 0; r < n; ++r) {
    logs[r] = temp_log(name + "_rank" + std::to_string(r));
    guard.pids.push_back(spawn(helper_path(), args, rank_env(r, n, port, extra), logs[r]));
  }
  for (int r = 0; r < n; ++r)
    if (!killed_after.count(r)) out[r].status = wait_or_kill(guard.pids[r], limit_s);
  for (int r : killed_after) out[r].status = wait_or_kill(guard.pids[r], 0.0);
  for (int r = 0; r < n; ++r) {
    out[r].log = read_file(logs[r]);
    std::remove(logs[r].c_str());
  }
  return out;
}

std::string logs_of(const std::vector<RankRun>& runs) {
  std::string s;
  for (size_t r = 0; r < runs.size(); ++r) s += "--- rank " + std::to_string(r) + ":\n" + runs[r].log;
  return s;
}

// Both ranks of the helper's "exchange 40" finished and said so.
void expect_exchanged(const std::vector<RankRun>& runs) {
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(exit_code(runs[r].status), 0) << logs_of(runs);
    EXPECT_NE(runs[r].log.find("OK exchange rank " + std::to_string(r) + " agent_store=0 sent=40 received=40"),
              std::string::npos)
        << logs_of(runs);
  }
}

TEST(Transport, TwoRanksExchangeVariableSizePayloadsExactly) {
  SKIP_WITHOUT_TRANSPORT();
  expect_exchanged(run_ranks("exchange", 2, {"exchange", "40"}, 120));
}

// Note [group sums in flight]: two members' sum on their own process group is the bits of the sum
// in rank order (the data-parallel sum during the backward relies on it), and a dead member is an
// error naming it and the sum's context.
// The helper's group_sum on n ranks: every rank checked its 8 sums bit for bit.
void expect_group_sums(int n, double limit_s) {
  auto runs = run_ranks("group_sum" + std::to_string(n), n, {"group_sum"}, limit_s);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(exit_code(runs[r].status), 0) << logs_of(runs);
    EXPECT_NE(runs[r].log.find("OK group_sum rank " + std::to_string(r) + " checked=8"), std::string::npos)
        << logs_of(runs);
  }
}

TEST(Transport, GroupSumsOfTwoAreTheSumInRankOrder) {
  SKIP_WITHOUT_TRANSPORT();
  expect_group_sums(2, 120);
}

// Note [group sums of more than two in rank order]: three members' chunks exchanged, summed in
// rank order and gathered give every member the bits of the sum in rank order, also for a tensor
// of fewer values than members (empty chunks) and with two sums in flight.
TEST(Transport, GroupSumsOfThreeAreTheSumInRankOrder) {
  SKIP_WITHOUT_TRANSPORT();
  expect_group_sums(3, 180);
}

TEST(Transport, AGroupSumWithADeadMemberNamesIt) {
  SKIP_WITHOUT_TRANSPORT();
  auto runs = run_ranks("group_sum_die", 2, {"group_sum", "die"}, 60);
  EXPECT_EQ(exit_code(runs[0].status), 3) << logs_of(runs);
  EXPECT_NE(runs[0].log.find("CAUGHT peer=1"), std::string::npos) << logs_of(runs);
  EXPECT_NE(runs[0].log.find("step 4, data-parallel gradients, bucket 0"), std::string::npos) << logs_of(runs);
}

TEST(Transport, CommunicationThreadKeepsOrderAndBytes) {
  SKIP_WITHOUT_TRANSPORT();
  auto runs = run_ranks("exchange_comm", 2, {"exchange", "40", "comm"}, 120);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(exit_code(runs[r].status), 0) << logs_of(runs);
    EXPECT_NE(runs[r].log.find("OK exchange rank " + std::to_string(r)), std::string::npos) << logs_of(runs);
  }
}

// torchrun's agent hosts the store and sets TORCHELASTIC_USE_AGENT_STORE=True: every rank must
// connect as a client. Here the test process plays the agent.
TEST(Transport, AgentStoreMakesEveryRankAClient) {
  SKIP_WITHOUT_TRANSPORT();
  const int port = find_free_port();
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(port);
  so.isServer = true;
  so.waitWorkers = false;
  so.timeout = std::chrono::seconds(60);
  auto agent = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  ProcessGroupGuard guard;
  std::vector<std::string> logs;
  for (int r = 0; r < 2; ++r) {
    logs.push_back(temp_log("agent_rank" + std::to_string(r)));
    guard.pids.push_back(
        spawn(helper_path(), {"exchange", "10"},
              rank_env(r, 2, port, {{"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"TORCHELASTIC_RESTART_COUNT", "3"}}),
              logs[r]));
  }
  for (int r = 0; r < 2; ++r) {
    const int st = wait_or_kill(guard.pids[r], 120);
    const std::string log = read_file(logs[r]);
    EXPECT_EQ(exit_code(st), 0) << log;
    EXPECT_NE(log.find("OK exchange rank " + std::to_string(r) + " agent_store=1"), std::string::npos) << log;
    std::remove(logs[r].c_str());
  }
  // The ranks' keys live under this attempt's prefix in the agent's store.
  EXPECT_TRUE(agent->check({"tapeline/attempt_3/info/0", "tapeline/attempt_3/info/1"}));
}

void expect_caught(const RankRun& run, int peer, const std::string& context, const std::string& why,
                   const std::string& all_logs) {
  EXPECT_EQ(exit_code(run.status), 3) << "the survivor must catch a TransportError\n" << all_logs;
  EXPECT_NE(run.log.find("CAUGHT peer=" + std::to_string(peer)), std::string::npos) << all_logs;
  EXPECT_NE(run.log.find("rank " + std::to_string(peer)), std::string::npos) << all_logs;
  EXPECT_NE(run.log.find(context), std::string::npos) << all_logs;
  EXPECT_NE(run.log.find(why), std::string::npos) << all_logs;
}

TEST(Transport, KilledPeerIsNamedByTheSurvivor) {
  SKIP_WITHOUT_TRANSPORT();
  // dist.timeout_s = 3; the hang guard (40 s) only catches a hang, it is no timing assert.
  auto runs = run_ranks("die1", 2, {"die", "1"}, 40, {{"TL_TIMEOUT_S", "3"}});
  ASSERT_TRUE(WIFSIGNALED(runs[1].status) && WTERMSIG(runs[1].status) == SIGKILL) << logs_of(runs);
  expect_caught(runs[0], 1, "step 12, boundary 2 forward", "has exited", logs_of(runs));
  std::cout << runs[0].log;
}

TEST(Transport, KilledStoreHostIsNamedByTheSurvivor) {
  SKIP_WITHOUT_TRANSPORT();
  auto runs = run_ranks("die0", 2, {"die", "0"}, 40, {{"TL_TIMEOUT_S", "3"}});
  ASSERT_TRUE(WIFSIGNALED(runs[0].status)) << logs_of(runs);
  expect_caught(runs[1], 0, "step 12, boundary 2 forward", "has exited", logs_of(runs));
}

TEST(Transport, KilledPeerFailsAPendingSend) {
  SKIP_WITHOUT_TRANSPORT();
  auto runs = run_ranks("die_send", 2, {"die", "1", "send"}, 40, {{"TL_TIMEOUT_S", "3"}});
  expect_caught(runs[0], 1, "step 12, boundary 1 forward send", "rank 1", logs_of(runs));
  std::cout << runs[0].log;
}

TEST(Transport, SendErrorOnTheCommThreadSurfacesAtTheNextCall) {
  SKIP_WITHOUT_TRANSPORT();
  auto runs = run_ranks("die_thread", 2, {"die", "1", "send", "thread"}, 40, {{"TL_TIMEOUT_S", "3"}});
  expect_caught(runs[0], 1, "step 12, boundary 1 forward send", "reported at: step 12, end of the forward",
                logs_of(runs));
}

TEST(Transport, SilentPeerTimesOut) {
  SKIP_WITHOUT_TRANSPORT();
  auto runs = run_ranks("silent", 2, {"silent"}, 40, {{"TL_TIMEOUT_S", "3"}}, /*killed_after=*/{1});
  expect_caught(runs[0], 1, "step 3, boundary 1 backward", "no answer within 3 s", logs_of(runs));
  EXPECT_NE(runs[0].log.find("is still running"), std::string::npos) << runs[0].log;
  std::cout << runs[0].log;
}

TEST(Transport, SilentPeerInACollectiveTimesOut) {
  SKIP_WITHOUT_TRANSPORT();
  auto runs = run_ranks("silent_coll", 2, {"silent_collective"}, 40, {{"TL_TIMEOUT_S", "3"}}, {1});
  expect_caught(runs[0], 1, "step 3, tied embeddings", "no answer within 3 s", logs_of(runs));
  EXPECT_NE(runs[0].log.find("rank 1 (pid"), std::string::npos) << runs[0].log;
}

// Rank 0 waits for rank 1, which runs but waits for rank 2, which is stopped: rank 0's error says
// rank 1 still runs and names rank 2 as the stalled one (Note [who stalled the run]).
TEST(Transport, AStalledRankBehindARunningPeerIsNamed) {
  SKIP_WITHOUT_TRANSPORT();
  auto runs = run_ranks("stalled_chain", 3, {"stalled_chain"}, 40, {{"TL_TIMEOUT_S", "3"}}, {2});
  expect_caught(runs[0], 1, "step 5, boundary 1 forward", "no answer within 3 s", logs_of(runs));
  EXPECT_NE(runs[0].log.find("rank 1 (pid"), std::string::npos) << runs[0].log;
  EXPECT_NE(runs[0].log.find("is still running"), std::string::npos) << runs[0].log;
  EXPECT_NE(runs[0].log.find("meanwhile rank 2 (pid"), std::string::npos) << runs[0].log;
  EXPECT_NE(runs[0].log.find("is stopped"), std::string::npos) << runs[0].log;
  EXPECT_NE(runs[0].log.find("SUSPECTS 2\n"), std::string::npos) << runs[0].log;
  // Rank 1's own peer is the stopped one: no suspects beside it.
  expect_caught(runs[1], 2, "step 5, boundary 2 forward", "is stopped", logs_of(runs));
  EXPECT_NE(runs[1].log.find("SUSPECTS\n"), std::string::npos) << runs[1].log;
}

TEST(Transport, ForgedHeadersAndPayloadsAreRejectedNamingThePeer) {
  SKIP_WITHOUT_TRANSPORT();
  const std::pair<const char*, const char*> cases[] = {
      {"magic", "not a tapeline message (bad magic"},
      {"size", "announced body of 1125899906842624 bytes"},
      {"tag", "got tag 5, expected 0: the two ranks' schedules disagree"},
      {"payload", "is not a valid payload"},
      {"bitflip", "body checksum mismatch"},
  };
  for (const auto& [kind, why] : cases) {
    SCOPED_TRACE(kind);
    auto runs = run_ranks(std::string("garbage_") + kind, 2, {"garbage", kind}, 40, {{"TL_TIMEOUT_S", "5"}});
    expect_caught(runs[0], 1, "step 1, boundary 1 forward", why, logs_of(runs));
  }
}

// Note [bodies in pieces]: from 1000 bytes, in pieces of 4 KiB (up to 256 of them), mixed with
// bodies in the frame and small ones, blocking and from the communication thread.
TEST(Transport, BodiesInPiecesArriveExactly) {
  SKIP_WITHOUT_TRANSPORT();
  const EnvList pieces = {{"TL_PIECES_MIN", "1000"}, {"TL_PIECE_BYTES", "4096"}};
  auto blocking = run_ranks("pieces", 2, {"exchange", "40"}, 120, pieces);
  expect_exchanged(blocking);
  auto runs = run_ranks("pieces_comm", 2, {"exchange", "40", "comm"}, 120, pieces);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(exit_code(runs[r].status), 0) << logs_of(runs);
    EXPECT_NE(runs[r].log.find("OK exchange rank " + std::to_string(r)), std::string::npos) << logs_of(runs);
  }
  // 18 of the 40 payloads (and so of their echoes) are 1000 bytes or more: sent in pieces.
  for (const auto* run : {&blocking, &runs})
    for (int r = 0; r < 2; ++r) EXPECT_NE((*run)[r].log.find(" in_pieces=18\n"), std::string::npos) << logs_of(*run);
}

// A body of 3 MiB in 3 pieces, corrupted after its sums were taken (or its header forged): the
// receiver names the peer, the message and the piece, and uses nothing of it.
TEST(Transport, CorruptBodiesInPiecesAreRejectedNamingThePeer) {
  SKIP_WITHOUT_TRANSPORT();
  const std::pair<const char*, const char*> cases[] = {
      {"pieces_bitflip", "body checksum mismatch in piece "},
      {"pieces_truncate", "body checksum mismatch in piece 2 of 3 (bytes 2097152..3145728 of 3145728"},
      {"pieces_trailer", "corrupt trailer of a body in pieces: check word mismatch"},
      {"pieces_oversize", "announced body of 1152921504606846976 bytes"},
      {"pieces_count", "a body of 3145728 bytes in 1 pieces; accepted 2..256 pieces"},
  };
  for (const auto& [kind, why] : cases) {
    SCOPED_TRACE(kind);
    auto runs = run_ranks(std::string("garbage_") + kind, 2, {"garbage", kind}, 40,
                          {{"TL_TIMEOUT_S", "5"}, {"TL_PIECES_MIN", "2097152"}});
    expect_caught(runs[0], 1, "step 1, boundary 1 forward", why, logs_of(runs));
    EXPECT_NE(runs[0].log.find("receive of message #0 from rank 1"), std::string::npos) << logs_of(runs);
  }
}

// The pieces of a body cover it exactly, in order; a trailer comes back as written, and a
// garbled one, or a header with a piece count out of range, is an error saying so.
TEST(Transport, PiecesCoverTheBodyAndTrailersAreChecked) {
  for (int64_t n : {int64_t(129), int64_t(4097), int64_t(1) << 20, (int64_t(3) << 20) + 5, int64_t(64) << 20}) {
    for (int64_t piece : {int64_t(64), int64_t(4096), int64_t(1) << 20}) {
      const int64_t count = wire::piece_count(n, piece);
      ASSERT_GE(count, 2) << n << " " << piece;
      ASSERT_LE(count, wire::kMaxPieces);
      int64_t at = 0;
      for (int64_t k = 0; k < count; ++k) {
        const wire::PieceSpan s = wire::piece_span(n, count, k);
        EXPECT_EQ(s.offset, at) << n << " " << piece << " " << k;
        EXPECT_GT(s.bytes, 0) << n << " " << piece << " " << k;
        if (k + 1 < count) {
          EXPECT_EQ(s.bytes % 64, 0);
        }
        at += s.bytes;
      }
      EXPECT_EQ(at, n) << n << " " << piece;
    }
  }
  EXPECT_EQ(wire::piece_count(64, 16), 0);  // too small for two non-empty pieces of 64-byte steps
  EXPECT_EQ(wire::piece_count(int64_t(64) << 20, int64_t(1) << 20), 64);

  const std::vector<uint32_t> sums = {1, 0xFFFFFFFFu, 12345};
  std::vector<int64_t> w = wire::make_trailer(9, sums);
  auto parse = [&](const std::vector<int64_t>& words, int64_t seq, int64_t count) {
    return wire::parse_trailer(reinterpret_cast<const uint8_t*>(words.data()), words.size() * 8, seq, count);
  };
  EXPECT_EQ(parse(w, 9, 3), sums);
  auto rejects = [&](const std::vector<int64_t>& words, int64_t seq, int64_t count, const std::string& why) {
    try {
      parse(words, seq, count);
      ADD_FAILURE() << "accepted; expected: " << why;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  rejects(w, 8, 3, "it is message #9's");
  rejects(w, 9, 4, "56 bytes, expected 64");
  std::vector<int64_t> bad = w;
  bad[4] ^= 2;  // a sum changed after the check word
  rejects(bad, 9, 3, "check word mismatch");
  bad = w;
  bad[0] = 0;
  rejects(bad, 9, 3, "bad magic");

  // Headers: a body in pieces with a count out of range, or without the checksum bit, is refused.
  auto header = [](int64_t n, int64_t layout, int64_t crc) {
    std::vector<int64_t> h(wire::kHeaderWords, 0);
    h[wire::kWordMagic] = wire::kMagic;
    h[wire::kWordBytes] = n;
    h[wire::kWordBodyCrc] = crc;
    h[wire::kWordLayout] = layout;
    h[wire::kWordCheck] = wire::check_word(h.data());
    return h;
  };
  auto parse_header = [](const std::vector<int64_t>& h) {
    return wire::parse_frame_header(reinterpret_cast<const uint8_t*>(h.data()), h.size() * 8, 0, nullptr,
                                    int64_t(1) << 34);
  };
  const int64_t pieces8 = wire::kLayoutPieces | (int64_t(8) << wire::kPieceCountShift);
  EXPECT_EQ(parse_header(header(int64_t(8) << 20, pieces8, wire::kBodyCrcPresent)).pieces, 8);
  for (int64_t count : {int64_t(0), int64_t(1), int64_t(257), int64_t(-3)}) {
    const int64_t layout = wire::kLayoutPieces | (count << wire::kPieceCountShift);
    EXPECT_THROW(parse_header(header(int64_t(8) << 20, layout, wire::kBodyCrcPresent)), std::runtime_error) << count;
  }
  EXPECT_THROW(parse_header(header(100, pieces8, wire::kBodyCrcPresent)), std::runtime_error);  // empty pieces
  EXPECT_THROW(parse_header(header(int64_t(8) << 20, pieces8, 0)), std::runtime_error);         // no checksum
  EXPECT_THROW(parse_header(header(int64_t(8) << 20, 3, 0)), std::runtime_error);               // unknown layout
}

TEST(Transport, EmulatedLinkNeverDeliversEarly) {
  SKIP_WITHOUT_TRANSPORT();
  auto runs = run_ranks("link", 2, {"link"}, 60);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(exit_code(runs[r].status), 0) << logs_of(runs);
  EXPECT_NE(runs[1].log.find("OK link"), std::string::npos) << logs_of(runs);
  std::cout << runs[1].log;
}

TEST(Transport, ConnectFailsWhenARankNeverArrives) {
  if (!Transport::available("gloo")) GTEST_SKIP() << "built without c10d's Gloo backend";
  DistEnv env;
  env.rank = 0;
  env.world_size = 2;
  env.master_port = find_free_port();
  TransportOptions o;
  o.timeout_s = 2;
  try {
    Transport::connect(env, o);
    FAIL() << "connected without rank 1";
  } catch (const TransportError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 0 of 2: rendezvous of the gloo process group failed within 2 s"), std::string::npos)
        << what;
    EXPECT_NE(what.find("rank 1 did not arrive"), std::string::npos) << what;
    EXPECT_EQ(e.peer(), 1);
  }
}

#define SKIP_WITHOUT_NCCL_PAIR()                                                                                \
  do {                                                                                                          \
    if (!Transport::available("nccl"))                                                                          \
      GTEST_SKIP() << "tapeline was built without c10d's NCCL backend (a CUDA libtorch and nccl.h are needed)"; \
    const int devices = at::detail::getCUDAHooks().getNumGPUs();                                                \
    if (devices < 2) GTEST_SKIP() << "needs 2 CUDA devices, found " << devices;                                 \
    if (helper_path().empty()) GTEST_SKIP() << "parallel_dist_helper was not built";                            \
  } while (0)

// NCCL (label gpu): the same exchange, all-reduce, broadcast and gather as on Gloo, two ranks
// on devices 0 and 1. Skipped with the reason where NCCL or two devices are missing.
TEST(TransportGpu, NcclRanksExchangePayloadsExactly) {
  SKIP_WITHOUT_NCCL_PAIR();
  expect_exchanged(run_ranks("nccl_exchange", 2, {"exchange", "40"}, 180, {{"TL_BACKEND", "nccl"}}));
}

TEST(TransportGpu, NcclKilledPeerIsNamedByTheSurvivor) {
  SKIP_WITHOUT_NCCL_PAIR();
  auto runs = run_ranks("nccl_die1", 2, {"die", "1"}, 60, {{"TL_TIMEOUT_S", "5"}, {"TL_BACKEND", "nccl"}});
  EXPECT_NE(runs[0].log.find("CAUGHT peer=1"), std::string::npos) << logs_of(runs);
}

TEST(RankDevice, RankModDeviceCount) {
  EXPECT_EQ(cuda_device_for(0, 1), 0);
  EXPECT_EQ(cuda_device_for(3, 4), 3);
  EXPECT_EQ(cuda_device_for(5, 4), 1);
  EXPECT_EQ(cuda_device_for(7, 2), 1);
  try {
    cuda_device_for(2, 0);
    FAIL() << "no error without devices";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("local rank 2: run.device = cuda but no CUDA device is visible"),
              std::string::npos)
        << e.what();
  }
}

// Note [posted capacity]: both ends derive the receiver's room from the sizes alone.
TEST(Transport, PostedCapacityGrowsToAMessageAndShrinksAfterSixteenSmallOnes) {
  wire::PostedCapacity c;
  EXPECT_EQ(c.bytes, wire::kInlineMax);
  EXPECT_FALSE(c.separate(wire::kInlineMax));
  EXPECT_TRUE(c.separate(wire::kInlineMax + 1));
  c.after(1000);
  EXPECT_EQ(c.bytes, wire::kInlineMax);
  c.after(int64_t(64) << 20);  // a power of two stays itself
  EXPECT_EQ(c.bytes, int64_t(64) << 20);
  c.after((int64_t(64) << 20) + 1);  // rounded up to 1/8 of 64 MiB
  EXPECT_EQ(c.bytes, int64_t(72) << 20);
  c.after(wire::kPostedMax + 1);  // beyond the largest room: separate, and no growth
  EXPECT_EQ(c.bytes, int64_t(72) << 20);
  for (int i = 0; i < 16; ++i) c.after(1000);  // its window held a 256 MiB body: no change
  EXPECT_EQ(c.bytes, int64_t(72) << 20);
  for (int i = 0; i < 16; ++i) c.after(i == 3 ? (int64_t(1) << 20) : 10);  // all <= 1/4: shrinks to the largest
  EXPECT_EQ(c.bytes, int64_t(1) << 20);
  for (int i = 0; i < 16; ++i) c.after(10);
  EXPECT_EQ(c.bytes, wire::kInlineMax);  // never below the start
  wire::PostedCapacity nccl(0);  // exact sizes: every body separate
  nccl.after(int64_t(1) << 20);
  EXPECT_EQ(nccl.bytes, 0);
  EXPECT_TRUE(nccl.separate(1));
  EXPECT_FALSE(nccl.separate(0));
}

TEST(Transport, UnknownBackendIsAnError) {
  DistEnv env;
  TransportOptions o;
  o.backend = "mpi";
  EXPECT_THROW(Transport::connect(env, o), c10::Error);
  EXPECT_FALSE(Transport::available("mpi"));
}

// torchrun (scripts/torchrun: the one of the libtorch the scripts build against): 2 ranks of the
// helper rendezvous through torchrun's agent store.
TEST(Transport, TorchrunLaunchesRanksThatRendezvous) {
  SKIP_WITHOUT_TRANSPORT();
  // torchrun's agent hosts the TCPStore: its torch must speak the store protocol of the libtorch
  // tapeline is built against (Debian's torchrun 1.13 resets a 2.x client's connection).
  const Torchrun torchrun = torchrun_for(compat::torch_version());
  if (!torchrun.why_not.empty()) GTEST_SKIP() << torchrun.why_not;
  ProcessGroupGuard guard;
  const std::string log = temp_log("torchrun");
  // Underscore spellings: torch 1.13's torchrun knows only those, 2.x accepts both.
  std::vector<std::string> args = {
      "--no_python", "--nproc_per_node", "2", "--master_port", std::to_string(find_free_port()),
      helper_path(), "exchange",         "10"};
  guard.pids.push_back(spawn(torchrun.path, args, {}, log));
  const int st = wait_or_kill(guard.pids.back(), 180);
  const std::string out = read_file(log);
  std::remove(log.c_str());
  EXPECT_EQ(exit_code(st), 0) << out;
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(out.find("OK exchange rank " + std::to_string(r) + " agent_store=1"), std::string::npos) << out;
}

}  // namespace
}  // namespace tl::ranks
