#pragma once
// The step planner (`tapeline plan`): one training step of a config on shapes only, through the
// code path a real step takes, to say how long it would take and what it would send.
//
// Note [planning a step]. The config is assembled as `train` assembles it (the task's shape, the
// model and its cuts, a Boundary per cut with its codecs, the schedule settings, the links, the
// device model), but the model is built under init::MetaGuard (Note [building on the meta
// device]): its parameters live on ATen's meta device, with shapes and no memory. A batch of the
// task's shape is made there too, and one LocalExecutor::train_step runs it: the micro-batch
// split, the lowered schedule, one RankInterpreter per pipeline rank, the stages' forwards and
// backwards on their tapes, the boundaries, the channel and its emulated links. Every op runs
// its meta kernel (shapes, no arithmetic) and is charged to the device model by the FLOPs and
// bytes it declares (Note [op costs]); the codecs, which cannot pack a meta tensor, size their
// payloads from their wire formats (Note [sizing a payload], Note [sized messages]). So the
// planned step is the in-process timeline of a real step with the same device model, minus the
// arithmetic (tests/tasks/plan_test.cpp checks the two agree). Data parallelism is planned on top
// (Note [data parallelism in a plan]), tensor parallelism inside it (Note [tensor parallelism in a
// plan]). Not planned: the optimizer step, and timeline.device = measured (no measurement on
// shapes: the planner asks for a device).
//
// Note [data parallelism in a plan]. With parallel.dp = D, each replica runs train.micro_batches
// / D of the step's micro-batches (as DistExecutor splits them): the planned pipeline step is one
// replica's. Then each pipeline rank's data-parallel group sums the gradients of its stages as
// the runtime does on emulated links between replicas (dp.bandwidth_mbps, dp.latency_ms; the runner
// sums after the backward there, dp.overlap off), message by message, each waited for before the
// next (Note [uncompressed gradients in buckets], Note [all-reduce by all-gather of payloads] in
// parallel/ranks/data_parallel.h):
//  - uncompressed gradients in flat buckets of dp.bucket_mib (ranks::bucket_layout): with two
//    replicas the whole bucket each way, one message; with D > 2 a chunk of 1/D to every other
//    member, then the summed chunk back, two rounds;
//  - compressed ones (dp.compression on dp.compress_stages), each sized by its codec for the
//    (shape[0], rest) matrix it is sent as, packed into one message to every other replica;
//  - the stages' buffers (BatchNorm statistics), one message to every other replica.
// The links between replicas are separate per direction and pair, as the transport emulates them,
// so the messages of a round travel side by side: a round of n bytes costs latency + 8 n /
// bandwidth. A rank's sums start when its pipeline part ends (compute + wait); the step ends
// when the last rank's sums do. On unlimited links the sums cost nothing, as on loopback.

//
// Note [tensor parallelism in a plan]. With parallel.tp = T, the meta model's blocks are split as
// tensor rank 0 of every stage splits them (shard_tensor_parallel, Note [tensor-parallel blocks]):
// its heads and MLP units, so the step's ops, FLOPs, parameters, optimizer state and activations
// are that rank's (every tensor rank's: the split is even; the replicated layers, LayerNorms,
// embeddings and head, are counted whole on each). The blocks' all-reduces go to a communicator
// that sends nothing: each call (a row-parallel output forward, a column-parallel input's
// gradient backward, per micro-batch, of the shape the runtime sums) is counted as tensor rank 0
// of parallel/ranks/tensor_parallel.cpp sends it, and its time on the emulated links between the
// tensor ranks (tp.bandwidth_mbps, tp.latency_ms; separate per direction and pair) is charged to
// the action that runs it, where it blocks the rank (the runtime counts it as compute), as seconds
// on the action's cost meter (CostMeter::add_seconds: no FLOPs, no bytes):
//  - uncompressed (tp.forward / tp.backward identity) on the CPU (Gloo), all_reduce_in_rank_order:
//    with two ranks the whole tensor each way, one message, one round; with T > 2 the
//    reduce-scatter (chunk j of n (j + 1) / T - n j / T values to member j) and the all-gather of
//    the summed chunk, 2 (T - 1) messages in two rounds; on CUDA (NCCL) the all-gather of T - 1
//    identity payloads, one round;
//  - compressed, tp.algorithm = allgather: the codec's payload of the whole tensor to each of the
//    T - 1 others, one round; reduce_scatter: the payloads of the (rows, C) chunks the others sum,
//    then of its summed chunk to each other, two rounds.
// Payloads are sized by the codec's wire format (Note [sizing a payload]): the worst case where the
// size depends on the data (tp_size says which). A round costs latency + 8 x its largest message /
// bandwidth. The bytes and messages are tensor rank 0's per step (tp_bytes, tp_messages); the
// step's `tapeline train` reports bytes_tp, every rank's.

#include <functional>
#include <string>
#include <vector>

#include "parallel/link.h"
#include "parallel/step.h"
#include "tasks/config.h"

