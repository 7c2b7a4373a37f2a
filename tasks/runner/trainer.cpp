// A run directory: run_training trains (or resumes) an Experiment epoch by epoch and writes what
// it measured (tasks/runner/trainer.h); evaluate_run reads one back.
#include "tasks/runner/trainer.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>

#include "layers/io/checkpoint.h"
#include "parallel/ranks/fault.h"

namespace tl {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const char* kCheckpoint = "checkpoint.safetensors";

std::string fnv1a_hex(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  std::ostringstream s;
  s << std::hex << std::setw(16) << std::setfill('0') << h;
  return s.str();
}

// Keys that do not change what a run computes (presentation, placement, file locations; one process
// or one per stage compute the same numbers, parallel/ranks/runtime.h).
bool outside_fingerprint(const std::string& key) {
  static const std::vector<std::string> keys = {
      "run.progress",   "run.log_every",  "run.checkpoint_every", "run.threads",       "run.measure_error",
      "run.device",     "data.root",      "data.prefetch",        "model.weights",     "pipeline.nproc",
      "dist.timeout_s", "dist.checksum",  "dist.inject_fault",    "dist.corrupt_rate", "dist.corrupt_seed",
      "parallel.dp",    "dp.compression", "dp.compress_stages",   "dp.bucket_mib",     "dp.overlap",
      "dist.pieces_min_bytes"};
  return key.rfind("boundary.", 0) == 0 || std::find(keys.begin(), keys.end(), key) != keys.end();
}

}  // namespace

std::string config_fingerprint(const Config& config) {
  std::string text;
  for (const auto& [k, v] : config.resolved())
    if (!outside_fingerprint(k)) text += k + "=" + v + "\n";
  return fnv1a_hex(text);
}

Config baseline_config(const Config& config) {
  // Compression keys go; the links (bandwidth, latency) stay: the baseline runs on the same network.
  auto is_link = [](const std::string& k) {
    auto ends = [&](const std::string& suffix) {
      return k.size() >= suffix.size() && k.compare(k.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    return ends(".bandwidth_mbps") || ends(".latency_ms");
  };
  std::vector<std::pair<std::string, std::string>> kv;
  for (const auto& [k, v] : config.resolved())
    if ((k.rfind("boundary.", 0) != 0 && k.rfind("dp.compress", 0) != 0) || is_link(k)) kv.emplace_back(k, v);
  return Config::load("", kv);
}
// ---- run_training ---------------------------------------------------------------------------------

namespace {

// Keeps the jsonl lines of steps <= max_step (a resumed run drops what came after its checkpoint).
void truncate_jsonl(const std::string& from, const std::string& to, int64_t max_step) {
  std::ostringstream kept;
  std::ifstream in(from);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    try {
      json j = json::parse(line);
      if (j.value("step", int64_t(0)) <= max_step) kept << line << "\n";
    } catch (const json::exception&) {
      // A torn last line of an interrupted run: dropped.
    }
  }
  write_file_atomic(to, kept.str());
}

// levels.csv with the rows of steps <= max_step (a resumed run drops what came after its
// checkpoint); a header alone when `from` does not exist.
void truncate_levels_csv(const std::string& from, const std::string& to, int64_t max_step) {
  std::ostringstream kept;
  kept << levels_csv_header() << "\n";
  std::ifstream in(from);
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    if (line.empty() || line.back() == '\r') continue;
    char* end = nullptr;
    const long long step = std::strtoll(line.c_str(), &end, 10);
    if (end != line.c_str() && *end == ',' && step <= max_step) kept << line << "\n";  // else a torn last line
  }
  write_file_atomic(to, kept.str());
}

}  // namespace

