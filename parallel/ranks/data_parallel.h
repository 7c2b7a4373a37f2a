#pragma once
// DataParallelSync: one pipeline rank's data-parallel group (the D ranks that hold the same stages
// in D replicas, parallel/grid.h), summing the stages' gradients after every backward, optionally
// compressed with the same codecs and payloads as the boundaries (config dp.compression), and
// keeping the replicas' buffers (BatchNorm running statistics) equal.
//
// Note [all-reduce by all-gather of payloads]. Compressed payloads cannot be summed on the wire (a
// TopK payload plus another is not a TopK payload; PowerSGD's factors of two matrices do not add),
// so each replica encodes its own gradient, sends the payload to every other replica of its group,
// decodes all D payloads (its own too) and sums them in replica order 0, 1, ..., D-1. Every replica
// forms the same sum of the same decoded tensors in the same order, so the replicas stay identical
// bit for bit, whatever the codec. Uncompressed (identity) the payload's body is a view of the
// gradient (the same bytes identity's encode() would copy), copied once, into the message, and the
// decoded tensor is the gradient itself; the sum is a fresh tensor. On the wire: (D - 1) payloads
// out of each rank per step, counted exactly (stats()); a ring all-reduce of raw floats sends
// 2 (D - 1) / D of the gradient's bytes out of each rank, so for D = 2 both send one gradient's
// bytes.
//
// Note [uncompressed gradients in buckets]. Uncompressed (identity, or a parameter its codec
// leaves out), the gradients are laid out back to back in flat buckets of at most dp.bucket_mib
// (in parameter order, one dtype a bucket, a parameter never split), allocated once (as
// Transport::message_buffer: sent whole, a bucket is its message's frame, not copied into one) and
// reused while nothing else holds them, and each bucket is summed by all_reduce_in_rank_order
// (group_sum.h): reduce-scatter then all-gather in place (two replicas: one exchange, summed in
// the received buffer), 2 (D - 1) / D of the bucket's bytes out of each rank as a ring
// all-reduce, and the same bits as the sum in replica order above, so a grid still gives one
// process's numbers. The gradients then are views of the sum. The layout is made once from the
// parameters that require grad (remade only if that set changes); a parameter without gradient
// in a step (none on any replica) sends zeros in its place and keeps none.
//
// Note [sums started during the backward]. With dp.overlap (the default, Gloo), a bucket's
// sum starts as soon as the step's last backward of every stage holding its parameters has run
// (stage_done, called by the interpreter: Note [stages done] in parallel/interpreter.h), while the
// rest of the step runs (the stages before it in the pipeline, this rank's other stages), as
// PyTorch's DDP starts a bucket when its gradients are ready. The gradients are summed scaled, as
// one process scales its accumulated gradient: by 1 / (the step's loss units), which every rank
// knows from the step's batch before it runs (begin_step; the units are integer counts, so their
// sum is exact in any order), so each gradient is scaled by the same multiplication the runtime
// applies at the end (scale_grads) as it is copied into its bucket, in one pass (Note [scaled into
// the bucket] in data_parallel.cpp): the same bits.
// The sum runs on a c10d process group of the replicas (Transport::start_group_sum, Note [group
// sums in flight]): Gloo's threads move the bytes while the backward goes on, and the step waits
// for them at its end. Every replica gets the bits of the in-rank-order sum: two replicas' a + b
// (b + a == a + b); more replicas' chunks are exchanged, summed in replica order and gathered
// (Note [group sums of more than two in rank order] in transport.h), with the bytes and messages
// of the sum after the backward. Within a stage's last backward, a parameter's
// gradient is final as soon as the backward has passed its layer (Note [leaves final within a
// stage] in parallel/interpreter.h): leaf_final() hears of it, and a bucket whose every parameter
// is final starts then, while the earlier layers' backward still runs (the buckets of the last
// layers first, as DDP's). What the engine does not release early (the weights of a split
// schedule's BackwardWeight, a parameter held by two stages) starts at stage_done. Every replica
// runs the same graph, so the buckets start in the same order on each, which the process group's
// sequence of sums needs. These bytes carry no body checksum (not tapeline
// frames; dp.overlap = false keeps the checksummed path), and emulated links (dp.bandwidth_mbps)
// do not delay them (the runner turns dp.overlap off with them).
//
// What is compressed: each parameter's gradient is viewed as a matrix (shape[0], the rest), as
// PowerSGD compresses a layer's gradient (a convolution's (out, in * kh * kw)); parameters of
// fewer than 2 dims (biases, norms' scales) go uncompressed, as in Vogels et al. Each parameter
// has its own codec instance: an ef(...) residual or a PowerSGD warm start is per parameter and
// per replica. Codecs whose decoder keeps state per sender (ef21, aqsgd), or that transform or
// constrain the model (ae, subspace), are rejected (dp_codec_problem(), from the traits of their
// registry records: compression/registry.h).
//
// Tied parameters (GPT-2's wte on the first and the last stage) are not summed here: the runtime
// sums them over every rank that holds them, all replicas at once (Optimus-CC's fused embedding
// synchronisation), before this runs.

