#include "parallel/interpreter.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "autograd/autograd.h"
#include "autograd/cost.h"
#include "autograd/leaf_final.h"

namespace tl {

// One compute action's duration: measured, and metered op by op when a device model is set
// (Note [device model]); the rank's clock takes the modelled seconds when the model drives it.
// Without a model no meter is installed, so the ops skip their cost accounting (flops() stays 0).
//
// Note [timing actions on a GPU]
// On a CUDA device an action's ops are only queued when its host code returns, so the host's clock
// would time the launches. Where the measured seconds drive the rank's clock (no device model, or
// a model that does not drive it: bench_pipeline --calibrate), the timer waits for the device's
// stream at both ends of the action, so each action is charged its own kernels and not the queue
// left by the one before. That costs the host its lead over the device: the price of a measured
// timeline on a GPU. With a device model driving the clock nothing waits.
class RankInterpreter::ActionTimer {
 public:
  explicit ActionTimer(RankInterpreter& rank) : rank_(rank) {
    if (rank.device_.type() != c10::DeviceType::CPU && !rank.model_clock_) {
      wait_ = true;
      wait_for_device(rank.device_);
    }
    t0_ = std::chrono::steady_clock::now();
    if (rank.model_) {
      meter_.emplace([m = rank.model_](const OpCost& c) { return m->seconds(c); });
      guard_.emplace(*meter_);
    }
  }
  /// The seconds the action adds to the rank's clock.
  double finish() {
    if (wait_) wait_for_device(rank_.device_);
    const double measured = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    if (!meter_) return measured;
    rank_.flops_ += meter_->total().flops;
    rank_.op_bytes_ += meter_->total().bytes;
    rank_.kernels_ += static_cast<double>(meter_->total().kernels);
    rank_.modelled_s_ += meter_->seconds();
    return rank_.model_clock_ ? meter_->seconds() : measured;
  }

