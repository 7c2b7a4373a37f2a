#include "layers/models/gpt2.h"

#include <cmath>

namespace tl {

GPT2::GPT2(const GPT2Config& c, const init::Generator& gen, const StageSelection& build)
    : Module("GPT2"), config_(c) {
  TORCH_CHECK(c.vocab_size > 0 && c.n_positions > 0 && c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0 &&
                  c.n_embd % c.n_head == 0,
              "GPT2: sizes must be positive and n_embd (", c.n_embd, ") a multiple of n_head (", c.n_head,
              "); got vocab ", c.vocab_size, ", positions ", c.n_positions, ", layers ", c.n_layer);
  TORCH_CHECK(build.is_whole() || gen, "GPT2: building some stages needs a generator (Note [initialisation by name])");
  // Segments: embeddings, one per block, then ln_f and the tied output projection.
  std::vector<std::string> ends = {"embed"};
  for (int64_t i = 0; i < c.n_layer; ++i) ends.push_back("h." + std::to_string(i));
  ends.push_back("");
  const std::vector<bool> built = build.built("GPT2", ends);

  // GPT-2 initialisation, replacing the layer defaults each module drew: N(0, init_std), the
  // residual projections N(0, init_std / sqrt(2 n_layer)), biases 0. Every module draws from its
  // own generator (Note [initialisation by name]).
  const double residual_std = c.init_std / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  auto embedding = [&](const std::string& name, int64_t rows) {
    const init::Generator g = init::fork(gen, name);
    auto e = register_module(name, std::make_shared<Embedding>(rows, c.n_embd, -1, g));
    init::normal_(e->weight().data(), 0.0, c.init_std, g);
    return e;
  };
  if (built.front() || built.back()) wte_ = embedding("wte", c.vocab_size);  // tied: first and last segment
  if (built.front()) {
    wpe_ = embedding("wpe", c.n_positions);
    drop_ = register_module("drop", std::make_shared<Dropout>(c.dropout, init::fork(gen, "drop")));
  }
  const auto block_opts = TransformerBlockOptions(c.n_embd, c.n_head).hidden(c.n_inner)
                              .norm(NormPlacement::Pre)
                              .fused_qkv(true)
                              .causal(true)
                              .activation("gelu_tanh")
                              .norm_eps(c.layer_norm_eps)
                              .dropout(c.dropout)
                              .attention_dropout(c.dropout);
  std::shared_ptr<Sequential> h;
  blocks_.resize(static_cast<size_t>(c.n_layer));
  for (int64_t i = 0; i < c.n_layer; ++i) {
    if (!built[static_cast<size_t>(i) + 1]) continue;
    if (!h) h = register_module("h", std::make_shared<Sequential>());
    const init::Generator g = init::fork(gen, "h." + std::to_string(i));
    auto block = std::make_shared<TransformerBlock>(block_opts, g);
    using Init = std::pair<std::shared_ptr<Linear>, double>;  // a projection and its std
    for (const auto& [l, sd] : {Init{block->attn()->qkv(), c.init_std}, Init{block->attn()->out(), residual_std},
                                 Init{block->mlp()->fc(), c.init_std}, Init{block->mlp()->proj(), residual_std}}) {
      init::normal_(l->weight().data(), 0.0, sd, g);
      l->bias().data().zero_();
    }
    h->push_back(std::to_string(i), block);
    blocks_[static_cast<size_t>(i)] = block;
  }
  if (built.back()) ln_f_ = register_module("ln_f", std::make_shared<LayerNorm>(c.n_embd, c.layer_norm_eps));
  segments_ = make_segments(built);
}

// ---- the forward pass -----------------------------------------------------------------------------

Variable GPT2::forward(const at::Tensor& ids) {
  Variable x = embed(ids);                                             // (B, T, C)
  for (int64_t i = 0; i < config_.n_layer; ++i) x = run_block(i, x);  // (B, T, C)
  return head(x);                                                      // (B, T, V)
}

Variable GPT2::embed(const at::Tensor& ids) const {
  check_segment_built(wpe_ != nullptr, "GPT2", "embed");
  TORCH_CHECK(ids.dim() == 2 && (ids.scalar_type() == at::kLong || ids.scalar_type() == at::kInt),
              "GPT2: token ids must be int64 (B, T), got ", ids.scalar_type(), " ", ids.sizes());
  TORCH_CHECK(ids.size(1) <= config_.n_positions, "GPT2: sequence length ", ids.size(1),
              " exceeds the context n_positions = ", config_.n_positions);
  const at::Tensor pos = at::arange(ids.size(1), ids.options().dtype(at::kLong));  // (T)
  Variable h = wte_->forward(ids) + wpe_->forward(pos);                           // (B, T, C) + (T, C)
  if (input_table_.defined()) h = h + Variable(input_table_.index_select(0, ids.reshape({-1})).view(h.sizes()));
  return drop_->forward(h);
}

Variable GPT2::run_block(int64_t i, const Variable& x) const {
  TORCH_CHECK(i >= 0 && i < config_.n_layer, "GPT2: block ", i, " out of range (n_layer ", config_.n_layer, ")");
  const auto& block = blocks_[static_cast<size_t>(i)];
  check_segment_built(block != nullptr, "GPT2", "h." + std::to_string(i));
  return block->forward(x);
}

Variable GPT2::head(const Variable& x) const {
  check_segment_built(ln_f_ != nullptr, "GPT2", "");
  return linear(ln_f_->forward(x), wte_->weight());  // (B, T, C) -> (B, T, V), tied
}

// ---- the pipeline form ----------------------------------------------------------------------------

std::vector<Segment> GPT2::make_segments(const std::vector<bool>& built) {
  std::vector<Segment> segments;
  auto add = [&](const std::string& end, std::vector<std::pair<std::string, ModulePtr>> modules, SegmentFn fn) {
    segments.push_back(segment_if_built(built[segments.size()], "GPT2", end, std::move(modules), std::move(fn)));
  };
  add("embed", {{"wte", wte_}, {"wpe", wpe_}, {"drop", drop_}},
      [this](const Variable& ids, const StageInputs&) { return embed(ids.data()); });
  for (int64_t i = 0; i < config_.n_layer; ++i) {
    const std::string path = "h." + std::to_string(i);
    add(path, {{path, blocks_[static_cast<size_t>(i)]}},
        [this, i](const Variable& x, const StageInputs&) { return run_block(i, x); });
  }
  add("", {{"ln_f", ln_f_}, {"wte", wte_}}, [this](const Variable& x, const StageInputs&) { return head(x); });
  return segments;
}

void GPT2::set_input_token_embedding(const at::Tensor& table) {
  TORCH_CHECK(!table.defined() || (table.dim() == 2 && table.size(0) == config_.vocab_size &&
                                   table.size(1) == config_.n_embd),
              "GPT2: the input token table must be (vocab_size, n_embd) = (", config_.vocab_size, ", ",
              config_.n_embd, "), got ", table.sizes());
  input_table_ = table;
}

std::vector<std::pair<Variable, int64_t>> GPT2::residual_writers(int64_t last_block) const {
  TORCH_CHECK(last_block < config_.n_layer, "GPT2: block ", last_block, " out of range (n_layer ", config_.n_layer, ")");
  // Only the modules built here (Note [building only some stages]); both holders of the tied wte
  // constrain it, so its copies stay equal.
  std::vector<std::pair<Variable, int64_t>> out;
  if (wte_) out.emplace_back(wte_->weight(), 1);
  if (wpe_) out.emplace_back(wpe_->weight(), 1);
  for (int64_t i = 0; i <= last_block; ++i) {
    const auto& b = blocks_[static_cast<size_t>(i)];
    if (!b) continue;  // another rank's (Note [building only some stages])
    for (const auto& l : {b->attn()->out(), b->mlp()->proj()}) {
      out.emplace_back(l->weight(), 0);
      out.emplace_back(l->bias(), 0);
    }
  }
  return out;
}

const std::shared_ptr<TransformerBlock>& GPT2::block(size_t i) const {
  TORCH_CHECK(i < blocks_.size(), "GPT2: block ", i, " out of range (n_layer ", blocks_.size(), ")");
  TORCH_CHECK(blocks_[i], "GPT2: block ", i, " was not built in this process (Note [building only some stages])");
  return blocks_[i];
}

}  // namespace tl
