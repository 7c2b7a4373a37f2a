#pragma once
// Timing lowered lists without a model: an event simulation of every rank's list under three send
// semantics, which finds deadlocks and mismatched messages, and the textbook step times it is
// checked against.

#include "parallel/slack.h"

namespace tl {

/// How sends behave in the simulation.
enum class SendMode {
  Eager,       // a send never blocks; the message is available to the receiver after its cost
  Rendezvous,  // a send blocks until the receiver is at the matching recv (Gloo's blocking send)
  SendQueue,   // sends go to a per-rank FIFO thread, each a rendezvous; compute never blocks on one
};

struct ComputeSpan {
  Action action;
  double start_s;
  double end_s;
};

struct SimResult {
  double step_s = 0.0;                          // when the last rank finishes its list
  std::vector<double> compute_s;                // per rank: time spent computing
  std::vector<double> finish_s;                 // per rank: when its list ends
  std::vector<std::vector<ComputeSpan>> spans;  // per rank: every compute action's interval
  /// Idle fraction of the ranks during the step: 1 - sum(compute) / (ranks * step).
  double bubble() const;
};

/// Runs every rank's list with the given costs (zero-cost messages unless set). Errors, naming each
/// rank's blocked action, if the lists deadlock under `mode`, or if a recv would get a different
/// message than it expects (rule 1 of the Note broken).
SimResult simulate_schedule(const std::vector<RankSchedule>& schedule, const SimCosts& costs,
                            SendMode mode = SendMode::Eager);

/// The textbook step time with uniform stages and free links: (M v + P - 1) (tf + tb) for P
/// pipeline ranks holding v stages each (tf, tb: one stage's forward and backward of one
/// micro-batch), i.e. M v slots of work per rank plus the P - 1 slots of the bubble. GPipe and
/// 1F1B: v = 1; interleaved 1F1B shrinks the bubble v times relative to the work.
double ideal_step_time(int ranks, int micro_batches, double forward_s, double backward_s, int virtual_stages = 1);

/// ZB-H1's textbook step (Note [ZB-H1] in parallel/schedule_generators.cpp), uniform stages, free
/// links, M >= P:
/// M (tf + ti + tw) + (P - 1)(tf + ti - tw), where ti + tw is one stage's whole backward.
double ideal_zbh1_step_time(int ranks, int micro_batches, double forward_s, double input_s, double weight_s);

/// The simulated timeline as text, one row per rank, one column per `slot_s` of time: forward
/// micro-batch 3 prints "F3" in each slot it occupies, idle slots print "..". For docs and logs.
std::string format_timeline(const SimResult& result, double slot_s);

}  // namespace tl
