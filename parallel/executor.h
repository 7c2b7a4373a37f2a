#pragma once
// Executing a schedule (parallel/schedule.h): each stage runs one micro-batch at a time, and the
// messages between stages are the Boundary's real payloads.
//
// StageRuntime is one stage's side of the protocol, used by the one schedule interpreter
// (parallel/interpreter.h) that both executors run: this file's in-process LocalExecutor and the
// multi-process DistExecutor (parallel/ranks/runtime.h).
//
//   forward(mb):   stage 0 reads the micro-batch's input; stage i > 0 decodes the payload from
//                  boundary i (receive_forward) into a fresh leaf that requires grad (cut from the
//                  sender's graph), applies the receiver transform (ae decoder, subspace U c + T),
//                  runs its layers; then either encodes for the next boundary (sender transform,
//                  send_forward) or, on the last stage, computes the task's loss.
//   backward(mb):  the last stage backpropagates its loss (weighted by the micro-batch's units);
//                  stage i < last decodes the gradient payload (receive_backward) and
//                  backpropagates it from the wire tensor it sent. Stage i > 0 then encodes its
//                  input leaf's .grad for boundary i (send_backward).
//   backward_input(mb), backward_weight(mb): the same backward in two parts for zero-bubble
//                  schedules (Note [split backward] in autograd/engine.cpp): the first computes and
//                  sends the input's gradient, the second the weight gradients; the micro-batch's
//                  tape lives until the second.
//
// Each micro-batch's forward records on its own Tape, kept until its backward and freed then, so
// interleaved micro-batches (1F1B) never mix.
//
// Note [codec state order]. Stateful codecs see their messages in the order the schedule sends
// them on each link: forward messages of a boundary in micro-batch order 0..M-1, backward
// messages in the order of the backward actions (GPipe and 1F1B both run backwards 0..M-1), step
// after step. Error-feedback residuals, PowerSGD warm starts and the lazy (Optimus-CC) buffer are
// per boundary and direction and are updated in exactly that order; AQ-SGD's caches are keyed by
// sample id; shared-mode payloads are kept per micro-batch index until that micro-batch's
// backward. That order is the same in-process and across processes, and a checkpoint taken at
// the end of a step holds it, so resumed runs continue the same sequence.

#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "parallel/channel.h"
#include "parallel/device_model.h"
#include "parallel/link.h"
#include "parallel/pipeline.h"
#include "parallel/schedule.h"

namespace tl {

/// One stage's half of the pipeline protocol for the micro-batches of one step.
class StageRuntime {
 public:
  StageRuntime(Pipeline& pipeline, size_t stage, const Pipeline::LossFn& loss_fn);

  size_t stage() const { return stage_; }
  bool first() const { return stage_ == 0; }
  bool last() const { return stage_ + 1 == pipeline_.num_stages(); }

  /// Forward of micro-batch `mb_index` (its rows `mb`, side inputs and units). `in`: the message
  /// from the previous stage (null on stage 0); its reference, when set, is measured against
  /// what this stage decoded (Note [reference tensors] in parallel/channel.h). Returns the message
  /// for the next stage (nullopt on the last stage), with the boundary input as reference when the
  /// boundary measures errors. `ctx` carries the micro-batch index, epoch and sample ids. With
  /// `keep` false (evaluation, under NoGradGuard) nothing is kept for a backward.
  std::optional<StageMessage> forward(int64_t mb_index, const Batch& mb, const StageMessage* in,
                                      const CodecContext& ctx, bool keep = true);
  /// Backward of micro-batch `mb_index`. `in`: the gradient message from the next stage (null on
  /// the last stage, or when the boundary sends none: backward mode none). Returns the gradient
  /// message for the previous stage (nullopt on stage 0 or when none is sent).
  std::optional<StageMessage> backward(int64_t mb_index, const StageMessage* in);
  /// backward() without the weight gradients, which wait for backward_weight(mb_index).
  std::optional<StageMessage> backward_input(int64_t mb_index, const StageMessage* in);
  /// The weight gradients of a micro-batch whose backward_input ran; then its tape is freed.
  void backward_weight(int64_t mb_index);
  /// Bytes held for pending weight gradients (saved tensors and output gradients of their ops).
  size_t held_for_weights_bytes() const;

  /// Last stage: the summed tally of the micro-batches (kTallySize), undefined before any forward.
  const at::Tensor& tally() const { return tally_; }
  /// The loss units accumulated this step (every stage knows them from the batch).
  double units() const { return units_; }
  /// Micro-batches whose backward has not run yet, wholly or in part (0 after a complete step).
  size_t in_flight() const { return in_flight_.size() + awaiting_weights_.size(); }

