#pragma once
// Reference models built from libtorch's torch::nn, with the same parameter names as tapeline's
// (so weights copy across by name): a CIFAR-style ResNet, GPT-2 with explicit attention and a
// BERT-style encoder with pooler and classifier.
// Used by the layer/model tests and by bench/bench_models.cpp.

#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

namespace tl::reference {

// ---- ResNet ---------------------------------------------------------------------------------------
struct BasicBlockImpl : torch::nn::Module {
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride)
      : conv1(torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)),
        bn1(out),
        conv2(torch::nn::Conv2dOptions(out, out, 3).padding(1).bias(false)),
        bn2(out) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
    if (stride != 1 || in != out) {
      downsample =
          torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
                                torch::nn::BatchNorm2d(out));
      register_module("downsample", downsample);
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = torch::relu(bn1(conv1(x)));
    y = bn2(conv2(y));
    return torch::relu(y + (downsample ? downsample->forward(x) : x));
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Sequential downsample{nullptr};
};
TORCH_MODULE(BasicBlock);

struct ResNetImpl : torch::nn::Module {
  ResNetImpl(const std::vector<int64_t>& blocks, const std::vector<int64_t>& widths, int64_t in_channels,
             int64_t num_classes)
      : conv1(torch::nn::Conv2dOptions(in_channels, widths[0], 3).padding(1).bias(false)), bn1(widths[0]) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    int64_t c = widths[0];
    for (size_t s = 0; s < blocks.size(); ++s) {
      torch::nn::Sequential layer;
      for (int64_t i = 0; i < blocks[s]; ++i) {
        layer->push_back(BasicBlock(c, widths[s], (s > 0 && i == 0) ? 2 : 1));
        c = widths[s];
      }
      layers.push_back(register_module("layer" + std::to_string(s + 1), layer));
    }
    fc = register_module("fc", torch::nn::Linear(c, num_classes));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn1(conv1(x)));
    for (auto& l : layers) x = l->forward(x);
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return fc(x);
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  std::vector<torch::nn::Sequential> layers;
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet);

// ---- GPT-2 ----------------------------------------------------------------------------------------
/// softmax(q k^T / sqrt(D) + mask) v, written out. q, k, v (B, H, T, D); attend: bool, true = keep.
inline torch::Tensor explicit_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                        const torch::Tensor& attend) {
  auto s = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));  // (B, H, T, T)
  if (attend.defined()) s = s.masked_fill(attend.logical_not(), -std::numeric_limits<float>::infinity());
  return torch::matmul(torch::softmax(s, -1), v);
}

/// GPT-2 style self-attention (fused qkv or separate q/k/v), explicit.
struct AttentionImpl : torch::nn::Module {
  AttentionImpl(int64_t dim, int64_t heads, bool fused, bool causal) : heads(heads), fused(fused), causal(causal) {
    if (fused) {
      qkv = register_module("qkv", torch::nn::Linear(dim, 3 * dim));
    } else {
      query = register_module("query", torch::nn::Linear(dim, dim));
      key = register_module("key", torch::nn::Linear(dim, dim));
      value = register_module("value", torch::nn::Linear(dim, dim));
    }
    out = register_module("out", torch::nn::Linear(dim, dim));
  }
  /// x (B, T, C); key_padding_mask bool (B, T) true = padding, or undefined.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& key_padding_mask = {}) {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2), d = c / heads;
    torch::Tensor q, k, v;
    if (fused) {
      auto parts = qkv(x).split(c, -1);
      q = parts[0], k = parts[1], v = parts[2];
    } else {
      q = query(x), k = key(x), v = value(x);
    }
    auto heads_of = [&](const torch::Tensor& y) { return y.view({b, t, heads, d}).transpose(1, 2); };
    torch::Tensor attend;
    if (causal) attend = torch::ones({t, t}, x.options().dtype(torch::kBool)).tril();
    if (key_padding_mask.defined()) {
      auto kp = key_padding_mask.logical_not().view({b, 1, 1, t});
      attend = attend.defined() ? attend.logical_and(kp) : kp;
    }
    auto y = explicit_attention(heads_of(q), heads_of(k), heads_of(v), attend);  // (B, H, T, D)
    return out(y.transpose(1, 2).reshape({b, t, c}));
  }
  int64_t heads;
  bool fused, causal;
  torch::nn::Linear qkv{nullptr}, query{nullptr}, key{nullptr}, value{nullptr}, out{nullptr};
};
TORCH_MODULE(Attention);

/// fc, gelu (erf or tanh), proj.
struct MLPImpl : torch::nn::Module {
  MLPImpl(int64_t dim, int64_t hidden, const std::string& approximate)
      : fc(register_module("fc", torch::nn::Linear(dim, hidden))),
        proj(register_module("proj", torch::nn::Linear(hidden, dim))),
        approximate(approximate) {}
  torch::Tensor forward(const torch::Tensor& x) { return proj(torch::gelu(fc(x), approximate)); }
  torch::nn::Linear fc, proj;
  std::string approximate;
};
TORCH_MODULE(MLP);

