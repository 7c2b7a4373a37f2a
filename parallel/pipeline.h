#pragma once
// Pipeline: a Splittable model cut into stages with a compression Boundary at every cut, run in
// one process, micro-batch by micro-batch.
//
//   x -> stage 0 -> boundary 1 -> stage 1 -> boundary 2 -> ... -> stage K-1 -> logits
//
// The pipeline is a Module with two children: "model" (the unsplit model, which owns every layer;
// the stages are views of it holding the same modules) and "boundaries" (children "1".."K-1",
// each a Boundary whose codecs carry their state). So named_parameters(), state_dict() and
// checkpoints hold every parameter exactly once, under the model's own dotted names, and
// train()/eval()/to() reach every stage and boundary.
//
// Multi-process reuse: a worker for stage i keeps the same Pipeline object (built identically on
// every worker from the same config and seed) and uses stage(i) with boundary(i) / boundary(i+1)
// through the Boundary's sender/receiver halves; micro_batch_slices() and context() define the
// split and the codec context every worker must agree on.
//
// Note [micro-batches and BatchNorm]. A step's batch is split into M micro-batches run one after
// another (forward and backward of micro-batch i before micro-batch i+1: activation memory of one
// micro-batch). Gradients are accumulated weighted by micro-batch size (GradAccumulator), so they
// equal the full batch's gradient for every layer that treats samples independently. BatchNorm does
// not: in training it normalises each micro-batch with that micro-batch's own mean and variance,
// and updates its running statistics once per micro-batch (M updates per step, each with the
// layer's momentum). Results therefore change with M for models with BatchNorm (ResNets); with
// M = 1 the step is exactly the full-batch step. Stateful codecs see M messages per step in order
// (ctx.micro_batch = 0..M-1).

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

#include "compression/boundary.h"
#include "layers/models/splittable.h"
#include "parallel/batch.h"
#include "parallel/device_model.h"
#include "parallel/link.h"
#include "parallel/schedule.h"
#include "parallel/step.h"

namespace tl {

/// Per-boundary settings from which a Pipeline builds its boundaries.
struct BoundarySpec {
  std::string forward = "identity";
  std::string backward = "identity";
  BackwardMode mode = BackwardMode::Independent;
  bool active_at_inference = true;
};

/// Statistics summed over boundaries (or over the ranks that each saw part of one boundary):
/// bytes and messages added, relative error and density averaged over the measured messages.
BoundaryStats sum_boundary_stats(const std::vector<BoundaryStats>& all);

class Pipeline : public Module {
 public:
  /// The task's loss of one micro-batch's output (the last stage's).
  using LossFn = std::function<MicroBatchLoss(const Variable& output, const Batch& micro_batch)>;

  /// Splits `model` (which must implement Splittable) at `cuts` and places boundaries[i] at
  /// cut i. Errors name a model that cannot be split and a count mismatch.
  Pipeline(ModulePtr model, std::vector<std::string> cuts, std::vector<BoundaryPtr> boundaries);
  /// Builds the boundaries from specs (one per cut, named after the cut point).
  static std::shared_ptr<Pipeline> build(ModulePtr model, std::vector<std::string> cuts,
                                         const std::vector<BoundarySpec>& specs);

  size_t num_stages() const { return stages_.size(); }
  const ModulePtr& stage(size_t i) const { return stages_.at(i); }
  /// Boundary i (0-based) sits after stage i, before stage i+1.
  const BoundaryPtr& boundary(size_t i) const { return boundaries_.at(i); }
  const std::vector<BoundaryPtr>& boundaries() const { return boundaries_; }
  const std::vector<std::string>& cuts() const { return cuts_; }
  const ModulePtr& model() const { return model_; }

  /// Whole pipeline on one input, every stage with the side inputs `inputs`, every boundary with
  /// the context `ctx` (training flag from the module mode; its token_ids are taken from
  /// inputs.token_ids when unset). forward(x) uses default inputs and context.
  Variable forward(const Variable& x, const CodecContext& ctx, const StageInputs& inputs = {});
  Variable forward(const Variable& x) override { return forward(x, CodecContext{}); }

