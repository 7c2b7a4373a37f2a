#include "layers/models/hf.h"

#include <cctype>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <type_traits>

#include "layers/io/safetensors.h"

namespace tl {

namespace {

enum class Kind { Mapped, Skipped, Unmapped };
struct Mapping {
  Kind kind = Kind::Unmapped;
  std::string name;        // project name when Mapped
  bool transpose = false;  // Conv1D (in, out) -> Linear (out, in)
};

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}
std::string strip(const std::string& s, const std::string& prefix) {
  return starts_with(s, prefix) ? s.substr(prefix.size()) : s;
}

/// "<head><digits>.<rest>" -> (digits, rest); false when `s` does not have that form.
bool split_indexed(const std::string& s, const std::string& head, std::string& index, std::string& rest) {
  if (!starts_with(s, head)) return false;
  size_t i = head.size(), j = i;
  while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
  if (j == i || j >= s.size() || s[j] != '.') return false;
  index = s.substr(i, j - i);
  rest = s.substr(j + 1);
  return true;
}

/// Maps "<hf>.weight|bias" through a table of module renames.
bool rename_param(const std::string& s, const std::vector<std::pair<std::string, std::string>>& table, std::string& out,
                  std::string* matched = nullptr) {
  for (const auto& [hf, ours] : table) {
    for (const char* p : {".weight", ".bias"}) {
      if (s == hf + p) {
        out = ours + p;
        if (matched) *matched = hf;
        return true;
      }
    }
  }
  return false;
}

Mapping map_gpt2(const std::string& hf_name) {
  Mapping m;
  const std::string s = strip(hf_name, "transformer.");
  std::string idx, rest, out, matched;
  if (rename_param(s, {{"wte", "wte"}, {"wpe", "wpe"}, {"ln_f", "ln_f"}}, out)) {
    m = {Kind::Mapped, out, false};
  } else if (split_indexed(s, "h.", idx, rest)) {
    if (rest == "attn.bias" || rest == "attn.masked_bias") return {Kind::Skipped, "", false};
    static const std::vector<std::pair<std::string, std::string>> table = {
        {"ln_1", "ln1"},        {"ln_2", "ln2"},           {"attn.c_attn", "attn.qkv"}, {"attn.c_proj", "attn.out"},
        {"mlp.c_fc", "mlp.fc"}, {"mlp.c_proj", "mlp.proj"}};
    if (rename_param(rest, table, out, &matched))
      m = {Kind::Mapped, "h." + idx + "." + out, !starts_with(matched, "ln_") && ends_with(out, ".weight")};
  }
  return m;
}

Mapping map_bert(const std::string& hf_name) {
  std::string s = strip(hf_name, "bert.");
  // TF-era LayerNorm parameter names.
  if (ends_with(s, "LayerNorm.gamma")) s = s.substr(0, s.size() - 5) + "weight";
  if (ends_with(s, "LayerNorm.beta")) s = s.substr(0, s.size() - 4) + "bias";
  if (s == "embeddings.position_ids") return {Kind::Skipped, "", false};
  std::string idx, rest, out;
  static const std::vector<std::pair<std::string, std::string>> top = {
      {"embeddings.word_embeddings", "embeddings.word"},
      {"embeddings.position_embeddings", "embeddings.position"},
      {"embeddings.token_type_embeddings", "embeddings.token_type"},
      {"embeddings.LayerNorm", "embeddings.norm"},
      {"pooler.dense", "pooler"},
      {"classifier", "classifier"}};
  if (rename_param(s, top, out)) return {Kind::Mapped, out, false};
  if (split_indexed(s, "encoder.layer.", idx, rest)) {
    static const std::vector<std::pair<std::string, std::string>> table = {
        {"attention.self.query", "attn.query"}, {"attention.self.key", "attn.key"},
        {"attention.self.value", "attn.value"}, {"attention.output.dense", "attn.out"},
        {"attention.output.LayerNorm", "ln1"},  {"intermediate.dense", "mlp.fc"},
        {"output.dense", "mlp.proj"},           {"output.LayerNorm", "ln2"}};
    if (rename_param(rest, table, out)) return {Kind::Mapped, "layers." + idx + "." + out, false};
  }
  return {};
}

std::string list_names(const std::vector<std::string>& names) {
  constexpr size_t kMax = 30;
  std::string s;
  for (size_t i = 0; i < names.size() && i < kMax; ++i) s += "\n    " + names[i];
  if (names.size() > kMax) s += "\n    ... and " + std::to_string(names.size() - kMax) + " more";
  return s;
}

/// Maps every checkpoint entry, checks the result against the model's state and loads it.
/// `allowed_missing(name)` / `allowed_unexpected(name)` relax the check for optional parts.
template <class MapFn, class MissingFn, class UnexpectedFn>
void load_mapped(Module& model, const TensorMap& checkpoint, const char* what, MapFn map, MissingFn allowed_missing,
                 UnexpectedFn allowed_unexpected, const std::vector<std::string>& ignore_prefixes = {}) {
  const TensorMap model_state = model.state_dict();
  TensorMap mapped;
  std::vector<std::string> unmapped, unexpected, missing, duplicate;
  for (const auto& [hf_name, tensor] : checkpoint) {
    bool ignored = false;
    for (const auto& p : ignore_prefixes) ignored = ignored || starts_with(hf_name, p);
    if (ignored) continue;
    const Mapping m = map(hf_name);
    if (m.kind == Kind::Skipped) continue;
    if (m.kind == Kind::Unmapped) {
      unmapped.push_back(hf_name);
      continue;
    }
    if (!model_state.count(m.name)) {
      if (!allowed_unexpected(m.name)) unexpected.push_back(hf_name + " -> " + m.name);
      continue;
    }
    if (mapped.count(m.name)) {  // e.g. both "bert.x" and "x"
      duplicate.push_back(hf_name + " -> " + m.name);
      continue;
    }
    TORCH_CHECK(!m.transpose || tensor.dim() == 2, what, ": '", hf_name, "' is a Conv1D weight and must be 2-D, got ",
                tensor.sizes());
    mapped[m.name] = m.transpose ? tensor.t().contiguous() : tensor;
  }
  // Generator states of dropout layers are the model's own (seeded at construction), never in a
  // Hugging Face checkpoint: they keep their values.
  auto is_generator_state = [](const std::string& n) {
    const std::string suffix = "generator";
    return n.size() >= suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  for (const auto& [name, _] : model_state)
    if (!mapped.count(name) && !allowed_missing(name) && !is_generator_state(name)) missing.push_back(name);
  TORCH_CHECK(unmapped.empty() && unexpected.empty() && missing.empty() && duplicate.empty(), what,
              ": the checkpoint does not match the model",
              unmapped.empty() ? "" : "\n  checkpoint names no rule maps:", list_names(unmapped),
              unexpected.empty() ? "" : "\n  checkpoint entries the model does not have:", list_names(unexpected),
              missing.empty() ? "" : "\n  model entries missing from the checkpoint:", list_names(missing),
              duplicate.empty() ? "" : "\n  model entries given twice:", list_names(duplicate));
  model.load_state_dict(mapped, /*strict=*/false);  // shapes checked there, all listed at once
}

nlohmann::json read_json(const std::string& path, const char* what) {
  std::ifstream in(path);
  TORCH_CHECK(in, what, ": cannot open '", path, "'");
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, what, ": '", path, "' is not valid JSON: ", e.what());
  }
}

