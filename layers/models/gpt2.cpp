#include "layers/models/gpt2.h"

#include <cmath>

namespace tl {

GPT2::GPT2(const GPT2Config& c, const init::Generator& gen) : Module("GPT2"), config_(c) {
  TORCH_CHECK(c.vocab_size > 0 && c.n_positions > 0 && c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0 &&
                  c.n_embd % c.n_head == 0,
              "GPT2: sizes must be positive and n_embd (", c.n_embd, ") a multiple of n_head (", c.n_head,
              "); got vocab ", c.vocab_size, ", positions ", c.n_positions, ", layers ", c.n_layer);
  wte_ = register_module("wte", std::make_shared<Embedding>(c.vocab_size, c.n_embd, -1, gen));
  wpe_ = register_module("wpe", std::make_shared<Embedding>(c.n_positions, c.n_embd, -1, gen));
  drop_ = register_module("drop", std::make_shared<Dropout>(c.dropout, gen));
  auto h = register_module("h", std::make_shared<Sequential>());
  const auto block_opts = TransformerBlockOptions(c.n_embd, c.n_head)
                              .norm(NormPlacement::Pre)
                              .fused_qkv(true)
                              .causal(true)
                              .activation("gelu_tanh")
                              .norm_eps(c.layer_norm_eps)
                              .dropout(c.dropout)
                              .attention_dropout(c.dropout);
  for (int64_t i = 0; i < c.n_layer; ++i)
    blocks_.push_back(h->push_back(std::make_shared<TransformerBlock>(block_opts, gen)));
  ln_f_ = register_module("ln_f", std::make_shared<LayerNorm>(c.n_embd, c.layer_norm_eps));

  // GPT-2 initialisation (replaces the layer defaults drawn above).
  const double residual_std = c.init_std / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  auto init_linear = [&](const std::shared_ptr<Linear>& l, double std) {
    init::normal_(l->weight().data(), 0.0, std, gen);
    l->bias().data().zero_();
  };
  init::normal_(wte_->weight().data(), 0.0, c.init_std, gen);
  init::normal_(wpe_->weight().data(), 0.0, c.init_std, gen);
  for (auto& block : blocks_) {
    init_linear(block->attn()->qkv(), c.init_std);
    init_linear(block->attn()->out(), residual_std);
    init_linear(block->mlp()->fc(), c.init_std);
    init_linear(block->mlp()->proj(), residual_std);
  }

  // Segments: embeddings, one per block, then ln_f and the tied output projection.
  auto wte = wte_, wpe = wpe_;
  auto drop = drop_;
  auto table = input_table_;
  const int64_t n_positions = c.n_positions;
  segments_.push_back(
      {"embed", {{"wte", wte}, {"wpe", wpe}, {"drop", drop}}, [wte, wpe, drop, table, n_positions](const Variable& ids, const StageInputs&) {
         const at::Tensor& t = ids.data();
         TORCH_CHECK(t.dim() == 2 && (t.scalar_type() == at::kLong || t.scalar_type() == at::kInt),
                     "GPT2: token ids must be int64 (B, T), got ", t.scalar_type(), " ", t.sizes());
         TORCH_CHECK(t.size(1) <= n_positions, "GPT2: sequence length ", t.size(1),
                     " exceeds the context n_positions = ", n_positions);
         at::Tensor pos = at::arange(t.size(1), t.options().dtype(at::kLong));  // (T)
         Variable h = wte->forward(t) + wpe->forward(pos);                       // (B, T, C) + (T, C)
         if (table->defined()) h = h + Variable(table->index_select(0, t.reshape({-1})).view(h.sizes()));
         return drop->forward(h);
       }});
  for (int64_t i = 0; i < c.n_layer; ++i) {
    auto block = blocks_[i];
    const std::string path = "h." + std::to_string(i);
    segments_.push_back({path, {{path, block}}, [block](const Variable& x, const StageInputs&) { return block->forward(x); }});
  }
  auto ln_f = ln_f_;
  segments_.push_back({"", {{"ln_f", ln_f}, {"wte", wte}}, [ln_f, wte](const Variable& x, const StageInputs&) {
                         return linear(ln_f->forward(x), wte->weight());  // (B, T, C) -> (B, T, V), tied
                       }});
}

Variable GPT2::forward(const at::Tensor& ids) { return run_segments(segments_, Variable(ids)); }

Variable GPT2::forward(const Variable& ids) { return run_segments(segments_, ids); }

Variable GPT2::forward(const Variable& ids, const StageInputs& inputs) { return run_segments(segments_, ids, inputs); }

void GPT2::set_input_token_embedding(const at::Tensor& table) {
  TORCH_CHECK(!table.defined() || (table.dim() == 2 && table.size(0) == config_.vocab_size &&
                                   table.size(1) == config_.n_embd),
              "GPT2: the input token table must be (vocab_size, n_embd) = (", config_.vocab_size, ", ",
              config_.n_embd, "), got ", table.sizes());
  *input_table_ = table;
}

std::vector<std::pair<Variable, int64_t>> GPT2::residual_writers(int64_t last_block) const {
  TORCH_CHECK(last_block < config_.n_layer, "GPT2: block ", last_block, " out of range (n_layer ", config_.n_layer, ")");
  std::vector<std::pair<Variable, int64_t>> out = {{wte_->weight(), 1}, {wpe_->weight(), 1}};
  for (int64_t i = 0; i <= last_block; ++i) {
    const auto& b = blocks_[i];
    for (const auto& l : {b->attn()->out(), b->mlp()->proj()}) {
      out.emplace_back(l->weight(), 0);
      out.emplace_back(l->bias(), 0);
    }
  }
  return out;
}

const std::shared_ptr<TransformerBlock>& GPT2::block(size_t i) const {
  TORCH_CHECK(i < blocks_.size(), "GPT2: block ", i, " out of range (n_layer ", blocks_.size(), ")");
  return blocks_[i];
}

}  // namespace tl
