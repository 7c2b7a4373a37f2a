#include "tasks/models.h"

#include <filesystem>

#include "layers/io/safetensors.h"
#include "layers/models/gpt2.h"
#include "layers/models/pretrained.h"
#include "layers/models/resnet.h"

namespace tl {
namespace fs = std::filesystem;

namespace {

bool is_resnet(const std::string& a) { return a.rfind("resnet", 0) == 0; }
bool is_gpt2(const std::string& a) { return a.rfind("gpt2", 0) == 0; }

std::string count_params(int64_t count) {
  const double n = static_cast<double>(count);
  std::ostringstream s;
  s.precision(3);
  if (n >= 1e6)
    s << n / 1e6 << "M";
  else
    s << n / 1e3 << "k";
  return s.str() + " parameters";
}

GPT2Config gpt2_size(const std::string& arch) {
  GPT2Config c;
  if (arch == "gpt2-tiny") {
    c.n_layer = 2, c.n_embd = 128, c.n_head = 4;
  } else if (arch == "gpt2-mini") {
    c.n_layer = 4, c.n_embd = 256, c.n_head = 4;
  } else if (arch == "gpt2-small") {
    c.n_layer = 12, c.n_embd = 768, c.n_head = 12;
  } else {
    TORCH_CHECK(false, "model.arch = ", arch, ": unknown GPT-2 size; known: gpt2-tiny, gpt2-mini, gpt2-small");
  }
  return c;
}

}  // namespace

const std::vector<std::string>& known_architectures() {
  static const std::vector<std::string> names = {"resnet8",   "resnet20",  "resnet18",  "resnet34",
                                                 "minilm",    "gpt2-tiny", "gpt2-mini", "gpt2-small"};
  return names;
}

BuiltModel build_model(const Config& config, const TaskShape& shape, const at::Generator& gen,
                       const StageSelection& build) {
  const std::string& arch = config.model.arch;
  BuiltModel out;
  const bool images = shape.input == TaskShape::Input::Images;
  const bool classes = shape.output == TaskShape::Output::Classes;
  if (is_resnet(arch)) {
    TORCH_CHECK(images && classes, "model.arch = ", arch, " classifies images; task.name = ", config.task.name,
                " needs ", classes ? "minilm" : "a gpt2-* model");
    try {
      out.model = make_resnet(arch, shape.channels, shape.num_classes, config.model.width, gen, build);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "model.arch = ", arch, ": ", e.what_without_backtrace());
    }
    out.head = arch + " (width " + std::to_string(config.model.width).substr(0, 4) + ", ";
    out.tail = ")";
  } else if (arch == "minilm") {
    TORCH_CHECK(!images && classes, "model.arch = minilm classifies text; task.name = ", config.task.name, " needs ",
                images ? "a resnet*" : "a gpt2-* model");
    PretrainedDir dir = find_minilm(config.model.weights);
    BertConfig bc = bert_config_from_hf(dir.config_json);
    if (config.model.dropout >= 0) bc.hidden_dropout = bc.attention_dropout = config.model.dropout;
    bc.pooling = config.model.pooling;
    std::shared_ptr<Bert> bert;
    if (config.model.pretrained) {
      bert = load_pretrained_bert(dir, shape.num_classes, gen, bc, build);
    } else {
      bc.num_labels = shape.num_classes;
      bc.add_pooler = true;
      bert = std::make_shared<Bert>(bc, gen, build);
    }
    TORCH_CHECK(bc.vocab_size >= shape.vocab_size, "model.arch = minilm: the tokenizer's vocabulary (",
                shape.vocab_size, ") is larger than the model's (", bc.vocab_size, ")");
    out.model = bert;
    out.weights_dir = dir.dir;
    out.head = std::string("minilm (") + (config.model.pretrained ? "pretrained from " + dir.dir : "random init") + ", ";
    out.tail = ")";
  } else if (is_gpt2(arch)) {
    TORCH_CHECK(!images && !classes, "model.arch = ", arch, " is a language model; task.name = ", config.task.name,
                " needs ", images ? "a resnet*" : "minilm");
    GPT2Config c = gpt2_size(arch);
    c.vocab_size = shape.vocab_size;
    const ModelSection& m = config.model;  // shape overrides (model.layers, ...)
    if (m.layers > 0) c.n_layer = m.layers;
    if (m.d_model > 0) c.n_embd = m.d_model;
    if (m.heads > 0) c.n_head = m.heads;
    if (m.ffn > 0) c.n_inner = m.ffn;
    TORCH_CHECK(m.vocab == 0 || m.vocab >= shape.vocab_size, "model.vocab = ", m.vocab, " is smaller than the task's ",
                shape.vocab_size, " tokens; accepted: 0 (the task's) or a number >= ", shape.vocab_size);
    if (m.vocab > 0) c.vocab_size = m.vocab;
    TORCH_CHECK(c.n_embd % c.n_head == 0, "model.heads = ", c.n_head, " does not divide the width ", c.n_embd,
                " (model.d_model)");
    c.n_positions = std::max<int64_t>(shape.seq_len, arch == "gpt2-small" ? 1024 : 0);
    c.dropout = config.model.dropout >= 0 ? config.model.dropout : 0.0;
    out.model = std::make_shared<GPT2>(c, gen, build);
    out.head = arch + " (" + std::to_string(c.n_layer) + " x " + std::to_string(c.n_embd) + ", vocab " +
               std::to_string(c.vocab_size) + ", context " + std::to_string(c.n_positions) + ", ";
    out.tail = ")";
  } else {
    std::string list;
    for (const auto& a : known_architectures()) list += (list.empty() ? "" : ", ") + a;
    TORCH_CHECK(false, "model.arch = ", arch, ": unknown architecture; known: ", list);
  }
  if (!config.model.init_from.empty()) {
    init_model_from(*out.model, config.model.init_from, /*part=*/!build.is_whole());
    out.tail += ", weights from " + config.model.init_from;
  }
  return out;
}