template <class T>
void read_key(const nlohmann::json& j, const char* key, T& out, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return;
  const nlohmann::json& v = j[key];
  // An integer key takes a JSON integer that fits: nlohmann converts a float (1e30, or an integer
  // too long for uint64, which it parses as a double) with a plain cast, which is undefined.
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    using Limits = std::numeric_limits<T>;
    bool fits = false;
    if (v.is_number_unsigned()) {
      fits = v.get<uint64_t>() <= uint64_t(Limits::max());
    } else if (v.is_number_integer()) {  // negative
      fits = std::is_signed_v<T> && v.get<int64_t>() >= int64_t(Limits::min());
    }
    TORCH_CHECK(fits, "'", path, "': key '", key, "' = ", v.dump(), " is not an integer in [",
                Limits::min(), ", ", Limits::max(), "]");
  }
  try {
    out = v.get<T>();
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "'", path, "': key '", key, "' has the wrong type: ", e.what());
  }
}

// A value read from config.json must lie in [lo, hi]; error naming the file, the key and the range.
template <typename T>
void check_range(const T& v, const char* key, double lo, double hi, const std::string& path, const char* what) {
  const double x = static_cast<double>(v);
  TORCH_CHECK(x >= lo && x <= hi, what, ": '", path, "': ", key, " = ", v, " is out of range; accepted: [", lo, ", ",
              hi, "]");
}

