#pragma once
// Pipeline schedules as data: for every rank (one stage per rank), the ordered list of actions it
// executes in one training step -- compute (forward / backward of one micro-batch) and the
// point-to-point messages between adjacent stages. An executor (in-process loop or threads, or the
// multi-process runtime) just walks its rank's list; a schedule can be printed, checked and
// timed without running a model. The shape follows torch.distributed.pipelining's schedules.
//
// Note [blocking send/recv and the order of messages on a link]. The multi-process runtime uses
// plain blocking send/recv (Gloo's batched isend/irecv hangs). On Gloo a send is a rendezvous:
// the bytes move only once the peer has posted the matching recv, so `send` blocks until the peer
// reaches it. Two rules make such a program deadlock-free:
//   1. On every link (s, s+1) both ends perform their halves of the link's messages in the same
//      order: if stage s's list sends activation 3 and then receives gradient 0, stage s+1's list
//      receives activation 3 before it sends gradient 0. (If not, both can sit in a send, each
//      waiting for the other's recv.)
//   2. No cycle of waits across links. Every list here has the shape "warm-up forwards, then
//      pairs, then cool-down backwards", and the simulator in tests/parallel/schedule_test.cpp runs
//      every list of 1..8 stages x 1..16 micro-batches with rendezvous semantics (and with a
//      per-rank FIFO send thread) and finds no deadlock and no mismatched message.
// 1F1B's textbook steady state on stage s, "RecvAct(f) F(f) SendAct(f) RecvGrad(b) B(b) SendGrad(b)",
// breaks rule 1: on link (s-1, s) stage s sends gradient b (end of its step) before it receives
// activation f+1 (start of its next step), while stage s-1 sends activation f+1 (right after its
// forward) before it receives gradient b. Both sit in a send. Here the receive of the next
// activation moves before the gradient send, so that on every link the activation of the steady
// step goes first, then the gradient:
//     warm-up:   RecvAct(f) F(f) SendAct(f)            (f < w = min(S - s - 1, M)), then RecvAct(w)
//     steady:    F(f) SendAct(f) RecvGrad(b) B(b) RecvAct(f + 1) SendGrad(b)
//     cool-down: RecvGrad(b) B(b) SendGrad(b)
// (no RecvAct on the first stage, no SendAct / RecvGrad on the last). Waiting for activation f+1
// before sending gradient b costs nothing: stage s-1 sent it right after its forward, before it
// started waiting for gradient b. With a communication thread (sends queued and executed in list
// order) the same lists are safe too, and compute never blocks on a send. (Receiving gradient b
// *before* sending activation f would also satisfy rule 1 but delays every activation by a round
// trip on the link: on a 100 ms link that is 200 ms per micro-batch.)
//
// Note [epilogue-only backward compression (Optimus-CC)]. Optimus-CC compresses only the
// gradient sends on the critical path of 1F1B: those of the cool-down phase (the receiver is
// waiting for them, nothing overlaps them) and the last send of the steady state (it opens the
// cool-down of the stage before). Steady-state sends before that overlap the receiver's forward
// work and go uncompressed. one_f_one_b_schedule marks them `compress_backward = false`; every
// other SendGrad (all of GPipe's: its backward phase is one long drain) keeps the default `true`.
// The flag only matters when a boundary is configured epilogue-only; otherwise executors ignore it.

#include <string>
#include <vector>

namespace tl {

enum class ActionType { Forward, Backward, SendActivation, RecvActivation, SendGrad, RecvGrad };

/// One step of one rank's list. `stage` is the stage that executes it (== the rank); the peer of a
/// message is stage + 1 (SendActivation, RecvGrad) or stage - 1 (RecvActivation, SendGrad).
struct Action {
  ActionType type;
  int stage;
  int micro_batch;
  /// Optimus-CC epilogue-only: false for backward sends off the critical path (SendGrad only).
  bool compress_backward = true;

  bool operator==(const Action& o) const {
    return type == o.type && stage == o.stage && micro_batch == o.micro_batch &&
           compress_backward == o.compress_backward;
  }
  bool operator!=(const Action& o) const { return !(*this == o); }
};
using RankSchedule = std::vector<Action>;

bool is_compute(ActionType t);
bool is_send(ActionType t);
bool is_recv(ActionType t);
/// The stage on the other end of a message action; -1 for compute.
int peer_stage(const Action& a);

/// GPipe: every forward (micro-batch 0..M-1), then every backward (0..M-1).
std::vector<RankSchedule> gpipe_schedule(int stages, int micro_batches);
/// 1F1B: stage s runs min(S - s - 1, M) warm-up forwards, then alternates one forward and one
/// backward, then the remaining backwards (cool-down). Messages placed per Note [blocking
/// send/recv and the order of messages on a link]; epilogue-only flags per Note [epilogue-only].
std::vector<RankSchedule> one_f_one_b_schedule(int stages, int micro_batches);
/// By name: "gpipe" or "1f1b". Error names the unknown name and the accepted ones.
std::vector<RankSchedule> make_schedule(const std::string& name, int stages, int micro_batches);

/// Structural checks of a hand-made or generated schedule: list r holds only stage r's actions;
/// every micro-batch is forwarded and backwarded once; a stage receives its input before the
/// forward and sends it after; gradients likewise. Errors name the rank, the action and the rule.
void validate_schedule(const std::vector<RankSchedule>& schedule, int micro_batches);

/// "F3", "B0", "RA3" (recv activation), "SA3", "RG0", "SG0"; a SendGrad with
/// compress_backward = false prints as "SG0~".
std::string action_token(const Action& a);
/// One row per rank: "rank 0: F0 F1 F2 F3 B0 ...". With `with_comm` false only compute actions are
/// listed (the classic picture); with true every action.
std::string format_schedule(const std::vector<RankSchedule>& schedule, bool with_comm = false);

// ---- timing: an event simulation of the lists ---------------------------------------------------

/// How sends behave in the simulation.
enum class SendMode {
  Eager,       // a send never blocks; the message is available to the receiver after its cost
  Rendezvous,  // a send blocks until the receiver is at the matching recv (Gloo's blocking send)
  SendQueue,   // sends go to a per-rank FIFO thread, each a rendezvous; compute never blocks on one
};

/// Durations in seconds (any unit works if used consistently). Per stage: forward and backward of
/// one micro-batch. Message costs are per message (0 = free links).
struct SimCosts {
  std::vector<double> forward_s;
  std::vector<double> backward_s;
  double activation_s = 0.0;
  double grad_s = 0.0;
  /// The same forward and backward time on every stage.
  static SimCosts uniform(int stages, double forward_s, double backward_s);
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

/// The theoretical step time of GPipe or 1F1B with uniform stages and free links:
/// (M + S - 1) * (tf + tb), i.e. M micro-batches plus the S - 1 slots of the bubble.
double ideal_step_time(int stages, int micro_batches, double forward_s, double backward_s);

/// The simulated timeline as text, one row per rank, one column per `slot_s` of time: forward
/// micro-batch 3 prints "F3" in each slot it occupies, idle slots print "..". For docs and logs.
std::string format_timeline(const SimResult& result, double slot_s);

}  // namespace tl
