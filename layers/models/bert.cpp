#include "layers/models/bert.h"

namespace tl {

namespace {
void check_ids(const at::Tensor& t, const char* what, const at::Tensor& ids) {
  TORCH_CHECK(t.dim() == 2 && (t.scalar_type() == at::kLong || t.scalar_type() == at::kInt), "Bert: ", what,
              " must be int64 (B, T), got ", t.scalar_type(), " ", t.sizes());
  TORCH_CHECK(!ids.defined() || t.sizes().equals(ids.sizes()), "Bert: ", what, " shape ", t.sizes(),
              " differs from the token ids' ", ids.sizes());
}

}  // namespace

Variable masked_mean(const Variable& h, const at::Tensor& attention_mask) {
  if (!attention_mask.defined()) return mean(h, {1}, false);  // (B, C)
  TORCH_CHECK(h.dim() == 3 && attention_mask.dim() == 2 && h.size(0) == attention_mask.size(0) &&
                  h.size(1) == attention_mask.size(1),
              "masked_mean: expected hidden (B, T, C) and attention_mask (B, T), got ", h.sizes(), " and ",
              attention_mask.sizes());
  const at::Tensor m = attention_mask.to(h.data().scalar_type()).unsqueeze(-1);  // (B, T, 1)
  const at::Tensor count = m.sum(1).clamp_min(1.0);                               // (B, 1): counts are whole
  return div(sum(mul(h, Variable(m)), {1}, false), Variable(count));             // (B, C)
}

// ---- embeddings ---------------------------------------------------------------------------------
BertEmbeddings::BertEmbeddings(const BertConfig& c, const init::Generator& gen) : Module("BertEmbeddings") {
  word_ = register_module("word", std::make_shared<Embedding>(c.vocab_size, c.hidden_size, c.pad_token_id, gen));
  position_ =
      register_module("position", std::make_shared<Embedding>(c.max_position_embeddings, c.hidden_size, -1, gen));
  token_type_ = register_module("token_type", std::make_shared<Embedding>(c.type_vocab_size, c.hidden_size, -1, gen));
  norm_ = register_module("norm", std::make_shared<LayerNorm>(c.hidden_size, c.layer_norm_eps));
  drop_ = register_module("drop", std::make_shared<Dropout>(c.hidden_dropout, gen));
}

Variable BertEmbeddings::forward(const at::Tensor& ids, const at::Tensor& token_type_ids) {
  check_ids(ids, "token ids", at::Tensor());
  const int64_t t = ids.size(1);
  TORCH_CHECK(t <= position_->num_embeddings(), "Bert: sequence length ", t,
              " exceeds max_position_embeddings = ", position_->num_embeddings());
  at::Tensor pos = at::arange(t, ids.options().dtype(at::kLong));  // (T)
  Variable x = word_->forward(ids) + position_->forward(pos);      // (B, T, C) + (T, C)
  if (token_type_ids.defined()) {
    check_ids(token_type_ids, "token_type_ids", ids);
    x = x + token_type_->forward(token_type_ids);
  } else {
    x = x + token_type_->forward(at::zeros({t}, ids.options().dtype(at::kLong)));  // type 0 everywhere
  }
  return drop_->forward(norm_->forward(x));
}

// ---- model --------------------------------------------------------------------------------------
Bert::Bert(const BertConfig& c, const init::Generator& gen, const StageSelection& build) : Module("Bert"), config_(c) {
  TORCH_CHECK(c.hidden_size > 0 && c.num_attention_heads > 0 && c.hidden_size % c.num_attention_heads == 0 &&
                  c.num_hidden_layers > 0 && c.intermediate_size > 0,
              "Bert: hidden_size (", c.hidden_size, ") must be a positive multiple of num_attention_heads (",
              c.num_attention_heads, "), with positive num_hidden_layers (", c.num_hidden_layers,
              ") and intermediate_size (", c.intermediate_size, ")");
  TORCH_CHECK(c.pooling == "cls" || c.pooling == "mean", "Bert: pooling = '", c.pooling,
              "' is not accepted; accepted: cls, mean");
  TORCH_CHECK(c.num_labels == 0 || c.add_pooler || c.pooling == "mean", "Bert: a classifier (num_labels = ",
              c.num_labels, ") on the [CLS] token needs the pooler (add_pooler = true) or pooling = mean");
  TORCH_CHECK(build.is_whole() || gen, "Bert: building some stages needs a generator (Note [initialisation by name])");
  // Segments: embeddings, one per layer, then the head.
  std::vector<std::string> ends = {"embeddings"};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) ends.push_back("layers." + std::to_string(i));
  ends.push_back("");
  const std::vector<bool> built = build.built("Bert", ends);