 private:
  RankInterpreter& rank_;
  bool wait_ = false;
  std::chrono::steady_clock::time_point t0_;
  std::optional<CostMeter> meter_;
  std::optional<CostMeterGuard> guard_;  // after meter_: destroyed first
};

RankInterpreter::RankInterpreter(Pipeline& pipeline, const StageLayout& layout, int rank, RankSchedule list,
                                 const LossFn& loss_fn, Channel& channel, Mode mode)
    : pipeline_(pipeline), layout_(layout), rank_(rank), list_(std::move(list)), channel_(channel), mode_(mode) {
  TORCH_CHECK(static_cast<size_t>(layout.stages()) == pipeline.num_stages(), "pipeline: a layout of ",
              layout.stages(), " stages for a ", pipeline.num_stages(), "-stage pipeline");
  TORCH_CHECK(rank >= 0 && rank < layout.ranks, "pipeline: rank ", rank, " of ", layout.ranks, " pipeline ranks");
  for (int s : layout.stages_of(rank)) stages_[s] = std::make_unique<StageRuntime>(pipeline, s, loss_fn);
  for (int s : layout.stages_of(rank))  // the device whose queue the timer waits for (CPU: none)
    for (const auto& p : pipeline.stage(s)->parameters())
      if (p.data().device().type() != c10::DeviceType::Meta) device_ = p.data().device();
  for (const Action& a : list_) {
    if (a.type == ActionType::SendGrad) grad_send_place_[{a.stage, a.micro_batch}] = {a.compress_backward, a.critical};
    micro_batches_ = std::max(micro_batches_, a.micro_batch + 1);
  }
  std::map<int, size_t> last;  // Note [stages done]
  for (size_t i = 0; i < list_.size(); ++i)
    if (list_[i].type == ActionType::Backward || list_[i].type == ActionType::BackwardInput ||
        list_[i].type == ActionType::BackwardWeight)
      last[list_[i].stage] = i;
  for (const auto& [stage, at] : last) last_backward_.emplace_back(at, stage);
  std::sort(last_backward_.begin(), last_backward_.end());
}

void RankInterpreter::begin(const MicroBatches& mbs) {
  TORCH_CHECK(mbs.size() == micro_batches_, "pipeline: rank ", rank_, "'s list was lowered for ", micro_batches_,
              " micro-batches; the step has ", mbs.size());
  mbs_ = &mbs;
  next_ = stages_done_ = 0;
  inbox_.clear(), outbox_.clear(), produced_s_.clear();
  clock_s_ = compute_s_ = comm_s_ = forward_s_ = weight_s_ = 0;
  held_for_weights_peak_ = activation_peak_ = 0;
  flops_ = op_bytes_ = kernels_ = modelled_s_ = 0;
  for (auto& [s, stage] : stages_) stage->reset();
}

RankInterpreter::~RankInterpreter() = default;

bool RankInterpreter::holds_last_stage() const { return stages_.count(layout_.stages() - 1) > 0; }

at::Tensor RankInterpreter::tally() const {
  return holds_last_stage() ? stages_.at(layout_.stages() - 1)->tally() : at::Tensor();
}

double RankInterpreter::units() const { return stages_.begin()->second->units(); }

MessageKey RankInterpreter::key_of(const Action& a) const {
  const bool act = a.type == ActionType::SendActivation || a.type == ActionType::RecvActivation;
  return MessageKey{act, std::min(a.stage, peer_stage(a)), a.micro_batch};
}

bool RankInterpreter::run() {
  TORCH_CHECK(mbs_, "pipeline: rank ", rank_, ": run() before begin()");
  while (next_ < list_.size()) {
    const Action& a = list_[next_];
    if (a.type != ActionType::SendActivation && a.type != ActionType::SendGrad) report_stages_done();
    switch (a.type) {
      case ActionType::Forward:
        forward(a);
        break;
      case ActionType::Backward:
      case ActionType::BackwardInput:
        backward(a);
        break;
      case ActionType::BackwardWeight:
        backward_weight(a);
        break;
      case ActionType::SendActivation:
      case ActionType::SendGrad:
        send(a);
        break;
      case ActionType::RecvActivation:
      case ActionType::RecvGrad:
        if (!recv(a)) return false;  // not sent yet: another rank's turn
        break;
    }
    ++next_;
  }
  report_stages_done();
  return true;
}

void RankInterpreter::report_stages_done() {
  for (; stages_done_ < last_backward_.size() && last_backward_[stages_done_].first < next_; ++stages_done_)
    if (on_stage_done_) on_stage_done_(last_backward_[stages_done_].second);
}

void RankInterpreter::set_device_model(const DeviceModel* model, bool drives_clock) {
  model_ = model && !model->measured() ? model : nullptr;
  model_clock_ = model_ && drives_clock;
}

void RankInterpreter::forward(const Action& a) {
  ActionTimer timer(*this);
  const int s = a.stage, mb = a.micro_batch;
  TORCH_CHECK(mb >= 0 && mb < mbs_->size(), "pipeline: rank ", rank_, " forward of micro-batch ", mb, " of ",
              mbs_->size());
  StageMessage in;
  if (s > 0) {
    auto it = inbox_.find({true, s - 1, mb});
    TORCH_CHECK(it != inbox_.end(), "pipeline: rank ", rank_, ": stage ", s, " has no activation of micro-batch ",
                mb, " from stage ", s - 1, " (the schedule runs the forward before its input arrives)");
    in = std::move(it->second);
    inbox_.erase(it);
  }
  std::optional<StageMessage> out =
      stages_.at(s)->forward(mb, mbs_->batches[mb], s > 0 ? &in : nullptr, mbs_->contexts[mb], mode_ == Mode::Train);
  const bool local = stages_.count(s + 1) > 0;
  if (out) (local ? inbox_ : outbox_)[MessageKey{true, s, mb}] = std::move(*out);  // a local stage takes it at once
  const double dt = timer.finish();
  clock_s_ += dt, compute_s_ += dt, forward_s_ += dt;
  if (out && !local) produced_s_[MessageKey{true, s, mb}] = clock_s_;
  if (mode_ == Mode::Train && model_) {  // counted on modelled timelines only (a walk of the tapes)
    size_t held = 0;
    for (const auto& [stage, runtime] : stages_) held += runtime->held_for_backward_bytes();
    activation_peak_ = std::max(activation_peak_, held);
  }
}

void RankInterpreter::backward(const Action& a) {
  TORCH_CHECK(mode_ == Mode::Train, "pipeline: rank ", rank_, ": a backward action in an evaluation list");
  const int s = a.stage, mb = a.micro_batch;
  auto place = grad_send_place_.find({s, mb});  // none: a stage of this rank takes it
  const GradSendPlace where = place == grad_send_place_.end() ? GradSendPlace{} : place->second;
  ActionTimer timer(*this);
  std::optional<StageMessage> in;
  auto it = inbox_.find({false, s, mb});
  if (it != inbox_.end()) in = std::move(it->second), inbox_.erase(it);
  // Note [leaves final within a stage]: the stage's last whole backward of the step tells of its
  // parameters as their gradients become final.
  std::optional<LeafFinalScope> releasing;
  if (on_leaf_final_ && a.type == ActionType::Backward &&
      std::any_of(last_backward_.begin(), last_backward_.end(), [&](const auto& e) { return e.first == next_; }))
    releasing.emplace([this, s](VariableImpl* leaf) { on_leaf_final_(s, leaf); });
  std::optional<StageMessage> out = a.type == ActionType::BackwardInput
                                        ? stages_.at(s)->backward_input(mb, in ? &*in : nullptr, where)
                                        : stages_.at(s)->backward(mb, in ? &*in : nullptr, where);
  releasing.reset();
  const bool local = stages_.count(s - 1) > 0;
  if (out) (local ? inbox_ : outbox_)[MessageKey{false, s - 1, mb}] = std::move(*out);
  const double dt = timer.finish();
  clock_s_ += dt, compute_s_ += dt;
  if (out && !local) produced_s_[MessageKey{false, s - 1, mb}] = clock_s_;
}

void RankInterpreter::backward_weight(const Action& a) {
  TORCH_CHECK(mode_ == Mode::Train, "pipeline: rank ", rank_, ": a backward action in an evaluation list");
  ActionTimer timer(*this);
  StageRuntime& stage = *stages_.at(a.stage);
  held_for_weights_peak_ = std::max(held_for_weights_peak_, stage.held_for_weights_bytes());
  stage.backward_weight(a.micro_batch);
  const double dt = timer.finish();
  clock_s_ += dt, compute_s_ += dt, weight_s_ += dt;
}

void RankInterpreter::send(const Action& a) {
  const MessageKey key = key_of(a);
  auto it = outbox_.find(key);
  if (it == outbox_.end()) {
    // Backward mode none: nothing to send, and the receiver does not wait for it.
    TORCH_CHECK(!key.activation && !pipeline_.boundary(static_cast<size_t>(key.boundary))->sends_gradient(),
                "pipeline: rank ", rank_, " sends ", key.describe(), " before computing it");
    return;
  }
  // Note [eager sends]. The lowered lists place a gradient send after the next activation's
  // receive (Note [blocking send/recv and the order of messages on a link] in lowering.h), which
  // blocking sends need. A transport that posts every send when its tensor is ready (an isend, as
  // torch.distributed.pipelining does) stamps it then; with eager sends the message carries the
  // time it was produced. The in-process channel never blocks on a send, so only the stamp moves.
  auto produced = produced_s_.find(key);
  const double sent_s = eager_sends_ && produced != produced_s_.end() ? produced->second : clock_s_;
  if (produced != produced_s_.end()) produced_s_.erase(produced);
  channel_.send(rank_, a.peer, key, std::move(it->second), sent_s);
  outbox_.erase(it);
}

bool RankInterpreter::recv(const Action& a) {
  const MessageKey key = key_of(a);
  if (!key.activation && !pipeline_.boundary(static_cast<size_t>(key.boundary))->sends_gradient()) return true;
  std::optional<Delivered> d = channel_.recv(a.peer, rank_, key, clock_s_);
  if (!d) return false;
  if (d->ready_s > clock_s_) comm_s_ += d->ready_s - clock_s_, clock_s_ = d->ready_s;
  inbox_[key] = std::move(d->message);
  return true;
}

// ---- ScopedInference ----------------------------------------------------------------------------

ScopedInference::ScopedInference(Pipeline& pipeline, bool compression)
    : pipeline_(pipeline), was_training_(pipeline.is_training()) {
  pipeline_.eval();
  for (const auto& b : pipeline_.boundaries()) {
    active_.push_back(b->active_at_inference());
    measure_.push_back(b->measures_error());
    b->set_active_at_inference(compression);
    b->set_measure_error(false);
  }
}

ScopedInference::~ScopedInference() {
  for (size_t i = 0; i < pipeline_.boundaries().size(); ++i) {
    pipeline_.boundary(i)->set_active_at_inference(active_[i]);
    pipeline_.boundary(i)->set_measure_error(measure_[i]);
  }
  if (was_training_) pipeline_.train();
}

}  // namespace tl