RunSummary run_training(const TrainRequest& req) {
  const auto t_start = std::chrono::steady_clock::now();
  TORCH_CHECK(!req.out_dir.empty(), "train: --out DIR is required");
  Experiment ex(req.config);
  const Config& cfg = ex.config();
  // Multi-process: rank 0 alone writes the run directory and prints progress; the others print
  // only errors. Every rank takes part in checkpoints and evaluations.
  const bool writer = ex.rank() == 0;
  Progress progress(req.quiet || !writer ? Progress::Mode::kNone : Progress::resolve(cfg.run.progress));
  if (writer) fs::create_directories(req.out_dir);
  const std::string out = req.out_dir;
  const std::string ckpt = (fs::path(out) / kCheckpoint).string();
  const std::string csv = (fs::path(out) / "metrics.csv").string();
  const std::string jsonl = (fs::path(out) / "metrics.jsonl").string();
  const std::string levels = (fs::path(out) / "levels.csv").string();
  auto write_file = [&](const std::string& path, const std::string& text) {
    if (writer) write_file_atomic(path, text);
  };

  std::vector<EpochMetrics> history;
  int64_t start_epoch = 0;
  double wall_before = 0.0;
  if (!req.resume_dir.empty()) {
    const std::string from = (fs::path(req.resume_dir) / kCheckpoint).string();
    TORCH_CHECK(fs::exists(from), "--resume ", req.resume_dir, ": no ", kCheckpoint, " there (nothing to resume)",
                ex.distributed() ? " on rank " + std::to_string(ex.rank()) +
                                       "; every rank reads it: on several machines put the run directory on a shared "
                                       "file system"
                                 : std::string());
    CheckpointInfo info = ex.load_checkpoint(from);
    start_epoch = info.epoch;
    auto fp = info.metadata.find("fingerprint");
    if (fp != info.metadata.end() && fp->second != config_fingerprint(cfg))
      progress.line(
          "warning: the configuration differs from the one the checkpoint was trained with; the result "
          "will not match an uninterrupted run");
    auto wall = info.metadata.find("wall_s");
    if (wall != info.metadata.end()) wall_before = std::stod(wall->second);
    const std::string old_csv = (fs::path(req.resume_dir) / "metrics.csv").string();
    if (fs::exists(old_csv))
      for (const auto& row : read_metrics_csv(old_csv))
        if (row.epoch <= start_epoch) history.push_back(row);
    const std::string old_jsonl = (fs::path(req.resume_dir) / "metrics.jsonl").string();
    if (writer && fs::exists(old_jsonl))
      truncate_jsonl(old_jsonl, jsonl, info.step);
    else
      write_file(jsonl, "");
    if (writer && ex.has_adaptive_codecs())
      truncate_levels_csv((fs::path(req.resume_dir) / "levels.csv").string(), levels, info.step);
    progress.line("resuming " + req.resume_dir + " after epoch " + std::to_string(start_epoch) + " (step " +
                  std::to_string(info.step) + ")");
    if (!ex.resume_note().empty())  // Note [grid state in checkpoints] in parallel/ranks/runtime.h
      progress.line("note: " + ex.resume_note());
  } else {
    write_file(jsonl, "");
    if (ex.has_adaptive_codecs()) write_file(levels, levels_csv_header() + "\n");
  }
  // Injected faults are for this invocation (Note [fault injection]): a resumed run does not repeat them.
  write_file((fs::path(out) / "config.ini").string(),
             cfg.to_ini({"dist.inject_fault", "dist.corrupt_rate", "dist.corrupt_seed"}));
  std::string placement;
  if (ex.distributed()) {
    const int v = ex.executor().layout().virtual_stages;
    const int64_t dp = cfg.parallel.dp;
    // Appended piece by piece: GCC 12 warns (-Wstringop-overflow, a false positive) on some
    // "literal" + std::string expressions.
    placement = "\n";
    placement += std::to_string(ex.world_size());
    placement += " processes, ";
    if (v > 1)
      placement += std::to_string(v) + std::string(" stages each");
    else
      placement += cfg.parallel.tp > 1 ? "one stage part each" : "one stage each";
    if (dp > 1) {
      placement += ", ";
      placement += std::to_string(dp);
      placement += " replicas of the pipeline (data-parallel gradients: ";
      placement += cfg.dp.compression.text();
      placement += ")";
    }
    if (cfg.parallel.tp > 1) {
      placement += ", each stage split over ";
      placement += std::to_string(cfg.parallel.tp);
      placement += " tensor-parallel ranks (all-reduces: forward ";
      placement += cfg.tp.forward.text();
      placement += ", backward ";
      placement += cfg.tp.backward.text();
      placement += ", ";
      placement += cfg.tp.algorithm;
      placement += ")";
    }
    placement += " (rank 0 writes the run)";
  }
  progress.line(ex.describe() + placement);

  RunSummary summary;
  summary.name = fs::path(out).filename().string();
  if (summary.name.empty()) summary.name = fs::path(out).parent_path().filename().string();
  summary.config = req.config_path;
  summary.task = ex.task().name();
  summary.metric = ex.task().metric().name;
  summary.higher_is_better = ex.task().metric().higher_is_better;
  // The specs of the cuts: one when they all agree, else each cut's in order ("a, b, c").
  auto specs_of = [&](bool forward) {
    std::vector<std::string> all;
    for (size_t i = 1; i <= ex.pipeline().boundaries().size(); ++i) {
      BoundarySettings b = cfg.boundary_at(static_cast<int64_t>(i));
      all.push_back((forward ? b.forward : b.backward).text());
    }
    if (all.empty()) return std::string("none (no cut)");
    if (std::all_of(all.begin(), all.end(), [&](const std::string& x) { return x == all[0]; })) return all[0];
    std::string joined;
    for (const auto& x : all) joined += (joined.empty() ? "" : ", ") + x;
    return joined;
  };
  summary.forward = specs_of(true);
  summary.backward = specs_of(false);
  summary.stages = static_cast<int64_t>(ex.pipeline().num_stages());
  summary.epochs = cfg.train.epochs;
  summary.train_samples = ex.task().train_samples();
  summary.test_samples = ex.task().test_samples();
  summary.fingerprint = config_fingerprint(cfg);
  if (!history.empty()) summary.last = history.back();

  const std::string unit = ex.task().unit_name();
  const std::string metric = summary.metric;
  // Time to target: the first epoch whose test metric with compression on reaches train.target.
  summary.target = cfg.train.target;
  summary.timeline_device = cfg.timeline.device;
  auto reached = [&](double value) {
    return cfg.train.target > 0 && (summary.higher_is_better ? value >= cfg.train.target : value <= cfg.train.target);
  };
  int64_t steps_so_far = 0;
  auto note_target = [&](const EpochMetrics& e) {
    steps_so_far += e.steps;
    summary.steps = steps_so_far;
    if (summary.time_to_target_s < 0 && reached(e.test_metric_compressed))
      summary.time_to_target_s = e.train_time_s, summary.wall_to_target_s = e.wall_s,
      summary.steps_to_target = steps_so_far;
  };
  for (const auto& e : history) note_target(e);
  double train_time = history.empty() ? 0.0 : history.back().train_time_s;
  int64_t run_epochs = 0;
  for (int64_t epoch = start_epoch; epoch < cfg.train.epochs; ++epoch) {
    if (req.stop_after_epochs > 0 && run_epochs >= req.stop_after_epochs) break;
    double loss_window = 0.0;
    int64_t window = 0;
    EpochMetrics m = ex.train_epoch(epoch, [&](const Experiment::StepLog& s) {
      progress.bar(s.epoch + 1, cfg.train.epochs, s.step_in_epoch, s.steps_in_epoch, s.loss, s.units_per_s, unit);
      loss_window += s.loss;
      ++window;
      if (s.step % cfg.run.log_every == 0 || s.step_in_epoch == s.steps_in_epoch) {
        json j{{"step", s.step},
               {"epoch", s.epoch + 1},
               {"loss", loss_window / double(window)},
               {metric, s.metric},
               {"lr", s.lr},
               {unit + "_per_s", s.units_per_s},
               {"wall_s", wall_before + seconds_since(t_start)}};
        if (writer) append_line(jsonl, j.dump());
        if (progress.mode() == Progress::Mode::kPlain) {
          std::ostringstream line;
          line << "epoch " << s.epoch + 1 << "/" << cfg.train.epochs << " step " << s.step_in_epoch << "/"
               << s.steps_in_epoch << "  loss " << std::fixed << std::setprecision(4) << loss_window / double(window)
               << "  lr " << std::setprecision(5) << s.lr << "  " << std::setprecision(0) << s.units_per_s << " " << unit
               << "/s";
          progress.line(line.str());
        }
        loss_window = 0.0;
        window = 0;
      }
    });
    if (writer)  // the codecs' levels, once per epoch (Note [levels of a multi-process run])
      for (const LevelRow& row : ex.epoch_levels()) append_line(levels, levels_csv_row(row));
    const Experiment::Evaluation on = ex.evaluate(true), off = ex.evaluate(false);
    m.test_loss_compressed = on.loss, m.test_metric_compressed = on.metric;
    m.test_loss_uncompressed = off.loss, m.test_metric_uncompressed = off.metric;
    m.wall_s = wall_before + seconds_since(t_start);
    train_time += m.train_time_s;
    m.train_time_s = train_time;
    note_target(m);
    history.push_back(m);
    ++run_epochs;

    json j{{"epoch_end", m.epoch},
           {"step", ex.global_step()},
           {"train_loss", m.train_loss},
           {"train_metric", m.train_metric},
           {"test_loss_compressed", m.test_loss_compressed},
           {"test_loss_uncompressed", m.test_loss_uncompressed},
           {"test_metric_compressed", m.test_metric_compressed},
           {"test_metric_uncompressed", m.test_metric_uncompressed},
           {"bytes_forward", m.bytes_forward},
           {"bytes_backward", m.bytes_backward},
           {"bytes_uncompressed", m.bytes_uncompressed},
           {"bytes_dp", m.bytes_dp},
           {"bytes_dp_uncompressed", m.bytes_dp_uncompressed},
           {"bytes_tp", m.bytes_tp},
           {"bytes_tp_uncompressed", m.bytes_tp_uncompressed},
           {"forward_rel_error", m.forward_rel_error},
           {"backward_rel_error", m.backward_rel_error},
           {"forward_density", m.forward_density},
           {"backward_density", m.backward_density},
           {"wall_s", m.wall_s},
           {"train_time_s", m.train_time_s},
           {"compute_s", m.compute_s},
           {"comm_s", m.comm_s},
           {"bubble", m.bubble}};
    j["boundaries"] = json::array();
    for (const auto& b : m.boundaries)
      j["boundaries"].push_back({{"index", b.index},
                                 {"bytes_forward", b.bytes_forward},
                                 {"bytes_backward", b.bytes_backward},
                                 {"forward_rel_error", b.forward_rel_error},
                                 {"backward_rel_error", b.backward_rel_error},
                                 {"forward_density", b.forward_density},
                                 {"backward_density", b.backward_density}});
    j["rank_times"] = json::array();
    for (size_t r = 0; r < m.rank_comm_s.size(); ++r)
      j["rank_times"].push_back({{"rank", r}, {"compute_s", m.rank_compute_s.at(r)}, {"comm_s", m.rank_comm_s[r]}});
    if (writer) append_line(jsonl, j.dump());
    write_file(csv, metrics_csv(history));
    summary.last = m;
    summary.peak_rss_bytes = ex.peak_rss_bytes();
    summary.parameter_bytes = ex.parameter_bytes();
    summary.optimizer_bytes = ex.optimizer_bytes();
    write_file((fs::path(out) / "summary.json").string(), summary_json(summary));
    if ((m.epoch % cfg.run.checkpoint_every == 0) || m.epoch == cfg.train.epochs ||
        (req.stop_after_epochs > 0 && run_epochs >= req.stop_after_epochs)) {
      CheckpointInfo info;
      info.step = ex.global_step();
      info.epoch = m.epoch;
      info.metadata["wall_s"] = std::to_string(m.wall_s);
      info.metadata["fingerprint"] = summary.fingerprint;
      ex.save_checkpoint(ckpt, info);
    }
    std::ostringstream line;
    line << std::fixed << "epoch " << m.epoch << "/" << cfg.train.epochs << ": train loss " << std::setprecision(4)
         << m.train_loss << ", test " << (metric == "accuracy" ? "acc" : metric) << " "
         << format_metric(metric, m.test_metric_compressed) << " compressed / "
         << format_metric(metric, m.test_metric_uncompressed) << " uncompressed, sent "
         << human_bytes(double(m.bytes_forward + m.bytes_backward) / double(std::max<int64_t>(m.steps, 1)))
         << "/step of " << human_bytes(double(m.bytes_uncompressed) / double(std::max<int64_t>(m.steps, 1)))
         << " uncompressed, " << std::setprecision(1) << m.wall_s << " s (pipeline time " << m.train_time_s
         << " s, bubble " << std::setprecision(0) << 100 * m.bubble << "%)";
    progress.line(line.str());
  }
  if (auto f = ranks::unfired_fault())
    TORCH_CHECK(false, "dist.inject_fault = ", f->text, ": the fault never fired: rank ", f->rank, " met no ",
                ranks::phase_name(f->phase), " hook at or after step ", f->step,
                " (docs/FAULTS.md says which ranks have which hooks)");
  return summary;
}

std::vector<double> evaluate_run(const std::string& run_dir, const std::vector<bool>& compression,
                                 const std::vector<std::pair<std::string, std::string>>& overrides,
                                 std::string* metric) {
  const std::string config = (fs::path(run_dir) / "config.ini").string();
  const std::string ckpt = (fs::path(run_dir) / kCheckpoint).string();
  TORCH_CHECK(fs::exists(config), "eval --run ", run_dir, ": no config.ini (not a tapeline run directory)");
  TORCH_CHECK(fs::exists(ckpt), "eval --run ", run_dir, ": no ", kCheckpoint, " (the run has not finished an epoch)");
  Config cfg = Config::load(config, overrides);
  Experiment ex(cfg, /*allow_distributed=*/false);  // one process reads the whole checkpoint
  CheckpointLoadOptions opt;
  opt.restore_rng = false;
  load_checkpoint(ckpt, ex.pipeline(), nullptr, nullptr, opt);
  if (metric) *metric = ex.task().metric().name;
  std::vector<double> values;
  for (bool on : compression) values.push_back(ex.evaluate(on).metric);
  return values;
}
}  // namespace tl
