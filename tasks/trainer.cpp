#include "tasks/trainer.h"

#include <ATen/Parallel.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>

#include "layers/io/checkpoint.h"
#include "layers/models/resnet.h"
#include "layers/optim/grad_utils.h"

namespace tl {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const char* kCheckpoint = "checkpoint.safetensors";

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

at::Device parse_run_device(const std::string& d) {
  at::Device device(d);
  TORCH_CHECK(!device.is_cuda() || at::hasCUDA(), "run.device = ", d,
              ": CUDA is not available in this build or on this machine; use run.device = cpu");
  return device;
}

std::shared_ptr<const Schedule> build_schedule(const TrainSection& t, int64_t steps_per_epoch) {
  ScheduleConfig s;
  const int64_t total = std::max<int64_t>(1, t.epochs * steps_per_epoch);
  const int64_t warmup = static_cast<int64_t>(std::llround(t.warmup_epochs * static_cast<double>(steps_per_epoch)));
  s.total_steps = total;
  s.min_lr = t.min_lr;
  if (t.schedule == "constant") {
    s.kind = "constant";
  } else if (t.schedule == "step") {
    s.kind = "step";
    s.step_size = std::max<int64_t>(1, t.step_epochs * steps_per_epoch);
    s.gamma = t.step_gamma;
  } else if (t.schedule == "cosine") {
    s.kind = warmup > 0 ? "warmup_cosine" : "cosine";
    s.warmup_steps = warmup;
  } else {
    s.kind = "warmup_linear";
    s.warmup_steps = warmup;
  }
  return make_schedule(s);
}

std::string fnv1a_hex(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  std::ostringstream s;
  s << std::hex << std::setw(16) << std::setfill('0') << h;
  return s.str();
}

// Keys that do not change what a run computes (presentation, placement, file locations).
bool outside_fingerprint(const std::string& key) {
  static const std::vector<std::string> keys = {"run.progress", "run.log_every", "run.checkpoint_every", "run.threads",
                                                "run.device",   "data.root",     "data.prefetch"};
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
  std::vector<std::pair<std::string, std::string>> kv;
  for (const auto& [k, v] : config.resolved())
    if (k.rfind("boundary.", 0) != 0) kv.emplace_back(k, v);
  return Config::load("", kv);
}

// ---- Experiment -----------------------------------------------------------------------------------

Experiment::Experiment(const Config& config) : config_(config) {
  if (config_.run.threads > 0) at::set_num_threads(static_cast<int>(config_.run.threads));
  device_ = parse_run_device(config_.run.device);
  at::manual_seed(config_.run.seed);  // the default generator, for anything that uses it

  // 1. Model, cuts and boundaries: no data read yet.
  DatasetSource source{config_.data.dataset, config_.data.root, config_.data.image_size, config_.data.channels};
  DatasetShape shape = dataset_shape(source);
  at::Generator gen = at::detail::createCPUGenerator(mix_seed(config_.run.seed, 0x6d6f64656cull));  // "model"
  std::shared_ptr<ResNet> model;
  try {
    model = make_resnet(config_.model.arch, shape.channels, shape.num_classes, config_.model.width, gen);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "model.arch = ", config_.model.arch, ": ", e.what_without_backtrace());
  }
  std::vector<std::string> cuts = config_.model.no_cuts        ? std::vector<std::string>{}
                                  : config_.model.cuts.empty() ? model->cut_points()
                                                               : config_.model.cuts;
  for (int64_t i : config_.boundary_override_indices())
    TORCH_CHECK(i <= static_cast<int64_t>(cuts.size()), "boundary.", i, ": the model has ", cuts.size(), " cut",
                cuts.size() == 1 ? "" : "s", " (model.cuts), so boundaries are numbered 1..", cuts.size());
  std::vector<BoundaryPtr> boundaries;
  for (size_t i = 0; i < cuts.size(); ++i) {
    BoundarySettings b = config_.boundary_at(static_cast<int64_t>(i + 1));
    try {  // e.g. backward_mode = shared with a forward codec that has no mask
      boundaries.push_back(std::make_shared<Boundary>("boundary " + std::to_string(i + 1) + " (after " + cuts[i] + ")",
                                                      b.forward, b.backward, parse_backward_mode(b.backward_mode),
                                                      b.active_at_inference));
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "boundary.", i + 1, " (config [boundary] / [boundary.", i + 1,
                  "]): ", e.what_without_backtrace());
    }
  }
  try {
    pipeline_ = std::make_shared<Pipeline>(model, cuts, boundaries);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "model.cuts: ", e.what_without_backtrace());
  }
  pipeline_->to(device_);

  // 2. Data.
  DatasetSplits data = load_dataset(source);
  ImageDataset train = data.train.head(config_.data.train_limit);
  ImageDataset test = data.test.head(config_.data.test_limit);
  LoaderOptions train_opt;
  train_opt.batch_size = config_.train.batch_size;
  train_opt.shuffle = true;
  train_opt.drop_last = config_.train.drop_last;
  train_opt.seed = config_.run.seed;
  if (config_.data.mean.empty()) {
    std::tie(train_opt.mean, train_opt.std) = train.channel_stats();
  } else {
    train_opt.mean = config_.data.mean;
    train_opt.std = config_.data.std;
  }
  train_opt.crop_padding = config_.data.crop_padding;
  train_opt.hflip = config_.data.hflip;
  train_opt.prefetch = config_.data.prefetch;
  LoaderOptions test_opt = train_opt;
  test_opt.batch_size = config_.train.eval_batch_size;
  test_opt.shuffle = false;
  test_opt.drop_last = false;
  test_opt.crop_padding = 0;
  test_opt.hflip = false;
  train_loader_ = std::make_unique<DataLoader>(train, train_opt);
  test_loader_ = std::make_unique<DataLoader>(test, test_opt);

  // 3. One forward pass in eval mode on two training samples: checks that the model accepts the
  //    images, and creates codec weights sized at their first input (ae with d = 0) before the
  //    optimizer collects the parameters. Eval mode leaves BatchNorm and codec state untouched.
  {
    Batch probe = train_loader_->make_batch(0, 0);
    pipeline_->eval();
    pipeline_->predict(probe.images.narrow(0, 0, std::min<int64_t>(2, probe.images.size(0))).to(device_), true);
    pipeline_->train();
    pipeline_->reset_stats();
  }

  // 4. Optimizer and schedule.
  GroupOptions opt;
  opt.lr = config_.train.lr;
  opt.momentum = config_.train.momentum;
  opt.nesterov = config_.train.nesterov;
  opt.weight_decay = config_.train.weight_decay;
  optimizer_ = std::make_unique<SGD>(weight_decay_groups(*pipeline_, config_.train.weight_decay), opt);
  scheduler_ = std::make_unique<LRScheduler>(*optimizer_, build_schedule(config_.train, steps_per_epoch()));
}