void apply_codec_constraints(Pipeline& pipeline) {
  auto gpt2 = std::dynamic_pointer_cast<GPT2>(pipeline.model());
  at::Tensor table;
  for (size_t i = 0; i < pipeline.boundaries().size(); ++i) {
    const BoundaryPtr& b = pipeline.boundary(i);
    const CompressorPtr& codec = b->forward_codec();
    if (!gpt2) {
      // Other models cannot add a token table; a codec that asks for one is an error.
      TORCH_CHECK(!codec->constrains_model(), b->name(), ": ", codec->spec(),
                  " needs the model to add its token table to the input embedding; only gpt2-* models do (use "
                  "vocab=0 for a plain projection)");
      continue;
    }
    const int64_t d = gpt2->config().n_embd;
    at::Tensor t = codec->input_token_embedding(d);
    if (t.defined()) {
      TORCH_CHECK(!table.defined() || table.equal(t), b->name(), ": ", codec->spec(), " has another token table than ",
                  "an earlier boundary; every subspace boundary must use the same seed and vocab");
      table = t;
    }
    // The cut is "embed" (after the embeddings) or "h.j" (after block j).
    const std::string& cut = pipeline.cuts()[i];
    const int64_t last_block = cut == "embed" ? -1 : std::stoll(cut.substr(2));
    codec->constrain_residual_writers(gpt2->residual_writers(last_block));
  }
  if (gpt2 && table.defined()) gpt2->set_input_token_embedding(table);
}

std::string tensor_parallel_problem(const Config& config) {
  const int64_t T = config.parallel.tp;
  if (T == 1) return "";
  const std::string& arch = config.model.arch;
  const std::string head = "parallel.tp = " + std::to_string(T) + ": ";
  int64_t heads = 0, width = 0;
  if (is_gpt2(arch)) {
    const GPT2Config c = gpt2_size(arch);
    heads = c.n_head, width = 4 * c.n_embd;
  } else if (arch == "minilm") {
    const BertConfig c = bert_config_from_hf(find_minilm(config.model.weights).config_json);
    heads = c.num_attention_heads, width = c.intermediate_size;
  } else {
    return head + "model.arch = " + arch +
           " has no transformer blocks to split (tensor parallelism splits attention and MLP layers: gpt2-* and "
           "minilm; ResNets run with parallel.tp = 1)";
  }
  if (heads % T != 0)
    return head + "model.arch = " + arch + " has " + std::to_string(heads) + " attention heads, which " +
           std::to_string(T) + " tensor-parallel ranks do not divide";
  if (width % T != 0)
    return head + "model.arch = " + arch + "'s MLP has " + std::to_string(width) + " hidden units, which " +
           std::to_string(T) + " tensor-parallel ranks do not divide";
  return "";
}

std::string BuiltModel::describe(int64_t parameters) const { return head + count_params(parameters) + tail; }

void init_model_from(Module& model, const std::string& run_or_checkpoint, bool part) {
  std::string path = run_or_checkpoint;
  if (fs::is_directory(path)) path = (fs::path(path) / "checkpoint.safetensors").string();
  TORCH_CHECK(fs::is_regular_file(path), "model.init_from = ", run_or_checkpoint,
              ": no checkpoint there (expected a tapeline run directory or a checkpoint.safetensors file)");
  // Checkpoint names: "model." (the checkpoint's module) + "model." (the pipeline's model child).
  const std::string prefix = "model.model.";
  TensorMap weights;
  for (auto& [name, t] : load_safetensors(path))
    if (name.rfind(prefix, 0) == 0) weights.emplace(name.substr(prefix.size()), t);
  TORCH_CHECK(!weights.empty(), "model.init_from = ", run_or_checkpoint,
              ": the file holds no model weights (not a tapeline training checkpoint)");
  if (part) {  // the stages built here: their entries, each of which must be there
    const TensorMap own = model.state_dict();
    for (auto it = weights.begin(); it != weights.end();) it = own.count(it->first) ? std::next(it) : weights.erase(it);
  }
  try {
    model.load_state_dict(weights, /*strict=*/true);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "model.init_from = ", run_or_checkpoint, ": ", e.what_without_backtrace());
  }
}

}  // namespace tl
