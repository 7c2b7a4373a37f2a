// The compute schedules of the registry (parallel/schedule_generators.h): per rank, the order of
// its forwards and backwards.
#include "parallel/schedule_generators.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace tl {

namespace {

Action compute(ActionType t, int stage, int mb) { return Action{t, stage, mb}; }

}  // namespace

// GPipe and 1F1B with one stage per rank (stage = rank).
std::vector<RankSchedule> gpipe_compute(const StageLayout& layout, int M) {
  const int S = layout.ranks;
  std::vector<RankSchedule> out(S);
  for (int s = 0; s < S; ++s) {
    for (int mb = 0; mb < M; ++mb) out[s].push_back(compute(ActionType::Forward, s, mb));
    for (int mb = 0; mb < M; ++mb) out[s].push_back(compute(ActionType::Backward, s, mb));
  }
  return out;
}

std::vector<RankSchedule> one_f_one_b_compute(const StageLayout& layout, int M) {
  const int S = layout.ranks;
  std::vector<RankSchedule> out(S);
  for (int s = 0; s < S; ++s) {
    const int warmup = std::min(S - s - 1, M);
    for (int f = 0; f < warmup; ++f) out[s].push_back(compute(ActionType::Forward, s, f));
    for (int f = warmup, b = 0; f < M; ++f, ++b) {
      out[s].push_back(compute(ActionType::Forward, s, f));
      out[s].push_back(compute(ActionType::Backward, s, b));
    }
    for (int b = M - warmup; b < M; ++b) out[s].push_back(compute(ActionType::Backward, s, b));
  }
  return out;
}

// Note [ZB-H1]. Qi et al.'s handcrafted zero-bubble schedule with 1F1B's memory. Rank r runs 1F1B's
// compute list with each backward B_k split into I_k (its input's gradient, sent at once: the
// previous rank waits for it) and W_{k-r} (the weight gradients of micro-batch k - r) right after
// it; the last r W's follow the last I. Rank r thus lags its W's by r micro-batches: the last rank,
// which 1F1B keeps busiest at the end, leaves P - 1 of them for its cool-down, where 1F1B idles.
// With uniform stages and free links the step is M (F + I + W) + (P - 1)(F + I - W) for M >= P,
// against 1F1B's (M + P - 1)(F + I + W): with I = W the bubble is a third of 1F1B's. The most
// micro-batches a rank holds (forward run, W not yet) is P, on every rank: 1F1B's peak (rank 0).
std::vector<RankSchedule> zbh1_compute(const StageLayout& layout, int M) {
  const int S = layout.ranks;
  std::vector<RankSchedule> out = one_f_one_b_compute(layout, M);
  for (int s = 0; s < S; ++s) {
    RankSchedule split;
    int w = 0;  // the next W of this rank
    for (const Action& a : out[s]) {
      if (a.type != ActionType::Backward) {
        split.push_back(a);
        continue;
      }
      split.push_back(compute(ActionType::BackwardInput, s, a.micro_batch));
      if (a.micro_batch - s >= 0) split.push_back(compute(ActionType::BackwardWeight, s, w++));
    }
    while (w < M) split.push_back(compute(ActionType::BackwardWeight, s, w++));
    out[s] = std::move(split);
  }
  return out;
}

