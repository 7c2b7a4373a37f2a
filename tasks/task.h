#pragma once
// Task: what is learned (the data, what a batch is, the loss, the metric), separate from the
// runner (trainer.h: epochs, optimizer, schedule, evaluation with compression on and off,
// checkpoints, run directory, progress, resume). The runner knows nothing of images or tokens.
//
//   vision   image classification: Fashion-MNIST, MNIST, CIFAR, image folders   tasks/vision.h
//   text     sequence classification: WordNet glosses -> supersenses           tasks/text.h
//   lm       causal language modelling: byte-level WordNet gloss text          tasks/lm.h
//
// Note [loss units]. A task counts its loss in units: samples for classification, predicted
// tokens for language modelling. Every batch carries its units per row (Batch::units, on the CPU),
// the loss of a micro-batch is the mean over its units, and the pipeline weights micro-batches by
// their units, so the step's gradient is the gradient of the mean over all units of the batch
// however it is split. Metrics come from a tally [loss sum, units, correct units] summed over
// micro-batches and batches on the device, read back once per step or evaluation.

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "parallel/batch.h"
#include "parallel/step.h"
#include "tasks/config.h"

namespace tl {

/// The task's headline metric.
struct MetricInfo {
  std::string name;       // "accuracy", "perplexity"
  bool higher_is_better;  // for comparisons and time to target
};

/// What a model needs to know of the task to be built (tasks/models.h), known before any data is
/// read so that the model and its cuts are validated first.
struct TaskShape {
  enum class Input { Images, Tokens } input = Input::Images;
  enum class Output { Classes, NextToken } output = Output::Classes;
  int64_t channels = 0;     // images
  int64_t num_classes = 0;  // classes
  int64_t vocab_size = 0;   // tokens
  int64_t seq_len = 0;      // tokens: longest sequence a batch holds
};

class Task {
 public:
  virtual ~Task() = default;

  /// "vision", "text", "lm" (task.name).
  virtual std::string name() const = 0;
  virtual MetricInfo metric() const = 0;
  /// The metric of a tally: accuracy = correct / units, perplexity = exp(loss).
  virtual double metric_value(const Tally& t) const = 0;
  virtual TaskShape shape() const = 0;
  /// The loss unit in throughput displays: "img", "seq", "tok".
  virtual std::string unit_name() const = 0;

  /// Reads and validates the data (after the model was built and checked).
  virtual void load_data() = 0;
  /// One line: the data and its sizes (after load_data()).
  virtual std::string describe() const = 0;
  virtual int64_t train_samples() const = 0;
  virtual int64_t test_samples() const = 0;

  /// Training batches of one epoch: a pure function of (run.seed, epoch, index) (Note
  /// [determinism] in data/loader.h), on the CPU.
  virtual int64_t train_batches() const = 0;
  virtual void start_epoch(int64_t epoch) = 0;
  virtual std::optional<Batch> next_train_batch() = 0;
  /// Batch `index` of the training epoch `epoch` (probes, tests).
  virtual Batch train_batch(int64_t epoch, int64_t index) const = 0;
  /// The test set in fixed batches, on the CPU.
  virtual int64_t eval_batches() const = 0;
  virtual Batch eval_batch(int64_t index) const = 0;

  /// The loss of one micro-batch from the last stage's output (on the batch's device).
  virtual MicroBatchLoss loss(const Variable& output, const Batch& micro_batch) const = 0;
};

/// The task selected by config.task.name (data not read yet).
std::unique_ptr<Task> make_task(const Config& config);

// ---- losses shared by tasks ----------------------------------------------------------------------
/// Classification: logits (b, classes), target (b) int64. Mean cross-entropy; tally [loss * b, b,
/// argmax == target].
MicroBatchLoss classification_loss(const Variable& logits, const Batch& mb);
/// Next-token prediction: logits (b, T, V), target (b, T) int64 with kIgnoreIndex where no token is
/// predicted. Mean cross-entropy over the counted tokens; tally [loss * n, n, argmax == target].
MicroBatchLoss next_token_loss(const Variable& logits, const Batch& mb);
constexpr int64_t kIgnoreIndex = -100;

}  // namespace tl
