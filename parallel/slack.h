#pragma once
// The critical path of a step: the slack of each gradient send on the step's dependency graph, and
// the costs of compute actions that it and the event simulator (parallel/simulate.h) read.

#include "parallel/schedule.h"

namespace tl {

/// What compute and messages cost. Durations in seconds (any unit works if used consistently). Per
/// stage (indexed by stage, not rank): forward and backward of one micro-batch. Message costs are
/// per message (0 = free links).
struct SimCosts {
  std::vector<double> forward_s;
  std::vector<double> backward_s;
  /// Per stage: the part of backward_s that is weight gradients (a split schedule runs it as W and
  /// the rest as I); empty: half of backward_s.
  std::vector<double> weight_s;
  double activation_s = 0.0;
  double grad_s = 0.0;
  /// The same forward and backward time on every stage.
  static SimCosts uniform(int stages, double forward_s, double backward_s);
  /// What a compute action costs on its stage.
  double of(const Action& a) const;
};

/// Note [slack of a gradient send]. Optimus-CC compresses only the gradient sends on the critical
/// path, and decides which ones those are for 1F1B by phase (Note [epilogue-only]). For any
/// schedule the question has one answer on the step's dependency graph: nodes are the compute
/// actions, with each action's cost; edges are each rank's order and the data between stages
/// (activation of micro-batch mb from stage s to s + 1, its gradient from s + 1 back to s). The
/// slack of a gradient send is how long it may be late without making the step longer: the latest
/// start of the backward that consumes it, minus the end of the backward that produced it. Zero
/// means it is on the critical path. Links are free here, so this is the slack the schedule itself
/// gives. Lowering's mark_critical pass (parallel/lowering.h) sets Action::critical from it (uniform
/// stages: F = 1, B = 2, I = W = 1) beside Optimus-CC's compress_backward; a boundary's
/// EpilogueRule picks one; `tapeline schedule --slack` prints both.
struct SendSlack {
  int rank;     // the sending rank
  Action send;  // its SendGrad action
  double slack_s;
};
/// Every gradient send of a lowered schedule with its slack under `costs`, in list order per rank.
std::vector<SendSlack> gradient_send_slack(const std::vector<RankSchedule>& schedule, const SimCosts& costs);

}  // namespace tl
