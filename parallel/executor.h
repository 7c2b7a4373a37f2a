#pragma once
// Executing a schedule (parallel/schedule.h): each stage runs one micro-batch at a time, and the
// messages between stages are the Boundary's real payloads.
//
// StageRuntime is one stage's side of the protocol, shared by every executor (this file's
// in-process LocalExecutor and the multi-process runtime, parallel/dist/):
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

  /// Forward of micro-batch `mb_index` (its rows `mb`, side inputs and units). `received`: the
  /// payload from the previous stage (null on stage 0). Returns the payload for the next stage
  /// (nullopt on the last stage). `ctx` carries the micro-batch index, epoch and sample ids.
  std::optional<Payload> forward(int64_t mb_index, const Batch& mb, const Payload* received, const CodecContext& ctx);
  /// Backward of micro-batch `mb_index`. `received`: the gradient payload from the next stage
  /// (null on the last stage, or when the boundary sends none: backward mode none). Returns the
  /// gradient payload for the previous stage (nullopt on stage 0 or when none is sent).
  std::optional<Payload> backward(int64_t mb_index, const Payload* received);

  /// Last stage: the summed tally of the micro-batches (kTallySize), undefined before any forward.
  const at::Tensor& tally() const { return tally_; }
  /// The loss units accumulated this step (every stage knows them from the batch).
  double units() const { return units_; }
  /// Micro-batches whose backward has not run yet (0 after a complete step).
  size_t in_flight() const { return in_flight_.size(); }

  /// In-process executors hold both ends of every boundary: with the neighbouring runtimes known,
  /// the receiving end measures each message's relative error and density (forward: the
  /// receiver's output against the sender's boundary input; backward: the decoded gradient against
  /// the one sent) where the boundary measures errors. Null: not measured (multi-process).
  void set_neighbours(StageRuntime* previous, StageRuntime* next) { previous_ = previous, next_ = next; }

 private:
  struct InFlight {
    std::unique_ptr<Tape> tape;
    CodecContext ctx;
    Variable input;             // stage > 0: the decoded wire tensor, a leaf that requires grad
    int64_t raw_in = 0;         // stage > 0: uncompressed size of the boundary's output (= its input h)
    Variable sent;              // stage < last: the wire tensor encoded for the next boundary (on the tape)
    int64_t raw_out = 0;        // stage < last: uncompressed size of h
    at::Tensor boundary_input;  // stage < last, when measuring: h before the sender transform
    Variable loss;              // last stage
    double weight = 0;
  };

  Pipeline& pipeline_;
  size_t stage_;
  Pipeline::LossFn loss_fn_;
  std::map<int64_t, InFlight> in_flight_;
  at::Tensor tally_;
  double units_ = 0;
  StageRuntime* previous_ = nullptr;
  StageRuntime* next_ = nullptr;
  std::map<int64_t, at::Tensor> sent_grads_;  // when measured by the previous stage
};

/// Timing of one executed step (seconds).
struct StepTiming {
  double step_s = 0;                // the step's duration on the executor's timeline
  std::vector<double> compute_s;    // per stage: time spent in forward and backward actions
  std::vector<double> comm_s;       // per stage: time spent waiting on messages (links, peers)
  /// Idle fraction: 1 - sum(compute) / (stages * step).
  double bubble() const;
};

/// Runs every stage of a Pipeline in this process, one action at a time, following the schedule's
/// per-stage action lists: stages take turns, a stage whose next action is a receive waits for
/// the message. Messages are real payloads; with link specs set, each boundary is emulated as a
/// Link on a virtual timeline: every stage has its own clock, advanced by the measured duration
/// of its compute actions and by waits for deliveries, so the step time is what a pipeline of
/// processes on such links would take (given these compute times), while the run stays
/// sequential and bit-reproducible.
class LocalExecutor {
 public:
  explicit LocalExecutor(Pipeline& pipeline);

  /// Links of the boundaries (one per cut); default: ideal links.
  void set_links(std::vector<LinkSpec> links);
  const std::vector<LinkSpec>& links() const { return links_; }

  /// One training step of `batch` split into `micro_batches` under `schedule` (gpipe, 1f1b).
  /// Gradients accumulate into the parameters (the caller zeroes them before and steps after).
  StepResult train_step(const Batch& batch, int64_t micro_batches, const std::string& schedule,
                        const Pipeline::LossFn& loss_fn, int64_t epoch, StepTiming* timing = nullptr);

 private:
  Pipeline& pipeline_;
  std::vector<LinkSpec> links_;
};

/// The codec context of micro-batch `index` (sample and token ids from the micro-batch).
CodecContext micro_batch_context(const Batch& mb, int64_t index, int64_t epoch);

/// A step's batch split into micro-batches (Pipeline::micro_batch_slices) with their codec
/// contexts, after checking the batch (rows, targets, units, sample ids): what every executor
/// and every rank splits the same way.
struct MicroBatches {
  std::vector<Batch> batches;
  std::vector<CodecContext> contexts;
  int size() const { return static_cast<int>(batches.size()); }
};
MicroBatches split_micro_batches(const Batch& batch, int64_t micro_batches, int64_t epoch);

/// Before the backward at list[at] of micro-batch `micro_batch` on a stage > 0 (Optimus-CC): the
/// gradient it produces is compressed only if its send is on the critical path (the schedule's
/// SendGrad flag), where the boundary before the stage is epilogue-only. Executors reset the
/// flags to true after the step.
void apply_epilogue_flag(Pipeline& pipeline, const RankSchedule& list, size_t at, int micro_batch);

}  // namespace tl
