#include "compression/stateful/error_feedback.h"

namespace tl {

using stateful::accumulation_type;

namespace {
void check_inner_decode(const Compressor& inner, const std::string& who) {
  TORCH_CHECK(!inner.decode_has_state(), who, ": the inner codec '", inner.spec(),
              "' keeps receiver state in decode(); ", who,
              " decodes its own payload on the sender to know what was sent, which would advance that state "
              "twice. Use a stateless inner codec (topk, quant, powersgd, ...)");
}
}  // namespace

// ---- ef / lazy ---------------------------------------------------------------------------------

ErrorFeedback::ErrorFeedback(CompressorPtr inner, Options opt)
    : WrappingCompressor(opt.lazy ? "LazyErrorPropagation" : "ErrorFeedback", std::move(inner)), opt_(std::move(opt)) {
  const char* who = opt_.lazy ? "lazy" : "ef";
  check_inner_decode(*inner_, who);
  TORCH_CHECK(!(opt_.lazy && opt_.per == Per::Sample),
              "lazy: the Optimus-CC buffer is one per boundary (shared by "
              "all micro-batches); use ef(C, per=sample) for per-sample EF");
  if (opt_.per == Per::Boundary) {
    error_.emplace(*this, "error");
  } else {
    rows_ = std::make_unique<stateful::SampleCache>(*this, "error", opt_.cache, std::string(who));
  }
}

std::string ErrorFeedback::spec() const {
  std::string s = std::string(opt_.lazy ? "lazy(" : "ef(") + inner_->spec();
  if (opt_.per == Per::Sample) {
    s += ", per=sample";
    if (opt_.cache.capacity > 0) s += ", capacity=" + std::to_string(opt_.cache.capacity);
  }
  if (opt_.carry == Carry::MicroBatches) s += ", carry=microbatches";
  return s + ")";
}

at::Tensor ErrorFeedback::sample_ids(const at::Tensor& x, const CodecContext& ctx) const {
  if (opt_.per == Per::Boundary) return at::Tensor();
  TORCH_CHECK(x.dim() >= 1, "ef(per=sample): the message must have a batch dimension, got a scalar");
  return stateful::checked_sample_ids(ctx, x.size(0), "ef(per=sample)");
}

at::Tensor ErrorFeedback::residual_for(const at::Tensor& x, const at::Tensor& ids) {
  const at::ScalarType acc = accumulation_type(x.scalar_type());
  if (opt_.per == Per::Boundary) return error_->get(x.sizes(), acc, x.device());
  const int64_t batch = x.size(0);
  const int64_t d = batch > 0 ? x.numel() / batch : 0;
  return rows_->gather(ids, d, acc, x.device()).view(x.sizes());
}

at::Tensor ErrorFeedback::residual(const at::Tensor& x, const CodecContext& ctx) {
  return residual_for(x, sample_ids(x, ctx));
}

void ErrorFeedback::store(const at::Tensor& e, const at::Tensor& value, const at::Tensor& ids) {
  if (opt_.per == Per::Boundary) {
    e.copy_(value);  // e is the registered buffer
  } else {
    rows_->set(ids, value.reshape({value.size(0), -1}));
  }
}

Payload ErrorFeedback::encode(const at::Tensor& x, const CodecContext& ctx) {
  if (!ctx.training) return inner_->encode(x, ctx);
  const at::ScalarType acc = accumulation_type(x.scalar_type());
  at::Tensor ids = sample_ids(x, ctx);
  at::Tensor e = residual_for(x, ids);  // (x shape), acc
  at::Tensor xs = x.to(acc) + e;        // x <- x + e
  if (x.scalar_type() == at::kFloat) {
    // A codec with fused kernels (quant on CUDA) computes x - c while it encodes.
    at::Tensor fused;
    Payload p = inner_->encode_with_residual(xs, ctx, &fused);
    if (fused.defined()) {
      store(e, fused, ids);  // e <- x - c
      return p;
    }
    store(e, xs - inner_->decode(p, ctx).to(acc), ids);
    return p;
  }
  Payload p = inner_->encode(xs.to(x.scalar_type()), ctx);  // C(x)
  at::Tensor c = inner_->decode(p, ctx).to(acc);            // what the receiver will see
  store(e, xs - c, ids);                                    // e <- x - c
  return p;
}

at::Tensor ErrorFeedback::decode(const Payload& p, const CodecContext& ctx) { return inner_->decode(p, ctx); }

at::Tensor ErrorFeedback::flush(const at::Tensor& x, const CodecContext& ctx) {
  if (!ctx.training) return x;
  const at::ScalarType acc = accumulation_type(x.scalar_type());
  at::Tensor ids = sample_ids(x, ctx);
  at::Tensor e = residual_for(x, ids);
  at::Tensor out = (x.to(acc) + e).to(x.scalar_type());
  store(e, at::zeros_like(e), ids);
  return out;
}

void ErrorFeedback::after_optimizer_step() {
  WrappingCompressor::after_optimizer_step();
  if (opt_.carry != Carry::MicroBatches) return;
  if (error_) error_->reset();
  if (rows_) rows_->reset();
}

// ---- ef21 --------------------------------------------------------------------------------------

EF21::EF21(CompressorPtr inner)
    : WrappingCompressor("EF21", std::move(inner)), sender_(*this, "state_sender"), receiver_(*this, "state_receiver") {
  check_inner_decode(*inner_, "ef21");
}

std::string EF21::spec() const { return "ef21(" + inner_->spec() + ")"; }

Payload EF21::encode(const at::Tensor& x, const CodecContext& ctx) {
  if (!ctx.training) return inner_->encode(x, ctx);
  const at::ScalarType acc = accumulation_type(x.scalar_type());
  at::Tensor a = sender_.get(x.sizes(), acc, x.device());                // A (sender copy)
  Payload p = inner_->encode((x.to(acc) - a).to(x.scalar_type()), ctx);  // C(x - A)
  a.add_(inner_->decode(p, ctx).to(acc));                                // A <- A + C(x - A)
  return p;
}

at::Tensor EF21::decode(const Payload& p, const CodecContext& ctx) {
  if (!ctx.training) return inner_->decode(p, ctx);
  at::Tensor c = inner_->decode(p, ctx);
  const at::ScalarType acc = accumulation_type(p.dtype);
  at::Tensor a = receiver_.get(p.shape, acc, c.device());  // A (receiver copy)
  a.add_(c.to(acc));
  return a.to(c.options().dtype(p.dtype), /*non_blocking=*/false, /*copy=*/true);
}

}  // namespace tl
