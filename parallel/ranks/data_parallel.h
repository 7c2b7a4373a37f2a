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
// process's numbers. The gradients then are views of the sum. (The sums start after the
// step's backward; overlapping them with the last micro-batches' backward is not done: the
// gradients are scaled by 1 / (the step's loss units over every replica) before they are summed,
// as one process scales its accumulated gradient, and those units are known only after every
// replica's last forward; summing first and scaling after would change the bits.)
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

#include <string>
#include <vector>

#include "compression/codec_spec.h"
#include "compression/compressor.h"
#include "parallel/ranks/transport.h"

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
  bool compresses(int64_t stage) const;
};

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

  /// Replaces every parameter's gradient by the sum over the replicas: the uncompressed ones in
  /// flat buckets (Note [uncompressed gradients in buckets]), the compressed ones by all-gather
  /// (Note [all-reduce by all-gather of payloads]). A parameter without gradient here has none on any replica (the
  /// replicas run the same stages) and keeps none. `step` tags the messages and names the step in
  /// errors.
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
  // Sends this replica's payloads as one message to every other replica of the group and returns
  // every replica's, by replica. raw_bytes >= 0: counted in stats() as that many raw bytes each.
  // Sums the uncompressed gradients in buckets; returns which parameters it summed.
  std::vector<bool> reduce_in_buckets(int64_t step, const std::string& where);
  std::vector<std::vector<Payload>> all_gather(const std::vector<Payload>& mine, int64_t tag, const std::string& context,
                                               at::Device device, int64_t raw_bytes);

  Transport& transport_;
  std::vector<int> group_;
  int replica_;
  std::vector<std::pair<std::string, Variable>> params_, buffers_;
  std::vector<double> decay_;  // per buffer
  std::vector<CompressorPtr> codecs_;  // per parameter
  int64_t bucket_bytes_ = int64_t(25) << 20;
  std::vector<at::Tensor> buckets_;  // flat, reused from step to step while their sizes hold
  DataParallelStats stats_;
};

}  // namespace tl::ranks