std::string Experiment::describe() const {
  std::ostringstream s;
  const auto& train = train_loader_->dataset();
  s << config_.model.arch << " (width " << config_.model.width << ", " << pipeline_->model()->num_parameters()
    << " parameters) on " << train.description << ": " << train.size() << " train / " << test_loader_->num_samples()
    << " test samples of " << train.channels() << "x" << train.height() << "x" << train.width() << ", "
    << pipeline_->num_stages() << " stage" << (pipeline_->num_stages() == 1 ? "" : "s");
  for (size_t i = 0; i < pipeline_->boundaries().size(); ++i) s << "\n  " << pipeline_->boundary(i)->describe();
  return s.str();
}

double Experiment::evaluate(bool compression) {
  pipeline_->eval();
  int64_t correct = 0, total = 0;
  for (int64_t b = 0; b < test_loader_->num_batches(); ++b) {
    Batch batch = test_loader_->make_batch(0, b);
    at::Tensor logits = pipeline_->predict(batch.images.to(device_), compression);  // (B, classes)
    correct += logits.argmax(1).eq(batch.labels.to(device_)).sum().item<int64_t>();
    total += batch.labels.numel();
  }
  pipeline_->train();
  return total > 0 ? static_cast<double>(correct) / static_cast<double>(total) : 0.0;
}

