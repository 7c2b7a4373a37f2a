#pragma once
// Multi-head self-attention over (B, T, C) sequences.

#include "layers/module.h"
#include "layers/nn/init.h"
#include "layers/nn/rng.h"
#include "layers/nn/tensor_parallel.h"

namespace tl {

struct AttentionOptions {
  AttentionOptions(int64_t embed_dim, int64_t num_heads) : embed_dim_(embed_dim), num_heads_(num_heads) {}
  // clang-format off
  /// One (3C, C) projection named "qkv" (GPT-2, torch.nn.MultiheadAttention's in_proj) or three
  /// (C, C) projections "query", "key", "value" (BERT).
  AttentionOptions& fused_qkv(bool on) { fused_qkv_ = on; return *this; }
  /// Query t attends only to keys <= t.
  AttentionOptions& causal(bool on) { causal_ = on; return *this; }
  /// Dropout on the attention probabilities (training only).
  AttentionOptions& dropout(double p) { dropout_ = p; return *this; }
  AttentionOptions& bias(bool on) { bias_ = on; return *this; }
  // clang-format on

  int64_t embed_dim_, num_heads_;
  bool fused_qkv_ = true, causal_ = false, bias_ = true;
  double dropout_ = 0.0;
};

/// softmax(q k^T / sqrt(D) + mask) v per head, heads concatenated, then the output projection
/// "out". Children: qkv | query, key, value (column-parallel); out (row-parallel). With attention dropout and a generator, the
/// dropout masks come from a stream forked off it after the projections' initialisation, whose
/// state is buffer "generator" (Note [generators per purpose], layers/nn/rng.h).
class MultiHeadAttention : public Module {
 public:
  explicit MultiHeadAttention(const AttentionOptions& options, const init::Generator& gen = std::nullopt);

  /// x (B, T, C) -> (B, T, C), every key visible (or causal).
  Variable forward(const Variable& x) override { return forward(x, at::Tensor()); }
  /// key_padding_mask: bool (B, T), true where the key is padding and must be ignored (as
  /// torch.nn.MultiheadAttention), or undefined. Combined with the causal mask when both apply.
  Variable forward(const Variable& x, const at::Tensor& key_padding_mask);

  /// Keeps this tensor-parallel rank's heads (Note [tensor-parallel blocks]); `site` names the
  /// sublayer's all-reduces. options() then describes the whole layer; local_heads() this rank's.
  void shard(const TensorParallelPtr& tp, const std::string& site);
  int64_t local_heads() const { return local_heads_; }

  const AttentionOptions& options() const { return options_; }
  /// The projections (qkv is null when not fused, query/key/value null when fused).
  const std::shared_ptr<ColumnParallelLinear>& qkv() const { return qkv_; }
  const std::shared_ptr<ColumnParallelLinear>& query() const { return query_; }
  const std::shared_ptr<ColumnParallelLinear>& key() const { return key_; }
  const std::shared_ptr<ColumnParallelLinear>& value() const { return value_; }
  const std::shared_ptr<RowParallelLinear>& out() const { return out_; }

 private:
  AttentionOptions options_;
  int64_t local_heads_;
  DropoutRng dropout_rng_;
  std::shared_ptr<ColumnParallelLinear> qkv_, query_, key_, value_;
  std::shared_ptr<RowParallelLinear> out_;
};

}  // namespace tl
