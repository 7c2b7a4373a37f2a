#pragma once
// Subspace networks / Protocol Models (Ramasinghe et al., 2025).
//
// A fixed orthonormal basis U (d x k: the Q of the QR decomposition of a seeded Gaussian) and a
// fixed random token embedding T (V x d, N(0, token_std^2)), both frozen buffers generated from
// `seed`, so every boundary (and every stage's replica) built with the same seed has the same ones.
// The token ids of the micro-batch travel with every message (CodecContext::token_ids, (B, T)).
//
//   input:   h0 = E[tok] + T[tok]               (add_token_embedding(), called by the model)
//   pre(h)  = U^T (h - T[tok])                  (k values per token go on the wire)
//   post(c) = U c + T[tok]                      (each receiver re-adds T[tok])
//
// Forward is lossless when h - T[tok] lies in span(U), which holds when every weight writing into
// the residual stream is projected: W <- U U^T W for the attention output and MLP down projections
// (weight and bias) of the layers feeding a boundary, and the trainable (token and position)
// embeddings. project_weights() does this once; designate() registers weights that
// after_optimizer_step() projects after every optimizer step. Backward sends U^T dL/dh, k wide, by
// construction (the gradient of post).
// With vocab=0 there is no token embedding: pre(h) = U^T h, post(c) = U c.

#include <cstdint>
#include <utility>
#include <vector>

#include "compression/stateful/common.h"

namespace tl {

class Subspace : public Compressor {
 public:
  struct Options {
    int64_t k = 0;
    int64_t d = 0;      // hidden width; 0: from the first input
    int64_t vocab = 0;  // V; 0: no token embedding
    uint64_t seed = 0;
    double token_std = 0.02;
    CompressorPtr wire;  // null: raw values
  };
  explicit Subspace(Options opt);

  std::string spec() const override;
  bool has_transform() const override { return true; }
  Variable pre(const Variable& h, const CodecContext& ctx) override;
  Variable post(const Variable& c, const CodecContext& ctx) override;
  Payload encode(const at::Tensor& c, const CodecContext& ctx) override;
  at::Tensor decode(const Payload& p, const CodecContext& ctx) override;
  void after_optimizer_step() override;
  bool constrains_model() const override { return opt_.vocab > 0; }
  at::Tensor input_token_embedding(int64_t d) override;
  void constrain_residual_writers(const std::vector<std::pair<Variable, int64_t>>& weights) override;

  /// U (d, k) and T (V, d); generated here when d is declared and they are not yet (Note [subspace
  /// tables are lazy]); empty while d is unknown (no d= in the spec and no forward yet).
  const at::Tensor& basis() {
    materialize_declared();
    return basis_.data();
  }
  const at::Tensor& token_embedding() {
    materialize_declared();
    return tokens_.data();
  }
  /// Generates U and T for width d (no-op when they exist for d).
  void materialize(int64_t d);

  /// h + T[tok]: the frozen token embedding added to the model's input embedding.
  Variable add_token_embedding(const Variable& h, const at::Tensor& token_ids);
  /// W <- U U^T W on the dimension of size d: dim 0 for Linear weights (out, in) and biases (d)
  /// (also when in == d), dim 1 for embeddings (V, d). Ambiguous cases use project_weight.
  void project_weights(const std::vector<Variable>& weights);
  void project_weight(const Variable& w, int64_t dim);
  /// Weights that after_optimizer_step() projects (the dim as in project_weights); projects them now.
  void designate(const std::vector<Variable>& weights);

 private:
  at::Tensor token_rows(const at::Tensor& token_ids, const Variable& like, const char* where);
  void check_width(int64_t d) const;
  /// Generates U and T where d is declared in the spec (no-op otherwise, or when they exist).
  void materialize_declared() {
    if (opt_.d > 0) materialize(opt_.d);
  }
  /// Materialises when d is declared; otherwise fails naming `where` unless a forward did.
  void require_materialized(const char* where);
  Options opt_;
  CompressorPtr wire_;
  Variable basis_, tokens_;
  std::vector<std::pair<Variable, int64_t>> designated_;
};

}  // namespace tl