EpochMetrics Experiment::train_epoch(int64_t epoch, const std::function<void(const StepLog&)>& on_step) {
  pipeline_->train();
  pipeline_->reset_stats();
  const auto loss_fn = [](const Variable& logits, const at::Tensor& y) { return cross_entropy(logits, y); };
  EpochMetrics m;
  m.epoch = epoch + 1;
  double loss_sum = 0.0;
  int64_t correct = 0, samples = 0;
  auto window_start = std::chrono::steady_clock::now();
  int64_t window_images = 0;
  train_loader_->start_epoch(epoch);
  while (auto batch = train_loader_->next()) {
    at::Tensor x = batch->images.to(device_), y = batch->labels.to(device_);
    optimizer_->zero_grad();
    StepResult r = pipeline_->train_step(x, y, batch->ids, config_.train.micro_batches, loss_fn, epoch);
    TORCH_CHECK(std::isfinite(r.loss), "training diverged at epoch ", epoch + 1, " step ", batch->index + 1,
                ": loss is ", r.loss, "; lower train.lr or use a milder compressor");
    if (config_.train.grad_clip > 0) clip_grad_norm(optimizer_->parameters(), config_.train.grad_clip);
    optimizer_->step();
    pipeline_->after_optimizer_step();  // every codec's hook (subspace projection, lazy EF carry)
    scheduler_->step();
    loss_sum += r.loss * static_cast<double>(r.samples);
    correct += r.correct;
    samples += r.samples;
    window_images += r.samples;
    ++m.steps;
    if (on_step) {
      StepLog log;
      log.step = scheduler_->step_count();
      log.epoch = epoch;
      log.step_in_epoch = batch->index + 1;
      log.steps_in_epoch = train_loader_->num_batches();
      log.loss = r.loss;
      log.acc = static_cast<double>(r.correct) / static_cast<double>(std::max<int64_t>(r.samples, 1));
      log.lr = optimizer_->lr(0);
      double dt = seconds_since(window_start);
      log.images_per_s = dt > 0 ? static_cast<double>(window_images) / dt : 0.0;
      if (dt > 2.0) window_start = std::chrono::steady_clock::now(), window_images = 0;
      on_step(log);
    }
  }
  TORCH_CHECK(samples > 0, "epoch ", epoch + 1, ": the training loader produced no batch");
  BoundaryStats stats = pipeline_->total_stats();
  m.train_loss = loss_sum / static_cast<double>(samples);
  m.train_acc = static_cast<double>(correct) / static_cast<double>(samples);
  m.bytes_forward = stats.forward.bytes;
  m.bytes_backward = stats.backward.bytes;
  m.bytes_uncompressed = stats.forward.raw_bytes + stats.backward.raw_bytes;
  if (stats.forward.measured > 0)
    m.forward_rel_error = stats.forward.rel_error_mean, m.forward_density = stats.forward.density_mean;
  if (stats.backward.measured > 0)
    m.backward_rel_error = stats.backward.rel_error_mean, m.backward_density = stats.backward.density_mean;
  m.lr = optimizer_->lr(0);
  return m;
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

}  // namespace

