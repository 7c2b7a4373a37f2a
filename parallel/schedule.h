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
// Note [interleaving needs the send thread]. With several stages per rank (interleaved 1F1B) the
// messages go round the ring (the last rank's stage sends to rank 0's next stage), and rule 1
// cannot hold with purely blocking sends: with P = 2 ranks, rank 1 sends stage 1's activation to
// rank 0 (stage 2) while rank 0 sends the next micro-batch to rank 1 (stage 1), each waiting for
// the other's receive. With sends queued on a communication thread (SendMode::SendQueue), which
// is how the multi-process runtime sends, every interleaved list runs; tests/parallel/
// schedule_test.cpp checks up to 4 ranks x 3 virtual stages x 16 micro-batches. (Megatron batches
// the two transfers into one P2P call for the same reason.)
//
// Note [ZB-H1 needs the send thread]. Lowering moves the next forward's activation receive before
// a gradient send only when that forward comes right after the backward. In ZB-H1 a W often sits
// between them (rank r: I_k, W_{k-r}, F_{k+...}); moving the receive there would make the rank wait
// for the activation before its W, and the W would then delay the gradient its neighbour waits
// for (a slot per rank per step on uniform stages, the bubble ZB-H1 exists to remove). So the
// receive stays after the W, the gradient goes first on that link while the neighbour sends the
// activation first, and with purely blocking sends both sit in a send. With the runtime's send
// thread (SendMode::SendQueue) every ZB-H1 list of 1..8 ranks x 1..16 micro-batches runs
// (tests/parallel/schedule_test.cpp), as Note [interleaving needs the send thread] says of
// interleaved 1F1B.
//
// Note [epilogue-only backward compression (Optimus-CC)]. Optimus-CC compresses only the
// gradient sends on the critical path of 1F1B: those of the cool-down phase (the receiver is
// waiting for them, nothing overlaps them) and the last send of the steady state (it opens the
// cool-down of the stage before). Steady-state sends before that overlap the receiver's forward
// work and go uncompressed. lower() marks a gradient send `compress_backward = false` when its rank
// still has a forward to run after it (for 1F1B: every steady-state send but the last); every
// other SendGrad (all of GPipe's: its backward phase is one long drain) keeps `true`.
// The flag only matters when a boundary is configured epilogue-only; otherwise executors ignore it.

#include <string>
#include <vector>

namespace tl {

/// Backward is a stage's whole backward. Zero-bubble schedules split it (Note [split backward] in
/// autograd/engine.cpp): BackwardInput computes the gradient of the stage's input (and sends it, as
/// Backward does), BackwardWeight later computes the weight gradients (no message).
enum class ActionType { Forward, Backward, SendActivation, RecvActivation, SendGrad, RecvGrad, BackwardInput, BackwardWeight };

/// One step of one rank's list. `stage` is the stage the action belongs to (a rank may hold
/// several: StageLayout); the stage on the other end of a message is stage + 1 (SendActivation,
/// RecvGrad) or stage - 1 (RecvActivation, SendGrad), and `peer` is that stage's rank.
struct Action {
  ActionType type;
  int stage;
  int micro_batch;
  /// Optimus-CC epilogue-only: false for backward sends off the critical path (SendGrad only;
  /// set by lower(), Note [epilogue-only backward compression]).
  bool compress_backward = true;
  /// Messages: the rank on the other end (set by lower()); -1 for compute actions.
  int peer = -1;
  /// The critical-path question answered by the step's dependency graph: zero slack (SendGrad
  /// only; set by lower() with uniform stages, Note [slack of a gradient send]).
  bool critical = true;

  bool operator==(const Action& o) const {
    return type == o.type && stage == o.stage && micro_batch == o.micro_batch &&
           compress_backward == o.compress_backward && critical == o.critical && peer == o.peer;
  }
  bool operator!=(const Action& o) const { return !(*this == o); }
};
using RankSchedule = std::vector<Action>;

bool is_compute(ActionType t);
bool is_send(ActionType t);
bool is_recv(ActionType t);
/// The stage on the other end of a message action; -1 for compute.
int peer_stage(const Action& a);

/// How stages are placed on the ranks. RoundRobin (Megatron's layout): stage s on rank s % P, so
/// rank r holds r, r + P, r + 2P, ... V (ZB-V's, two stages per rank): rank r holds stages r and
/// 2P - 1 - r, so the pipeline runs down the ranks and back up; rank 0 holds the first and the
/// last stage, rank P - 1 the two middle ones (handed over in memory).
enum class Placement { RoundRobin, V };

/// Where the stages of a pipeline live: `ranks` pipeline ranks, each holding `virtual_stages`
/// stages, placed by `placement`. With one stage per rank, stage = rank.
struct StageLayout {
  int ranks = 1;
  int virtual_stages = 1;
  Placement placement = Placement::RoundRobin;

