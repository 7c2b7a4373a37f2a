#pragma once
// RankInterpreter: the one interpreter of a pipeline rank's lowered action list
// (parallel/schedule.h), over a Channel (parallel/channel.h). The in-process executor runs one per
// rank over a LocalChannel and lets them take turns; the multi-process runtime runs its own rank's
// over a C10dChannel. Everything a step does with an action list happens here, once:
//
//   Forward(s, mb)   the stage's StageRuntime on micro-batch mb, its input taken from the inbox
//                    (a received message, or the payload a stage of this rank handed over);
//                    its output goes to the outbox (a Send follows) or straight to the inbox of
//                    the next stage when that stage lives on this rank (no message);
//   Backward(s, mb)  likewise with gradients; the gradient it sends carries the place the lowered
//                    list gives that send (GradSendPlace: in Optimus-CC's epilogue, on the
//                    critical path), from which the boundary's epilogue-only policy decides;
//   BackwardInput(s, mb), BackwardWeight(s, mb): the same backward in two parts (zero-bubble
//                    schedules): the first as Backward but leaving the weight gradients, which
//                    the second computes;
//   Send / Recv      hand a message to the channel / take one from it (a receive of a gradient
//                    that the boundary does not send, backward mode none, is skipped on both
//                    sides, as is a send of nothing).
//
// A rank's clock: the sum of its compute times and of its waits for messages (the channel says
// when a message is ready on the receiver's clock: a virtual delivery time in process, the real
// end of a blocking receive across processes). compute_s and comm_s split it. Compute times are
// measured, or modelled on a device from the ops' counted costs (set_device_model,
// parallel/device_model.h).
//
// Note [interpreters are kept]. An executor makes a rank's interpreter once per (schedule, layout,
// micro-batches), as it takes the lowered list (Note [plans are made once] in executor.h), and runs
// it step after step. Kept: the list, the stage runtimes, the gradient sends' places, the device
// and the device model. The step's, which begin() resets (so a step that failed half-way leaves
// nothing to the next): the micro-batches, the position in the list, the inbox and outbox, the
// clocks and counters, and each stage runtime's micro-batches in flight, tally and units
// (StageRuntime::reset). Nothing of a step survives into the next but the model's gradients and
// the codecs' state, which live in the Pipeline.
//
// Note [stages done]. A stage's weight gradients are final once the step's last action that
// computes them has run (its last Backward, or BackwardWeight in a split schedule; BackwardInput
// too, for what runs whole in it). set_on_stage_done() hears of each stage then, before the next
// action that is not a send (so the messages that action produced leave first) or at the end of
// the list: the data-parallel sum starts that stage's buckets there (Note [sums started during the
// backward] in parallel/ranks/data_parallel.h).
//
// Note [leaves final within a stage]. Inside a stage's last backward, each parameter's gradient is
// final as soon as the backward has passed its layer (the layers run backward from the last), long
// before the stage is done. With set_on_leaf_final(), that backward runs under a LeafFinalScope
// (autograd/leaf_final.h), so the data-parallel sum can start a bucket of the last layers while the
// first ones are still computing, as DDP does. Only a whole Backward: in a split schedule the
// weights' gradients appear in BackwardWeight, whose ops run in one pass after B, and their stage
// is reported done right after it.

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "parallel/channel.h"
#include "parallel/device_model.h"
#include "parallel/pipeline.h"
#include "parallel/schedule.h"
#include "parallel/stage_runtime.h"

namespace tl {

class RankInterpreter {
 public:
  /// Training runs forward and backward actions (lists of make_schedule); evaluation runs the
  /// forward-only list (forward_only_schedule) with nothing kept for a backward: the caller holds
  /// a NoGradGuard and the boundaries' inference switches (ScopedInference).
  enum class Mode { Train, Evaluate };

  /// `rank`: this pipeline rank of `layout`; `list`: its lowered actions. References must outlive
  /// the interpreter. Made once per (schedule, layout, micro-batches) and run step after step
  /// (Note [interpreters are kept]): begin() starts each step.
  RankInterpreter(Pipeline& pipeline, const StageLayout& layout, int rank, RankSchedule list, const LossFn& loss_fn,
                  Channel& channel, Mode mode);
  ~RankInterpreter();

  /// Starts a step (or an evaluation batch) over `mbs`, the micro-batches the actions index (it
  /// must outlive the step): resets everything of the last step (Note [interpreters are kept]).
  /// An error when `mbs` holds another number of micro-batches than the list was lowered for.
  void begin(const MicroBatches& mbs);