// Note [ZB-V]. Qi et al.'s zero-bubble schedule on a V placement: rank r holds chunk 0 = stage r
// and chunk 1 = stage 2P - 1 - r, so a micro-batch runs down the ranks on chunk 0 and back up on
// chunk 1, and rank 0 computes the loss. Every backward is split (I, then W). Rank r's list, with
// F0/F1 a forward of chunk 0/1 and counts per chunk (the order torch.distributed.pipelining's
// ScheduleZBVZeroBubble uses):
//   warm-up: 2 (P - r) - 1 times F0; r times F1 F0; P - r times F1 I1 W1;
//   steady:  while forwards are left: F0 (while any), I0 W0, F1 I1 W1;
//   cool-down: r times I0 I1; P - r times I0 W0; then the W1's left, then the W0's left.
// It is built for max(M, 2P - 1) micro-batches and the actions of micro-batches >= M are dropped
// (the order of the others stands). Each rank then holds at most 2P chunk-activations at once, as
// 1F1B's rank 0 holds P whole-stage ones (a chunk is half a stage). With every chunk taking
// F = I = W = 1 and sends that do not wait for their receiver (SendMode::Eager), the simulator
// finds the step 6M + (P - 1) for M >= 2P - 1: the only idle time is the start-up, one chunk
// forward per rank down the V. The same model cut for ZB-H1 (two chunks a stage) takes
// 6M + 2 (P - 1), 1F1B 6 (M + P - 1). With one send in flight per rank (SendMode::SendQueue)
// ZB-V's lead over ZB-H1 is gone: the runtime keeps several in flight (Note [communication
// thread]). As ZB-H1, it needs the send thread (Note [ZB-H1 needs the send thread]), and its two
// directions of a link carry both kinds of message (Note [receive in the order sent]).
std::vector<RankSchedule> zbv_compute(const StageLayout& layout, int M) {
  const int P = layout.ranks;
  TORCH_CHECK(layout.placement == Placement::V && layout.virtual_stages == 2,
              "zbv_compute: a V layout of two stages per rank, got ", layout.virtual_stages,
              " (a bug: the registry "
              "checks it)");
  const int n = std::max(M, 2 * P - 1);
  std::vector<RankSchedule> out(P);
  for (int r = 0; r < P; ++r) {
    const int c0 = r, c1 = 2 * P - 1 - r;
    int f0 = 0, f1 = 0, i0 = 0, i1 = 0, w0 = 0, w1 = 0;
    RankSchedule l;
    auto add = [&](ActionType t, int stage, int& count) { l.push_back(compute(t, stage, count++)); };
    for (int k = 0; k < 2 * (P - r) - 1; ++k) add(ActionType::Forward, c0, f0);
    for (int k = 0; k < r; ++k) add(ActionType::Forward, c1, f1), add(ActionType::Forward, c0, f0);
    for (int k = 0; k < P - r; ++k)
      add(ActionType::Forward, c1, f1), add(ActionType::BackwardInput, c1, i1), add(ActionType::BackwardWeight, c1, w1);
    while (f1 < f0 || f0 < n) {
      if (f0 < n) add(ActionType::Forward, c0, f0);
      add(ActionType::BackwardInput, c0, i0), add(ActionType::BackwardWeight, c0, w0);
      add(ActionType::Forward, c1, f1), add(ActionType::BackwardInput, c1, i1), add(ActionType::BackwardWeight, c1, w1);
    }
    for (int k = 0; k < r; ++k) add(ActionType::BackwardInput, c0, i0), add(ActionType::BackwardInput, c1, i1);
    for (int k = 0; k < P - r; ++k) add(ActionType::BackwardInput, c0, i0), add(ActionType::BackwardWeight, c0, w0);
    while (w1 < i1) add(ActionType::BackwardWeight, c1, w1);
    while (w0 < i0) add(ActionType::BackwardWeight, c0, w0);
    TORCH_CHECK(f0 == n && i0 == n && w0 == n && f1 == n && i1 == n && w1 == n, "zbv schedule: rank ", r, " built ", f0,
                "/", i0, "/", w0, " and ", f1, "/", i1, "/", w1, " F/I/W of its chunks for ", n,
                " micro-batches (a bug)");
    for (const Action& a : l)
      if (a.micro_batch < M) out[r].push_back(a);
  }
  return out;
}

// Megatron's interleaved 1F1B (schedules.py, forward_backward_pipelining_with_interleaving): the
// k-th forward of a rank is micro-batch (k / (P v)) P + k % P on its chunk (k / P) % v; the k-th
// backward the same micro-batch on chunk v - 1 - (k / P) % v. Warm-up: 2 (P - r - 1) + (v - 1) P
// forwards (all of them when that reaches M v), then one forward and one backward, then the rest.
// Interleaving one stage per rank is 1F1B.
std::vector<RankSchedule> interleaved_compute(const StageLayout& layout, int M) {
  const int P = layout.ranks, v = layout.virtual_stages;
  if (v == 1) return one_f_one_b_compute(layout, M);
  TORCH_CHECK(M % P == 0, "interleaved schedule: micro_batches = ", M, " must be a multiple of the ", P,
              " pipeline ranks (micro-batches go round the ranks in groups of ", P, ")");
  const int total = M * v;
  std::vector<RankSchedule> out(P);
  for (int r = 0; r < P; ++r) {
    auto stage_of = [&](int k, bool forward) {
      const int chunk = (k / P) % v;
      return (forward ? chunk : v - 1 - chunk) * P + r;
    };
    auto mb_of = [&](int k) { return (k / (P * v)) * P + k % P; };
    const int warmup = std::min(total, 2 * (P - r - 1) + (v - 1) * P);
    for (int k = 0; k < warmup; ++k) out[r].push_back(compute(ActionType::Forward, stage_of(k, true), mb_of(k)));
    for (int f = warmup, b = 0; f < total; ++f, ++b) {
      out[r].push_back(compute(ActionType::Forward, stage_of(f, true), mb_of(f)));
      out[r].push_back(compute(ActionType::Backward, stage_of(b, false), mb_of(b)));
    }
    for (int b = total - warmup; b < total; ++b)
      out[r].push_back(compute(ActionType::Backward, stage_of(b, false), mb_of(b)));
  }
  return out;
}

}  // namespace tl
