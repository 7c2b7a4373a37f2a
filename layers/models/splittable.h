#pragma once
// Splitting a model into pipeline stages at named cut points.
//
// A model is an ordered list of Segments, each ending at a named cut point (the last segment
// ends at the model's output). split({"layer1", "layer3"}) groups consecutive segments into
// stages; each stage is a Module whose forward(Variable) runs its segments in order, and whose
// children are the model's own modules registered under their original dotted paths, so a stage's
// named_parameters() are a subset of the model's, with the same names, sharing storage.
//
// Note [tied parameters across stages]: a module used by two segments (GPT-2's token embedding,
// which is also the output projection) is registered in every stage that uses it. In-process the
// stages share one Variable and its gradient accumulates both uses; a multi-process pipeline must
// all-reduce such a parameter's gradient between the stages that hold it.

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "layers/module.h"

namespace tl {

/// Side inputs that every stage of one micro-batch may need, besides the activation it receives.
/// They travel with the micro-batch (a pipeline hands them to each stage's forward, and a
/// multi-process runtime sends them along), never through mutable state on the model, so
/// micro-batches in flight at the same time (1F1B) cannot see each other's inputs.
struct StageInputs {
  at::Tensor token_ids;       // (B, T) int64: the model's input tokens (BERT/GPT-2; subspace codecs)
  at::Tensor attention_mask;  // (B, T): 1 = token, 0 = padding (Hugging Face convention); undefined = none
  at::Tensor token_type_ids;  // (B, T) int64 segment ids (BERT); undefined = all 0

  /// Rows [start, start + size) of every defined tensor (micro-batches).
  StageInputs slice(int64_t start, int64_t size) const;
  /// Every defined tensor moved to `device`.
  StageInputs to(at::Device device) const;
};

struct Splittable {
  virtual ~Splittable() = default;
  /// The ordered names where the model may be cut (a cut is "after this point").
  virtual std::vector<std::string> cut_points() const = 0;
  /// cuts: distinct cut points in model order. Returns cuts.size() + 1 stages; stage i's
  /// forward(Variable) -> Variable runs the slice between cut i-1 and cut i. Stages share
  /// parameters with the model. An error names a bad cut and lists the valid ones.
  virtual std::vector<ModulePtr> split(const std::vector<std::string>& cuts) = 0;
};

/// Note [building only some stages]. A rank of a multi-process pipeline runs only its stages, so it
/// builds only theirs: a model constructed with a StageSelection creates the modules of the
/// selected stages' segments and no others. Every segment keeps its name and cut point (so
/// cut_points() and split() behave as for the whole model), but an unbuilt one has no modules and
/// running it is an error naming the segment. Initialisation does not depend on what is built:
/// each segment's modules draw from a generator of their own, init::fork(gen, path) (Note
/// [initialisation by name] in layers/nn/init.h), so a stage holds the same numbers whichever
/// stages are built beside it, in one process or in many.
struct StageSelection {
  /// The cuts the model will be split at (as split() takes them); ignored when `stages` is unset.
  std::vector<std::string> cuts;
  /// Stages to build (0 .. cuts.size()); unset: the whole model. An empty set builds no module:
  /// a skeleton that answers cut_points().
  std::optional<std::set<int64_t>> stages;

  static StageSelection whole() { return {}; }
  static StageSelection skeleton() { return {{}, std::set<int64_t>{}}; }
  static StageSelection of(std::vector<std::string> cuts, std::set<int64_t> stages) {
    return {std::move(cuts), std::move(stages)};
  }
  bool is_whole() const { return !stages.has_value(); }
  /// Whether each segment is built, given the model's segment ends in order (the last one "").
  /// Errors as split_segments for bad cuts, and name a stage that does not exist.
  std::vector<bool> built(const std::string& model, const std::vector<std::string>& segment_ends) const;
};

/// A segment's computation, from the previous segment's output (or the model input) to its own,
/// given the micro-batch's side inputs.
using SegmentFn = std::function<Variable(const Variable&, const StageInputs&)>;

/// One atomic piece of a model between two consecutive cut points.
struct Segment {
  /// The cut point at the end of this segment; empty for the model's last segment.
  std::string end;
  /// Modules this segment uses, registered in a stage under these dotted paths ("layer1.0").
  std::vector<std::pair<std::string, ModulePtr>> modules;
  SegmentFn fn;
};

/// A pipeline stage: a run of segments. Children mirror the model's dotted names.
class Stage : public Module {
 public:
  Stage() : Module("Stage") {}
  /// Registers the segment's modules (once each) and appends its computation.
  void add(const Segment& segment);
  Variable forward(const Variable& x, const StageInputs& inputs);
  Variable forward(const Variable& x) override { return forward(x, StageInputs{}); }
  /// The cut points this stage spans, e.g. "layer1.1 .. layer2" (for messages and printing).
  const std::vector<std::string>& segment_names() const { return names_; }

 private:
  void add_at_path(const std::string& path, const ModulePtr& module);
  std::vector<std::function<Variable(const Variable&, const StageInputs&)>> fns_;
  std::vector<std::string> names_;
};

/// The cut points of a segment list: every segment's `end` but the last's.
std::vector<std::string> segment_cut_points(const std::vector<Segment>& segments);

/// Validates `cuts` (known, distinct, in model order; errors name `model` and list the valid cut
/// points) and groups the segments into cuts.size() + 1 stages.
std::vector<ModulePtr> split_segments(const std::string& model, const std::vector<Segment>& segments,
                                      const std::vector<std::string>& cuts);

/// A segment that was not built (Note [building only some stages]): no modules; running it is an
/// error naming `model` and the segment.
Segment unbuilt_segment(const std::string& model, const std::string& end);

/// {end, modules, fn} if the segment was built here, else unbuilt_segment(model, end).
Segment segment_if_built(bool built, const std::string& model, const std::string& end,
                         std::vector<std::pair<std::string, ModulePtr>> modules, SegmentFn fn);

/// That error, unless `built`: for a model's own methods that run one segment (GPT2::embed).
void check_segment_built(bool built, const std::string& model, const std::string& end);

/// Runs every segment in order (the unsplit forward).
Variable run_segments(const std::vector<Segment>& segments, const Variable& x, const StageInputs& inputs = {});

}  // namespace tl