// The shapes a config may describe: positive, and small enough that building the model does not
// try to allocate more than any checkpoint of these families has (the largest published GPT-2
// and BERT are ~1.5 B and ~0.3 B parameters).
constexpr double kMaxVocab = 1 << 22, kMaxWidth = 1 << 16, kMaxLayers = 1024, kMaxPositions = 1 << 20;

}  // namespace

std::string hf_gpt2_name(const std::string& hf_name) { return map_gpt2(hf_name).name; }
std::string hf_bert_name(const std::string& hf_name) { return map_bert(hf_name).name; }

// ---- GPT-2 --------------------------------------------------------------------------------------
void load_hf_gpt2(GPT2& model, const TensorMap& checkpoint) {
  TensorMap rest = checkpoint;
  for (const char* lm : {"lm_head.weight", "transformer.lm_head.weight"}) {
    auto it = rest.find(lm);
    if (it == rest.end()) continue;
    auto wte = checkpoint.find("transformer.wte.weight");
    if (wte == checkpoint.end()) wte = checkpoint.find("wte.weight");
    TORCH_CHECK(
        wte != checkpoint.end() && wte->second.sizes().equals(it->second.sizes()) && wte->second.equal(it->second),
        "load_hf_gpt2: '", lm,
        "' differs from the token embedding; this GPT-2 ties them and cannot load an "
        "untied output projection");
    rest.erase(it);
  }
  auto never = [](const std::string&) { return false; };
  load_mapped(model, rest, "load_hf_gpt2", map_gpt2, never, never);
}

void load_hf_gpt2(GPT2& model, const std::string& path) { load_hf_gpt2(model, load_safetensors(path)); }

GPT2Config gpt2_config_from_hf(const std::string& path) {
  const auto j = read_json(path, "gpt2_config_from_hf");
  GPT2Config c;
  read_key(j, "vocab_size", c.vocab_size, path);
  read_key(j, "n_positions", c.n_positions, path);
  read_key(j, "n_embd", c.n_embd, path);
  read_key(j, "n_layer", c.n_layer, path);
  read_key(j, "n_head", c.n_head, path);
  read_key(j, "layer_norm_epsilon", c.layer_norm_eps, path);
  read_key(j, "initializer_range", c.init_std, path);
  double resid = c.dropout, embd = c.dropout, attn = c.dropout;
  read_key(j, "resid_pdrop", resid, path);
  read_key(j, "embd_pdrop", embd, path);
  read_key(j, "attn_pdrop", attn, path);
  TORCH_CHECK(resid == embd && embd == attn, "gpt2_config_from_hf: '", path,
              "': this GPT2 uses one dropout probability, but resid_pdrop = ", resid, ", embd_pdrop = ", embd,
              ", attn_pdrop = ", attn);
  c.dropout = resid;
  const char* what = "gpt2_config_from_hf";
  check_range(c.vocab_size, "vocab_size", 1, kMaxVocab, path, what);
  check_range(c.n_positions, "n_positions", 1, kMaxPositions, path, what);
  check_range(c.n_embd, "n_embd", 1, kMaxWidth, path, what);
  check_range(c.n_layer, "n_layer", 1, kMaxLayers, path, what);
  check_range(c.n_head, "n_head", 1, kMaxWidth, path, what);
  TORCH_CHECK(c.n_embd % c.n_head == 0, what, ": '", path, "': n_embd = ", c.n_embd, " is not a multiple of n_head = ",
              c.n_head);
  check_range(c.layer_norm_eps, "layer_norm_epsilon", 0, 1, path, what);
  check_range(c.init_std, "initializer_range", 0, 1e3, path, what);
  TORCH_CHECK(c.dropout >= 0 && c.dropout < 1, what, ": '", path, "': the dropout probability ", c.dropout,
              " is not in [0, 1)");
  return c;
}

