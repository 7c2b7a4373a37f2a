#pragma once
// Uniform quantisation to 1..8 bits, bit-packed.
//
// Scale groups: one per tensor; one per channel (dim `dim`; auto: dim 1 for tensors of 4 or more
// dims, (B, C, H, W), else the last dim, (..., hidden)); or one per block of `block`
// consecutive elements of the flattened tensor.
// Modes, per group:
//   maxabs (AQ-SGD, exactly):  s = max|x|;  q = clip(round(x / (s + 1e-6) * 2^(b-1)), -2^(b-1), 2^(b-1) - 1),
//                              stored as q + 2^(b-1);  x^ = q / 2^(b-1) * s
//   minmax (2^b levels):       step = (hi - lo) / (2^b - 1);  q = clip(round((x - lo) / step), 0, 2^b - 1);
//                              x^ = lo + q * step
// round=nearest rounds half to even; round=stochastic uses floor(v + u), u ~ U[0, 1) (24 bits, from
// a counter hash of a per-call seed drawn from the codec's generator on the CPU path, from ATen's
// generator on the portable path), which is unbiased inside the clipping range up to float
// rounding (below 2^-16 of a step). The scales go on the wire in `scales` type (fp16 by
// default), rounded outward (s, hi up; lo down) so every x stays inside its group's range; both
// ends then use the same rounded scales, so the error stays within half a step (maxabs: except
// at x near +s, where the formula clips to 2^(b-1) - 1, one step below). A zero scale goes on the
// wire as +0 whatever the signs of the zeros it came from, so a group of zeros (+0 or -0) has
// codes 2^(b-1) (maxabs) or 0 (minmax) and decodes to +0 (Note [zero scales] in quant_logic.h).
//
// Payload: params = {bits, scale (0 tensor, 1 channel, 2 block), mode (0 maxabs, 1 minmax),
//                    round (0 nearest, 1 stochastic), channel dim or -1, block or 0, scale type}
//          body   = [scales: G (maxabs) or 2G (minmax: G lows then G highs) values][ceil(n * b / 8) code bytes]

#include "compression/compressor.h"
#include "compression/spec.h"
#include "layers/nn/rng.h"

namespace tl {

struct QuantOptions {
  enum class Scale { kTensor = 0, kChannel = 1, kBlock = 2 };
  enum class Mode { kMaxAbs = 0, kMinMax = 1 };
  int64_t bits = 8;
  Scale scale = Scale::kTensor;
  std::optional<int64_t> dim;  // channel dim; none: auto
  int64_t block = 256;
  Mode mode = Mode::kMaxAbs;
  bool stochastic = false;
  at::ScalarType scale_type = at::kHalf;
  uint64_t seed = 0;  // stochastic rounding
};

class Quantize : public Compressor {
 public:
  explicit Quantize(QuantOptions o);
  static CompressorPtr from_spec(SpecArgs& args);

  std::string spec() const override;
  Payload encode(const at::Tensor& x, const CodecContext& ctx) override;
  at::Tensor decode(const Payload& p, const CodecContext& ctx) override;
  /// With the fused kernels (CUDA tensors, or their host logic under HostEmulationGuard) the
  /// residual is written by the quantising kernel itself; bit for bit x - decode(payload).
  Payload encode_with_residual(const at::Tensor& x, const CodecContext& ctx, at::Tensor* residual) override;
  /// encode for a float32 CPU tensor on the fast path whose per-group min and max (G floats each,
  /// as the CPU path's own pass finds them: several groups, NaN skipped) the caller already has:
  /// the same payload as encode (hadquant's rotation finds them while each tile is in registers).
  Payload encode_with_minmax(const at::Tensor& x, const float* mn, const float* mx, const CodecContext& ctx);
  const QuantOptions& options() const { return o_; }
  /// Exact: the header, the G (maxabs) or 2G (minmax) scales and ceil(n * bits / 8) code bytes.
  PayloadSize payload_size(const std::vector<int64_t>& shape, at::ScalarType dtype) const override;

  /// The channel dim used for a tensor of `ndim` dims (scale=channel).
  int64_t channel_dim(int64_t ndim) const;

 private:
  Payload encode_impl(const at::Tensor& x, const CodecContext& ctx, at::Tensor* residual,
                      const float* given_mn = nullptr, const float* given_mx = nullptr);

  QuantOptions o_;
  BufferedGenerator generator_;  // stochastic rounding: a CPU generator, its state the buffer "generator"
};

}  // namespace tl