  /// Meters every compute action with `model` (null or "measured": none); with `drives_clock`,
  /// the clock advances by the modelled seconds instead of the measured ones. `model` must
  /// outlive the interpreter.
  void set_device_model(const DeviceModel* model, bool drives_clock);
  /// Eager sends: a message leaves when its compute produced it, not when the list reaches its
  /// send action (Note [eager sends] in interpreter.cpp). Default off.
  void set_eager_sends(bool on) { eager_sends_ = on; }
  /// Note [stages done]: called with a stage of this rank once the step's last action computing
  /// its gradients has run (and the sends right after it), before the rank goes on.
  void set_on_stage_done(std::function<void(int stage)> on_done) { on_stage_done_ = std::move(on_done); }
  /// Note [leaves final within a stage]: during a stage's last backward of the step (a whole
  /// Backward action), called with the stage and each leaf (parameter) as soon as its gradient is
  /// final, while the backward goes on (Note [leaves released when final] in autograd/leaf_final.h).
  void set_on_leaf_final(std::function<void(int stage, VariableImpl* leaf)> on_final) {
    on_leaf_final_ = std::move(on_final);
  }

  /// Runs actions until the list is done (true) or a receive finds its message not sent yet
  /// (false: call again after the other ranks ran; only an in-process channel does that). After
  /// begin().
  bool run();
  bool done() const { return next_ >= list_.size(); }
  /// Actions run so far.
  size_t position() const { return next_; }

  int rank() const { return rank_; }
  /// Whether this rank holds the last stage (its tally is the step's).
  bool holds_last_stage() const;
  /// The last stage's tally (kTallySize; undefined on other ranks or before any forward).
  at::Tensor tally() const;
  /// Loss units seen by the rank's first stage (every stage sees all of the step's).
  double units() const;
  /// Seconds on this rank's clock: all, computing, waiting for messages.
  double clock_s() const { return clock_s_; }
  double compute_s() const { return compute_s_; }
  double comm_s() const { return comm_s_; }
  /// The parts of compute_s() in forwards and in W actions (the rest is backward).
  double forward_s() const { return forward_s_; }
  double weight_s() const { return weight_s_; }
  /// FLOPs counted and seconds modelled in compute actions (0 without a device model).
  double flops() const { return flops_; }
  /// Bytes of memory traffic and kernels counted in compute actions (0 without a device model).
  double op_bytes() const { return op_bytes_; }
  double kernels() const { return kernels_; }
  double modelled_s() const { return modelled_s_; }
  /// The most bytes this rank's stages held for pending weight gradients (split schedules; 0 else).
  size_t held_for_weights_peak() const { return held_for_weights_peak_; }
  /// The most bytes this rank's stages held for backward (StageRuntime::held_for_backward_bytes)
  /// after any of its forwards: the peak activation memory of the step, as the engine counts it.
  /// Counted with a device model only (0 otherwise).
  size_t activation_peak() const { return activation_peak_; }

 private:
  class ActionTimer;
  void forward(const Action& a);
  void backward(const Action& a);
  void backward_weight(const Action& a);
  void send(const Action& a);
  bool recv(const Action& a);
  MessageKey key_of(const Action& a) const;
  void report_stages_done();

  // Kept from step to step (Note [interpreters are kept]).
  Pipeline& pipeline_;
  StageLayout layout_;
  int rank_;
  RankSchedule list_;
  int micro_batches_ = 0;  // that the list runs: 1 + the largest micro_batch it names
  Channel& channel_;
  Mode mode_;
  std::map<int, std::unique_ptr<StageRuntime>> stages_;  // this rank's stages
  bool eager_sends_ = false;
  // Per (stage, micro-batch): where the lowered list places the gradient it sends.
  std::map<std::pair<int, int>, GradSendPlace> grad_send_place_;
  const DeviceModel* model_ = nullptr;
  bool model_clock_ = false;
  c10::Device device_ = c10::Device(c10::DeviceType::CPU);  // where this rank's stages' parameters are
  std::function<void(int)> on_stage_done_;
  std::function<void(int, VariableImpl*)> on_leaf_final_;
  std::vector<std::pair<size_t, int>> last_backward_;  // (position, stage): each stage's last backward action, in order

  // The step's: begin() resets them.
  const MicroBatches* mbs_ = nullptr;
  size_t next_ = 0;
  size_t stages_done_ = 0;  // entries of last_backward_ reported
  std::map<MessageKey, StageMessage> inbox_, outbox_;
  std::map<MessageKey, double> produced_s_;  // eager sends: when each outbox message was produced
  double clock_s_ = 0, compute_s_ = 0, comm_s_ = 0, forward_s_ = 0, weight_s_ = 0;
  size_t held_for_weights_peak_ = 0;
  size_t activation_peak_ = 0;
  double flops_ = 0, op_bytes_ = 0, kernels_ = 0, modelled_s_ = 0;
};

/// The inference toggle for a forward-only pass: the pipeline in eval mode, every boundary's
/// forward codec on (`compression`) or bypassed, no error measured; all restored on scope exit.
class ScopedInference {
 public:
  ScopedInference(Pipeline& pipeline, bool compression);
  ~ScopedInference();
  ScopedInference(const ScopedInference&) = delete;
  ScopedInference& operator=(const ScopedInference&) = delete;

 private:
  Pipeline& pipeline_;
  bool was_training_;
  std::vector<bool> active_, measure_;
};

}  // namespace tl
