#include "compression/stateful/aqsgd.h"

#include <cctype>

#include "compression/codecs/common.h"
#include "compression/cuda/aqsgd_cuda.h"

namespace tl {

using stateful::accumulation_type;

namespace {
stateful::SampleCacheOptions side(stateful::SampleCacheOptions o, const char* suffix) {
  if (!o.file.empty()) o.file += suffix;
  return o;
}
bool is_spec_word(const std::string& w) {
  if (w.empty() || !(std::isalpha(static_cast<unsigned char>(w[0])) || w[0] == '_')) return false;
  for (char c : w)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
  return true;
}
const char* dtype_word(at::ScalarType t) { return t == at::kHalf ? "fp16" : t == at::kBFloat16 ? "bf16" : "fp32"; }

// Note [fused AQ-SGD passes]. On a CUDA float32 message whose cache rows are in memory on the same
// device, the ATen path's gather, subtraction, addition, cast and index_copy become two kernels
// (compression/cuda/aqsgd_*): the sender's x - m(id) in one pass, and m(id) <- m(id) + c in
// place in one (the receiver's also writes its output). They compute what the ATen path computes,
// in the same float32 operations and the same rounding to the cache's type, so the caches and the
// payloads are equal bit for bit (tests/compression/aqsgd_test.cpp, on the host through
// HostEmulationGuard). File-backed caches (host memory), float64 messages and caches on another
// device keep the ATen path. The inner codec runs between the two passes as before.
codec::gpu::CacheRows cache_rows(const at::Tensor& rows, const at::Tensor& ids_on_device, int64_t d) {
  return {rows.data_ptr(), codec::kernel_wire_type(rows.scalar_type()), d, ids_on_device.data_ptr<int64_t>(),
          ids_on_device.numel()};
}

// m(ids) <- m(ids) + c, and out = the new m(ids) when given: the kernel, or its logic on the host.
void update_rows(const at::Tensor& c, const codec::gpu::CacheRows& m, float* out) {
  if (c.is_cuda())
    codec::gpu::aqsgd_update_cuda(c.get_device(), c.data_ptr<float>(), m, out);
  else
    codec::gpu::aqsgd_update_host(c.data_ptr<float>(), m, out);
}
}  // namespace

AqSgd::AqSgd(CompressorPtr inner, Options opt) : WrappingCompressor("AqSgd", std::move(inner)), opt_(std::move(opt)) {
  TORCH_CHECK(opt_.warmup_epochs >= 0, "aqsgd: warmup must be >= 0 epochs, got ", opt_.warmup_epochs);
  TORCH_CHECK(!inner_->decode_has_state(), "aqsgd: the inner codec '", inner_->spec(),
              "' keeps receiver state in decode(); aqsgd decodes its own payload on the sender. Use a stateless "
              "inner codec (quant, topk, ...)");
  sender_ = std::make_unique<stateful::SampleCache>(*this, "cache_sender", side(opt_.cache, ".sender"), "aqsgd");
  receiver_ = std::make_unique<stateful::SampleCache>(*this, "cache_receiver", side(opt_.cache, ".receiver"), "aqsgd");
}

std::string AqSgd::spec() const {
  std::string s = "aqsgd(" + inner_->spec();
  if (opt_.warmup_epochs != 1) s += ", warmup=" + std::to_string(opt_.warmup_epochs);
  if (opt_.cache.capacity > 0) s += ", capacity=" + std::to_string(opt_.cache.capacity);
  if (opt_.cache.dtype != at::kFloat) s += std::string(", cache=") + dtype_word(opt_.cache.dtype);
  // Spec words cannot hold '/': a file given as a path (C++ API) is left out of the spec string.
  if (!opt_.cache.file.empty() && is_spec_word(opt_.cache.file)) s += ", file=" + opt_.cache.file;
  return s + ")";
}

Payload AqSgd::raw_payload(const at::Tensor& x) {
  Payload p;
  p.codec = codec_id("aqsgd");
  p.dtype = x.scalar_type();
  p.shape = x.sizes().vec();
  BodyWriter w;
  w.put(x);
  p.body = w.finish();
  return p;
}

bool AqSgd::is_raw(const Payload& p) { return p.codec == codec_id("aqsgd"); }

at::Tensor AqSgd::decode_raw(const Payload& p) {
  TORCH_CHECK(is_raw(p), "aqsgd: expected a raw payload, got one from codec '", codec_name(p.codec), "'");
  TORCH_CHECK(p.params.empty(), "aqsgd: corrupt raw payload: expected no parameters, got ", p.params.size());
  TORCH_CHECK(at::isFloatingType(p.dtype), "aqsgd: corrupt raw payload: dtype ", p.dtype, " is not floating point");
  BodyReader r(p, "aqsgd");
  at::Tensor t = r.take(p.dtype, p.numel());
  r.finish();
  return t.view(p.shape).clone();
}

Payload AqSgd::encode(const at::Tensor& x, const CodecContext& ctx) {
  if (!ctx.training) return inner_->encode(x, ctx);
  TORCH_CHECK(x.dim() >= 1, "aqsgd: the message must have a batch dimension (one row per sample), got a scalar");
  const int64_t batch = x.size(0);
  at::Tensor ids = stateful::checked_sample_ids(ctx, batch, "aqsgd");
  if (ctx.epoch < opt_.warmup_epochs || !sender_->all_seen(ids)) {
    sender_->set(ids, x.reshape({batch, -1}));  // m(id) <- x
    return raw_payload(x);
  }
  const at::ScalarType acc = accumulation_type(x.scalar_type());
  const int64_t d = batch > 0 ? x.numel() / batch : 0;
  if (x.scalar_type() == at::kFloat && codec::use_fused_kernel(x)) {
    at::Tensor rows = sender_->rows_in_place(ids, d, x.device());  // (N, D)
    if (rows.defined()) {
      // Note [fused AQ-SGD passes].
      at::Tensor ids_d = ids.to(x.device()).contiguous(), xc = x.contiguous();  // (B), (B, ...)
      const codec::gpu::CacheRows m = cache_rows(rows, ids_d, d);
      at::Tensor delta = at::empty_like(xc);  // x - m(id)
      if (xc.is_cuda())
        codec::gpu::aqsgd_delta_cuda(xc.get_device(), xc.data_ptr<float>(), m, delta.data_ptr<float>());
      else
        codec::gpu::aqsgd_delta_host(xc.data_ptr<float>(), m, delta.data_ptr<float>());
      Payload p = inner_->encode(delta, ctx);
      update_rows(inner_->decode(p, ctx).to(at::kFloat).contiguous(), m, nullptr);
      return p;
    }
  }
  at::Tensor m = sender_->gather(ids, d, acc, x.device()).view(x.sizes());  // m(id)
  Payload p = inner_->encode((x.to(acc) - m).to(x.scalar_type()), ctx);     // C(x - m)
  at::Tensor c = inner_->decode(p, ctx).to(acc);
  sender_->set(ids, (m + c).reshape({batch, -1}));  // m(id) <- m(id) + C(x - m)
  return p;
}

at::Tensor AqSgd::decode(const Payload& p, const CodecContext& ctx) {
  if (!ctx.training) {
    TORCH_CHECK(!is_raw(p),
                "aqsgd: got a raw (training warm-up) payload while decoding in eval mode: sender and "
                "receiver disagree on CodecContext::training");
    return inner_->decode(p, ctx);
  }
  TORCH_CHECK(!p.shape.empty(), "aqsgd: the message must have a batch dimension, got a scalar payload");
  const int64_t batch = p.shape[0];
  at::Tensor ids = stateful::checked_sample_ids(ctx, batch, "aqsgd");
  if (is_raw(p)) {
    at::Tensor x = decode_raw(p);
    receiver_->set(ids, x.reshape({batch, -1}));
    return x;
  }
  TORCH_CHECK(receiver_->all_seen(ids),
              "aqsgd: received a delta for samples the receiver cache has never seen: "
              "sender and receiver caches diverged (restore both ends from the same checkpoint)");
  at::Tensor c = inner_->decode(p, ctx);
  const at::ScalarType acc = accumulation_type(p.dtype);
  const int64_t d = batch > 0 ? c.numel() / batch : 0;
  if (p.dtype == at::kFloat && codec::use_fused_kernel(c)) {
    at::Tensor rows = receiver_->rows_in_place(ids, d, c.device());  // (N, D)
    if (rows.defined()) {
      // Note [fused AQ-SGD passes].
      at::Tensor ids_d = ids.to(c.device()).contiguous(), cf = c.to(at::kFloat).contiguous();  // (B), (B, ...)
      at::Tensor out = at::empty_like(cf);                                                     // the new m(id)
      update_rows(cf, cache_rows(rows, ids_d, d), out.data_ptr<float>());
      return out;
    }
  }
  at::Tensor m = receiver_->gather(ids, d, acc, c.device()).view(c.sizes()) + c.to(acc);
  at::Tensor stored = m.to(opt_.cache.dtype);  // what the cache holds (rounded like the sender's)
  receiver_->set(ids, stored.reshape({batch, -1}));
  return stored.to(p.dtype);
}

Payload AqSgd::encode_shared(const at::Tensor& g, const Payload& fwd, const CodecContext& ctx) {
  if (is_raw(fwd)) return raw_payload(g);
  return inner_->encode_shared(g, fwd, ctx);
}

at::Tensor AqSgd::decode_shared(const Payload& p, const Payload& fwd, const CodecContext& ctx) {
  if (is_raw(fwd)) return decode_raw(p);
  return inner_->decode_shared(p, fwd, ctx);
}

}  // namespace tl