  /// Forward and backward of one step over `micro_batches` micro-batches (at::chunk along dim 0:
  /// fewer when the batch has fewer rows), run stage by stage under the pipeline's schedule by the
  /// in-process executor (parallel/executor.h): each stage and micro-batch records on its own
  /// tape, freed after its backward, and the boundaries' real payloads cross between stages.
  /// Gradients are accumulated into the parameters' grad weighted by each micro-batch's loss units,
  /// so the result is the gradient of the mean loss over the batch's units (samples, or tokens);
  /// the caller zeroes them before and steps the optimizer after.
  StepResult train_step(const Batch& batch, int64_t micro_batches, const LossFn& loss_fn, const StepPosition& at = {});

  /// The schedule of train_step, a name of the registry (schedule_kinds() in parallel/schedule.h;
  /// "1f1b" by default); an error lists the names.
  void set_schedule(const std::string& name);
  const std::string& schedule() const { return schedule_; }
  /// Stages per pipeline rank (pipeline.virtual_stages; > 1 with the interleaved schedule, 2 with
  /// zbv). An error names a count that does not divide the stages.
  void set_virtual_stages(int virtual_stages);
  int virtual_stages() const { return virtual_stages_; }
  /// Where the stages live: virtual_stages() per rank, placed as the schedule needs (a V for zbv,
  /// round robin otherwise). An error says what does not fit.
  StageLayout layout() const;

  /// The task's tally (loss_fn's) of one evaluation batch run forward through every stage by the
  /// in-process executor, the boundaries' forward codecs on (`compression`) or bypassed.
  at::Tensor evaluate_batch(const Batch& batch, bool compression, const LossFn& loss_fn);
  /// Link emulation per boundary (one spec per cut; default ideal), on the executor's virtual
  /// timeline (parallel/executor.h).
  void set_links(const std::vector<LinkSpec>& links);
  /// The device whose compute the timeline models (parallel/device_model.h; default "measured").
  void set_device_model(const DeviceModel& model) { device_ = model; }
  const DeviceModel& device_model() const { return device_; }
  /// Timing of the last train_step on the executor's timeline.
  const StepTiming& last_timing() const;

  /// The last stage's output under NoGradGuard in the current mode; `compression` false bypasses
  /// every boundary's forward codec in eval mode (the inference toggle), true keeps them on. The
  /// boundaries' configured toggles are restored afterwards.
  at::Tensor predict(const at::Tensor& x, bool compression, const StageInputs& inputs = {});

  /// Forwards to every boundary (and so to its codecs): call after each optimizer step.
  void after_optimizer_step();
  /// Sum of the boundaries' statistics per direction (bytes and messages summed; relative error
  /// and density averaged over the measured messages), and reset.
  BoundaryStats total_stats() const;
  void reset_stats();
  /// Whether boundaries measure relative error and density in training (a few reductions per
  /// message). On by default, except at boundaries uncompressed both ways (their error is 0 and
  /// measuring it would be the only cost of the split). Never measured in predict().
  void set_measure_error(bool on);

  /// The micro-batch row ranges of a batch of `batch` rows: (start, size) pairs, as at::chunk.
  static std::vector<std::pair<int64_t, int64_t>> micro_batch_slices(int64_t batch, int64_t micro_batches);

 private:
  ModulePtr model_;
  std::vector<std::string> cuts_;
  std::vector<ModulePtr> stages_;
  std::vector<BoundaryPtr> boundaries_;
  std::vector<bool> measure_;  // per boundary, restored after predict()
  std::string schedule_ = "1f1b";
  int virtual_stages_ = 1;
  std::vector<LinkSpec> links_;
  DeviceModel device_;
  std::shared_ptr<StepTiming> timing_;
};

}  // namespace tl
