#pragma once
// The small types of one training step, shared by tasks, executors and the runner: what a task's
// loss says of a micro-batch (MicroBatchLoss, its Tally), where a step sits in the run
// (StepPosition), what a step returns (StepResult) and how long it took (StepTiming). A task
// includes this and parallel/batch.h, not the pipeline.

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "parallel/batch.h"

namespace tl {

/// What a task's loss says of one micro-batch.
struct MicroBatchLoss {
  Variable loss;     // scalar: the mean loss over the micro-batch's units (samples or tokens)
  at::Tensor tally;  // (kTallySize) float64 on the output's device: sums the task's metric needs
};
/// Tally layout shared by tasks and runner: [loss sum, units, correct units].
constexpr int64_t kTallySize = 3;

/// The task's loss of one micro-batch's output (the last stage's).
using LossFn = std::function<MicroBatchLoss(const Variable& output, const Batch& micro_batch)>;

/// Sums of a tally (Note [loss units] in tasks/task.h), read back on the host.
struct Tally {
  double loss_sum = 0, units = 0, correct = 0;
  static Tally from(const at::Tensor& t);  // (kTallySize) on any device: one sync
  double loss() const { return units > 0 ? loss_sum / units : 0.0; }
};

/// Result of one training step's forward and backward passes.
struct StepResult {
  double loss = 0.0;     // mean loss over the batch's units
  double units = 0.0;    // samples (classification) or counted tokens (language modelling)
  double correct = 0.0;  // units predicted right (argmax)
  int64_t rows = 0;
  int64_t micro_batches = 0;
};

/// Where a training step sits in the run: what the executors copy into every micro-batch's codec
/// context (CodecContext::epoch, step, progress; schedule(...) switches codecs on the progress).
/// An epoch alone (the implicit conversion, as unit tests pass it) leaves step and progress unknown.
struct StepPosition {
  int64_t epoch = 0;
  int64_t step = 0;      // global step, 1-based; 0: unknown
  double progress = -1;  // fraction of the run's training steps done before this one, [0, 1); < 0: unknown
  StepPosition(int64_t epoch = 0, int64_t step = 0, double progress = -1)  // NOLINT: implicit from an epoch
      : epoch(epoch), step(step), progress(progress) {}
  /// Step `step` (1-based) of a run of `total_steps` steps.
  static StepPosition of(int64_t epoch, int64_t step, int64_t total_steps) {
    return {epoch, step, total_steps > 0 ? static_cast<double>(step - 1) / static_cast<double>(total_steps) : -1.0};
  }
};

/// Timing of one executed step (seconds).
struct StepTiming {
  double step_s = 0;                           // the step's duration on the executor's timeline
  std::vector<double> compute_s;               // per pipeline rank: time spent in forward and backward actions
  std::vector<double> comm_s;                  // per pipeline rank: time spent waiting on messages (links, peers)
  std::vector<double> forward_s;               // per pipeline rank: the part of compute_s in forwards
  std::vector<double> weight_s;                // per pipeline rank: the part in W actions (split schedules; else 0)
  std::vector<size_t> held_for_weights_bytes;  // per pipeline rank: the most held between I and W
  std::vector<double> flops;                   // per pipeline rank: FLOPs counted in compute (with a device model)
  std::vector<double> op_bytes;                // per pipeline rank: memory traffic counted likewise (bytes)
  std::vector<double> kernels;                 // per pipeline rank: kernels counted likewise
  std::vector<double> modelled_s;              // per pipeline rank: compute seconds on the device model (else 0)
  std::vector<size_t> activation_bytes;        // per pipeline rank: the most held for backward (activation_peak)
  /// Idle fraction: 1 - sum(compute) / (ranks * step).
  double bubble() const;
};

/// One row of levels.csv (runs with adaptive codecs: schedule, adaptive, budget): a codec's level
/// after a training step (CodecLevel: the phase, the adapted argument's value or the candidate)
/// and the bytes its boundary direction sent in that step (all its micro-batches).
struct LevelRow {
  int64_t step = 0;       // global step, 1-based
  int64_t epoch = 0;      // 1-based
  int64_t boundary = 0;   // 1-based, as boundary.N
  std::string direction;  // forward | backward
  double level = 0;
  std::string label;  // a spec or "k=0.05": quoted in the file (it may hold commas)
  int64_t bytes = 0;
};

/// Seconds of wall time since `t0` (steady clock).
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace tl
