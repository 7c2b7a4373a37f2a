#include "tasks/runner/trainer.h"

#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <set>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include <cstdlib>
#include <thread>
#include <tuple>

#include "layers/io/checkpoint.h"
#include "layers/optim/adam.h"
#include "layers/optim/grad_utils.h"
#include "layers/optim/sgd.h"
#include "tasks/data/loader.h"
#include "parallel/ranks/rendezvous.h"
#include "parallel/ranks/fault.h"
#include "parallel/ranks/runtime.h"
#include "parallel/ranks/transport.h"
#include "parallel/executor.h"
#include "tasks/models.h"

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

// Keys that do not change what a run computes (presentation, placement, file locations; one process
// or one per stage compute the same numbers, parallel/ranks/runtime.h).
bool outside_fingerprint(const std::string& key) {
  static const std::vector<std::string> keys = {"run.progress", "run.log_every", "run.checkpoint_every", "run.threads",
                                                "run.measure_error",
                                                "run.device",   "data.root",     "data.prefetch", "model.weights",
                                                "pipeline.nproc", "dist.timeout_s", "dist.checksum", "dist.inject_fault",
                                                "dist.corrupt_rate", "dist.corrupt_seed", "parallel.dp",
                                                "dp.compression", "dp.compress_stages"};
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

// ---- Experiment -----------------------------------------------------------------------------------

namespace {

// run.threads = 0: every core. Measured on 2 cores (ResNet-18 step, README): 1.16 s with ATen's
// default of 1 thread here, 0.70 s with 2.
int choose_threads(int64_t requested) {
  if (requested > 0) return static_cast<int>(requested);
  const unsigned cores = std::thread::hardware_concurrency();
  return cores > 0 ? static_cast<int>(cores) : at::get_num_threads();
}

// Note [OpenBLAS threads]: Debian's libtorch 1.13 multiplies matrices in OpenBLAS (its pthreads
// build), whose worker pool at::set_num_threads does not reach: with run.threads = 1 a MiniLM
// fine-tuning run still multiplied on both cores of a 2-core machine (37.7 s of CPU for 25 s of
// wall, 9.5 s of it in the kernel, workers spinning), and two such runs side by side (two labs,
// as scripts/test runs them) took 42.1 s each; with OpenBLAS told too, 34.3 s each, with 1 s of
// kernel time. OpenBLAS's own setter is called where the process has one (PyTorch's wheels use
// MKL or their own OpenMP, which at::set_num_threads does reach).
void set_blas_threads(int threads) {
  using Setter = void (*)(int);
  if (auto set = reinterpret_cast<Setter>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) set(threads);
}

std::unique_ptr<Optimizer> build_optimizer(const TrainSection& t, Module& model) {
  GroupOptions opt;
  opt.lr = t.lr;
  opt.weight_decay = t.weight_decay;
  // Decay applies to weights only: biases, norm parameters and (transformers) embeddings' norms stay.
  auto groups = weight_decay_groups(model, t.weight_decay);
  if (t.optimizer == "adamw") {
    opt.set_betas(t.beta1, t.beta2).set_eps(t.eps);
    return std::make_unique<AdamW>(std::move(groups), opt);
  }
  opt.momentum = t.momentum;
  opt.nesterov = t.nesterov;
  return std::make_unique<SGD>(std::move(groups), opt);
}

}  // namespace

Experiment::Experiment(const Config& config, bool allow_distributed) : config_(config) {
  // One rank of several (torchrun, tapeline train --nproc): the environment says so.
  std::optional<ranks::DistEnv> env;
  if (allow_distributed && ranks::DistEnv::one_of_several()) env = ranks::DistEnv::from_env();
  if (allow_distributed && !env)
    TORCH_CHECK(config_.pipeline.nproc == 1, "pipeline.nproc = ", config_.pipeline.nproc,
                ": this process is not one of several ranks (RANK and WORLD_SIZE are not set); start the ranks with "
                "`tapeline train --nproc ",
                config_.pipeline.nproc, " ...` or torchrun, or set pipeline.nproc = 1 to run every stage here");
  if (env)
    TORCH_CHECK(config_.pipeline.nproc == 1 || config_.pipeline.nproc == env->world_size, "pipeline.nproc = ",
                config_.pipeline.nproc, " but ", env->world_size,
                " ranks were started (WORLD_SIZE); start as many ranks as the config says, or drop pipeline.nproc");
  if (env && config_.run.threads == 0) {  // the machine's cores shared by the ranks on it
    const unsigned cores = std::thread::hardware_concurrency();
    config_.run.threads = std::max<int64_t>(1, static_cast<int64_t>(cores) / std::max(1, env->local_world_size));
  }
  threads_ = choose_threads(config_.run.threads);
  at::set_num_threads(threads_);
  set_blas_threads(threads_);  // Note [OpenBLAS threads]
  device_ = parse_run_device(config_.run.device);
  if (env && device_.is_cuda()) {  // rank r on device r mod devices (one machine; local rank on several)
    const int devices = at::detail::getCUDAHooks().getNumGPUs();
    device_ = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(ranks::cuda_device_for(env->local_rank, devices)));
  }
  at::manual_seed(config_.run.seed);  // the default generator, for anything that uses it

  // 1. Task, model, cuts and boundaries: no data read yet. One rank of several builds only its
  //    stages (Note [building only some stages]); the cut points come from the config or, when it
  //    names none, from a skeleton of the model (no modules).
  task_ = make_task(config_);
  at::Generator gen = at::detail::createCPUGenerator(mix_seed(config_.run.seed, 0x6d6f64656cull));  // "model"
  auto model_cuts = [&](const BuiltModel& m) {
    auto* splittable = dynamic_cast<Splittable*>(m.model.get());
    TORCH_CHECK(splittable, "model.arch = ", config_.model.arch, " cannot be split into stages");
    return config_.model.no_cuts        ? std::vector<std::string>{}
           : config_.model.cuts.empty() ? splittable->cut_points()
                                        : config_.model.cuts;
  };
  StageSelection selection;
  if (env) {
    const std::vector<std::string> cuts =
        config_.model.no_cuts      ? std::vector<std::string>{}
        : !config_.model.cuts.empty() ? config_.model.cuts
                                      : model_cuts(build_model(config_, task_->shape(), gen, StageSelection::skeleton()));
    const int stages = static_cast<int>(cuts.size()) + 1, v = static_cast<int>(config_.pipeline.virtual_stages);
    // A world, dp or virtual_stages that does not fit is reported below, with the whole model.
    if (v >= 1 && stages % v == 0 && env->world_size == stages / v * config_.parallel.dp * config_.parallel.tp) {
      const Grid grid = Grid::of(env->world_size, stages / v, static_cast<int>(config_.parallel.dp),
                                 static_cast<int>(config_.parallel.tp));
      std::set<int64_t> own;
      const Placement placement = placement_of(config_.pipeline.schedule);
      if (placement == Placement::RoundRobin || v == 2)  // else reported below
        for (int s : StageLayout::of(stages, v, placement).stages_of(grid.pipeline_rank(env->rank))) own.insert(s);
      selection = StageSelection::of(cuts, own);
    }
  }
  {  // parallel.tp: checked on the config before anything is built (tasks/models.h)
    const std::string problem = tensor_parallel_problem(config_);
    TORCH_CHECK(problem.empty(), problem);
  }
  BuiltModel built = build_model(config_, task_->shape(), gen, selection);
  if (config_.parallel.tp > 1) {  // Note [tensor-parallel blocks]: this rank's part of every block it built
    TORCH_CHECK(env, "parallel.tp = ", config_.parallel.tp,
                ": tensor parallelism runs one process per tensor rank; start the ranks with `tapeline train --nproc N` "
                "or torchrun (docs/TENSOR.md)");
    tensor_parallel_ = std::make_shared<TensorParallel>(env->rank % config_.parallel.tp, config_.parallel.tp);
    shard_tensor_parallel(*built.model, tensor_parallel_, "model.arch = " + config_.model.arch);
  }
  std::vector<std::string> cuts = model_cuts(built);
  for (int64_t i : config_.boundary_override_indices())
    TORCH_CHECK(i <= static_cast<int64_t>(cuts.size()), "boundary.", i, ": the model has ", cuts.size(), " cut",
                cuts.size() == 1 ? "" : "s", " (model.cuts), so boundaries are numbered 1..", cuts.size());
  std::vector<BoundaryPtr> boundaries;
  std::vector<LinkSpec> links;
  for (size_t i = 0; i < cuts.size(); ++i) {
    BoundarySettings b = config_.boundary_at(static_cast<int64_t>(i + 1));
    links.push_back({b.bandwidth_mbps, b.latency_ms});
    try {  // e.g. backward_mode = shared with a forward codec that has no mask
      boundaries.push_back(std::make_shared<Boundary>("boundary " + std::to_string(i + 1) + " (after " + cuts[i] + ")",
                                                      b.forward, b.backward, parse_backward_mode(b.backward_mode),
                                                      b.active_at_inference));
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "boundary.", i + 1, " (config [boundary] / [boundary.", i + 1,
                  "]): ", e.what_without_backtrace());
    }
    boundaries.back()->set_epilogue_only(b.epilogue_only);
    boundaries.back()->set_epilogue_rule(b.epilogue_rule == "critical_path" ? EpilogueRule::CriticalPath
                                                                             : EpilogueRule::Optimus);
  }
  try {
    pipeline_ = std::make_shared<Pipeline>(built.model, cuts, boundaries);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "model.cuts: ", e.what_without_backtrace());
  }
  pipeline_->set_schedule(config_.pipeline.schedule);
  try {
    pipeline_->set_virtual_stages(static_cast<int>(config_.pipeline.virtual_stages));
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "pipeline.virtual_stages = ", config_.pipeline.virtual_stages, " does not divide the ",
                pipeline_->num_stages(), " stages (", cuts.size(), " cuts, model.cuts)");
  }
  pipeline_->set_links(links);
  pipeline_->set_device_model(device_model(config_.timeline.device));
  pipeline_->set_measure_error(config_.run.measure_error);
  // Links shared by the boundaries between two ranks (interleaved) must agree: checked now.
  link_specs_by_rank_pair(pipeline_->layout(), links);
  pipeline_->to(device_);
  apply_codec_constraints(*pipeline_);  // subspace codecs project the GPT-2 weights they need

  // 1b. Multi-process: meet the other ranks (a grid of pipeline ranks x replicas, parallel/grid.h)
  //     before the data is read, so a mismatch or a missing rank is reported early. Links are
  //     emulated at the receiver.
  TORCH_CHECK(env || config_.parallel.dp == 1, "parallel.dp = ", config_.parallel.dp,
              ": data parallelism runs one process per pipeline rank and replica; start ",
              pipeline_->num_stages() / config_.pipeline.virtual_stages * config_.parallel.dp,
              " ranks with `tapeline train --nproc N` or torchrun (docs/GRID.md)");
  TORCH_CHECK(env || (config_.dist.inject_fault.empty() && config_.dist.corrupt_rate == 0),
              "dist.inject_fault and dist.corrupt_rate inject faults into the messages between ranks; this run has one "
              "process: start several with `tapeline train --nproc N` or torchrun (docs/FAULTS.md)");
  TORCH_CHECK(!env || config_.timeline.device == "measured", "timeline.device = ", config_.timeline.device,
              " models compute on the in-process pipeline's timeline; a run of several processes measures its "
              "real time: set timeline.device = measured, or run in one process (pipeline.nproc = 1)");
  if (env) {
    if (!config_.dist.inject_fault.empty()) {  // Note [fault injection]
      ranks::arm_fault(ranks::parse_fault(config_.dist.inject_fault), env->rank, static_cast<int>(config_.parallel.dp));
      ranks::fault_point(ranks::FaultPhase::Rendezvous, 0, nullptr, false, "before meeting the other ranks");
    }
    const int pipeline_ranks = static_cast<int>(pipeline_->num_stages() / config_.pipeline.virtual_stages);
    const Grid grid = Grid::of(env->world_size, pipeline_ranks, static_cast<int>(config_.parallel.dp),
                               static_cast<int>(config_.parallel.tp));
    ranks::TransportOptions o;
    o.backend = device_.is_cuda() ? "nccl" : "gloo";
    o.timeout_s = config_.dist.timeout_s;
    o.comm_thread = true;  // sends overlap compute
    o.checksum = config_.dist.checksum;
    o.corrupt_rate = config_.dist.corrupt_rate;
    o.corrupt_seed = static_cast<uint64_t>(config_.dist.corrupt_seed);
    const int r = env->rank;
    const StageLayout layout = pipeline_->layout();  // round robin, or ZB-V's V
    const int replica = grid.replica(r), t = grid.tensor_rank(r);
    for (const auto& [pair, spec] : link_specs_by_rank_pair(layout, links))  // pipeline ranks of this replica
      if (grid.rank_of(pair.second, replica, t) == r) o.link_from[grid.rank_of(pair.first, replica, t)] = spec;
    for (int peer : grid.data_group(grid.pipeline_rank(r), t))  // the other replicas of this pipeline rank
      if (peer != r) o.link_from[peer] = LinkSpec{config_.dp.bandwidth_mbps, config_.dp.latency_ms};
    transport_ = ranks::Transport::connect(*env, o);
    if (tensor_parallel_) {  // the blocks' all-reduces go over the transport from now on
      ranks::TensorParallelOptions tp;
      tp.size = static_cast<int>(config_.parallel.tp);
      tp.forward = config_.tp.forward;
      tp.backward = config_.tp.backward;
      tp.active_at_inference = config_.tp.active_at_inference;
      tp.algorithm = config_.tp.algorithm;
      tp_sync_ = std::make_shared<ranks::TensorParallelSync>(
          *transport_, grid.tensor_group(grid.pipeline_rank(r), replica), t, tensor_parallel_->sites(), tp);
      tensor_parallel_->bind(tp_sync_);
    }
  }

  // 2. Data.
  task_->load_data();

  // 3. One forward pass in eval mode on two training samples: checks that the model accepts the
  //    task's batches, and creates codec weights sized at their first input (ae with d = 0)
  //    before the optimizer collects the parameters. Eval mode leaves BatchNorm and codec state
  //    untouched.
  {
    Batch probe = task_->train_batch(0, 0);
    probe = probe.slice(0, std::min<int64_t>(2, probe.rows())).to(device_);
    pipeline_->eval();
    if (transport_) {  // each rank holds only its stages: the probe crosses the ranks
      const auto loss_fn = [this](const Variable& out, const Batch& mb) { return task_->loss(out, mb); };
      if (tp_sync_) tp_sync_->set_phase(0, "before training: checking the model on two training samples", false, true);
      ranks::run_probe(*pipeline_, *transport_, static_cast<int>(config_.parallel.dp), probe, loss_fn,
                      static_cast<int>(config_.parallel.tp));
    } else {
      pipeline_->predict(probe.input, true, probe.side);
    }
    pipeline_->train();
    pipeline_->reset_stats();
  }

  // 4. Optimizer and schedule.
  optimizer_ = build_optimizer(config_.train, *pipeline_);
  scheduler_ = std::make_unique<LRScheduler>(*optimizer_, build_schedule(config_.train, steps_per_epoch()));
  if (transport_) {
    ranks::DataParallelOptions dp;
    dp.replicas = static_cast<int>(config_.parallel.dp);
    dp.compression = config_.dp.compression;
    dp.compress_stages = config_.dp.compress_stages;
    for (int64_t s : dp.compress_stages)
      TORCH_CHECK(s < static_cast<int64_t>(pipeline_->num_stages()), "dp.compress_stages: stage ", s,
                  " does not exist; the model has ", pipeline_->num_stages(), " stages (0 .. ",
                  pipeline_->num_stages() - 1, ")");
    dist_ = std::make_unique<ranks::DistExecutor>(*pipeline_, *transport_, dp, tp_sync_.get());
    dist_->synchronized(*optimizer_);
  }
  model_description_ = built.describe(dist_ ? dist_->model_parameters() : built.model->num_parameters());
}

