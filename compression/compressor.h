#pragma once
// Compressor: one operator family (TopK, quantisation, PowerSGD, EF(...), ...). It is a Module so
// that its state (EF residuals, AQ-SGD caches, PowerSGD warm starts, generator state, learned
// weights) is registered, checkpointed and moved like any parameter or buffer; a compressor
// belongs to exactly one boundary direction and is never shared.
//
// Note [sender and receiver state]. In a pipeline the sender (stage i) runs encode and the
// receiver (stage i+1) runs decode, each on its own replica of the compressor. Stateful codecs
// (EF21's A, AQ-SGD's cache) keep a sender copy updated by encode and a receiver copy updated by
// decode; both are deterministic functions of the payloads, so they stay identical. In one
// process both copies live in the same object, which lets the tests check that they agree.

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "compression/payload.h"
#include "layers/module.h"

namespace tl {

/// Per-call information a codec may use.
struct CodecContext {
  at::Tensor sample_ids;  // (B) int64 ids of the samples in the micro-batch (AQ-SGD); may be undefined
  at::Tensor token_ids;   // (B, T) int64 token ids travelling with the message (subspace); may be undefined
  int64_t micro_batch = 0;
  int64_t epoch = 0;
  /// Training progress (schedule(...), docs/COMPRESSION.md section 4.5): the global step, 1-based,
  /// and the fraction of the run's training steps done before it, (step - 1) / total, in [0, 1).
  /// Filled by the executors from the trainer's StepPosition. A context made without them (unit
  /// tests, evaluation batches) has step 0 and progress -1, "unknown": a codec then keeps the
  /// level of the last training message it saw (its first level before any).
  int64_t step = 0;
  double progress = -1;
  bool training = true;
  bool knows_progress() const { return progress >= 0; }
};

/// The level an adaptive codec is at (schedule, adaptive, budget): a number to plot (the phase,
/// the adapted argument's value, the candidate's index) and a short label (a spec).
struct CodecLevel {
  double value = 0;
  std::string label;
};

/// Note [sizing a payload]. The planner (tasks/runner/plan.h) runs a step on shapes only (the meta
/// device), where no codec can pack real bytes. Each codec instead says, from its wire format,
/// how many bytes encode() would put on the wire (Payload::nbytes(), header included) for a tensor
/// of a shape and dtype. Exact where the format fixes the size; where it depends on the data
/// (threshold's count, delta indices and index=auto) the declared worst case, flagged so. Codecs
/// whose size depends on state or training (adaptive and scheduled levels, aqsgd's cache hits, ae's
/// learned code width) and those without a sizing (quantile, colsparse, subspace, lazy) throw, naming
/// themselves; at a boundary the user may give the size instead (plan.forward_bytes /
/// backward_bytes: `given`).
/// tests/compression/sizing_test.cpp checks each against real encodes.
struct PayloadSize {
  enum class Kind { Exact, WorstCase, Given };
  int64_t bytes = 0;
  Kind kind = Kind::Exact;
  /// "exact", "worst case", "given".
  static const char* word(Kind k);
  /// The weaker of two kinds (a sum of an exact and a worst-case size is a worst case).
  static Kind weaker(Kind a, Kind b) { return a > b ? a : b; }
};

/// Payload::header_bytes() of a payload of `ndim` dims and `nparams` params.
inline int64_t payload_header_bytes(int64_t ndim, int64_t nparams) { return 16 + 8 * (ndim + nparams); }

class Compressor : public Module {
 public:
  explicit Compressor(std::string type_name) : Module(std::move(type_name)) {}

  /// Canonical spec string: parse_compressor(spec()) builds an equivalent compressor.
  virtual std::string spec() const = 0;