  // Every module is built with, then given Hugging Face's initialisation (N(0, initializer_range)
  // weights, zero biases) from, its own generator (Note [initialisation by name]).
  const double std = c.initializer_range;
  auto init_linear = [&](const std::shared_ptr<Linear>& l, const init::Generator& g) {
    init::normal_(l->weight().data(), 0.0, std, g);
    l->bias().data().zero_();
  };
  if (built.front()) {
    const init::Generator g = init::fork(gen, "embeddings");
    embeddings_ = register_module("embeddings", std::make_shared<BertEmbeddings>(c, g));
    init::normal_(embeddings_->word()->weight().data(), 0.0, std, g);
    if (c.pad_token_id >= 0) embeddings_->word()->weight().data()[c.pad_token_id].zero_();
    init::normal_(embeddings_->position()->weight().data(), 0.0, std, g);
    init::normal_(embeddings_->token_type()->weight().data(), 0.0, std, g);
  }

  const auto opts = TransformerBlockOptions(c.hidden_size, c.num_attention_heads)
                        .hidden(c.intermediate_size)
                        .norm(NormPlacement::Post)
                        .fused_qkv(false)
                        .causal(false)
                        .activation(c.hidden_act)
                        .norm_eps(c.layer_norm_eps)
                        .dropout(c.hidden_dropout)
                        .attention_dropout(c.attention_dropout);
  std::shared_ptr<Sequential> layers;
  layers_.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string path = "layers." + std::to_string(i);
    if (!built[static_cast<size_t>(i) + 1]) continue;
    if (!layers) layers = register_module("layers", std::make_shared<Sequential>());
    const init::Generator g = init::fork(gen, path);
    auto layer = std::make_shared<TransformerBlock>(opts, g);
    const auto& attn = layer->attn();
    for (const std::shared_ptr<Linear>& l : std::initializer_list<std::shared_ptr<Linear>>{
             attn->query(), attn->key(), attn->value(), attn->out(), layer->mlp()->fc(), layer->mlp()->proj()})
      init_linear(l, g);
    layers->push_back(std::to_string(i), layer);
    layers_[static_cast<size_t>(i)] = layer;
  }

  if (built.back()) {
    if (c.add_pooler && c.pooling == "cls") {
      const init::Generator g = init::fork(gen, "pooler");
      pooler_ = register_module("pooler", std::make_shared<Linear>(c.hidden_size, c.hidden_size, true, g));
      init_linear(pooler_, g);
    }
    drop_ = register_module("drop", std::make_shared<Dropout>(c.hidden_dropout, init::fork(gen, "drop")));
    if (c.num_labels > 0) {
      const init::Generator g = init::fork(gen, "classifier");
      classifier_ = register_module("classifier", std::make_shared<Linear>(c.hidden_size, c.num_labels, true, g));
      init_linear(classifier_, g);
    }
  }
  segments_ = make_segments(built);
}

at::Tensor Bert::key_padding_mask(const at::Tensor& attention_mask, const at::Tensor& ids) {
  if (!attention_mask.defined()) return {};
  TORCH_CHECK(attention_mask.dim() == 2 && (!ids.defined() || attention_mask.sizes().equals(ids.sizes())),
              "Bert: attention_mask must be (B, T) like the token ids ",
              ids.defined() ? ids.sizes() : at::IntArrayRef(), ", got ", attention_mask.sizes());
  return attention_mask.scalar_type() == at::kBool ? attention_mask.logical_not() : attention_mask.eq(0);
}

