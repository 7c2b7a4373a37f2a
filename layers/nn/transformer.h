#pragma once
// Position-wise MLP and the transformer block in its two classic forms:
//   pre-LN (GPT-2):  x = x + drop(attn(ln1(x)));  x = x + drop(mlp(ln2(x)))
//   post-LN (BERT):  x = ln1(x + drop(attn(x)));  x = ln2(x + drop(mlp(x)))

#include "layers/module.h"
#include "layers/nn/activation.h"
#include "layers/nn/attention.h"
#include "layers/nn/init.h"
#include "layers/nn/linear.h"
#include "layers/nn/tensor_parallel.h"
#include "layers/nn/norm.h"

namespace tl {

/// fc (C -> hidden, column-parallel), activation, proj (hidden -> C, row-parallel). Children: fc,
/// act, proj.
class MLP : public Module {
 public:
  /// activation: "gelu" (erf), "gelu_tanh" (GPT-2's gelu_new) or "relu".
  MLP(int64_t dim, int64_t hidden, const std::string& activation = "gelu", bool bias = true,
      const init::Generator& gen = std::nullopt);
  /// x (..., C) -> (..., C)
  Variable forward(const Variable& x) override;

  /// Keeps this tensor-parallel rank's hidden units (Note [tensor-parallel blocks]).
  void shard(const TensorParallelPtr& tp, const std::string& site);

  const std::shared_ptr<ColumnParallelLinear>& fc() const { return fc_; }
  const std::shared_ptr<RowParallelLinear>& proj() const { return proj_; }

 private:
  std::shared_ptr<ColumnParallelLinear> fc_;
  ModulePtr act_;
  std::shared_ptr<RowParallelLinear> proj_;
};

enum class NormPlacement { Pre, Post };

struct TransformerBlockOptions {
  TransformerBlockOptions(int64_t dim, int64_t num_heads) : dim_(dim), num_heads_(num_heads) {}
  // clang-format off
  TransformerBlockOptions& hidden(int64_t h) { hidden_ = h; return *this; }  // 0: 4 * dim
  TransformerBlockOptions& norm(NormPlacement p) { norm_ = p; return *this; }
  TransformerBlockOptions& fused_qkv(bool on) { fused_qkv_ = on; return *this; }
  TransformerBlockOptions& causal(bool on) { causal_ = on; return *this; }
  TransformerBlockOptions& activation(const std::string& a) { activation_ = a; return *this; }
  TransformerBlockOptions& norm_eps(double e) { norm_eps_ = e; return *this; }
  /// Dropout after the attention output and the MLP output (residual dropout).
  TransformerBlockOptions& dropout(double p) { dropout_ = p; return *this; }
  TransformerBlockOptions& attention_dropout(double p) { attention_dropout_ = p; return *this; }
  // clang-format on

  int64_t dim_, num_heads_, hidden_ = 0;
  NormPlacement norm_ = NormPlacement::Pre;
  bool fused_qkv_ = true, causal_ = false;
  std::string activation_ = "gelu";
  double norm_eps_ = 1e-5, dropout_ = 0.0, attention_dropout_ = 0.0;
};

/// Children: ln1, attn, ln2, mlp, drop (ln1 normalises around the attention, ln2 around the MLP,
/// in both placements).
class TransformerBlock : public Module {
 public:
  explicit TransformerBlock(const TransformerBlockOptions& options, const init::Generator& gen = std::nullopt);
  /// x (B, T, C) -> (B, T, C)
  Variable forward(const Variable& x) override { return forward(x, at::Tensor()); }
  /// key_padding_mask: bool (B, T), true = padding (see MultiHeadAttention).
  Variable forward(const Variable& x, const at::Tensor& key_padding_mask);

  const TransformerBlockOptions& options() const { return options_; }
  const std::shared_ptr<LayerNorm>& ln1() const { return ln1_; }
  const std::shared_ptr<LayerNorm>& ln2() const { return ln2_; }
  const std::shared_ptr<MultiHeadAttention>& attn() const { return attn_; }
  const std::shared_ptr<MLP>& mlp() const { return mlp_; }

 private:
  TransformerBlockOptions options_;
  std::shared_ptr<LayerNorm> ln1_, ln2_;
  std::shared_ptr<MultiHeadAttention> attn_;
  std::shared_ptr<MLP> mlp_;
  std::shared_ptr<Dropout> drop_;
};

}  // namespace tl