#include <functional>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "compression/codec_spec.h"
#include "compression/compressor.h"
#include "parallel/ranks/transport.h"

namespace tl {
class Pipeline;
struct StageLayout;
}  // namespace tl

namespace tl::ranks {

/// Why `spec` cannot compress data-parallel gradients (empty: it can).
std::string dp_codec_problem(const CodecSpec& spec);
/// The same of a spec's text (its parse error, when it does not parse or build).
std::string dp_codec_problem(const std::string& text);

/// Config [parallel] dp and [dp]: data parallelism across pipeline replicas.
struct DataParallelOptions {
  int replicas = 1;                     // parallel.dp: D
  CodecSpec compression;  // dp.compression: codec of the gradients (identity)
  std::vector<int64_t> compress_stages;  // dp.compress_stages: stages whose gradients are compressed (empty: all)
  int64_t bucket_bytes = int64_t(25) << 20;  // dp.bucket_mib: uncompressed gradients per flat bucket
  bool overlap = true;  // dp.overlap: buckets summed during the backward (Note [sums started during the backward])
  bool compresses(int64_t stage) const;
};

/// Note [uncompressed gradients in buckets]'s layout: the buckets, each a list of indices into
/// `numel` / `dtype` (the parameters, in order; those with `in_bucket` false left out), at most
/// `bucket_bytes` each unless one parameter alone is larger, one dtype a bucket. The runtime lays
/// its buckets out with it, and the planner its messages (tasks/runner/plan.h).
std::vector<std::vector<size_t>> bucket_layout(const std::vector<int64_t>& numel,
                                               const std::vector<at::ScalarType>& dtype,
                                               const std::vector<bool>& in_bucket, int64_t bucket_bytes);

/// The stages holding each parameter of `pipeline`, by identity (its data's TensorImpl): stages
/// are views of one model, so a tied parameter (GPT-2's wte) is held by two.
using ParameterStages = std::map<const at::TensorImpl*, std::set<int>>;
ParameterStages parameter_stages(const Pipeline& pipeline);

/// One parameter whose gradient a pipeline rank's data-parallel group sums.
struct SummedParameter {
  std::string name;
  Variable param;
  bool compressed = false;  // through dp.compression: held by a stage options.compresses(), 2 or more dims
  std::vector<int> stages;  // the stages holding it (empty: a boundary's learned codec weight)
};

/// Note [the gradients a rank sums]. What pipeline rank `rank`'s data-parallel group sums, in
/// pipeline.named_parameters()'s order (the same on every replica): the parameters of its stages
/// except the tied ones (`tied(name)`: held by several ranks, summed over the world instead), and
/// the boundaries' learned codec weights, held by no stage (those of another rank's boundaries
/// have no gradient there and cost a few bytes). A parameter is compressed when the first stage
/// holding it is one that `options` compresses and it has 2 or more dims (Note [all-reduce by
/// all-gather of payloads]). DistExecutor hands this to DataParallelSync; the planner charges it
/// (Note [data parallelism in a plan] in tasks/runner/plan.h). `stages`: parameter_stages(pipeline).
std::vector<SummedParameter> summed_parameters(const Pipeline& pipeline, const ParameterStages& stages,
                                               const StageLayout& layout, int rank,
                                               const std::function<bool(const std::string&)>& tied,
                                               const DataParallelOptions& options);

/// Bytes of data-parallel messages sent by this rank.
struct DataParallelStats {
  int64_t messages = 0;
  int64_t bytes = 0;      // payload bytes sent (header and body, Payload::nbytes)
  int64_t raw_bytes = 0;  // what the same messages would have been uncompressed
};

class DataParallelSync {
 public:
  /// `group`: transport ranks of the group by replica; `replica`: this rank's index in it.
  /// `params` / `buffers`: this rank's stages' (tied parameters left out), in the same order on
  /// every replica; `compressed[i]`: whether params[i]'s gradient goes through `spec` (a
  /// parameter of fewer than 2 dims never does); `decay[i]`: for a floating-point buffer that is
  /// a running average updated once per micro-batch as r = decay r + (1 - decay) s (BatchNorm's,
  /// decay = 1 - momentum), else 0 (Note [running statistics across replicas]).
  DataParallelSync(Transport& transport, std::vector<int> group, int replica,
                   std::vector<std::pair<std::string, Variable>> params, const std::vector<bool>& compressed,
                   std::vector<std::pair<std::string, Variable>> buffers, std::vector<double> decay,
                   const CodecSpec& spec);