std::string grid_problem(const Config& config, int world) {
  try {
    const std::string tp = tensor_parallel_problem(config);
    if (!tp.empty()) return tp;
    int64_t stages = 1;
    if (!config.model.no_cuts) {
      if (!config.model.cuts.empty()) {
        stages = static_cast<int64_t>(config.model.cuts.size()) + 1;
      } else {
        auto task = make_task(config);
        at::Generator gen = at::detail::createCPUGenerator(0);
        BuiltModel skeleton = build_model(config, task->shape(), gen, StageSelection::skeleton());
        auto* splittable = dynamic_cast<Splittable*>(skeleton.model.get());
        if (splittable) stages = static_cast<int64_t>(splittable->cut_points().size()) + 1;
      }
    }
    const int64_t v = config.pipeline.virtual_stages;
    if (v < 1 || stages % v != 0) return "";  // reported by the ranks with the whole story
    Grid::of(world, static_cast<int>(stages / v), static_cast<int>(config.parallel.dp),
             static_cast<int>(config.parallel.tp));
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

Experiment::~Experiment() = default;

int Experiment::rank() const { return transport_ ? transport_->rank() : 0; }
int Experiment::world_size() const { return transport_ ? transport_->world_size() : 1; }

void Experiment::save_checkpoint(const std::string& path, const CheckpointInfo& info) {
  if (!dist_) {
    tl::save_checkpoint(path, *pipeline_, optimizer_.get(), scheduler_.get(), info);
    return;
  }
  dist_->save_checkpoint(path, checkpoint_contents(*pipeline_, optimizer_.get(), scheduler_.get(), info));
}

CheckpointInfo Experiment::load_checkpoint(const std::string& path) {
  CheckpointLoadOptions options;
  options.part = dist_ != nullptr;  // this rank's stages (Note [building only some stages])
  if (tensor_parallel_) {           // whole tensors cut to this tensor rank's parts
    options.shards = pipeline_->named_shards();
    options.tensor_rank = tensor_parallel_->rank();
    options.tensor_size = tensor_parallel_->size();
  }
  CheckpointInfo info = tl::load_checkpoint(path, *pipeline_, optimizer_.get(), scheduler_.get(), options);
  if (dist_) {
    resume_note_ = dist_->restore_grid_state(path);  // this replica's own codec state
    dist_->synchronized(*optimizer_);                // the reference that later changes are against
  }
  return info;
}

std::string Experiment::describe() const {
  std::ostringstream s;
  s << "task " << task_->name() << ": " << task_->describe() << "\nmodel " << model_description_ << ", "
    << pipeline_->num_stages() << " stage" << (pipeline_->num_stages() == 1 ? "" : "s") << "; optimizer "
    << optimizer_->name() << "; " << threads_ << " thread" << (threads_ == 1 ? "" : "s") << " on "
    << device_.str();
  for (size_t i = 0; i < pipeline_->boundaries().size(); ++i) s << "\n  " << pipeline_->boundary(i)->describe();
  return s.str();
}

Experiment::Evaluation Experiment::evaluate(bool compression) {
  // One forward-only pass per test batch through every stage, by the one interpreter (in this
  // process, or this rank's stages); the tally is the last stage's.
  const auto loss_fn = [this](const Variable& out, const Batch& mb) { return task_->loss(out, mb); };
  at::Tensor tally;
  for (int64_t b = 0; b < task_->eval_batches(); ++b) {
    if (dist_ && !dist_->evaluates(b)) continue;  // another replica's share
    const Batch batch = task_->eval_batch(b).to(device_);
    at::Tensor t = dist_ ? dist_->evaluate_batch(batch, compression, loss_fn, b)
                         : pipeline_->evaluate_batch(batch, compression, loss_fn);
    if (t.defined()) tally = tally.defined() ? tally + t : t;
  }
  Tally t;
  if (dist_)
    t = dist_->share_tally(tally, std::string("evaluation with compression ") + (compression ? "on" : "off"));
  else if (tally.defined())
    t = Tally::from(tally);  // one sync per evaluation
  if (t.units <= 0) return {};
  return {t.loss(), task_->metric_value(t)};
}

bool Experiment::has_adaptive_codecs() const {
  for (const auto& b : pipeline_->boundaries())
    if (b->forward_codec()->level() || b->backward_codec()->level()) return true;
  return false;
}

namespace {

// Bytes sent so far this epoch by each boundary, forward and backward.
std::vector<std::pair<int64_t, int64_t>> bytes_sent(const Pipeline& p) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& b : p.boundaries()) {
    const BoundaryStats s = b->stats();
    out.emplace_back(s.forward.bytes, s.backward.bytes);
  }
  return out;
}

// levels.csv rows of a step: every codec with a level, and what its direction sent since `before`.
std::vector<LevelRow> level_rows(const Pipeline& p, const std::vector<std::pair<int64_t, int64_t>>& before,
                                 int64_t step, int64_t epoch) {
  const auto after = bytes_sent(p);
  std::vector<LevelRow> rows;
  for (size_t i = 0; i < p.boundaries().size(); ++i) {
    const BoundaryPtr& b = p.boundary(i);
    for (bool forward : {true, false}) {
      const auto level = (forward ? b->forward_codec() : b->backward_codec())->level();
      if (!level) continue;
      LevelRow r;
      r.step = step, r.epoch = epoch + 1, r.boundary = static_cast<int64_t>(i + 1);
      r.direction = forward ? "forward" : "backward";
      r.level = level->value, r.label = level->label;
      r.bytes = forward ? after[i].first - before[i].first : after[i].second - before[i].second;
      rows.push_back(r);
    }
  }
  return rows;
}

// Note [levels of a multi-process run]: each direction's codec lives on the rank that sends with
// it, so every rank keeps the rows of the directions it sent (a direction it did not send moved 0
// bytes there) and rank 0 gathers them once per epoch: no collective per step. Merged as one
// process would report them: bytes summed over the replicas (each sends its share of the
// micro-batches), the level and label of replica 0's codec (whose state the checkpoint holds; the
// replicas' codecs see different messages and may differ), a stage's tensor ranks once (they send
// the same messages). With one replica the rows equal the in-process run's
// (MultiProcessTrain.AdaptiveLevelsAreThoseOfOneProcess).
std::vector<LevelRow> gather_level_rows(ranks::DistExecutor& d, const std::vector<LevelRow>& mine, int64_t epoch) {
  json out = json::array();
  if (d.tensor_rank() == 0)
    for (const LevelRow& r : mine)
      out.push_back({r.step, r.epoch, r.boundary, r.direction == "forward", r.level, r.label, r.bytes});
  const std::vector<std::string> all = d.transport().gather_bytes(
      out.dump(), 0, "end of epoch " + std::to_string(epoch + 1) + ", gathering the codecs' levels");
  std::map<std::tuple<int64_t, int64_t, bool>, LevelRow> merged;  // (step, boundary, backward)
  for (size_t rank = 0; rank < all.size(); ++rank) {
    const bool replica0 = d.grid().replica(static_cast<int>(rank)) == 0;
    for (const json& j : json::parse(all[rank])) {
      LevelRow r;
      r.step = j[0], r.epoch = j[1], r.boundary = j[2];
      r.direction = j[3].get<bool>() ? "forward" : "backward";
      r.level = j[4], r.label = j[5], r.bytes = j[6];
      auto [it, fresh] = merged.try_emplace({r.step, r.boundary, r.direction == "backward"}, r);
      if (fresh) continue;
      it->second.bytes += r.bytes;
      if (replica0) it->second.level = r.level, it->second.label = r.label;
    }
  }
  std::vector<LevelRow> rows;
  for (auto& [key, r] : merged) rows.push_back(std::move(r));
  return rows;
}

}  // namespace

