#pragma once
// Lab 2: your own compressor. SignCompressor sends one bit per entry (its sign) and one float
// scale per sample (row of dim 0):
//
//   encode:  s_r = mean_j |x_rj|        (fp32, one per row r)
//            b_rj = 1 if x_rj >= 0 else 0 (packed 8 per byte with pack_bits(codes, 1))
//   decode:  x^_rj = s_r * (2 b_rj - 1)
//
// Why the mean of |x|: for a fixed sign pattern, ||x_r - s sign(x_r)||^2 = ||x_r||^2
// - 2 s sum_j |x_rj| + n s^2 is smallest at s = sum_j |x_rj| / n. For Gaussian entries the
// relative error ||x - x^|| / ||x|| is then sqrt(1 - 2/pi) ~ 0.60 whatever the size.
//
// Wire format (payload.h): codec "sign", the original dtype and shape, no params; body = the
// rows' scales (rows x fp32) followed by the packed sign bits (ceil(numel / 8) bytes). Rows: the
// size of dim 0 for a tensor of 2 or more dims; a 0-d or 1-d tensor is one row.
//
// The skeleton (labs/lab2/skeleton/sign_compressor.cpp) leaves encode and decode to you; the
// solution is in labs/lab2/solution/. The same test (labs/lab2/sign_compressor_test.cpp) checks both.

#include "compression/compressor.h"

namespace tl::lab2 {

class SignCompressor : public Compressor {
 public:
  /// Registers the codec (register_sign_compressor) on first use.
  SignCompressor();
  std::string spec() const override { return "sign"; }
  Payload encode(const at::Tensor& x, const CodecContext& ctx) override;
  at::Tensor decode(const Payload& p, const CodecContext& ctx) override;
};

/// Rows of a tensor of this shape: the size of dim 0, or 1 for a 0-d or 1-d tensor.
int64_t sign_rows(at::IntArrayRef shape);

/// Registers the spec name "sign" (so `sign` works in boundary specs and parse_compressor) and
/// its payload codec id. Safe to call more than once.
void register_sign_compressor();

}  // namespace tl::lab2