  /// Note [sums started during the backward]: the buckets' sums start as stages finish.
  /// `stages[i]`: this rank's stages that hold params[i] (empty: its gradient is final only at
  /// the step's end). Makes the replicas' c10d process group (collective over the group). Only
  /// with two replicas on Gloo (an error otherwise).
  void sum_during_backward(std::vector<std::vector<int>> stages);
  bool sums_during_backward() const { return !stages_.empty(); }
  /// A step starts: its gradients are to be scaled by `scale` (1 / the step's loss units) before
  /// they are summed. Without sum_during_backward(), nothing.
  void begin_step(int64_t step, const std::string& where, double scale);
  /// The step's last backward of `stage` has run: the buckets whose every parameter is now final
  /// are scaled and their sums started.
  void stage_done(int stage);
  /// `leaf`'s gradient is final in the step's last backward of `stage` (Note [leaves final within
  /// a stage]): if it is one of the parameters, held by that stage alone, and the last of its
  /// bucket to become final, the bucket is scaled and its sum started. Other leaves: nothing.
  void leaf_final(int stage, VariableImpl* leaf);
  /// Whether `p`'s gradient went scaled into a bucket started in stage_done this step (the
  /// caller scales the others).
  bool scaled(const Variable& p) const { return scaled_.count(p.impl()) > 0; }

  /// Replaces every parameter's gradient by the sum over the replicas: the uncompressed ones in
  /// flat buckets (Note [uncompressed gradients in buckets]; those started during the backward
  /// are waited for), the compressed ones by all-gather (Note [all-reduce by all-gather of
  /// payloads]). A parameter without gradient here has none on any replica (the replicas run the
  /// same stages) and keeps none. `step` tags the messages and names the step in errors.
  void reduce_gradients(int64_t step, const std::string& where);
  /// Note [running statistics across replicas]. After replica e ran its k micro-batches of the
  /// step, from the running average r0 of the step's start (`since`), it holds
  /// r_e = a^k r0 + c_e (a = decay). One process running all D k micro-batches in replica order
  /// would hold a^(D k) r0 + sum_e a^((D - 1 - e) k) c_e: every replica forms that, in replica
  /// order, so the running statistics are one process's to rounding. Integer buffers (BatchNorm's
  /// batch counter) become r0 plus every replica's increment; other floating-point buffers the
  /// replicas' mean.
  void sync_buffers(int64_t step, const std::string& where, const std::vector<at::Tensor>& since, int64_t k);
  /// Copies of the buffers now (for sync_buffers' `since`).
  std::vector<at::Tensor> snapshot_buffers() const;
  bool has_buffers() const { return !buffers_.empty(); }

  /// Bytes of uncompressed gradients per bucket (dp.bucket_mib; > 0).
  void set_bucket_bytes(int64_t bytes);
  const DataParallelStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }
  /// Every codec's state (error-feedback residuals, PowerSGD warm starts), keyed
  /// "<parameter>.<codec entry>": this replica's own (Note [grid state in checkpoints]).
  TensorMap codec_state() const;
  /// Restores codec_state()'s entries; an entry of no parameter here is an error (raised before
  /// anything changes).
  void load_codec_state(const TensorMap& state);
  /// The per-parameter codecs (state, for tests).
  const std::vector<CompressorPtr>& codecs() const { return codecs_; }

 private:
  // Note [uncompressed gradients in buckets].
  struct Bucket {
    struct Part {
      size_t param;
      int64_t offset;
    };
    std::vector<Part> parts;
    int64_t numel = 0;
    at::ScalarType dtype = at::kFloat;
    at::Tensor flat;  // reused from step to step while nothing else holds it
    bool started = false;
  };
  // Lays the buckets out, unless the parameters that go in them are those of the last layout.
  void layout_buckets();
  // Fills bucket b from the gradients (scaled first by `scale` unless 1) and sums it: started on
  // the replicas' process group (sum_during_backward), else summed here and the gradients set.
  void sum_bucket(size_t b, double scale);
  // Sends this replica's payloads as one message to every other replica of the group and returns
  // every replica's, by replica. raw_bytes >= 0: counted in stats() as that many raw bytes each.
  std::vector<std::vector<Payload>> all_gather(const std::vector<Payload>& mine, int64_t tag, const std::string& context,
                                               at::Device device, int64_t raw_bytes);

  Transport& transport_;
  std::vector<int> group_;
  int replica_;
  std::vector<std::pair<std::string, Variable>> params_, buffers_;
  std::vector<double> decay_;  // per buffer
  std::vector<CompressorPtr> codecs_;  // per parameter
  int64_t bucket_bytes_ = int64_t(25) << 20;
  std::vector<bool> in_bucket_;  // per parameter: whether its gradient goes in a bucket (the layout's)
  std::vector<Bucket> buckets_;
  // Note [sums started during the backward]: per parameter the stages holding it (empty vector:
  // not summed during the backward), and the step's state.
  std::vector<std::vector<int>> stages_;
  bool in_step_ = false;
  int64_t step_ = 0;
  std::string where_;
  double scale_ = 1.0;
  std::set<int> done_;                              // stages done this step
  std::vector<bool> final_;                         // per parameter: final this step (leaf_final)
  std::unordered_map<const VariableImpl*, size_t> param_index_;  // parameter -> index in params_
  std::vector<size_t> bucket_of_;                   // per parameter: its bucket, or SIZE_MAX
  std::unordered_set<const VariableImpl*> scaled_;  // gradients scaled this step by sum_bucket
  DataParallelStats stats_;
};

}  // namespace tl::ranks