 private:
  struct InFlight {
    std::unique_ptr<Tape> tape;
    CodecContext ctx;
    Variable input;       // stage > 0: the decoded wire tensor, a leaf that requires grad
    int64_t raw_in = 0;   // stage > 0: uncompressed size of the boundary's output (= its input h)
    Variable sent;        // stage < last: the wire tensor encoded for the next boundary (on the tape)
    int64_t raw_out = 0;  // stage < last: uncompressed size of h
    Variable loss;        // last stage
    double weight = 0;
    DeferredWeightGrads weights;  // after backward_input: what backward_weight computes
  };
  std::optional<StageMessage> run_backward(int64_t mb_index, const StageMessage* in, bool split);

  Pipeline& pipeline_;
  size_t stage_;
  Pipeline::LossFn loss_fn_;
  std::map<int64_t, InFlight> in_flight_;
  std::map<int64_t, InFlight> awaiting_weights_;  // backward_input ran, backward_weight not yet
  at::Tensor tally_;
  double units_ = 0;
};

/// Runs every stage of a Pipeline in this process: one RankInterpreter per pipeline rank over a
/// LocalChannel, taking turns; a rank whose next action is a receive waits for the message.
/// Messages are real payloads; with link specs set, each boundary is emulated as a Link on a
/// virtual timeline: every rank has its own clock, advanced by the measured duration of its
/// compute actions and by waits for deliveries, so the step time is what a pipeline of processes
/// on such links would take (given these compute times), while the run stays sequential and
/// bit-reproducible.
class LocalExecutor {
 public:
  /// The stages placed as pipeline.layout() says (virtual stages, V placement for zbv).
  explicit LocalExecutor(Pipeline& pipeline);

  /// Links of the boundaries (one per cut); default: ideal links. With several stages per rank,
  /// boundaries between the same two ranks share that link and must agree on its spec.
  void set_links(std::vector<LinkSpec> links);
  const std::vector<LinkSpec>& links() const { return links_; }
  const StageLayout& layout() const { return layout_; }
  /// Compute on a modelled device (parallel/device_model.h): every rank's compute actions are
  /// metered; with `drives_clock` the timeline advances by the modelled seconds (then step times
  /// do not depend on this machine and are the same in every run), else by the measured ones
  /// (calibration: StepTiming has both). Default: "measured", nothing metered.
  void set_device_model(const DeviceModel& model, bool drives_clock = true);

  /// One training step of `batch` split into `micro_batches` under `schedule` (gpipe, 1f1b,
  /// interleaved, zbh1, zbv; one that fits the layout). Gradients accumulate into the parameters (the caller zeroes them before and
  /// steps after).
  StepResult train_step(const Batch& batch, int64_t micro_batches, const std::string& schedule,
                        const Pipeline::LossFn& loss_fn, const StepPosition& at, StepTiming* timing = nullptr);

  /// Forward-only pass of one evaluation batch through every stage, with the boundaries' forward
  /// codecs on (`compression`) or bypassed (the inference toggle); the task's tally of the last
  /// stage's output (loss_fn's).
  at::Tensor evaluate_batch(const Batch& batch, bool compression, const Pipeline::LossFn& loss_fn);

 private:
  Pipeline& pipeline_;
  StageLayout layout_;
  std::vector<LinkSpec> links_;
  DeviceModel model_;
  bool model_clock_ = true;
};

/// The codec context of micro-batch `index` (sample and token ids from the micro-batch; epoch,
/// step and progress from `at`).
CodecContext micro_batch_context(const Batch& mb, int64_t index, const StepPosition& at);

/// A step's batch split into micro-batches (Pipeline::micro_batch_slices) with their codec
/// contexts, after checking the batch (rows, targets, units, sample ids): what every executor
/// and every rank splits the same way.
struct MicroBatches {
  std::vector<Batch> batches;
  std::vector<CodecContext> contexts;
  int size() const { return static_cast<int>(batches.size()); }
};
MicroBatches split_micro_batches(const Batch& batch, int64_t micro_batches, const StepPosition& at);
/// An evaluation batch as the one micro-batch of a forward-only pass (its codec context carries
/// the token ids).
MicroBatches evaluation_batch(const Batch& batch);

/// The step's result from the last stage's tally and the step's loss units (one device sync).
StepResult step_result(const at::Tensor& tally, double units, int64_t rows, int micro_batches);

/// The emulated link of each directed pair of pipeline ranks that exchange messages, from the
/// boundaries' link specs (boundary b joins the ranks of stages b and b + 1; both directions use
/// its spec). Boundaries that share a pair of ranks (interleaved) must agree: an error names them.
std::map<std::pair<int, int>, LinkSpec> link_specs_by_rank_pair(const StageLayout& layout,
                                                                const std::vector<LinkSpec>& boundary_links);

}  // namespace tl
