#pragma once
// StageRuntime: one stage's side of the pipeline protocol for the micro-batches of one step, and
// the step's micro-batches (split once, the same way on every rank). Used by the one schedule
// interpreter (parallel/interpreter.h) that both executors run (parallel/executor.h: in process,
// parallel/local_executor.h; one process per rank, parallel/ranks/runtime.h). Each stage runs one
// micro-batch at a time, and the messages between stages are the Boundary's real payloads.
//
//   forward(mb):   stage 0 reads the micro-batch's input; stage i > 0 decodes the payload from
//                  boundary i (receive_forward) into a fresh leaf that requires grad (cut from the
//                  sender's graph), applies the receiver transform (ae decoder, subspace U c + T),
//                  runs its layers; then either encodes for the next boundary (sender transform,
//                  send_forward) or, on the last stage, computes the task's loss.
//   backward(mb):  the last stage backpropagates its loss (weighted by the micro-batch's units);
//                  stage i < last decodes the gradient payload (receive_backward) and
//                  backpropagates it from the wire tensor it sent. Stage i > 0 then encodes its
//                  input leaf's .grad for boundary i (send_backward, with the place the
//                  schedule gives that send: the boundary's epilogue-only policy reads it).
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
#include "parallel/pipeline.h"
#include "parallel/step.h"

namespace tl {

/// One stage's half of the pipeline protocol for the micro-batches of one step.
class StageRuntime {
 public:
  StageRuntime(Pipeline& pipeline, size_t stage, const LossFn& loss_fn);

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
  /// `place`: where the schedule puts the gradient send (GradSendPlace: epilogue-only compression).
  std::optional<StageMessage> backward(int64_t mb_index, const StageMessage* in, GradSendPlace place = {});
  /// backward() without the weight gradients, which wait for backward_weight(mb_index).
  std::optional<StageMessage> backward_input(int64_t mb_index, const StageMessage* in, GradSendPlace place = {});
  /// The weight gradients of a micro-batch whose backward_input ran; then its tape is freed.
  void backward_weight(int64_t mb_index);
  /// Bytes held for pending weight gradients (saved tensors and output gradients of their ops).
  size_t held_for_weights_bytes() const;
  /// Bytes the tapes of the micro-batches in flight save for their backward (Tape::saved_bytes:
  /// each op's saved tensors, a tensor saved by two ops counted twice), plus held_for_weights_bytes.
  size_t held_for_backward_bytes() const;

  /// Last stage: the summed tally of the micro-batches (kTallySize), undefined before any forward.
  const at::Tensor& tally() const { return tally_; }
  /// The loss units accumulated this step (every stage knows them from the batch).
  double units() const { return units_; }
  /// Micro-batches whose backward has not run yet, wholly or in part (0 after a complete step).
  size_t in_flight() const { return in_flight_.size() + awaiting_weights_.size(); }
  /// Forgets the last step: its micro-batches in flight (a step that failed half-way), tally and
  /// units (Note [interpreters are kept] in parallel/interpreter.h).
  void reset();

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
  std::optional<StageMessage> run_backward(int64_t mb_index, const StageMessage* in, bool split, GradSendPlace place);

  Pipeline& pipeline_;
  size_t stage_;
  LossFn loss_fn_;
  std::map<int64_t, InFlight> in_flight_;
  std::map<int64_t, InFlight> awaiting_weights_;  // backward_input ran, backward_weight not yet
  at::Tensor tally_;
  double units_ = 0;
};

/// The codec context of micro-batch `index` (sample and token ids from the micro-batch; epoch,
/// step and progress from `at`).
CodecContext micro_batch_context(const Batch& mb, int64_t index, const StepPosition& at);

/// The micro-batch row ranges of a batch of `batch` rows: (start, size) pairs, as at::chunk makes
/// them (ceil(B / M) rows each, the last smaller: possibly fewer than M).
std::vector<std::pair<int64_t, int64_t>> micro_batch_slices(int64_t batch, int64_t micro_batches);

/// A step's batch split into micro-batches (micro_batch_slices) with their codec
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

}  // namespace tl
