#pragma once
// Learned autoencoder boundary (Bian et al., MLSys 2024): a linear encoder W_e (d_code x d) on the
// sender and a linear decoder W_d (d x d_code) on the receiver, no bias, no nonlinearity,
// Xavier-uniform init, trained jointly with the model (both are parameters of this codec, hence of
// the Boundary, hence of the stage that owns it).
//
//   pre(h)  = W_e h   on the feature dimension: the last dim of (..., d) activations
//             (layout=last), or the channel dim of (B, C, H, W) activations (layout=channel);
//             layout=auto (default) picks channel for 4-D inputs and last otherwise.
//   wire    = the code z (d_code wide), packed by the wire codec (wire=SPEC, e.g. wire=fp16 or
//             wire=quant(8)); raw values (the identity codec) by default.
//   post(z) = W_d z   on the same dimension.
//
// Its gradient crosses the wire d_code wide, so backward is compressed by construction; a
// Boundary's backward codec, if any, applies to that d_code-wide gradient.
// With d=0 (the default) the weights are created at the first forward from the input's width (then
// build the optimizer after one forward, or give d=...); they are resizable, so a checkpoint also
// restores an AE that has not run yet.

#include <cstdint>

#include "compression/stateful/common.h"

namespace tl {

class Autoencoder : public Compressor {
 public:
  enum class Layout { Auto, Last, Channel };
  struct Options {
    int64_t d_code = 0;
    int64_t d = 0;  // input width; 0: from the first input
    Layout layout = Layout::Auto;
    CompressorPtr wire;  // null: raw values
    uint64_t seed = 0;   // Xavier init
  };
  explicit Autoencoder(Options opt);

  std::string spec() const override;
  bool has_transform() const override { return true; }
  Variable pre(const Variable& h, const CodecContext& ctx) override;
  Variable post(const Variable& z, const CodecContext& ctx) override;
  Payload encode(const at::Tensor& z, const CodecContext& ctx) override;
  at::Tensor decode(const Payload& p, const CodecContext& ctx) override;

  const Variable& encoder_weight() const { return w_enc_; }  // (d_code, d)
  const Variable& decoder_weight() const { return w_dec_; }  // (d, d_code)
  /// Creates the weights for input width d (no-op when they exist with that width).
  void materialize(int64_t d, at::Device device, at::ScalarType dtype);

 private:
  bool channel_layout(const Variable& t) const;
  int64_t feature_dim(const at::Tensor& t) const;
  Options opt_;
  CompressorPtr wire_;
  Variable w_enc_, w_dec_;
};

}  // namespace tl
