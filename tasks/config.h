#pragma once
// The configuration of a training run: INI files read with Boost.Program_options, overridden
// key by key from the command line (`--train.epochs=3`). Every key is declared once in a schema
// (config.cpp) with its default, what it accepts and a help line; docs/CONFIG.md documents the
// same keys (a test checks that every key is there). Unknown keys and bad values are errors
// raised while the config is read, before any data is loaded or any model built.
//
// Boundaries: [boundary] sets the forward/backward compressors, backward mode and inference
// toggle of every cut; a section [boundary.N] (N = 1 for the first cut) overrides keys for one
// cut, e.g. `[boundary.2] forward = quant(4)` or `--boundary.2.forward=quant(4)`.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "compression/codec_spec.h"

namespace tl {

struct RunSection {
  uint64_t seed = 0;
  std::string device = "cpu";     // cpu | cuda | cuda:N
  int64_t threads = 0;            // ATen intra-op threads; 0 = ATen's default
  int64_t log_every = 20;         // steps between metrics.jsonl lines and plain progress lines
  std::string progress = "auto";  // auto | bar | plain | none
  int64_t checkpoint_every = 1;   // epochs between checkpoints (the last epoch always)
  bool measure_error = true;      // boundary statistics (relative error, density) in training
};

struct TaskSection {
  std::string name = "vision";  // vision | text | lm (tasks/task.h)
};

struct DataSection {
  std::string dataset = "fashion-mnist";  // "auto" in a file resolves per task: fashion-mnist or wordnet
  std::string root;                         // empty: the dataset's default location
  int64_t train_limit = 0, test_limit = 0;  // 0 = all samples
  int64_t image_size = 0, channels = 0;     // image folders only
  std::vector<double> mean, std;            // empty = computed from the training split ("auto")
  int64_t crop_padding = 0;
  bool hflip = false;
  int64_t prefetch = 2;
  // Text (task = text, lm).
  int64_t max_length = 64;      // text: tokens per sequence, [CLS] and [SEP] included (longer ones truncated)
  bool pad_to_max_length = false;  // text: every batch max_length wide (per-sample caches need fixed shapes)
  int64_t seq_len = 64;         // lm: tokens per training window
  double test_fraction = 0.1;   // wordnet: share of synsets held out for testing (split by hash)
};

struct ModelSection {
  std::string arch = "resnet8";  // "auto" in a file resolves per task: resnet8, minilm, gpt2-tiny
  double width = 1.0;            // ResNets
  std::string weights;           // minilm: directory of the pretrained files (empty: found at run time)
  bool pretrained = true;        // minilm: start from the pretrained weights (false: random initialisation)
  std::string init_from;         // a run directory or checkpoint file whose model weights start this run
  double dropout = -1;           // transformers: dropout probability (< 0: the architecture's default)
  std::string pooling = "mean";  // minilm: sentence vector for the classifier, "mean" or "cls"
  std::vector<std::string> cuts;  // cut point names; empty = all of the model's cut points
  bool no_cuts = false;           // cuts = none: one stage, no boundary
  // GPT-2 shape overrides (0: the arch's own): blocks, width, heads, MLP width, vocabulary.
  int64_t layers = 0, d_model = 0, heads = 0, ffn = 0, vocab = 0;
};

struct TrainSection {
  std::string optimizer = "sgd";  // sgd | adamw
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adamw
  int64_t epochs = 10;
  int64_t batch_size = 128;
  int64_t micro_batches = 1;
  double lr = 0.05, momentum = 0.9, weight_decay = 5e-4;
  bool nesterov = false;
  std::string schedule = "cosine";  // constant | cosine | step
  double warmup_epochs = 0.0;
  int64_t step_epochs = 30;  // schedule = step: decay every step_epochs
  double step_gamma = 0.1;
  double min_lr = 0.0;     // cosine floor
  double target = 0.0;     // > 0: time to reach this test metric (compression on) goes into summary.json
  double grad_clip = 0.0;  // global-norm clipping; 0 = off
  bool drop_last = true;
  int64_t eval_batch_size = 500;
};

// Codec specs are held parsed (CodecSpec: parsed once, when the config is read; they compare and
// print as their text).
struct BoundarySettings {
  CodecSpec forward;   // identity
  CodecSpec backward;  // identity
  std::string backward_mode = "independent";  // independent | shared | straight-through | none
  bool active_at_inference = true;
  bool epilogue_only = false;  // Optimus-CC: compress only backward sends on the schedule's critical path
  std::string epilogue_rule = "optimus";  // which sends are critical: optimus | critical_path
  double bandwidth_mbps = 0;   // link emulation: 0 = unlimited
  double latency_ms = 0;
};

struct PipelineSection {
  std::string schedule = "1f1b";  // a name of the schedule registry (parallel/schedule.h)
  int64_t virtual_stages = 1;     // stages per pipeline rank (interleaved)
  int64_t nproc = 1;              // > 1: one process per pipeline rank (tapeline train --nproc, or torchrun)
};

struct TimelineSection {
  std::string device = "measured";  // measured | h100 | a100 | cpu (parallel/device_model.h)
  std::string link_model = "pipelined";  // pipelined | inbound (parallel/link.h, LinkModel)
};

struct PlanSection {  // tapeline plan (tasks/runner/plan.h)
  int64_t forward_bytes = -1;   // bytes per forward message instead of the codec's size (-1: the codec's)
  int64_t backward_bytes = -1;  // ... per backward message
};

struct ParallelSection {
  int64_t dp = 1;  // data-parallel replicas of the pipeline (world = pipeline ranks x dp x tp)
  int64_t tp = 1;  // tensor-parallel ranks per stage (transformer blocks split Megatron's way)
};

struct TpSection {
  CodecSpec forward;                    // codec of the row-parallel outputs' all-reduce (forward)
  CodecSpec backward;                   // codec of the column-parallel inputs' gradient all-reduce (backward)
  bool active_at_inference = true;      // tp.forward at evaluation (with compression on)
  std::string algorithm = "allgather";  // allgather | reduce_scatter (quant only)
  double bandwidth_mbps = 0;  // emulated link between the tensor ranks of a stage, each direction; 0: unlimited
  double latency_ms = 0;      // its one-way latency
};

struct DpSection {
  CodecSpec compression;                 // codec of the data-parallel gradients
  std::vector<int64_t> compress_stages;  // stages (0-based) whose gradients are compressed; empty: all
  double bucket_mib = 25;                // uncompressed gradients per flat bucket (MiB)
  bool overlap = true;                   // buckets summed during the backward (Gloo)
  double bandwidth_mbps = 0;             // link emulation between replicas: 0 = unlimited
  double latency_ms = 0;
};

struct DistSection {
  double timeout_s = 60;  // a peer silent this long is an error naming it
  bool checksum = true;   // CRC-32C of every message body (Note [body checksum] in parallel/ranks/transport.h)
  int64_t pieces_min_bytes = int64_t(8) << 20;  // bodies in pieces from this size (Note [bodies in pieces]); 0: never
  // Debugging: fault injection (Note [fault injection] in parallel/ranks/fault.h, docs/FAULTS.md).
  std::string inject_fault;  // RANK:PHASE:STEP:KIND, empty: none
  double corrupt_rate = 0;   // probability that a sent message has a bit flipped after its checksum
  int64_t corrupt_seed = 0;
};

/// One documented key.
struct ConfigKey {
  std::string name;           // section.key
  std::string default_value;  // as written in an INI file
  std::string accepted;       // what values are valid
  std::string help;
};

class Config {
 public:
  RunSection run;
  TaskSection task;
  DataSection data;
  ModelSection model;
  TrainSection train;
  PipelineSection pipeline;
  TimelineSection timeline;
  PlanSection plan;
  ParallelSection parallel;
  DpSection dp;
  TpSection tp;
  DistSection dist;
  BoundarySettings boundary;  // [boundary]: every cut

