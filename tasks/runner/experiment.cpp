#include "tasks/runner/experiment.h"

#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "autograd/threads.h"
#include "layers/io/checkpoint.h"
#include "layers/optim/adam.h"
#include "layers/optim/sgd.h"
#include "parallel/local_executor.h"
#include "parallel/ranks/fault.h"
#include "parallel/ranks/rendezvous.h"
#include "parallel/ranks/runtime.h"
#include "parallel/ranks/transport.h"
#include "tasks/data/loader.h"
#include "tasks/models.h"

namespace tl {

std::vector<std::string> configured_cuts(const Config& config, const std::function<TaskShape()>& shape) {
  if (config.model.no_cuts) return {};
  if (!config.model.cuts.empty()) return config.model.cuts;
  at::Generator gen = at::detail::createCPUGenerator(0);
  BuiltModel skeleton = build_model(config, shape(), gen, StageSelection::skeleton());
  auto* splittable = dynamic_cast<Splittable*>(skeleton.model.get());
  TORCH_CHECK(splittable, "model.arch = ", config.model.arch, " cannot be split into stages");
  return splittable->cut_points();
}

RunBoundaries build_boundaries(const Config& config, const std::vector<std::string>& cuts) {
  for (int64_t i : config.boundary_override_indices())
    TORCH_CHECK(i <= static_cast<int64_t>(cuts.size()), "boundary.", i, ": the model has ", cuts.size(), " cut",
                cuts.size() == 1 ? "" : "s", " (model.cuts), so boundaries are numbered 1..", cuts.size());
  RunBoundaries out;
  for (size_t i = 0; i < cuts.size(); ++i) {
    BoundarySettings b = config.boundary_at(static_cast<int64_t>(i + 1));
    out.links.push_back({b.bandwidth_mbps, b.latency_ms});
    try {  // e.g. backward_mode = shared with a forward codec that has no mask
      out.boundaries.push_back(std::make_shared<Boundary>(
          "boundary " + std::to_string(i + 1) + " (after " + cuts[i] + ")", b.forward.build(), b.backward.build(),
          parse_backward_mode(b.backward_mode), b.active_at_inference));
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "boundary.", i + 1, " (config [boundary] / [boundary.", i + 1,
                  "]): ", e.what_without_backtrace());
    }
    out.boundaries.back()->set_epilogue_only(b.epilogue_only);
    out.boundaries.back()->set_epilogue_rule(b.epilogue_rule == "critical_path" ? EpilogueRule::CriticalPath
                                                                                : EpilogueRule::Optimus);
  }
  return out;
}

ScheduleSettings schedule_settings(const Config& config, const std::vector<LinkSpec>& links) {
  ScheduleSettings schedule;
  schedule.schedule = config.pipeline.schedule;
  schedule.virtual_stages = static_cast<int>(config.pipeline.virtual_stages);
  schedule.links = links;
  schedule.device = device_model(config.timeline.device);
  schedule.link_model = link_model_of(config.timeline.link_model);
  return schedule;
}