// ---- BERT ---------------------------------------------------------------------------------------
void load_hf_bert(Bert& model, const TensorMap& checkpoint, const HfBertOptions& options) {
  auto is_pooler = [](const std::string& n) { return starts_with(n, "pooler."); };
  auto allowed_missing = [&](const std::string& n) {
    return (options.allow_pooler_mismatch && is_pooler(n)) ||
           (options.allow_missing_classifier && starts_with(n, "classifier."));
  };
  auto allowed_unexpected = [&](const std::string& n) { return options.allow_pooler_mismatch && is_pooler(n); };
  load_mapped(model, checkpoint, "load_hf_bert", map_bert, allowed_missing, allowed_unexpected,
              options.ignore_prefixes);
}

void load_hf_bert(Bert& model, const std::string& path, const HfBertOptions& options) {
  load_hf_bert(model, load_safetensors(path), options);
}

BertConfig bert_config_from_hf(const std::string& path) {
  const auto j = read_json(path, "bert_config_from_hf");
  BertConfig c;
  read_key(j, "vocab_size", c.vocab_size, path);
  read_key(j, "hidden_size", c.hidden_size, path);
  read_key(j, "num_hidden_layers", c.num_hidden_layers, path);
  read_key(j, "num_attention_heads", c.num_attention_heads, path);
  read_key(j, "intermediate_size", c.intermediate_size, path);
  read_key(j, "max_position_embeddings", c.max_position_embeddings, path);
  read_key(j, "type_vocab_size", c.type_vocab_size, path);
  read_key(j, "pad_token_id", c.pad_token_id, path);
  read_key(j, "layer_norm_eps", c.layer_norm_eps, path);
  read_key(j, "hidden_dropout_prob", c.hidden_dropout, path);
  read_key(j, "attention_probs_dropout_prob", c.attention_dropout, path);
  read_key(j, "initializer_range", c.initializer_range, path);
  std::string act = "gelu";
  read_key(j, "hidden_act", act, path);
  if (act == "gelu") {
    c.hidden_act = "gelu";
  } else if (act == "gelu_new" || act == "gelu_pytorch_tanh") {
    c.hidden_act = "gelu_tanh";
  } else if (act == "relu") {
    c.hidden_act = "relu";
  } else {
    TORCH_CHECK(false, "bert_config_from_hf: '", path, "': hidden_act '", act,
                "' is not supported; known: gelu, gelu_new, gelu_pytorch_tanh, relu");
  }
  std::string type = "absolute";
  read_key(j, "position_embedding_type", type, path);
  TORCH_CHECK(type == "absolute", "bert_config_from_hf: '", path, "': position_embedding_type '", type,
              "' is not supported; only 'absolute'");
  const char* what = "bert_config_from_hf";
  check_range(c.vocab_size, "vocab_size", 1, kMaxVocab, path, what);
  check_range(c.hidden_size, "hidden_size", 1, kMaxWidth, path, what);
  check_range(c.num_hidden_layers, "num_hidden_layers", 1, kMaxLayers, path, what);
  check_range(c.num_attention_heads, "num_attention_heads", 1, kMaxWidth, path, what);
  TORCH_CHECK(c.hidden_size % c.num_attention_heads == 0, what, ": '", path, "': hidden_size = ", c.hidden_size,
              " is not a multiple of num_attention_heads = ", c.num_attention_heads);
  check_range(c.intermediate_size, "intermediate_size", 1, 4 * kMaxWidth, path, what);
  check_range(c.max_position_embeddings, "max_position_embeddings", 1, kMaxPositions, path, what);
  check_range(c.type_vocab_size, "type_vocab_size", 1, kMaxVocab, path, what);
  check_range(c.pad_token_id, "pad_token_id", 0, static_cast<double>(c.vocab_size - 1), path, what);
  check_range(c.layer_norm_eps, "layer_norm_eps", 0, 1, path, what);
  check_range(c.initializer_range, "initializer_range", 0, 1e3, path, what);
  TORCH_CHECK(c.hidden_dropout >= 0 && c.hidden_dropout < 1 && c.attention_dropout >= 0 && c.attention_dropout < 1,
              what, ": '", path, "': hidden_dropout_prob and attention_probs_dropout_prob must be in [0, 1)");
  return c;
}

}  // namespace tl