  /// Settings of boundary `index` (1-based): [boundary] with [boundary.index] overrides applied.
  BoundarySettings boundary_at(int64_t index) const;
  /// Indices that have a [boundary.N] section (validated against the model's cut count later).
  std::vector<int64_t> boundary_override_indices() const;

  /// Every key with its value (schema order, then boundary overrides), as strings.
  const std::vector<std::pair<std::string, std::string>>& resolved() const { return resolved_; }
  /// The value of one key as a string (error for an unknown key).
  std::string value(const std::string& key) const;
  /// The resolved config as an INI file that load_config reads back to the same Config; keys in
  /// `omit` are left out (they read back as their defaults).
  std::string to_ini(const std::vector<std::string>& omit = {}) const;

  /// Reads `ini_path` (may be empty: defaults only), then applies `overrides` ("section.key" ->
  /// value; later entries win). Throws std::invalid_argument naming the source, the key and what
  /// is accepted. Compressor specs are checked by building them (parse_compressor).
  static Config load(const std::string& ini_path,
                     const std::vector<std::pair<std::string, std::string>>& overrides = {});

  /// The documented keys (boundary.N.* are described as boundary.N.<key>).
  static const std::vector<ConfigKey>& keys();

 private:
  std::map<int64_t, std::map<std::string, std::string>> boundary_overrides_;
  std::vector<std::pair<std::string, std::string>> resolved_;
};

/// Splits command-line tokens into config overrides and the rest. Accepted override forms:
/// `--section.key=value` and `--section.key value`. Any other `--x.y` token with a dot is an
/// override too (validated by Config::load). Returns overrides in order; `rest` gets the others.
std::vector<std::pair<std::string, std::string>> split_overrides(const std::vector<std::string>& args,
                                                                 std::vector<std::string>& rest);

}  // namespace tl