EpochMetrics Experiment::train_epoch(int64_t epoch, const std::function<void(const StepLog&)>& on_step) {
  pipeline_->train();
  pipeline_->reset_stats();
  const auto loss_fn = [this](const Variable& out, const Batch& mb) { return task_->loss(out, mb); };
  EpochMetrics m;
  m.epoch = epoch + 1;
  Tally total;
  auto window_start = std::chrono::steady_clock::now();
  double window_units = 0;
  task_->start_epoch(epoch);
  const int64_t total_steps = config_.train.epochs * steps_per_epoch();  // the run's, for the codecs' progress
  const bool levels = on_step && has_adaptive_codecs();
  std::vector<LevelRow> sent_levels;  // multi-process: this rank's rows (Note [levels of a multi-process run])
  epoch_levels_.clear();
  while (auto batch = task_->next_train_batch()) {
    optimizer_->zero_grad();
    const auto sent_before = levels ? bytes_sent(*pipeline_) : std::vector<std::pair<int64_t, int64_t>>();
    StepTiming timing;
    StepResult r;
    const int64_t global = scheduler_->step_count() + 1;
    const StepPosition at = StepPosition::of(epoch, global, total_steps);
    if (dist_) {  // this rank's stage; the result is the last stage's, on every rank
      r = dist_->train_step(batch->to(device_), config_.train.micro_batches, pipeline_->schedule(), loss_fn, at,
                            &timing);
    } else {
      r = pipeline_->train_step(batch->to(device_), config_.train.micro_batches, loss_fn, at);
      timing = pipeline_->last_timing();
    }
    TORCH_CHECK(std::isfinite(r.loss), "training diverged at epoch ", epoch + 1, " step ", batch->index + 1,
                ": loss is ", r.loss, "; lower train.lr or use a milder compressor");
    if (config_.train.grad_clip > 0) {
      if (dist_)
        dist_->clip_grad_norm(config_.train.grad_clip, global);
      else
        clip_grad_norm(pipeline_->parameters(), config_.train.grad_clip);  // the order the ranks sum in
    }
    optimizer_->step();
    pipeline_->after_optimizer_step();  // every codec's hook (subspace projection, lazy EF carry)
    scheduler_->step();
    m.train_time_s += timing.step_s;
    for (size_t s = 0; s < timing.compute_s.size(); ++s) {
      m.compute_s += timing.compute_s[s] / static_cast<double>(timing.compute_s.size());
      m.comm_s += timing.comm_s[s] / static_cast<double>(timing.comm_s.size());
    }
    const Tally step{r.loss * r.units, r.units, r.correct};
    total.loss_sum += step.loss_sum, total.units += step.units, total.correct += step.correct;
    window_units += r.units;
    ++m.steps;
    std::vector<LevelRow> step_levels;
    if (levels) step_levels = level_rows(*pipeline_, sent_before, scheduler_->step_count(), epoch);
    if (dist_)
      for (LevelRow& row : step_levels)
        if (row.bytes > 0) sent_levels.push_back(std::move(row));
    if (on_step) {
      StepLog log;
      log.step = scheduler_->step_count();
      log.epoch = epoch;
      log.step_in_epoch = batch->index + 1;
      log.steps_in_epoch = task_->train_batches();
      log.loss = r.loss;
      log.metric = task_->metric_value(step);
      log.lr = optimizer_->lr(0);
      double dt = seconds_since(window_start);
      log.units_per_s = dt > 0 ? window_units / dt : 0.0;
      if (dt > 2.0) window_start = std::chrono::steady_clock::now(), window_units = 0;
      if (!dist_) log.levels = std::move(step_levels);
      on_step(log);
    }
  }
  TORCH_CHECK(total.units > 0, "epoch ", epoch + 1, ": the task produced no training batch");
  std::vector<BoundaryStats> per_boundary;
  if (dist_ && levels) epoch_levels_ = gather_level_rows(*dist_, sent_levels, epoch);
  if (dist_) {
    // Rank 0 gets every rank's part: bytes are counted by each direction's sender. Pipeline time
    // is the slowest rank's; compute and comm are averaged over the ranks (stages), as in process.
    auto totals =
        dist_->gather_epoch(m.train_time_s, m.compute_s, m.comm_s, epoch, ranks::optimizer_state_bytes(*optimizer_));
    if (!totals.train_time_s.empty()) {
      const double n = static_cast<double>(totals.train_time_s.size());
      m.train_time_s = *std::max_element(totals.train_time_s.begin(), totals.train_time_s.end());
      m.compute_s = m.comm_s = 0;
      for (size_t i = 0; i < totals.compute_s.size(); ++i)
        m.compute_s += totals.compute_s[i] / n, m.comm_s += totals.comm_s[i] / n;
    }
    per_boundary = totals.boundaries;  // empty on ranks > 0
    m.bytes_dp = totals.data_parallel.bytes;
    m.bytes_tp = totals.tensor_parallel.bytes;
    m.bytes_tp_uncompressed = totals.tensor_parallel.raw_bytes;
    if (!totals.peak_rss_bytes.empty()) {
      peak_rss_bytes_ = totals.peak_rss_bytes;
      parameter_bytes_ = totals.parameter_bytes;
      optimizer_bytes_ = totals.optimizer_bytes;
    }
    m.bytes_dp_uncompressed = totals.data_parallel.raw_bytes;
  } else {
    for (const auto& b : pipeline_->boundaries()) per_boundary.push_back(b->stats());
    peak_rss_bytes_ = {ranks::peak_resident_bytes()};
    parameter_bytes_ = {ranks::parameter_bytes(*pipeline_)};
    optimizer_bytes_ = {ranks::optimizer_state_bytes(*optimizer_)};
  }
  const BoundaryStats stats = sum_boundary_stats(per_boundary);
  m.bubble = m.train_time_s > 0 ? std::max(0.0, 1.0 - m.compute_s / m.train_time_s) : 0.0;
  m.train_loss = total.loss();
  m.train_metric = task_->metric_value(total);
  m.bytes_forward = stats.forward.bytes;
  m.bytes_backward = stats.backward.bytes;
  m.bytes_uncompressed = stats.forward.raw_bytes + stats.backward.raw_bytes;
  if (stats.forward.measured > 0)
    m.forward_rel_error = stats.forward.rel_error_mean, m.forward_density = stats.forward.density_mean;
  if (stats.backward.measured > 0)
    m.backward_rel_error = stats.backward.rel_error_mean, m.backward_density = stats.backward.density_mean;
  for (size_t i = 0; i < per_boundary.size(); ++i) {
    const BoundaryStats& b = per_boundary[i];
    BoundaryMetrics bm;
    bm.index = static_cast<int64_t>(i + 1);
    bm.bytes_forward = b.forward.bytes;
    bm.bytes_backward = b.backward.bytes;
    if (b.forward.measured > 0) bm.forward_rel_error = b.forward.rel_error_mean, bm.forward_density = b.forward.density_mean;
    if (b.backward.measured > 0)
      bm.backward_rel_error = b.backward.rel_error_mean, bm.backward_density = b.backward.density_mean;
    m.boundaries.push_back(bm);
  }
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
    const int v = ex.pipeline().virtual_stages();
    const int64_t dp = cfg.parallel.dp;
    placement = "\n" + std::to_string(ex.world_size()) + " processes, " +
                (v > 1 ? std::to_string(v) + " stages each" : std::string(cfg.parallel.tp > 1 ? "one stage part each" : "one stage each")) +
                (dp > 1 ? ", " + std::to_string(dp) + " replicas of the pipeline (data-parallel gradients: " +
                              cfg.dp.compression + ")"
                        : std::string()) +
                (cfg.parallel.tp > 1 ? ", each stage split over " + std::to_string(cfg.parallel.tp) +
                                           " tensor-parallel ranks (all-reduces: forward " + cfg.tp.forward +
                                           ", backward " + cfg.tp.backward + ", " + cfg.tp.algorithm + ")"
                                     : std::string()) +
                " (rank 0 writes the run)";
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
      if (writer)
        for (const LevelRow& row : s.levels) append_line(levels, levels_csv_row(row));
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
    if (writer)  // a multi-process run's rows, once per epoch (Note [levels of a multi-process run])
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