namespace {

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

// run.threads = 0: every core. Measured on 2 cores (ResNet-18 step, README): 1.16 s with ATen's
// default of 1 thread here, 0.70 s with 2.
int choose_threads(int64_t requested) {
  if (requested > 0) return static_cast<int>(requested);
  const unsigned cores = std::thread::hardware_concurrency();
  return cores > 0 ? static_cast<int>(cores) : at::get_num_threads();
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
    TORCH_CHECK(config_.pipeline.nproc == 1 || config_.pipeline.nproc == env->world_size,
                "pipeline.nproc = ", config_.pipeline.nproc, " but ", env->world_size,
                " ranks were started (WORLD_SIZE); start as many ranks as the config says, or drop pipeline.nproc");
  if (env && config_.run.threads == 0) {  // the machine's cores shared by the ranks on it
    const unsigned cores = std::thread::hardware_concurrency();
    config_.run.threads = std::max<int64_t>(1, static_cast<int64_t>(cores) / std::max(1, env->local_world_size));
  }
  threads_ = choose_threads(config_.run.threads);
  set_compute_threads(threads_);  // ATen's and OpenBLAS's (Note [OpenBLAS threads])
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
  const std::vector<std::string> cuts = configured_cuts(config_, [&] { return task_->shape(); });
  StageSelection selection;
  if (env) {
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
    TORCH_CHECK(
        env, "parallel.tp = ", config_.parallel.tp,
        ": tensor parallelism runs one process per tensor rank; start the ranks with `tapeline train --nproc N` "
        "or torchrun (docs/TENSOR.md)");
    tensor_parallel_ = std::make_shared<TensorParallel>(env->rank % config_.parallel.tp, config_.parallel.tp);
    shard_tensor_parallel(*built.model, tensor_parallel_, "model.arch = " + config_.model.arch);
  }
  RunBoundaries run_boundaries = build_boundaries(config_, cuts);
  const std::vector<BoundaryPtr>& boundaries = run_boundaries.boundaries;
  const std::vector<LinkSpec>& links = run_boundaries.links;
  try {
    pipeline_ = std::make_shared<Pipeline>(built.model, cuts, boundaries);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "model.cuts: ", e.what_without_backtrace());
  }
  const ScheduleSettings schedule = schedule_settings(config_, links);
  StageLayout layout;
  try {
    layout = schedule.layout(static_cast<int>(pipeline_->num_stages()));
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "pipeline.virtual_stages = ", config_.pipeline.virtual_stages, " does not divide the ",
                pipeline_->num_stages(), " stages (", cuts.size(), " cuts, model.cuts)");
  }
  pipeline_->set_measure_error(config_.run.measure_error);
  // Links shared by the boundaries between two ranks (interleaved) must agree: checked now.
  link_specs_by_rank_pair(layout, links);
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
  TORCH_CHECK(!env || config_.timeline.link_model == "pipelined", "timeline.link_model = ",
              config_.timeline.link_model,
              " is emulated on the in-process timeline only; a run of several processes emulates pipelined links: "
              "set timeline.link_model = pipelined, or run in one process (pipeline.nproc = 1)");
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
    o.pieces_min_bytes = config_.dist.pieces_min_bytes;
    o.corrupt_rate = config_.dist.corrupt_rate;
    o.corrupt_seed = static_cast<uint64_t>(config_.dist.corrupt_seed);
    const int r = env->rank;
    const int replica = grid.replica(r), t = grid.tensor_rank(r);
    for (const auto& [pair, spec] : link_specs_by_rank_pair(layout, links))  // pipeline ranks of this replica
      if (grid.rank_of(pair.second, replica, t) == r) o.link_from[grid.rank_of(pair.first, replica, t)] = spec;
    for (int peer : grid.data_group(grid.pipeline_rank(r), t))  // the other replicas of this pipeline rank
      if (peer != r) o.link_from[peer] = LinkSpec{config_.dp.bandwidth_mbps, config_.dp.latency_ms};
    for (int peer : grid.tensor_group(grid.pipeline_rank(r), replica))  // the other tensor ranks of this stage
      if (peer != r) o.link_from[peer] = LinkSpec{config_.tp.bandwidth_mbps, config_.tp.latency_ms};
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
  const LossFn loss_fn = [this](const Variable& out, const Batch& mb) { return task_->loss(out, mb); };
  {
    Batch probe = task_->train_batch(0, 0);
    probe = probe.slice(0, std::min<int64_t>(2, probe.rows())).to(device_);
    pipeline_->eval();
    if (transport_) {  // each rank holds only its stages: the probe crosses the ranks
      if (tp_sync_) tp_sync_->set_phase(0, "before training: checking the model on two training samples", false, true);
      ranks::run_probe(*pipeline_, layout, *transport_, static_cast<int>(config_.parallel.dp), probe, loss_fn,
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
  // 5. The executor: how every step of this run is run, chosen once.
  if (transport_) {
    ranks::DataParallelOptions dp;
    dp.replicas = static_cast<int>(config_.parallel.dp);
    dp.compression = config_.dp.compression;
    dp.compress_stages = config_.dp.compress_stages;
    dp.bucket_bytes = static_cast<int64_t>(config_.dp.bucket_mib * double(1 << 20));
    // Emulated links between the replicas delay tapeline messages only: the sums go after the backward.
    dp.overlap = config_.dp.overlap && config_.dp.bandwidth_mbps <= 0 && config_.dp.latency_ms <= 0;
    for (int64_t s : dp.compress_stages)
      TORCH_CHECK(s < static_cast<int64_t>(pipeline_->num_stages()), "dp.compress_stages: stage ", s,
                  " does not exist; the model has ", pipeline_->num_stages(), " stages (0 .. ",
                  pipeline_->num_stages() - 1, ")");
    executor_ = std::make_unique<ranks::DistExecutor>(*pipeline_, *transport_, loss_fn, schedule, dp, tp_sync_.get());
  } else {
    executor_ = std::make_unique<LocalExecutor>(*pipeline_, loss_fn, schedule);
  }
  executor_->synchronized(*optimizer_);
  model_description_ = built.describe(executor_->model_parameters());
}

std::string grid_problem(const Config& config, int world) {
  try {
    const std::string tp = tensor_parallel_problem(config);
    if (!tp.empty()) return tp;
    const int64_t stages =
        static_cast<int64_t>(configured_cuts(config, [&] { return make_task(config)->shape(); }).size()) + 1;
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

int Experiment::rank() const { return executor_->rank(); }
int Experiment::world_size() const { return executor_->world_size(); }

void Experiment::save_checkpoint(const std::string& path, const CheckpointInfo& info) {
  executor_->save_checkpoint(path, checkpoint_contents(*pipeline_, optimizer_.get(), scheduler_.get(), info));
}

CheckpointInfo Experiment::load_checkpoint(const std::string& path) {
  CheckpointLoadOptions options;
  options.part = executor_->holds_part();  // this rank's stages (Note [building only some stages])
  if (tensor_parallel_) {                  // whole tensors cut to this tensor rank's parts
    options.shards = pipeline_->named_shards();
    options.tensor_rank = tensor_parallel_->rank();
    options.tensor_size = tensor_parallel_->size();
  }
  CheckpointInfo info = tl::load_checkpoint(path, *pipeline_, optimizer_.get(), scheduler_.get(), options);
  resume_note_ = executor_->restore_rank_state(path);  // e.g. this replica's own codec state
  executor_->synchronized(*optimizer_);                // the reference that later changes are against
  return info;
}

std::string Experiment::describe() const {
  std::ostringstream s;
  s << "task " << task_->name() << ": " << task_->describe() << "\nmodel " << model_description_ << ", "
    << pipeline_->num_stages() << " stage" << (pipeline_->num_stages() == 1 ? "" : "s") << "; optimizer "
    << optimizer_->name() << "; " << threads_ << " thread" << (threads_ == 1 ? "" : "s") << " on " << device_.str();
  for (size_t i = 0; i < pipeline_->boundaries().size(); ++i) s << "\n  " << pipeline_->boundary(i)->describe();
  return s.str();
}

}  // namespace tl
