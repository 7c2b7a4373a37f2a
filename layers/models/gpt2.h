#pragma once
// GPT-2: token + learned position embeddings, pre-LN transformer blocks with causal fused-qkv
// attention and a gelu_tanh MLP, a final LayerNorm, and an output projection tied to the token
// embedding (logits = h wte^T).
//
// Names: wte, wpe, drop, h.{i}.{ln1, attn.qkv, attn.out, ln2, mlp.fc, mlp.proj}, ln_f.
// Initialisation (as GPT-2 / Hugging Face): every Linear weight and both embeddings
// N(0, init_std), biases 0, LayerNorms 1/0, and the two projections that write into the
// residual stream (attn.out, mlp.proj) N(0, init_std / sqrt(2 * n_layer)).
//
// Cut points: "embed" (after the embeddings), then "h.0" .. "h.{n_layer-1}" (after each block).
//
// forward() reads as the model does: embed, every block, head. A pipeline stage runs the same
// methods, one segment per cut point (layers/models/splittable.h); the segments call the model,
// so it must outlive its stages (a Pipeline holds it).

#include "layers/models/splittable.h"
#include "layers/nn/activation.h"
#include "layers/nn/embedding.h"
#include "layers/nn/norm.h"
#include "layers/nn/sequential.h"
#include "layers/nn/transformer.h"

namespace tl {

struct GPT2Config {
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;  // context length
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_inner = 0;  // MLP width (0: 4 * n_embd)
  double dropout = 0.1;  // embedding, attention-probability and residual dropout
  double layer_norm_eps = 1e-5;
  double init_std = 0.02;
};

class GPT2 : public Module, public Splittable {
 public:
  /// `build`: the stages to construct (Note [building only some stages]); every module is
  /// initialised from init::fork(gen, its path).
  explicit GPT2(const GPT2Config& config, const init::Generator& gen = std::nullopt, const StageSelection& build = {});

  /// ids (B, T) int64, T <= n_positions -> logits (B, T, vocab_size): head(blocks(embed(ids))).
  Variable forward(const at::Tensor& ids);
  /// The same, with the ids carried by a Variable (pipeline stage 0 input).
  Variable forward(const Variable& ids) override { return forward(ids.data()); }
  /// The pipeline form; GPT-2 reads no side inputs.
  Variable forward(const Variable& ids, const StageInputs&) { return forward(ids.data()); }

  /// ids (B, T) -> (B, T, C): wte[ids] + wpe[0 .. T) (+ the input token table), dropout. Segment "embed".
  Variable embed(const at::Tensor& ids) const;
  /// Block i: (B, T, C) -> (B, T, C). Segment "h.i".
  Variable run_block(int64_t i, const Variable& x) const;
  /// ln_f, then the output projection tied to wte: (B, T, C) -> (B, T, vocab_size). The last segment.
  Variable head(const Variable& x) const;

  std::vector<std::string> cut_points() const override { return segment_cut_points(segments_); }
  std::vector<ModulePtr> split(const std::vector<std::string>& cuts) override {
    return split_segments("GPT2", segments_, cuts);
  }

  /// Adds a frozen (vocab_size, n_embd) table to the input embedding: h0 = wte[tok] + wpe[pos] +
  /// table[tok] (Protocol Models' fixed token embedding, shared with the subspace codecs; set once
  /// before training, on the model's device). Undefined removes it.
  void set_input_token_embedding(const at::Tensor& table);
  /// The weights that write into the residual stream up to and including block `last_block`
  /// (-1: the embeddings only), each with its dimension of size n_embd: wte and wpe (dim 1), and
  /// every block's attn.out and mlp.proj weight and bias (dim 0); of a model built in part, those it
  /// holds.
  std::vector<std::pair<Variable, int64_t>> residual_writers(int64_t last_block) const;

  const GPT2Config& config() const { return config_; }
  const std::shared_ptr<Embedding>& wte() const { return wte_; }
  const std::shared_ptr<Embedding>& wpe() const { return wpe_; }
  const std::shared_ptr<TransformerBlock>& block(size_t i) const;
  const std::shared_ptr<LayerNorm>& ln_f() const { return ln_f_; }

 private:
  /// The segments of this model's cut points; `built` as StageSelection::built gives it.
  std::vector<Segment> make_segments(const std::vector<bool>& built);

  GPT2Config config_;
  std::shared_ptr<Embedding> wte_, wpe_;
  std::shared_ptr<Dropout> drop_;
  std::vector<std::shared_ptr<TransformerBlock>> blocks_;
  std::shared_ptr<LayerNorm> ln_f_;
  at::Tensor input_table_;  // (vocab_size, n_embd) or undefined
  std::vector<Segment> segments_;
};

}  // namespace tl
