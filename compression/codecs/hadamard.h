#pragma once
// Hadamard-rotated tile quantisation (TAH-Quant; the rotation of QuaRot): the last (hidden) dim
// is cut into tiles of `tile` elements (a power of two), each tile is rotated by the randomised
// Hadamard transform R = H diag(s) / sqrt(t), then quantised max-abs to `bits` bits with one
// scale per tile (quant's max-abs formula, quant(bits, scale=block, block=t) on the rotated
// tensor, scales fp16 by default). The receiver dequantises and applies R^-1 = diag(s) H / sqrt(t).
// The signs s (+-1, t of them, shared by every tile) are a hash of `seed`, which both ends know
// from the spec; they are not sent.
//
// Note [hadamard tiles]. A tensor of shape (..., D) is viewed as (rows, D). The tile actually
// used is t = min(tile, the smallest power of two >= D), so a narrow tensor is not padded to a
// wide tile. When D is not a multiple of t, each row is zero-padded to D' = ceil(D / t) * t
// before the rotation; the padded positions rotate into real values, so their codes are sent
// (the receiver drops them after the inverse rotation). 0-D and 1-D tensors are one row.
// The rotation spreads an outlier over its whole tile, which shrinks the tile's max-abs scale
// relative to its typical value: on heavy-tailed activations the error is well below plain
// per-tile quantisation at the same bits (tests/compression/hadamard_test.cpp measures it).
//
// Payload: params = {bits, tile (as configured), seed, scale type}
//          body   = [G scales][ceil(rows * D' * bits / 8) code bytes], G = max(rows * D' / t, 1)
// so nbytes = 16 + 8 * (ndim + 4) + G * scale bytes + ceil(rows * D' * bits / 8).
//
// Gradient: like quant, hadquant has no shared mode; a Boundary passes the gradient straight
// through, compresses it independently (any backward spec, hadquant included) or sends none.

#include "compression/codecs/quant.h"
#include "compression/compressor.h"
#include "compression/spec.h"

namespace tl {

struct HadamardQuantOptions {
  int64_t bits = 4;
  int64_t tile = 128;
  uint64_t seed = 0;
  at::ScalarType scale_type = at::kHalf;
};

class HadamardQuant : public Compressor {
 public:
  explicit HadamardQuant(HadamardQuantOptions o);
  static CompressorPtr from_spec(SpecArgs& args);

  std::string spec() const override;
  Payload encode(const at::Tensor& x, const CodecContext& ctx) override;
  at::Tensor decode(const Payload& p, const CodecContext& ctx) override;
  const HadamardQuantOptions& options() const { return o_; }
  /// Exact (the nbytes formula above).
  PayloadSize payload_size(const std::vector<int64_t>& shape, at::ScalarType dtype) const override;

 private:
  HadamardQuantOptions o_;
  std::shared_ptr<Quantize> quant_;  // quant(bits, scale=block, block=tile): codes and scales of the rotated tiles
};

namespace codec {

/// Whether the rotation may use AVX-512 registers where the CPU has them (Note [butterflies in
/// AVX-512 registers], hadamard.cpp; default true); the AVX2 form otherwise. Returns the previous
/// setting (for tests of both).
bool set_hadamard_avx512(bool on);
/// The tile used for rows of D elements (Note [hadamard tiles]): min(tile, smallest power of two >= D).
int64_t hadamard_tile(int64_t tile, int64_t D);
/// The t pseudo-random signs (+-1) of `seed` (Note [hadamard signs]: a hash of the index and the
/// seed, the same on every device), in `options`' dtype and on its device.
at::Tensor hadamard_signs(int64_t t, uint64_t seed, const at::TensorOptions& options);
/// y = H diag(s) x / sqrt(t) on each row of x (M, t), t = signs.numel() a power of two: the fast
/// Walsh-Hadamard transform, log2(t) stages of ATen adds and subtracts, in x's dtype.
at::Tensor hadamard_rotate(const at::Tensor& x, const at::Tensor& signs);
/// The inverse: x = diag(s) H y / sqrt(t).
at::Tensor hadamard_unrotate(const at::Tensor& y, const at::Tensor& signs);

}  // namespace codec
}  // namespace tl
