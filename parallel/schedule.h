#pragma once
// Pipeline schedules as data: for every rank, the ordered list of actions it executes in one
// training step -- compute (forward / backward of one micro-batch on one of its stages) and the
// point-to-point messages between stages on different ranks. An executor (in-process or the
// multi-process runtime) walks its rank's list; a schedule can be printed, parsed back, checked
// and timed without running a model. The shape follows torch.distributed.pipelining's schedules.
//
// A schedule is built in two passes, as torch.distributed.pipelining builds its own:
//   1. the *compute* schedule: per rank, the order of its Forward and Backward actions
//      (the registry's generators, parallel/schedule_generators.h);
//   2. lower(): inserts the messages and decides what each send does (parallel/lowering.h).
// The event simulator and the critical-path slack read lowered lists (parallel/simulate.h,
// parallel/slack.h).
//
// This header holds the action IR, the placement of stages on ranks, the text form of a list, the
// structural checks, and the registry of the schedules by name, from which config, pipeline and
// CLI take their names, placements and virtual-stage rules.

#include <string>
#include <vector>

namespace tl {

// ---- the action IR ------------------------------------------------------------------------------

/// Backward is a stage's whole backward. Zero-bubble schedules split it (Note [split backward] in
/// autograd/engine.cpp): BackwardInput computes the gradient of the stage's input (and sends it, as
/// Backward does), BackwardWeight later computes the weight gradients (no message).
enum class ActionType {
  Forward,
  Backward,
  SendActivation,
  RecvActivation,
  SendGrad,
  RecvGrad,
  BackwardInput,
  BackwardWeight
};

/// One step of one rank's list. `stage` is the stage the action belongs to (a rank may hold
/// several: StageLayout); the stage on the other end of a message is stage + 1 (SendActivation,
/// RecvGrad) or stage - 1 (RecvActivation, SendGrad), and `peer` is that stage's rank.
struct Action {
  ActionType type;
  int stage;
  int micro_batch;
  /// Optimus-CC epilogue-only: false for backward sends off the critical path (SendGrad only;
  /// set by lower(), Note [epilogue-only backward compression] in parallel/lowering.h).
  bool compress_backward = true;
  /// Messages: the rank on the other end (set by lower()); -1 for compute actions.
  int peer = -1;
  /// The critical-path question answered by the step's dependency graph: zero slack (SendGrad
  /// only; set by lower() with uniform stages, Note [slack of a gradient send] in parallel/slack.h).
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
/// The action that takes a stage's output gradient and sends its input's: B, or I of a split backward.
bool takes_gradient(ActionType t);
/// The stage on the other end of a message action; -1 for compute.
int peer_stage(const Action& a);

// ---- where stages live --------------------------------------------------------------------------

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

  bool operator==(const StageLayout& o) const {
    return ranks == o.ranks && virtual_stages == o.virtual_stages && placement == o.placement;
  }
};

/// Errors naming the number when ranks, virtual stages or micro-batches are < 1.
void check_schedule_sizes(const StageLayout& layout, int micro_batches);

// ---- the registry of schedules ------------------------------------------------------------------

/// Builds the compute-only lists (no messages) of a schedule for a layout its record accepts.
using ComputeGenerator = std::vector<RankSchedule> (*)(const StageLayout& layout, int micro_batches);

/// One record per schedule name: what config, Pipeline and the CLI know of a schedule.
struct ScheduleKind {
  const char* name;
  /// How its stages are placed on the ranks.
  Placement placement;
  /// Stages per rank it runs: min_virtual_stages..max_virtual_stages (max 0: no upper bound).
  int min_virtual_stages;
  int max_virtual_stages;
  /// With more than one stage per rank: how the stages sit ("places two stages on each rank in a
  /// V"), for error messages.
  const char* stages_per_rank;
  ComputeGenerator generate;
  /// One line for config and CLI help.
  const char* help;