  /// Sender side: pack x (any shape; float32/16/bf16) into a payload. May update sender state.
  virtual Payload encode(const at::Tensor& x, const CodecContext& ctx) = 0;
  /// Receiver side: unpack to a tensor of the original shape and dtype. May update receiver state.
  /// A payload this codec did not produce, or a corrupt one, is an error.
  virtual at::Tensor decode(const Payload& p, const CodecContext& ctx) = 0;

  /// encode(x), and where this codec can do it in the same pass (the fused CUDA kernels of
  /// compression/cuda), also *residual = x - decode(payload) as a float32 tensor of x's shape, for
  /// error feedback; otherwise *residual is left undefined and the caller decodes. Only asked
  /// for float32 x.
  virtual Payload encode_with_residual(const at::Tensor& x, const CodecContext& ctx, at::Tensor* residual) {
    *residual = at::Tensor();
    return encode(x, ctx);
  }

  /// Backward mode `shared`: whether the gradient can be sent on the forward payload's support
  /// (TopK/RandK mask) or basis (projection).
  virtual bool supports_shared() const { return false; }
  /// Encode gradient g on the support/basis of forward payload `fwd` (both ends have `fwd`).
  virtual Payload encode_shared(const at::Tensor& g, const Payload& fwd, const CodecContext& ctx);
  virtual at::Tensor decode_shared(const Payload& p, const Payload& fwd, const CodecContext& ctx);

  /// Differentiable transforms around the wire for learned and projecting compressors
  /// (autoencoder: pre = encoder on the sender, post = decoder on the receiver; subspace: U^T and
  /// U). The wire then carries pre(h), compressed by wire_codec() if any. Identity by default.
  virtual bool has_transform() const { return false; }
  virtual Variable pre(const Variable& h, const CodecContext& ctx) { return h; }
  virtual Variable post(const Variable& z, const CodecContext& ctx) { return z; }

  /// The level of an adaptive codec: that of its last message (training or evaluation); nullopt
  /// for a codec of fixed level. Wrappers report their inner codec's.
  virtual std::optional<CodecLevel> level() const { return std::nullopt; }

  /// The bytes encode() puts on the wire for a tensor of `shape` and `dtype` (Note [sizing a
  /// payload]). The default refuses, naming the codec: the planner then cannot size it.
  virtual PayloadSize payload_size(const std::vector<int64_t>& shape, at::ScalarType dtype) const;
  /// The same for encode_shared() of a gradient of `shape` on the forward payload of the same shape.
  virtual PayloadSize shared_payload_size(const std::vector<int64_t>& shape, at::ScalarType dtype) const;

  /// Hook for schedules: called after every optimizer step (subspace weight projection).
  virtual void after_optimizer_step() {}

  /// Whether decode() changes receiver state (EF21's A, AQ-SGD's cache). A wrapper that decodes
  /// its own payload on the sender side (error feedback) must not wrap such a codec, or the
  /// receiver copy would be updated twice in a single-process run.
  virtual bool decode_has_state() const { return false; }
  /// A message that goes uncompressed instead of through this codec (Optimus-CC's epilogue-only
  /// sends off the critical path): what to send for `x`. An error-feedback codec adds its pending
  /// residual and clears it; every other codec sends `x`.
  virtual at::Tensor deliver_residual(const at::Tensor& x, const CodecContext& ctx) { return x; }

  /// Whether this codec needs the model's cooperation (below) to work as intended.
  virtual bool constrains_model() const { return false; }
  /// Codecs that constrain the model they sit in (Protocol Models' subspace): the frozen (V, d)
  /// token embedding the model must add to its input embedding (undefined: none), for a model
  /// of width `d`...
  virtual at::Tensor input_token_embedding(int64_t d) { return {}; }
  /// ... and the weights that write into the residual stream before this boundary, each with its
  /// dimension of size d, kept in the codec's subspace now and after every optimizer step.
  virtual void constrain_residual_writers(const std::vector<std::pair<Variable, int64_t>>& weights) {}
};

using CompressorPtr = std::shared_ptr<Compressor>;

}  // namespace tl
