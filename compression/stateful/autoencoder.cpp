#include "compression/stateful/autoencoder.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "autograd/ops.h"
#include "compression/stateful/common.h"

namespace tl {

namespace {
const char* layout_word(Autoencoder::Layout l) {
  return l == Autoencoder::Layout::Last ? "last" : l == Autoencoder::Layout::Channel ? "channel" : "auto";
}
}  // namespace

Autoencoder::Autoencoder(Options opt) : Compressor("Autoencoder"), opt_(std::move(opt)) {
  TORCH_CHECK(opt_.d_code >= 1, "ae: the code width d_code must be >= 1, got ", opt_.d_code);
  TORCH_CHECK(opt_.d >= 0, "ae: the input width d must be >= 0 (0: from the first input), got ", opt_.d);
  TORCH_CHECK(opt_.d_code <= stateful::kMaxWidth && opt_.d <= stateful::kMaxWidth, "ae: d_code=", opt_.d_code,
              ", d=", opt_.d, " is too large; accepted: up to ", stateful::kMaxWidth);
  wire_ = opt_.wire ? opt_.wire : parse_compressor("identity");
  TORCH_CHECK(!wire_->has_transform(), "ae: the wire codec '", wire_->spec(), "' cannot itself be ae or subspace");
  register_module("wire", wire_);
  w_enc_ = register_parameter("encoder", at::zeros({opt_.d_code, 0}));
  w_dec_ = register_parameter("decoder", at::zeros({0, opt_.d_code}));
  mark_resizable("encoder");
  mark_resizable("decoder");
  if (opt_.d > 0) materialize(opt_.d, at::kCPU, at::kFloat);
}

std::string Autoencoder::spec() const {
  std::string s = "ae(" + std::to_string(opt_.d_code);
  if (opt_.d > 0) s += ", d=" + std::to_string(opt_.d);
  if (opt_.layout != Layout::Auto) s += std::string(", layout=") + layout_word(opt_.layout);
  if (opt_.wire) s += ", wire=" + opt_.wire->spec();
  if (opt_.seed != 0) s += ", seed=" + std::to_string(opt_.seed);
  return s + ")";
}

void Autoencoder::materialize(int64_t d, at::Device device, at::ScalarType dtype) {
  if (w_enc_.data().size(1) == d && w_enc_.numel() > 0) return;
  TORCH_CHECK(w_enc_.numel() == 0, "ae: the weights were made for input width ", w_enc_.data().size(1),
              " but the input now has width ", d, " (", opt_.layout == Layout::Auto ? "layout=auto" : "",
              "); one ae codec serves one boundary shape");
  TORCH_CHECK(opt_.d == 0 || opt_.d == d, "ae: declared d=", opt_.d, " but the input has width ", d);
  TORCH_CHECK(d <= stateful::kMaxWidth && d * opt_.d_code <= stateful::kMaxTableElements, "ae: input width d=", d,
              " with d_code=", opt_.d_code, " is too large; accepted: d up to ", stateful::kMaxWidth,
              " and weights of d x d_code up to ", stateful::kMaxTableElements, " elements");
  // Xavier-uniform: U(-b, b), b = sqrt(6 / (fan_in + fan_out)); the same bound for both matrices.
  const double bound = std::sqrt(6.0 / static_cast<double>(d + opt_.d_code));
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(opt_.seed);
  at::Tensor enc = at::empty({opt_.d_code, d}, at::kFloat).uniform_(-bound, bound, gen);
  at::Tensor dec = at::empty({d, opt_.d_code}, at::kFloat).uniform_(-bound, bound, gen);
  at::ScalarType t = at::isFloatingType(dtype) ? dtype : at::kFloat;
  w_enc_.set_data(enc.to(device, t));
  w_dec_.set_data(dec.to(device, t));
}

bool Autoencoder::channel_layout(const Variable& t) const {
  if (opt_.layout == Layout::Channel) {
    TORCH_CHECK(t.dim() == 4, "ae(layout=channel): expects (B, C, H, W) activations, got shape ", t.sizes());
    return true;
  }
  return opt_.layout == Layout::Auto && t.dim() == 4;
}

Variable Autoencoder::pre(const Variable& h, const CodecContext& ctx) {
  TORCH_CHECK(h.dim() >= 1, "ae: cannot encode a scalar");
  const bool ch = channel_layout(h);
  materialize(ch ? h.size(1) : h.size(-1), h.device(), h.scalar_type());
  if (!ch) return linear(h, w_enc_);  // (..., d) -> (..., d_code)
  // (B, C, H, W) -> (B, H, W, C) -> (B, H, W, d_code) -> (B, d_code, H, W)
  return permute(linear(permute(h, {0, 2, 3, 1}), w_enc_), {0, 3, 1, 2});
}

Variable Autoencoder::post(const Variable& z, const CodecContext& ctx) {
  TORCH_CHECK(w_dec_.numel() > 0, "ae: post() before pre(): the weights do not exist yet (give d=...)");
  if (!channel_layout(z)) return linear(z, w_dec_);  // (..., d_code) -> (..., d)
  return permute(linear(permute(z, {0, 2, 3, 1}), w_dec_), {0, 3, 1, 2});
}

int64_t Autoencoder::feature_dim(const at::Tensor& t) const {
  const bool ch = opt_.layout == Layout::Channel || (opt_.layout == Layout::Auto && t.dim() == 4);
  return ch ? 1 : t.dim() - 1;
}

Payload Autoencoder::encode(const at::Tensor& z, const CodecContext& ctx) {
  TORCH_CHECK(z.dim() >= 1 && z.size(feature_dim(z)) == opt_.d_code, "ae: encode() sends the code (width ", opt_.d_code,
              " on dim ", z.dim() >= 1 ? feature_dim(z) : 0, "), got shape ", z.sizes(),
              "; use ae as a Boundary's forward codec, which applies the encoder (pre) first");
  return wire_->encode(z, ctx);
}

at::Tensor Autoencoder::decode(const Payload& p, const CodecContext& ctx) { return wire_->decode(p, ctx); }

}  // namespace tl