namespace tl {

/// One direction of one link's traffic in the planned step.
struct PlanLink {
  int boundary = 0;       // 1-based, as boundary.N
  int src = 0, dst = 0;   // pipeline ranks
  bool forward = true;    // carries activations (a V placement's turn: activations and gradients)
  std::string direction;  // forward, backward, or both
  LinkSpec spec;
  int64_t bytes = 0, messages = 0;
  double busy_s = 0;          // transmitting (bytes x 8 / bandwidth; 0 when unlimited)
  double bytes_per_unit = 0;  // bytes / the step's loss units (tokens for lm)
  std::string size;           // how the payloads were sized: exact, worst case, given
  std::string codec;          // the spec that sized them
};

struct PlanRank {
  int rank = 0;
  std::vector<int> stages;
  double compute_s = 0, wait_s = 0, flops = 0;
  // Note [data parallelism in a plan]: what this rank sends its replicas per step, and how long
  // its sums take after its pipeline part (0 with one replica).
  int64_t dp_bytes = 0, dp_messages = 0;
  double dp_sum_s = 0;
  // Note [tensor parallelism in a plan]: tensor rank 0's all-reduces per step (0 with T = 1), what
  // it sends, and their time on the tp links (part of compute_s).
  int64_t tp_all_reduces = 0, tp_bytes = 0, tp_messages = 0;
  double tp_s = 0;
  int64_t parameter_bytes = 0;   // its stages' parameters (a tied one on two ranks counted on both; one tensor rank's)
  int64_t optimizer_bytes = 0;   // the optimizer's state for them (adamw: 2 per parameter, sgd with momentum: 1)
  int64_t activation_bytes = 0;  // the most its stages held for backward after a forward (engine's float32 count)
};

struct Plan {
  std::string model;  // BuiltModel::describe
  int64_t parameters = 0;
  int stages = 0, ranks = 0;  // of one replica's pipeline
  int replicas = 1;           // parallel.dp (Note [data parallelism in a plan])
  std::string schedule, device, link_model, unit;
  int64_t micro_batches = 0, rows = 0;
  double units = 0;  // loss units of the step (tokens, images, sequences), over every replica
  double step_s = 0, bubble = 0, flops = 0, mfu = 0;  // step_s: with the data-parallel sums
  double pipeline_s = 0;  // one replica's pipeline part of the step (step_s with one replica)
  double dp_sum_s = 0;    // step_s - pipeline_s: what the data-parallel sums add
  std::string dp_codec, dp_size = "exact";  // dp.compression, and how its payloads were sized
  int tensor = 1;                           // parallel.tp (Note [tensor parallelism in a plan])
  std::string tp_forward, tp_backward, tp_algorithm, tp_size = "exact";  // its codecs, algorithm, sizes
  LinkSpec tp_link;                                                      // tp.bandwidth_mbps, tp.latency_ms
  double forward_bytes_per_unit = 0, backward_bytes_per_unit = 0;  // the busiest link's, each way
  std::vector<PlanRank> rank_plans;
  std::vector<PlanLink> links;
  // Note [tied sums in a plan]: parameters held by several ranks (GPT-2's wte on the first and the
  // last) have their gradients summed by an all-reduce after the last backward. Not on the timeline
  // (step_s): the in-process timeline and emulated links do not charge collectives.
  int64_t tied_bytes = 0;  // float32 gradient bytes of the tied parameters, each holder's contribution
  int tied_ranks = 0;      // ranks holding a tied parameter (0: none)
  double tied_sum_s = 0;   // a ring all-reduce of tied_bytes among them on the slowest configured link
  double planning_s = 0;   // wall time of plan_step

  /// plan.json (docs/CONFIG.md, "tapeline plan", documents every field).
  std::string to_json() const;
  /// The human summary `tapeline plan` prints.
  std::string to_text() const;
};

/// Plans one step of `config` (Note [planning a step]). `progress` hears what is being done.
/// Errors name what cannot be planned: timeline.device = measured, a codec the planner cannot
/// size (naming it), a model whose ops have no meta kernel (naming the op).
Plan plan_step(const Config& config, const std::function<void(const std::string&)>& progress = {});

/// Note [tied sums in a plan]. On a real network the tied parameters' all-reduce crosses the links:
/// among k ranks a ring all-reduce of n bytes sends 2 (k - 1) / k x n bytes each way on each link
/// and waits 2 (k - 1) latencies; the plan charges that on the slowest configured link (the ranks
/// meet there or worse). A run of processes on emulated links sends it over the real network
/// (loopback: free), which is what `train --nproc` measures; on shaped links (two nodes) it is
/// part of the step. So the step of a real network is step_s + tied_sum_s.
/// One real training step of `config`, assembled as plan_step assembles it but with the model
/// built and initialised on the CPU, on a batch of the same shapes with random token ids (or
/// normal images): its timeline on the same device model. What a plan is checked against
/// (tests/tasks/plan_test.cpp, bench/bench_plan.cpp). `units`, if given, receives its loss units.
StepTiming real_step(const Config& config, double* units = nullptr);

/// Writes plan.to_json() to `path` (temp file and rename).
void write_plan(const Plan& plan, const std::string& path);

/// `tapeline plan --sweep key=v1,v2,...`: the plans of each value of `key` as a table (one row
/// each: the value, step time, bubble, MFU, bytes per unit each way, the busiest link's busy time).
std::string sweep_table(const std::string& key, const std::vector<std::pair<std::string, Plan>>& rows);

}  // namespace tl