// ---- the forward pass -----------------------------------------------------------------------------

BertOutput Bert::forward(const at::Tensor& ids, const at::Tensor& attention_mask, const at::Tensor& token_type_ids) {
  const at::Tensor kpm = key_padding_mask(attention_mask, ids);
  BertOutput out;
  out.hidden = embed(ids, token_type_ids);  // (B, T, C)
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) out.hidden = run_layer(i, out.hidden, kpm);
  head(out, attention_mask);  // pooled (B, C), logits (B, num_labels)
  return out;
}

Variable Bert::embed(const at::Tensor& ids, const at::Tensor& token_type_ids) const {
  check_segment_built(embeddings_ != nullptr, "Bert", "embeddings");
  return embeddings_->forward(ids, token_type_ids);
}

Variable Bert::run_layer(int64_t i, const Variable& x, const at::Tensor& key_padding_mask) const {
  TORCH_CHECK(i >= 0 && i < config_.num_hidden_layers, "Bert: layer ", i, " out of range (",
              config_.num_hidden_layers, " layers)");
  const auto& layer = layers_[static_cast<size_t>(i)];
  check_segment_built(layer != nullptr, "Bert", "layers." + std::to_string(i));
  return layer->forward(x, key_padding_mask);
}

void Bert::head(BertOutput& out, const at::Tensor& attention_mask) const {
  check_segment_built(drop_ != nullptr, "Bert", "");
  if (config_.pooling == "mean") {
    out.pooled = masked_mean(out.hidden, attention_mask);  // (B, C)
  } else {
    if (!pooler_) return;
    Variable first = squeeze(narrow(out.hidden, 1, 0, 1), 1);  // (B, C): the [CLS] position
    out.pooled = tanh(pooler_->forward(first));
  }
  if (classifier_) out.logits = classifier_->forward(drop_->forward(out.pooled));  // (B, num_labels)
}

// ---- the pipeline form ----------------------------------------------------------------------------

std::vector<Segment> Bert::make_segments(const std::vector<bool>& built) {
  std::vector<Segment> segments;
  auto add = [&](const std::string& end, std::vector<std::pair<std::string, ModulePtr>> modules, SegmentFn fn) {
    segments.push_back(segment_if_built(built[segments.size()], "Bert", end, std::move(modules), std::move(fn)));
  };
  add("embeddings", {{"embeddings", embeddings_}},
      [this](const Variable& ids, const StageInputs& in) { return embed(ids.data(), in.token_type_ids); });
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    const std::string path = "layers." + std::to_string(i);
    add(path, {{path, layers_[static_cast<size_t>(i)]}}, [this, i](const Variable& x, const StageInputs& in) {
      return run_layer(i, x, key_padding_mask(in.attention_mask, in.token_ids));
    });
  }
  // The attention mask and token types come with each micro-batch's StageInputs.
  std::vector<std::pair<std::string, ModulePtr>> head_modules;
  if (pooler_) head_modules.emplace_back("pooler", pooler_);
  if (classifier_) {
    head_modules.emplace_back("drop", drop_);
    head_modules.emplace_back("classifier", classifier_);
  }
  add("", head_modules, [this](const Variable& x, const StageInputs& in) {
    BertOutput out{x, {}, {}};
    head(out, in.attention_mask);
    return out.logits.defined() ? out.logits : out.pooled.defined() ? out.pooled : out.hidden;
  });
  return segments;
}

Variable Bert::forward(const Variable& ids, const StageInputs& inputs) { return run_segments(segments_, ids, inputs); }

const std::shared_ptr<TransformerBlock>& Bert::layer(size_t i) const {
  TORCH_CHECK(i < layers_.size(), "Bert: layer ", i, " out of range (", layers_.size(), " layers)");
  TORCH_CHECK(layers_[i], "Bert: layer ", i, " was not built in this process (Note [building only some stages])");
  return layers_[i];
}

}  // namespace tl
