// MultiHeadAttention, MLP and TransformerBlock.
#include "layers/nn/transformer.h"

namespace tl {

// ---- MultiHeadAttention -------------------------------------------------------------------------
MultiHeadAttention::MultiHeadAttention(const AttentionOptions& o, const init::Generator& gen)
    : Module("MultiHeadAttention"), options_(o), local_heads_(o.num_heads_) {
  TORCH_CHECK(o.embed_dim_ > 0 && o.num_heads_ > 0 && o.embed_dim_ % o.num_heads_ == 0,
              "MultiHeadAttention: embed_dim (", o.embed_dim_, ") must be a positive multiple of num_heads (",
              o.num_heads_, ")");
  TORCH_CHECK(o.dropout_ >= 0.0 && o.dropout_ < 1.0, "MultiHeadAttention: dropout must be in [0, 1), got ", o.dropout_);
  const int64_t c = o.embed_dim_;
  if (o.fused_qkv_) {  // rows [q; k; v]: three blocks, each split by heads
    qkv_ = register_module("qkv", std::make_shared<ColumnParallelLinear>(c, 3 * c, o.bias_, gen, /*groups=*/3));
  } else {
    query_ = register_module("query", std::make_shared<ColumnParallelLinear>(c, c, o.bias_, gen));
    key_ = register_module("key", std::make_shared<ColumnParallelLinear>(c, c, o.bias_, gen));
    value_ = register_module("value", std::make_shared<ColumnParallelLinear>(c, c, o.bias_, gen));
  }
  out_ = register_module("out", std::make_shared<RowParallelLinear>(c, c, o.bias_, gen));
  if (o.dropout_ > 0.0) dropout_rng_ = DropoutRng(gen, *this);
}

void MultiHeadAttention::shard(const TensorParallelPtr& tp, const std::string& site) {
  TORCH_CHECK(!out_->is_split(), site, ": already split over tensor-parallel ranks");
  const int64_t n = tp->size(), r = tp->rank();
  TORCH_CHECK(options_.num_heads_ % n == 0, site, ": ", options_.num_heads_, " heads do not split over ", n,
              " tensor-parallel ranks");
  // This rank's heads: their rows of the projections (of each third of a fused [q; k; v]), and the
  // matching input columns of out.
  for (const auto& l : {qkv_, query_, key_, value_})
    if (l) l->split(tp, site);
  out_->split(tp, site);
  local_heads_ = options_.num_heads_ / n;
  if (dropout_rng_.has_stream()) dropout_rng_.fork_for_rank(r);  // Note [tensor-parallel blocks]
  tp->add_site(site);
}

Variable MultiHeadAttention::forward(const Variable& x, const at::Tensor& key_padding_mask) {
  const int64_t c = options_.embed_dim_, h = local_heads_, d = c / options_.num_heads_;
  TORCH_CHECK(x.dim() == 3 && x.size(2) == c, "MultiHeadAttention(", c, ", heads ", options_.num_heads_,
              "): input must be (B, T, ", c, "), got ", x.sizes());
  const int64_t b = x.size(0), t = x.size(1);

  // Each (B, H, T, D), H this rank's heads (Note [tensor-parallel blocks]).
  Variable q, k, v;
  if (qkv_) {
    // (B, T, 3C) -> (B, T, 3, H, D) -> (3, B, H, T, D): rows of the fused weight are [q; k; v].
    Variable qkv = permute(view(qkv_->forward(x), {b, t, 3, h, d}), {2, 0, 3, 1, 4});
    variable_list parts = chunk(qkv, 3, 0);
    q = squeeze(parts[0], 0);
    k = squeeze(parts[1], 0);
    v = squeeze(parts[2], 0);
  } else {
    const Variable xc = query_->copy_input(x);  // one f for the three projections
    auto heads = [&](const std::shared_ptr<ColumnParallelLinear>& proj) {  // (B, T, C) -> (B, H, T, D)
      return transpose(view(proj->forward_copied(xc), {b, t, h, d}), 1, 2);
    };
    q = heads(query_);
    k = heads(key_);
    v = heads(value_);
  }

  at::Tensor mask;  // bool, true = attend, broadcast to (B, H, T, T)
  bool causal = options_.causal_;
  if (key_padding_mask.defined()) {
    TORCH_CHECK(key_padding_mask.scalar_type() == at::kBool && key_padding_mask.dim() == 2 &&
                    key_padding_mask.size(0) == b && key_padding_mask.size(1) == t,
                "MultiHeadAttention: key_padding_mask must be bool (B, T) = (", b, ", ", t,
                ") with true at padding, got ", key_padding_mask.scalar_type(), " ", key_padding_mask.sizes());
    mask = key_padding_mask.logical_not().view({b, 1, 1, t});
    if (causal) {  // one boolean mask carrying both constraints
      mask = mask.logical_and(at::ones({t, t}, mask.options()).tril());
      causal = false;
    }
  }
  const double p = is_training() ? options_.dropout_ : 0.0;
  const std::optional<at::Generator> drop_gen = p > 0.0 ? dropout_rng_.generator_for(x.device()) : std::nullopt;
  Variable y = scaled_dot_product_attention(q, k, v, mask, causal, p, drop_gen);  // (B, H, T, D)
  if (p > 0.0) dropout_rng_.commit();
  y = reshape(transpose(y, 1, 2), {b, t, h * d});  // (B, T, C), or this rank's (B, T, C / T)
  return out_->forward(y);
}

// ---- MLP ----------------------------------------------------------------------------------------
MLP::MLP(int64_t dim, int64_t hidden, const std::string& activation, bool bias, const init::Generator& gen)
    : Module("MLP") {
  fc_ = register_module("fc", std::make_shared<ColumnParallelLinear>(dim, hidden, bias, gen));
  if (activation == "gelu") {
    act_ = std::make_shared<GELU>("none");
  } else if (activation == "gelu_tanh") {
    act_ = std::make_shared<GELU>("tanh");
  } else if (activation == "relu") {
    act_ = std::make_shared<ReLU>();
  } else {
    TORCH_CHECK(false, "MLP: unknown activation '", activation, "'; known: gelu, gelu_tanh, relu");
  }
  register_module("act", act_);
  proj_ = register_module("proj", std::make_shared<RowParallelLinear>(hidden, dim, bias, gen));
}

void MLP::shard(const TensorParallelPtr& tp, const std::string& site) {
  TORCH_CHECK(!proj_->is_split(), site, ": already split over tensor-parallel ranks");
  fc_->split(tp, site);    // this rank's hidden units
  proj_->split(tp, site);  // their input columns
  tp->add_site(site);
}

Variable MLP::forward(const Variable& x) {
  // (..., C) -> (..., F), or this rank's (..., F / T) -> (..., C) (Note [tensor-parallel blocks])
  return proj_->forward(act_->forward(fc_->forward(x)));
}

// ---- TransformerBlock ---------------------------------------------------------------------------
TransformerBlock::TransformerBlock(const TransformerBlockOptions& o, const init::Generator& gen)
    : Module("TransformerBlock"), options_(o) {
  const int64_t hidden = o.hidden_ > 0 ? o.hidden_ : 4 * o.dim_;
  auto attn_opts =
      AttentionOptions(o.dim_, o.num_heads_).fused_qkv(o.fused_qkv_).causal(o.causal_).dropout(o.attention_dropout_);
  const bool pre = o.norm_ == NormPlacement::Pre;
  // Registration order follows the data flow of each form (it orders named_parameters()).
  if (pre) ln1_ = register_module("ln1", std::make_shared<LayerNorm>(o.dim_, o.norm_eps_));
  attn_ = register_module("attn", std::make_shared<MultiHeadAttention>(attn_opts, gen));
  if (!pre) ln1_ = register_module("ln1", std::make_shared<LayerNorm>(o.dim_, o.norm_eps_));
  if (pre) ln2_ = register_module("ln2", std::make_shared<LayerNorm>(o.dim_, o.norm_eps_));
  mlp_ = register_module("mlp", std::make_shared<MLP>(o.dim_, hidden, o.activation_, true, gen));
  if (!pre) ln2_ = register_module("ln2", std::make_shared<LayerNorm>(o.dim_, o.norm_eps_));
  drop_ = register_module("drop", std::make_shared<Dropout>(o.dropout_, gen));
}

Variable TransformerBlock::forward(const Variable& x, const at::Tensor& key_padding_mask) {
  if (options_.norm_ == NormPlacement::Pre) {
    Variable y = x + drop_->forward(attn_->forward(ln1_->forward(x), key_padding_mask));
    return y + drop_->forward(mlp_->forward(ln2_->forward(y)));
  }
  Variable y = ln1_->forward(x + drop_->forward(attn_->forward(x, key_padding_mask)));
  return ln2_->forward(y + drop_->forward(mlp_->forward(y)));
}

}  // namespace tl
