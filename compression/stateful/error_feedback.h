#pragma once
// Error feedback around an inner codec C, in three forms.
//
//  ef(C)    Error feedback (Bian et al.; Rudakov et al.). One residual e per boundary direction
//           (shape of the micro-batch), or one per sample (per=sample, keyed by sample id):
//               x <- x + e;   c = C(x);   e <- x - c;   send C's payload of x.
//           The sender decodes its own payload to know c. In the backward direction this is the
//           research's  c = C(g + e); e <- e + g - c  (the same update: e' = g + e - c).
//  lazy(C)  Optimus-CC lazy error propagation: the same update with one buffer per boundary shared
//           by all micro-batches (the error of one micro-batch is added to the next), meant for
//           backward PowerSGD: lazy(powersgd(rank=16)). carry=steps keeps the buffer across
//           optimizer steps; carry=microbatches drops it after each step (after_optimizer_step()).
//  ef21(C)  EF21: both ends keep an estimate A (sender: updated by encode, receiver: by decode):
//               d = C(x - A);  A <- A + d;  send C's payload of x - A;  the receiver outputs A.
//
// Note [why the EF buffer is per boundary]. The residual is a property of one message stream: a
// codec object belongs to one boundary direction (compressor.h), so its buffer is too. With 1F1B
// the backward messages come in a different order than the forward ones; a per-boundary residual
// simply follows the order messages are sent in, a per-sample residual follows the sample ids
// saved with each micro-batch.
//
// Policies (documented in docs/COMPRESSION.md):
//  - A message whose shape differs from the buffer's (e.g. the smaller last micro-batch of an
//    epoch) resets the per-boundary state to zeros first; both ends see the shape, so EF21's two
//    copies reset together.
//  - In eval mode (ctx.training false) the codec acts as plain C and leaves its state untouched, so
//    validating never perturbs the training stream.
//  - flush(x) (called by the Boundary when a backward send goes uncompressed, e.g. epilogue-only
//    compression off the critical path) returns x + e and clears e: the pending error is delivered
//    with the lossless message.

#include <memory>
#include <optional>

#include "compression/stateful/common.h"

namespace tl {

class ErrorFeedback : public stateful::WrappingCompressor {
 public:
  enum class Per { Boundary, Sample };
  enum class Carry { Steps, MicroBatches };
  struct Options {
    Per per = Per::Boundary;
    Carry carry = Carry::Steps;
    stateful::SampleCacheOptions cache;  // per = Sample
    bool lazy = false;                   // spec name "lazy" instead of "ef"
  };
  ErrorFeedback(CompressorPtr inner, Options opt);

  std::string spec() const override;
  Payload encode(const at::Tensor& x, const CodecContext& ctx) override;
  at::Tensor decode(const Payload& p, const CodecContext& ctx) override;
  /// The inner codec's payload (of x plus the residual, in x's dtype).
  PayloadSize payload_size(const std::vector<int64_t>& shape, at::ScalarType dtype) const override {
    return inner_->payload_size(shape, dtype);
  }
  void after_optimizer_step() override;

  /// x + e with the residual cleared (the message is sent uncompressed and carries the error).
  at::Tensor flush(const at::Tensor& x, const CodecContext& ctx);
  at::Tensor deliver_residual(const at::Tensor& x, const CodecContext& ctx) override { return flush(x, ctx); }
  /// The residual for messages of `x`'s shape (per boundary), or the rows of ctx.sample_ids
  /// (per sample), as (B, ...) of x's shape; zeros where nothing is pending.
  at::Tensor residual(const at::Tensor& x, const CodecContext& ctx);
  const Options& options() const { return opt_; }

 private:
  at::Tensor sample_ids(const at::Tensor& x, const CodecContext& ctx) const;  // undefined per boundary
  at::Tensor residual_for(const at::Tensor& x, const at::Tensor& ids);
  void store(const at::Tensor& e, const at::Tensor& value, const at::Tensor& ids);

  Options opt_;
  std::optional<stateful::StateBuffer> error_;   // per boundary
  std::unique_ptr<stateful::SampleCache> rows_;  // per sample
};

class EF21 : public stateful::WrappingCompressor {
 public:
  explicit EF21(CompressorPtr inner);

  std::string spec() const override;
  Payload encode(const at::Tensor& x, const CodecContext& ctx) override;
  at::Tensor decode(const Payload& p, const CodecContext& ctx) override;
  /// The inner codec's payload (of x - A, in x's dtype).
  PayloadSize payload_size(const std::vector<int64_t>& shape, at::ScalarType dtype) const override {
    return inner_->payload_size(shape, dtype);
  }
  bool decode_has_state() const override { return true; }  // the receiver's A

  /// The sender's and the receiver's estimate A (empty before the first message).
  const at::Tensor& sender_state() const { return sender_.value(); }
  const at::Tensor& receiver_state() const { return receiver_.value(); }

 private:
  stateful::StateBuffer sender_;
  stateful::StateBuffer receiver_;
};

}  // namespace tl