  int stages() const { return ranks * virtual_stages; }
  int rank_of(int stage) const {
    return placement == Placement::V && stage >= ranks ? 2 * ranks - 1 - stage : stage % ranks;
  }
  /// The stages of `rank`, in model order (its chunks 0..v-1).
  std::vector<int> stages_of(int rank) const;
  /// `stages` stages over stages / virtual_stages ranks; an error names both numbers when
  /// virtual_stages does not divide stages, or when a V placement has other than 2 per rank.
  static StageLayout of(int stages, int virtual_stages = 1, Placement placement = Placement::RoundRobin);
};

/// The placement a schedule runs on: V for "zbv", round robin for the others.
Placement placement_of(const std::string& schedule);

// ---- compute schedules and their lowering ---------------------------------------------------
//
// A schedule is built in two passes, as torch.distributed.pipelining builds its own:
//   1. the *compute* schedule: per rank, the order of its Forward and Backward actions;
//   2. lower(): inserts the messages and decides what each send does.
//
// Note [lowering]. A message crosses between ranks wherever a stage's neighbour lives on another
// rank (on the same rank the payload is handed over in memory: no action). lower() places, for
// each compute action in a rank's list, the receives of its inputs right before it and the sends
// of its outputs right after it, with one exception that keeps the blocking-send rule 1 below:
// when a compute action sends a gradient to rank p and the rank's next compute action needs an
// activation from p, that receive moves before the gradient send (on every link the activation
// of a steady step goes first, then the gradient). The flags of Note [epilogue-only] are decided
// here too, from the list: a gradient send is off the critical path when its rank still has a
// forward to run after it (the receiver then has forward work to overlap it with).

/// Compute-only lists (no messages) of the named schedule: "gpipe", "1f1b", "zbh1" (one stage per
/// rank), "interleaved" (Megatron's interleaved 1F1B over layout.virtual_stages stages per rank;
/// micro_batches must be a multiple of layout.ranks when v > 1) or "zbv" (zero-bubble ZB-V: two
/// stages per rank in a V placement). Errors name what is accepted.
std::vector<RankSchedule> compute_schedule(const std::string& name, const StageLayout& layout, int micro_batches);
/// Inserts sends and receives and the epilogue-only flags (Note [lowering]).
std::vector<RankSchedule> lower(const std::vector<RankSchedule>& compute, const StageLayout& layout);
/// compute_schedule + lower.
std::vector<RankSchedule> make_schedule(const std::string& name, const StageLayout& layout, int micro_batches);
/// One stage per rank: make_schedule(name, StageLayout::of(stages), micro_batches).
std::vector<RankSchedule> make_schedule(const std::string& name, int stages, int micro_batches);
/// GPipe: every forward (micro-batch 0..M-1), then every backward (0..M-1).
std::vector<RankSchedule> gpipe_schedule(int stages, int micro_batches);
/// 1F1B: stage s runs min(S - s - 1, M) warm-up forwards, then alternates one forward and one
/// backward, then the remaining backwards (cool-down). Messages placed per Note [blocking
/// send/recv and the order of messages on a link]; epilogue-only flags per Note [epilogue-only].
std::vector<RankSchedule> one_f_one_b_schedule(int stages, int micro_batches);
/// Interleaved 1F1B (Megatron's virtual pipeline): rank r runs its forwards in rounds of P
/// micro-batches, chunk 0 then chunk 1 ... (backwards with the chunks reversed), after
/// 2 (P - r - 1) + (v - 1) P warm-up forwards.
std::vector<RankSchedule> interleaved_schedule(int ranks, int virtual_stages, int micro_batches);
/// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): 1F1B with each backward split
/// into I (input gradient, sent at once) and W (weight gradients), the W's placed where 1F1B would
/// idle. Note [ZB-H1].
std::vector<RankSchedule> zbh1_schedule(int stages, int micro_batches);
/// ZB-V (same paper): P ranks holding 2 stages each in a V placement (rank r: stages r and
/// 2P - 1 - r), every backward split. Note [ZB-V].
std::vector<RankSchedule> zbv_schedule(int ranks, int micro_batches);
/// Forward-only lists of one micro-batch (evaluation), lowered.
std::vector<RankSchedule> forward_only_schedule(const StageLayout& layout);
/// The schedules make_schedule knows, for messages: "gpipe, 1f1b, interleaved, zbh1, zbv".
const char* known_schedules();

/// Structural checks of a hand-made or generated schedule: list r holds only the stages of rank
/// r; every micro-batch is forwarded and backwarded once on every stage; a stage receives its
/// input before the forward and sends it after; gradients likewise; messages name the right
/// peer rank. Errors name the rank, the action and the rule. (`layout` defaults to one stage
/// per rank.)
void validate_schedule(const std::vector<RankSchedule>& schedule, int micro_batches);
void validate_schedule(const std::vector<RankSchedule>& schedule, int micro_batches, const StageLayout& layout);

/// "F3", "B0", "I0" (input gradient), "W0" (weight gradients), "RA3" (recv activation), "SA3",
/// "RG0", "SG0"; a SendGrad with
/// compress_backward = false prints as "SG0~". With `with_stage` the stage follows: "F3s5".
std::string action_token(const Action& a, bool with_stage = false);
/// One row per rank: "rank 0: F0 F1 F2 F3 B0 ...". With `with_comm` false only compute actions are
/// listed (the classic picture); with true every action. Stages are named when a rank holds
/// several.
std::string format_schedule(const std::vector<RankSchedule>& schedule, bool with_comm = false);

// ---- timing: an event simulation of the lists ---------------------------------------------------

/// How sends behave in the simulation.
enum class SendMode {
  Eager,       // a send never blocks; the message is available to the receiver after its cost
  Rendezvous,  // a send blocks until the receiver is at the matching recv (Gloo's blocking send)
  SendQueue,   // sends go to a per-rank FIFO thread, each a rendezvous; compute never blocks on one
};

/// Durations in seconds (any unit works if used consistently). Per stage (indexed by stage, not
/// rank): forward and backward of one micro-batch. Message costs are per message (0 = free links).
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

/// Note [slack of a gradient send]. Optimus-CC compresses only the gradient sends on the critical
/// path, and decides which ones those are for 1F1B by phase (Note [epilogue-only]). For any
/// schedule the question has one answer on the step's dependency graph: nodes are the compute
/// actions, with each action's cost; edges are each rank's order and the data between stages
/// (activation of micro-batch mb from stage s to s + 1, its gradient from s + 1 back to s). The
/// slack of a gradient send is how long it may be late without making the step longer: the latest
/// start of the backward that consumes it, minus the end of the backward that produced it. Zero
/// means it is on the critical path. Links are free here, so this is the slack the schedule itself
/// gives. lower() sets Action::critical from it (uniform stages: F = 1, B = 2, I = W = 1) beside
/// Optimus-CC's compress_backward; a boundary's EpilogueRule picks one; `tapeline schedule --slack`
/// prints both.
struct SendSlack {
  int rank;       // the sending rank
  Action send;    // its SendGrad action
  double slack_s;
};
/// Every gradient send of a lowered schedule with its slack under `costs`, in list order per rank.
std::vector<SendSlack> gradient_send_slack(const std::vector<RankSchedule>& schedule, const SimCosts& costs);

/// ZB-H1's textbook step (Note [ZB-H1] in schedule.cpp), uniform stages, free links, M >= P:
/// M (tf + ti + tw) + (P - 1)(tf + ti - tw), where ti + tw is one stage's whole backward.
double ideal_zbh1_step_time(int ranks, int micro_batches, double forward_s, double input_s, double weight_s);

/// The simulated timeline as text, one row per rank, one column per `slot_s` of time: forward
/// micro-batch 3 prints "F3" in each slot it occupies, idle slots print "..". For docs and logs.
std::string format_timeline(const SimResult& result, double slot_s);

}  // namespace tl