/// Pre-LN (GPT-2) or post-LN (BERT) transformer block, no dropout.
struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t dim, int64_t heads, int64_t hidden, bool pre, bool fused, bool causal,
            const std::string& approximate, double eps)
      : pre(pre),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim}).eps(eps)))),
        attn(register_module("attn", Attention(dim, heads, fused, causal))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim}).eps(eps)))),
        mlp(register_module("mlp", MLP(dim, hidden, approximate))) {}
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& key_padding_mask = {}) {
    if (pre) {
      auto y = x + attn(ln1(x), key_padding_mask);
      return y + mlp(ln2(y));
    }
    auto y = ln1(x + attn(x, key_padding_mask));
    return ln2(y + mlp(y));
  }
  bool pre;
  torch::nn::LayerNorm ln1;
  Attention attn;
  torch::nn::LayerNorm ln2;
  MLP mlp;
};
TORCH_MODULE(Block);

/// GPT-2 without dropout: embeddings, pre-LN causal blocks, ln_f, tied output projection.
struct GPT2Impl : torch::nn::Module {
  GPT2Impl(int64_t vocab, int64_t positions, int64_t dim, int64_t layers, int64_t heads)
      : wte(register_module("wte", torch::nn::Embedding(vocab, dim))),
        wpe(register_module("wpe", torch::nn::Embedding(positions, dim))),
        h(register_module("h", torch::nn::ModuleList())),
        ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))) {
    for (int64_t i = 0; i < layers; ++i) h->push_back(Block(dim, heads, 4 * dim, true, true, true, "tanh", 1e-5));
  }
  torch::Tensor forward(const torch::Tensor& ids) {  // (B, T) -> (B, T, V)
    auto x = wte(ids) + wpe(torch::arange(ids.size(1), ids.options()));
    for (auto& m : *h) x = m->as<Block>()->forward(x);
    return torch::nn::functional::linear(ln_f(x), wte->weight);
  }
  torch::nn::Embedding wte, wpe;
  torch::nn::ModuleList h;
  torch::nn::LayerNorm ln_f;
};
TORCH_MODULE(GPT2);

// ---- BERT -----------------------------------------------------------------------------------------
/// Sizes of the BERT reference (tapeline's BertConfig without the tapeline dependency).
struct BertSizes {
  int64_t vocab, positions, types, dim, layers, heads, hidden, labels;
  double eps = 1e-12;
};

/// word, position, token_type, norm (no dropout).
struct BertEmbeddingsImpl : torch::nn::Module {
  explicit BertEmbeddingsImpl(const BertSizes& c)
      : word(register_module("word", torch::nn::Embedding(c.vocab, c.dim))),
        position(register_module("position", torch::nn::Embedding(c.positions, c.dim))),
        token_type(register_module("token_type", torch::nn::Embedding(c.types, c.dim))),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim}).eps(c.eps)))) {}
  torch::nn::Embedding word, position, token_type;
  torch::nn::LayerNorm norm;
};
TORCH_MODULE(BertEmbeddings);

/// BERT without dropout: embeddings, post-LN blocks (erf gelu), pooler (tanh), classifier.
struct BertImpl : torch::nn::Module {
  explicit BertImpl(const BertSizes& c)
      : embeddings(register_module("embeddings", BertEmbeddings(c))),
        layers(register_module("layers", torch::nn::ModuleList())),
        pooler(register_module("pooler", torch::nn::Linear(c.dim, c.dim))),
        classifier(register_module("classifier", torch::nn::Linear(c.dim, c.labels))) {
    for (int64_t i = 0; i < c.layers; ++i)
      layers->push_back(Block(c.dim, c.heads, c.hidden, false, false, false, "none", c.eps));
  }
  /// ids, mask (1 = token, 0 = padding) and types (B, T) int64 -> logits (B, labels)
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& mask, const torch::Tensor& types) {
    auto x = embeddings->word(ids) + embeddings->position(torch::arange(ids.size(1), ids.options())) +
             embeddings->token_type(types);  // (B, T, C)
    x = embeddings->norm(x);
    const auto kpm = mask.eq(0);  // (B, T) true = padding
    for (auto& l : *layers) x = l->as<Block>()->forward(x, kpm);
    return classifier(torch::tanh(pooler(x.select(1, 0))));
  }
  BertEmbeddings embeddings;
  torch::nn::ModuleList layers;
  torch::nn::Linear pooler, classifier;
};
TORCH_MODULE(Bert);

/// Copies every parameter and buffer of `src` (a tapeline state_dict) into `dst` by name; false
/// (and nothing copied for that name) where a name is absent.
inline std::vector<std::string> copy_into(torch::nn::Module& dst, const std::map<std::string, at::Tensor>& src) {
  std::vector<std::string> absent;
  torch::NoGradGuard no_grad;
  auto params = dst.named_parameters();
  auto buffers = dst.named_buffers();
  for (const auto& [name, t] : src) {
    if (auto* p = params.find(name)) {
      p->copy_(t);
    } else if (auto* b = buffers.find(name)) {
      b->copy_(t);
    } else {
      absent.push_back(name);
    }
  }
  return absent;
}

}  // namespace tl::reference