RunSummary run_training(const TrainRequest& req) {
  const auto t_start = std::chrono::steady_clock::now();
  TORCH_CHECK(!req.out_dir.empty(), "train: --out DIR is required");
  Experiment ex(req.config);
  const Config& cfg = ex.config();
  Progress progress(req.quiet ? Progress::Mode::kNone : Progress::resolve(cfg.run.progress));
  fs::create_directories(req.out_dir);
  const std::string out = req.out_dir;
  const std::string ckpt = (fs::path(out) / kCheckpoint).string();
  const std::string csv = (fs::path(out) / "metrics.csv").string();
  const std::string jsonl = (fs::path(out) / "metrics.jsonl").string();

  std::vector<EpochMetrics> history;
  int64_t start_epoch = 0;
  double wall_before = 0.0;
  if (!req.resume_dir.empty()) {
    const std::string from = (fs::path(req.resume_dir) / kCheckpoint).string();
    TORCH_CHECK(fs::exists(from), "--resume ", req.resume_dir, ": no ", kCheckpoint, " there (nothing to resume)");
    CheckpointInfo info = load_checkpoint(from, ex.pipeline(), &ex.optimizer(), &ex.scheduler());
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
    if (fs::exists(old_jsonl))
      truncate_jsonl(old_jsonl, jsonl, info.step);
    else
      write_file_atomic(jsonl, "");
    progress.line("resuming " + req.resume_dir + " after epoch " + std::to_string(start_epoch) + " (step " +
                  std::to_string(info.step) + ")");
  } else {
    write_file_atomic(jsonl, "");
  }
  write_file_atomic((fs::path(out) / "config.ini").string(), cfg.to_ini());
  progress.line(ex.describe());

  RunSummary summary;
  summary.name = fs::path(out).filename().string();
  if (summary.name.empty()) summary.name = fs::path(out).parent_path().filename().string();
  summary.config = req.config_path;
  // The specs of the cuts: one when they all agree, else each cut's in order ("a, b, c").
  auto specs_of = [&](bool forward) {
    std::vector<std::string> all;
    for (size_t i = 1; i <= ex.pipeline().boundaries().size(); ++i) {
      BoundarySettings b = cfg.boundary_at(static_cast<int64_t>(i));
      all.push_back(forward ? b.forward : b.backward);
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
  summary.train_samples = ex.train_loader().num_samples();
  summary.test_samples = ex.test_loader().num_samples();
  summary.fingerprint = config_fingerprint(cfg);
  if (!history.empty()) summary.last = history.back();

  int64_t run_epochs = 0;
  for (int64_t epoch = start_epoch; epoch < cfg.train.epochs; ++epoch) {
    if (req.stop_after_epochs > 0 && run_epochs >= req.stop_after_epochs) break;
    double loss_window = 0.0;
    int64_t window = 0;
    EpochMetrics m = ex.train_epoch(epoch, [&](const Experiment::StepLog& s) {
      progress.bar(s.epoch + 1, cfg.train.epochs, s.step_in_epoch, s.steps_in_epoch, s.loss, s.images_per_s);
      loss_window += s.loss;
      ++window;
      if (s.step % cfg.run.log_every == 0 || s.step_in_epoch == s.steps_in_epoch) {
        json j{{"step", s.step},
               {"epoch", s.epoch + 1},
               {"loss", loss_window / double(window)},
               {"acc", s.acc},
               {"lr", s.lr},
               {"images_per_s", s.images_per_s},
               {"wall_s", wall_before + seconds_since(t_start)}};
        append_line(jsonl, j.dump());
        if (progress.mode() == Progress::Mode::kPlain) {
          std::ostringstream line;
          line << "epoch " << s.epoch + 1 << "/" << cfg.train.epochs << " step " << s.step_in_epoch << "/"
               << s.steps_in_epoch << "  loss " << std::fixed << std::setprecision(4) << loss_window / double(window)
               << "  lr " << std::setprecision(5) << s.lr << "  " << std::setprecision(0) << s.images_per_s << " img/s";
          progress.line(line.str());
        }
        loss_window = 0.0;
        window = 0;
      }
    });
    m.test_acc_compressed = ex.evaluate(true);
    m.test_acc_uncompressed = ex.evaluate(false);
    m.wall_s = wall_before + seconds_since(t_start);
    history.push_back(m);
    ++run_epochs;

    json j{{"epoch_end", m.epoch},
           {"step", ex.global_step()},
           {"train_loss", m.train_loss},
           {"train_acc", m.train_acc},
           {"test_acc_compressed", m.test_acc_compressed},
           {"test_acc_uncompressed", m.test_acc_uncompressed},
           {"bytes_forward", m.bytes_forward},
           {"bytes_backward", m.bytes_backward},
           {"bytes_uncompressed", m.bytes_uncompressed},
           {"forward_rel_error", m.forward_rel_error},
           {"backward_rel_error", m.backward_rel_error},
           {"forward_density", m.forward_density},
           {"backward_density", m.backward_density},
           {"wall_s", m.wall_s}};
    append_line(jsonl, j.dump());
    write_file_atomic(csv, metrics_csv(history));
    summary.last = m;
    write_file_atomic((fs::path(out) / "summary.json").string(), summary_json(summary));
    if ((m.epoch % cfg.run.checkpoint_every == 0) || m.epoch == cfg.train.epochs ||
        (req.stop_after_epochs > 0 && run_epochs >= req.stop_after_epochs)) {
      CheckpointInfo info;
      info.step = ex.global_step();
      info.epoch = m.epoch;
      info.metadata["wall_s"] = std::to_string(m.wall_s);
      info.metadata["fingerprint"] = summary.fingerprint;
      save_checkpoint(ckpt, ex.pipeline(), &ex.optimizer(), &ex.scheduler(), info);
    }
    std::ostringstream line;
    line << std::fixed << "epoch " << m.epoch << "/" << cfg.train.epochs << ": train loss " << std::setprecision(4)
         << m.train_loss << ", test acc " << std::setprecision(2) << 100 * m.test_acc_compressed << "% compressed / "
         << 100 * m.test_acc_uncompressed << "% uncompressed, sent "
         << human_bytes(double(m.bytes_forward + m.bytes_backward) / double(std::max<int64_t>(m.steps, 1)))
         << "/step of " << human_bytes(double(m.bytes_uncompressed) / double(std::max<int64_t>(m.steps, 1)))
         << " uncompressed, " << std::setprecision(1) << m.wall_s << " s";
    progress.line(line.str());
  }
  return summary;
}

std::vector<double> evaluate_run(const std::string& run_dir, const std::vector<bool>& compression,
                                 const std::vector<std::pair<std::string, std::string>>& overrides) {
  const std::string config = (fs::path(run_dir) / "config.ini").string();
  const std::string ckpt = (fs::path(run_dir) / kCheckpoint).string();
  TORCH_CHECK(fs::exists(config), "eval --run ", run_dir, ": no config.ini (not a tapeline run directory)");
  TORCH_CHECK(fs::exists(ckpt), "eval --run ", run_dir, ": no ", kCheckpoint, " (the run has not finished an epoch)");
  Config cfg = Config::load(config, overrides);
  Experiment ex(cfg);
  CheckpointLoadOptions opt;
  opt.restore_rng = false;
  load_checkpoint(ckpt, ex.pipeline(), nullptr, nullptr, opt);
  std::vector<double> acc;
  for (bool on : compression) acc.push_back(ex.evaluate(on));
  return acc;
}

}  // namespace tl
