#pragma once
// Experiment: a config assembled into a run (the runner's first job; tasks/runner/trainer.h writes
// the run directory around it). A task (tasks/task.h: data, batches, loss, metric), a model
// (tasks/models.h) split into stages with a compression Boundary at each cut (parallel/pipeline.h),
// an optimizer (SGD or AdamW) with a learning-rate schedule, and the executor that runs every step
// (parallel/executor.h: in this process, or this rank's stages of a grid of processes), chosen
// once here. The epoch loop (train_epoch, evaluate) lives in epoch.cpp and asks only the executor.

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "layers/io/checkpoint.h"
#include "layers/nn/tensor_parallel.h"
#include "layers/optim/optimizer.h"
#include "layers/optim/schedule.h"
#include "parallel/executor.h"
#include "parallel/pipeline.h"
#include "tasks/config.h"
#include "tasks/runner/report.h"
#include "tasks/task.h"

namespace tl {

namespace ranks {
class Transport;
class TensorParallelSync;
}  // namespace ranks

/// The cut points `config` asks for: none (model.no_cuts), model.cuts, or the model's own, read
/// from a skeleton of it (no modules built, nothing drawn from a generator). `shape`: the task's,
/// asked for only when the skeleton is needed.
std::vector<std::string> configured_cuts(const Config& config, const std::function<TaskShape()>& shape);

/// The boundaries of `config` at `cuts` (a Boundary per cut with its codecs, [boundary.N] applied)
/// and their links; errors name the key.
struct RunBoundaries {
  std::vector<BoundaryPtr> boundaries;
  std::vector<LinkSpec> links;
};
RunBoundaries build_boundaries(const Config& config, const std::vector<std::string>& cuts);
/// How config's steps are scheduled and timed: pipeline.schedule, virtual_stages, the links,
/// timeline.device and timeline.link_model.
ScheduleSettings schedule_settings(const Config& config, const std::vector<LinkSpec>& links);

/// Why `world` processes cannot run `config` as a grid of pipeline ranks x parallel.dp x
/// parallel.tp ("" if they can): the launcher's check before it starts any process (the ranks
/// check again). Builds a skeleton of the model (no modules, no data).
std::string grid_problem(const Config& config, int world);

/// Everything a run is made of. The constructor validates in the order that fails fastest:
/// device, task and model and cuts and boundary specs (no data read yet), then the data, then one
/// forward pass on a training batch (shapes; creates lazily sized codec weights) before the
/// optimizer is built. Nothing is trained here.
///
/// Multi-process (this process is one rank of several: torchrun or `tapeline train --nproc`, see
/// parallel/ranks/rendezvous.h): every rank builds the same experiment from the same config and
/// seed, connects to the others (dist.timeout_s), and trains and evaluates only its own stage
/// (parallel/ranks/runtime.h); the step results, evaluations and epoch metrics are the same on
/// every rank (gathered to rank 0 where only rank 0 needs them). With `allow_distributed` false
/// the experiment runs in this process whatever the environment says (evaluation of a run).
class Experiment {
 public:
  explicit Experiment(const Config& config, bool allow_distributed = true);
  ~Experiment();

  const Config& config() const { return config_; }
  Task& task() { return *task_; }
  Pipeline& pipeline() { return *pipeline_; }
  const std::shared_ptr<Pipeline>& pipeline_ptr() const { return pipeline_; }
  Optimizer& optimizer() { return *optimizer_; }
  LRScheduler& scheduler() { return *scheduler_; }
  at::Device device() const { return device_; }
  int64_t steps_per_epoch() const { return task_->train_batches(); }
  /// ATen intra-op threads in use.
  int threads() const { return threads_; }
  /// One line per stage and boundary (printed at the start of a run).
  std::string describe() const;

  /// Test-set loss and metric with the boundaries' forward codecs on (`compression`) or bypassed.
  struct Evaluation {
    double loss = 0, metric = 0;
  };
  Evaluation evaluate(bool compression);

  /// Per-step report for logging: global step, epoch (0-based), loss and metric of the step,
  /// learning rate, throughput in loss units per second over the last steps.
  struct StepLog {
    int64_t step = 0, epoch = 0, step_in_epoch = 0, steps_in_epoch = 0;
    double loss = 0, metric = 0, lr = 0, units_per_s = 0;
  };
  /// Whether a boundary codec has a level that changes in training (CodecLevel: schedule,
  /// adaptive, budget, or a wrapper of one). Such a run reports the levels (levels.csv) once per
  /// epoch (epoch_levels(); Note [levels of a multi-process run] in parallel/ranks/runtime.cpp).
  bool has_adaptive_codecs() const;
  /// Rank 0: the levels.csv rows of the epoch train_epoch last ran (every rank's, merged); empty
  /// elsewhere.
  const std::vector<LevelRow>& epoch_levels() const { return epoch_levels_; }
  /// Trains epoch `epoch` (0-based): returns the epoch's metrics without test metrics and
  /// wall time. `on_step` is called after every optimizer step.
  EpochMetrics train_epoch(int64_t epoch, const std::function<void(const StepLog&)>& on_step);
  int64_t global_step() const { return scheduler_->step_count(); }

  /// How every step of this run is run (parallel/executor.h), chosen when the run was assembled.
  Executor& executor() { return *executor_; }
  /// Whether this process is one rank of a multi-process pipeline, and which (0 otherwise).
  bool distributed() const { return transport_ != nullptr; }
  int rank() const;
  /// Peak resident memory of every rank (rank 0; one entry in process), as of the last epoch.
  const std::vector<int64_t>& peak_rss_bytes() const { return peak_rss_bytes_; }
  /// After load_checkpoint: what a multi-process run could not restore exactly ("" when nothing).
  const std::string& resume_note() const { return resume_note_; }
  /// Per rank (one entry in process), after an epoch: parameter and optimizer-state bytes held.
  const std::vector<int64_t>& parameter_bytes() const { return parameter_bytes_; }
  const std::vector<int64_t>& optimizer_bytes() const { return optimizer_bytes_; }
  int world_size() const;
  /// Saves a checkpoint of the whole pipeline (multi-process: collective, written by rank 0 from
  /// every rank's state; Note [one checkpoint] in parallel/ranks/runtime.h).
  void save_checkpoint(const std::string& path, const CheckpointInfo& info);
  /// Loads one (every rank reads the same file) and returns its counters.
  CheckpointInfo load_checkpoint(const std::string& path);

 private:
  Config config_;
  at::Device device_{at::kCPU};
  int threads_ = 1;
  std::unique_ptr<Task> task_;
  std::string model_description_;
  std::shared_ptr<Pipeline> pipeline_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<LRScheduler> scheduler_;
  std::unique_ptr<ranks::Transport> transport_;
  std::unique_ptr<Executor> executor_;
  TensorParallelPtr tensor_parallel_;                   // parallel.tp > 1: this rank's group, as the blocks see it
  std::shared_ptr<ranks::TensorParallelSync> tp_sync_;  // ... and its all-reduces over the transport
  std::vector<int64_t> peak_rss_bytes_, parameter_bytes_, optimizer_bytes_;
  std::string resume_note_;
  std::vector<LevelRow> epoch_levels_;  // multi-process runs, rank 0: the last epoch's levels.csv rows
};

}  // namespace tl
