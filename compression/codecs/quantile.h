#pragma once
// Non-uniform, distribution-aware quantisation with a quantile codebook (as hivemind's
// Quantile8BitQuantization, and with fewer bits). With L = 2^bits:
//   codewords c_i = the (i + 0.5) / L quantiles of x, or of an evenly strided sample of `sample`
//   of its elements; each x gets the code of its nearest codeword (ties: the lower one);
//   centers=mean (default, as hivemind) then replaces each codeword by the mean of the x it got
//   (codewords nobody got stay the quantile), centers=quantile keeps the quantiles.
// Payload: params = {bits, sample, centers (0 quantile, 1 mean), codebook type}
//          body   = [L codewords][ceil(n * bits / 8) code bytes]

#include "compression/compressor.h"
#include "compression/spec.h"

namespace tl {

struct QuantileOptions {
  int64_t bits = 8;
  int64_t sample = 65536;  // elements the quantiles are taken from (at most 2^24)
  bool mean_centers = true;
  at::ScalarType codebook = at::kFloat;
};

class QuantileCodec : public Compressor {
 public:
  explicit QuantileCodec(QuantileOptions o);
  static CompressorPtr from_spec(SpecArgs& args);

  std::string spec() const override;
  Payload encode(const at::Tensor& x, const CodecContext& ctx) override;
  at::Tensor decode(const Payload& p, const CodecContext& ctx) override;

 private:
  at::Tensor encode_cpu(const at::Tensor& xf) const;       // xf: (n) float32 on the CPU -> body
  at::Tensor encode_portable(const at::Tensor& xf) const;  // any device
  QuantileOptions o_;
};

}  // namespace tl