  bool accepts_virtual_stages(int v) const {
    return v >= min_virtual_stages && (max_virtual_stages == 0 || v <= max_virtual_stages);
  }
  /// "" when it runs `v` stages per rank, else the error that says what it needs, naming
  /// pipeline.schedule and pipeline.virtual_stages and the schedules that do run v.
  std::string virtual_stages_problem(int v) const;
};

/// Every schedule, in the order messages list them: gpipe, 1f1b, interleaved, zbh1, zbv.
const std::vector<ScheduleKind>& schedule_kinds();
/// The record of `name`; an error "unknown pipeline schedule 'x'; known: ..." otherwise.
const ScheduleKind& schedule_kind(const std::string& name);
/// The record of `name`, or nullptr.
const ScheduleKind* find_schedule_kind(const std::string& name);
/// The names, in registry order.
std::vector<std::string> schedule_names();
/// The names for messages: "gpipe, 1f1b, interleaved, zbh1, zbv".
const char* known_schedules();
/// Every record's "name: help", joined by "; ", for config and CLI help.
std::string schedules_help();
/// The placement the named schedule runs on (V for zbv, round robin for the others).
Placement placement_of(const std::string& schedule);

// ---- building the lists -------------------------------------------------------------------------

/// Compute-only lists (no messages) of the named schedule on `layout`: "gpipe", "1f1b", "zbh1" (one
/// stage per rank), "interleaved" (Megatron's interleaved 1F1B over layout.virtual_stages stages
/// per rank; micro_batches must be a multiple of layout.ranks when v > 1) or "zbv" (zero-bubble
/// ZB-V: two stages per rank in a V placement). Errors name what is accepted.
std::vector<RankSchedule> compute_schedule(const std::string& name, const StageLayout& layout, int micro_batches);
/// compute_schedule + lower (parallel/lowering.h).
std::vector<RankSchedule> make_schedule(const std::string& name, const StageLayout& layout, int micro_batches);
/// One stage per rank: make_schedule(name, StageLayout::of(stages), micro_batches).
std::vector<RankSchedule> make_schedule(const std::string& name, int stages, int micro_batches);
/// Forward-only lists of one micro-batch (evaluation), lowered.
std::vector<RankSchedule> forward_only_schedule(const StageLayout& layout);

/// The lowered lists of make_schedule(name, layout, micro_batches), built once per (schedule,
/// layout, micro-batches) in this process and reused: a step asks for its plan without lowering
/// it again. Thread-safe; the reference stays valid for the life of the process. Errors as
/// make_schedule's (nothing is kept for a bad key).
const std::vector<RankSchedule>& cached_schedule(const std::string& name, const StageLayout& layout, int micro_batches);
/// forward_only_schedule(layout), built once per layout likewise.
const std::vector<RankSchedule>& cached_forward_only_schedule(const StageLayout& layout);

/// GPipe: every forward (micro-batch 0..M-1), then every backward (0..M-1).
std::vector<RankSchedule> gpipe_schedule(int stages, int micro_batches);
/// 1F1B: stage s runs min(S - s - 1, M) warm-up forwards, then alternates one forward and one
/// backward, then the remaining backwards (cool-down). Messages placed per Note [blocking
/// send/recv and the order of messages on a link] (parallel/lowering.h).
std::vector<RankSchedule> one_f_one_b_schedule(int stages, int micro_batches);
/// Interleaved 1F1B (Megatron's virtual pipeline): rank r runs its forwards in rounds of P
/// micro-batches, chunk 0 then chunk 1 ... (backwards with the chunks reversed), after
/// 2 (P - r - 1) + (v - 1) P warm-up forwards.
std::vector<RankSchedule> interleaved_schedule(int ranks, int virtual_stages, int micro_batches);
/// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): 1F1B with each backward split
/// into I (input gradient, sent at once) and W (weight gradients), the W's placed where 1F1B would
/// idle. Note [ZB-H1] in parallel/schedule_generators.cpp.
std::vector<RankSchedule> zbh1_schedule(int stages, int micro_batches);
/// ZB-V (same paper): P ranks holding 2 stages each in a V placement (rank r: stages r and
/// 2P - 1 - r), every backward split. Note [ZB-V] in parallel/schedule_generators.cpp.
std::vector<RankSchedule> zbv_schedule(int ranks, int micro_batches);

// ---- text and checks ----------------------------------------------------------------------------

/// "F3", "B0", "I0" (input gradient), "W0" (weight gradients), "RA3" (recv activation), "SA3",
/// "RG0", "SG0"; a SendGrad with compress_backward = false prints as "SG0~". With `with_stage` the
/// stage follows: "F3s5".
std::string action_token(const Action& a, bool with_stage = false);
/// One row per rank: "rank 0: F0 F1 F2 F3 B0 ...". With `with_comm` false only compute actions are
/// listed (the classic picture); with true every action. Stages are named when a rank holds
/// several.
std::string format_schedule(const std::vector<RankSchedule>& schedule, bool with_comm = false);
/// The exact text of a list: format_schedule(schedule, true) with every token naming its stage and
/// a "+" after a gradient send with slack (critical = false): "rank 1: RA0s1 F0s1 ... SG0s1~+".
/// parse_schedule reads it back to the same actions.
std::string schedule_text(const std::vector<RankSchedule>& schedule);
/// One token of format_schedule or schedule_text on `rank`: a token without its stage belongs to the
/// rank's only stage (an error when `layout` puts several on it); a message's peer is the rank of
/// the stage on its other end. Errors name the token and the grammar.
Action parse_action(const std::string& token, int rank, const StageLayout& layout);
/// Reads format_schedule's (with_comm) or schedule_text's form: one "rank r: ..." row per rank of
/// `layout`, in order. parse_schedule(schedule_text(s), layout) == s for a lowered s.
std::vector<RankSchedule> parse_schedule(const std::string& text, const StageLayout& layout);

/// Structural checks of a hand-made or generated schedule: list r holds only the stages of rank
/// r; every micro-batch is forwarded and backwarded once on every stage; a stage receives its
/// input before the forward and sends it after; gradients likewise; messages name the right
/// peer rank. Errors name the rank, the action and the rule. (`layout` defaults to one stage
/// per rank.)
void validate_schedule(const std::vector<RankSchedule>& schedule, int micro_batches);
void validate_schedule(const std::vector<RankSchedule>& schedule, int micro_batches, const StageLayout& layout);

}  // namespace tl
