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
// The pipeline is what is run, and nothing of running it: an executor (parallel/executor.h) runs
// its stages under a schedule, in this process or one process per rank. A rank builds the same
// Pipeline from the same config and seed (only its own stages' modules) and its executor uses
// stage(i) with boundary(i) / boundary(i+1) through the Boundary's sender/receiver halves.
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

 private:
  ModulePtr model_;
  std::vector<std::string> cuts_;
  std::vector<ModulePtr> stages_;
  std::vector<BoundaryPtr> boundaries_;
  std::vector<bool> measure_;  // per boundary, restored after predict()
};

}  // namespace tl
