#pragma once
// Low rank: one PowerSGD step of rank r (Vogels et al.; Optimus-CC's compressed backpropagation).
// The tensor is viewed as a matrix M (rows x cols): cols = the product of the dims from `dim` on
// (default -1: the last dim, (tokens x hidden)), rows = the rest. With Q (cols x r) warm-started
// from the previous call (a registered, resizable buffer `q`; first call: seeded Gaussian):
//   P = M Q;  P = orth(P) (reduced QR);  Q = M^T P;  send P and Q;  receiver: M^ = P Q^T.
// r is min(rank, rows, cols) (a rank-r factorisation of a smaller matrix is the matrix itself).
// If rank(M) <= r the result is exact after one step (P then spans M's columns, and P P^T M = M).
// The receiver keeps no state.
//
// Plain payload:  params = {0, r, rows, cols, dim, value type}, sections P (rows, r), Q (cols, r).
// Shared payload (backward mode `shared`, projection on the forward basis P):
//                 params = {1, value type}, section Q_g = G^T P (cols, r); receiver: P Q_g^T.

#include "compression/codecs/sectioned.h"
#include "compression/spec.h"

namespace tl {

struct PowerSgdOptions {
  int64_t rank = 4;
  int64_t dim = -1;
  at::ScalarType values = at::kFloat;
  uint64_t seed = 0;
};

class PowerSgd : public SectionedCodec {
 public:
  explicit PowerSgd(PowerSgdOptions o);
  static CompressorPtr from_spec(SpecArgs& args);

  const char* codec() const override { return "powersgd"; }
  std::string spec() const override;

  TL_SECTIONED_CODEC_PARTS;

  TL_SECTIONED_CODEC_SHARED_PARTS;
  /// Exact: P (rows, r) and Q (cols, r), or Q_g (cols, r) in shared mode.
  SizedParts size_parts(const std::vector<int64_t>& shape, at::ScalarType dtype) const override;
  SizedParts size_shared_parts(const std::vector<int64_t>& shape, at::ScalarType dtype) const override;
  bool shared_uses_forward_values() const override { return true; }

  /// The warm-start Q (cols x r) after the last encode (empty before the first).
  const at::Tensor& warm_start() const { return q_.data(); }

 private:
  struct Layout {
    int64_t r, rows, cols, dim;
    at::ScalarType wire;
  };
  Layout layout(const Payload& rest) const;

  PowerSgdOptions o_;
  Variable q_;
};

}  // namespace tl
