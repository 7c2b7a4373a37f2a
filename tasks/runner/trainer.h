#pragma once
// The runner's run directory: run_training assembles an Experiment (tasks/runner/experiment.h),
// trains it epoch by epoch (epoch.cpp) and writes what it measured:
//
//   <run>/config.ini               the resolved configuration (every key)
//   <run>/metrics.csv              one row per epoch (report.h)
//   <run>/metrics.jsonl            one JSON object per run.log_every steps, plus one per epoch
//   <run>/summary.json             the last epoch's values and run information
//   <run>/levels.csv               with adaptive codecs (schedule, adaptive, budget): each codec's
//                                  level and its direction's bytes, every step (written per epoch)
//   <run>/checkpoint.safetensors   model + boundary state, optimizer, schedule, RNG (atomic)
//
// The runner knows nothing of images or tokens: every epoch it trains on the task's batches and
// evaluates the test set twice, with the boundaries' compression on and off, in the task's metric.
//
// Note [resume reproduces the run]. Everything random is a function of run.seed and the epoch:
// the sample order and augmentation of epoch e (loader.h), the model initialisation (seeded
// generator), the codecs' generators (registered state, checkpointed). A checkpoint is written at
// the end of an epoch with every piece of state, so resuming from it and training the remaining
// epochs replays exactly what the uninterrupted run did (tests/tasks/trainer_test.cpp checks the
// metrics are identical).

#include <string>
#include <utility>
#include <vector>

#include "tasks/config.h"
#include "tasks/runner/experiment.h"
#include "tasks/runner/report.h"

namespace tl {

/// What `tapeline train` asks for.
struct TrainRequest {
  Config config;
  std::string config_path;  // shown in summary.json
  std::string out_dir;
  std::string resume_dir;         // non-empty: continue from its checkpoint (may equal out_dir)
  int64_t stop_after_epochs = 0;  // > 0: stop after this many epochs in this invocation
  bool quiet = false;             // no progress output at all (tests)
};

/// Trains (or resumes) and writes the run directory; returns the summary of the last epoch.
RunSummary run_training(const TrainRequest& request);

/// `tapeline eval`: the test metric of the run's last checkpoint (accuracy, perplexity: the
/// task's) for each entry of `compression` (true: boundaries' forward codecs on, false: bypassed).
/// `overrides` may change e.g. data.root or run.device.
/// `metric`, when given, receives the metric's name.
std::vector<double> evaluate_run(const std::string& run_dir, const std::vector<bool>& compression,
                                 const std::vector<std::pair<std::string, std::string>>& overrides = {},
                                 std::string* metric = nullptr);

/// The settings a baseline must share with a run to be comparable (everything but the boundary
/// keys and presentation keys), hashed (FNV-1a, hex).
std::string config_fingerprint(const Config& config);
/// The same config with every boundary uncompressed (identity both ways, no per-cut overrides).
Config baseline_config(const Config& config);

}  // namespace tl
