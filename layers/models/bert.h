#pragma once
// BERT-style encoder: word + position + token-type embeddings and a LayerNorm, post-LN
// transformer blocks with separate query/key/value projections and a gelu MLP, a pooler (tanh of
// a dense layer on the first token, or the masked mean of the tokens) and an optional
// sequence-classification head.
//
// Names: embeddings.{word, position, token_type, norm}, layers.{i}.{attn.query, attn.key,
// attn.value, attn.out, ln1, mlp.fc, mlp.proj, ln2}, pooler, classifier.
// Initialisation (as Hugging Face): Linear weights and embeddings N(0, initializer_range), biases
// 0, the padding row of the word embedding 0, LayerNorms 1/0.
//
// Cut points: "embeddings", then "layers.0" .. "layers.{n-1}" (after each block).
//
// forward() reads as the model does: embed, every layer, head. A pipeline stage runs the same
// methods, one segment per cut point; the segments call the model, so it must outlive its stages
// (a Pipeline holds it).

#include "layers/models/splittable.h"
#include "layers/nn/activation.h"
#include "layers/nn/embedding.h"
#include "layers/nn/linear.h"
#include "layers/nn/norm.h"
#include "layers/nn/sequential.h"
#include "layers/nn/transformer.h"

namespace tl {

struct BertConfig {
  int64_t vocab_size = 30522;
  int64_t hidden_size = 768;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t intermediate_size = 3072;
  int64_t max_position_embeddings = 512;
  int64_t type_vocab_size = 2;
  int64_t pad_token_id = 0;
  std::string hidden_act = "gelu";  // gelu (erf), gelu_tanh, relu
  double layer_norm_eps = 1e-12;
  double hidden_dropout = 0.1;
  double attention_dropout = 0.1;
  double initializer_range = 0.02;
  bool add_pooler = true;
  /// How the sentence vector is made: "cls" (BERT: tanh(pooler(h[:, 0])), needs add_pooler) or
  /// "mean" (sentence-transformers: the mean of the last hidden states over the tokens of the
  /// attention mask; no pooler is built, whatever add_pooler says).
  std::string pooling = "cls";
  int64_t num_labels = 0;  // > 0: a classifier (dropout, Linear) on the pooled output
};

/// Children: word, position, token_type, norm, drop.
class BertEmbeddings : public Module {
 public:
  BertEmbeddings(const BertConfig& config, const init::Generator& gen = std::nullopt);
  /// ids (B, T) int64, token_type_ids (B, T) int64 or undefined (all 0) -> (B, T, C)
  Variable forward(const at::Tensor& ids, const at::Tensor& token_type_ids);
  Variable forward(const Variable& ids) override { return forward(ids.data(), at::Tensor()); }

  const std::shared_ptr<Embedding>& word() const { return word_; }
  const std::shared_ptr<Embedding>& position() const { return position_; }
  const std::shared_ptr<Embedding>& token_type() const { return token_type_; }
  const std::shared_ptr<LayerNorm>& norm() const { return norm_; }

 private:
  std::shared_ptr<Embedding> word_, position_, token_type_;
  std::shared_ptr<LayerNorm> norm_;
  std::shared_ptr<Dropout> drop_;
};

struct BertOutput {
  Variable hidden;  // (B, T, C) last hidden states
  Variable pooled;  // (B, C), undefined without pooling (pooling "cls" without a pooler)
  Variable logits;  // (B, num_labels), undefined without classifier
};

/// The mean of hidden states (B, T, C) over the positions attention_mask (B, T) keeps (nonzero),
/// per sequence: (B, C); an all-masked row gives zeros. Undefined mask: the mean over T. The
/// classifier's `pooling = mean` head and sentence embeddings (pretrained.h) both use it.
Variable masked_mean(const Variable& hidden, const at::Tensor& attention_mask);

class Bert : public Module, public Splittable {
 public:
  /// `build`: the stages to construct (Note [building only some stages]); every module is
  /// initialised from init::fork(gen, its path).
  explicit Bert(const BertConfig& config, const init::Generator& gen = std::nullopt, const StageSelection& build = {});

  /// ids (B, T) int64; attention_mask (B, T), 1/true = token, 0/false = padding (Hugging Face
  /// convention; any dtype), or undefined (all tokens); token_type_ids (B, T) or undefined (0).
  BertOutput forward(const at::Tensor& ids, const at::Tensor& attention_mask = {},
                     const at::Tensor& token_type_ids = {});

  /// ids (B, T), token_type_ids (B, T) or undefined -> (B, T, C). Segment "embeddings".
  Variable embed(const at::Tensor& ids, const at::Tensor& token_type_ids) const;
  /// Layer i: (B, T, C) -> (B, T, C); key_padding_mask bool (B, T), true at padding, or
  /// undefined. Segment "layers.i".
  Variable run_layer(int64_t i, const Variable& x, const at::Tensor& key_padding_mask) const;
  /// The pooled output and the logits from out.hidden, as the config asks (the last segment);
  /// attention_mask as forward's.
  void head(BertOutput& out, const at::Tensor& attention_mask) const;

  /// The pipeline form, as split() stages run it: ids in, the side inputs (attention mask, token
  /// types) from `inputs`; the last segment returns logits (classifier), else the pooled output,
  /// else the hidden states. forward(ids) has no padding and token type 0.
  Variable forward(const Variable& ids, const StageInputs& inputs);
  Variable forward(const Variable& ids) override { return forward(ids, StageInputs{}); }

  std::vector<std::string> cut_points() const override { return segment_cut_points(segments_); }
  std::vector<ModulePtr> split(const std::vector<std::string>& cuts) override {
    return split_segments("Bert", segments_, cuts);
  }

  const BertConfig& config() const { return config_; }
  const std::shared_ptr<BertEmbeddings>& embeddings() const { return embeddings_; }
  const std::shared_ptr<TransformerBlock>& layer(size_t i) const;
  const std::shared_ptr<Linear>& pooler() const { return pooler_; }
  const std::shared_ptr<Linear>& classifier() const { return classifier_; }

 private:
  static at::Tensor key_padding_mask(const at::Tensor& attention_mask, const at::Tensor& ids);
  /// The segments of this model's cut points; `built` as StageSelection::built gives it.
  std::vector<Segment> make_segments(const std::vector<bool>& built);

  BertConfig config_;
  std::shared_ptr<BertEmbeddings> embeddings_;
  std::vector<std::shared_ptr<TransformerBlock>> layers_;
  std::shared_ptr<Linear> pooler_, classifier_;
  std::shared_ptr<Dropout> drop_;
  std::vector<Segment> segments_;
};

}  // namespace tl
