#include "parallel/stage_runtime.h"

#include <algorithm>

#include "autograd/autograd.h"

namespace tl {

namespace {
int64_t raw_size(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }
}  // namespace

// ---- StageRuntime --------------------------------------------------------------------------------

StageRuntime::StageRuntime(Pipeline& pipeline, size_t stage, const LossFn& loss_fn)
    : pipeline_(pipeline), stage_(stage), loss_fn_(loss_fn) {
  TORCH_CHECK(stage < pipeline.num_stages(), "StageRuntime: stage ", stage, " of a ", pipeline.num_stages(),
              "-stage pipeline");
}

std::optional<StageMessage> StageRuntime::forward(int64_t mb_index, const Batch& mb, const StageMessage* in,
                                                  const CodecContext& ctx, bool keep) {
  TORCH_CHECK(!in_flight_.count(mb_index), "stage ", stage_, ": micro-batch ", mb_index, " is already in flight");
  InFlight f;
  if (keep) f.tape = std::make_unique<Tape>();
  f.ctx = ctx;
  std::optional<TapeGuard> guard;
  if (keep) guard.emplace(*f.tape);  // this micro-batch's graph on this stage
  Variable x;
  if (first()) {
    x = Variable(mb.input);
  } else {
    TORCH_CHECK(in && in->payload, "stage ", stage_, ": micro-batch ", mb_index, " has no activation from stage ",
                stage_ - 1);
    const BoundaryPtr& b = pipeline_.boundary(stage_ - 1);
    at::Tensor zhat = b->receive_forward(*in->payload, ctx);
    f.input = Variable(zhat, /*requires_grad=*/keep);  // cut from the sender's graph
    x = b->receiver_transform(f.input, ctx);
    f.raw_in = raw_size(x.data());
    if (in->reference.defined()) b->measure_forward(in->reference, x.data(), zhat);
  }
  Variable h = std::static_pointer_cast<Stage>(pipeline_.stage(stage_))->forward(x, mb.side);
  std::optional<StageMessage> out;
  if (last()) {
    MicroBatchLoss l = loss_fn_(h, mb);
    tally_ = tally_.defined() ? tally_ + l.tally : l.tally;
    f.loss = l.loss;
  } else {
    const BoundaryPtr& b = pipeline_.boundary(stage_);
    f.raw_out = raw_size(h.data());
    f.sent = b->sender_transform(h, ctx);
    out = StageMessage{b->send_forward(f.sent.data(), ctx, f.raw_out),
                       keep && b->measures_error() ? h.data() : at::Tensor()};
  }
  if (keep) {
    f.weight = mb.weight();
    units_ += f.weight;
    in_flight_.emplace(mb_index, std::move(f));
  }
  return out;
}

std::optional<StageMessage> StageRuntime::backward(int64_t mb_index, const StageMessage* in, GradSendPlace place) {
  return run_backward(mb_index, in, false, place);
}

std::optional<StageMessage> StageRuntime::backward_input(int64_t mb_index, const StageMessage* in,
                                                         GradSendPlace place) {
  return run_backward(mb_index, in, true, place);
}

std::optional<StageMessage> StageRuntime::run_backward(int64_t mb_index, const StageMessage* in, bool split,
                                                       GradSendPlace place) {
  auto it = in_flight_.find(mb_index);
  TORCH_CHECK(it != in_flight_.end(), "stage ", stage_, ": backward of micro-batch ", mb_index, " before its forward");
  InFlight f = std::move(it->second);
  in_flight_.erase(it);
  // Whole, or B of Note [split backward]: the weights' gradients wait in f.weights.
  auto backprop = [&](const Variable& root, const at::Tensor& grad) {
    if (split)
      f.weights = backward_inputs({root}, {grad}, f.input.defined() ? variable_list{f.input} : variable_list{});
    else
      root.backward(grad);
  };
  if (last()) {
    // Seeded with the micro-batch's units: the gradient of its summed loss (Note [accumulation
    // weights] in layers/optim/grad_utils.h); the step divides by the batch's units once.
    if (f.weight > 0) backprop(f.loss, at::full_like(f.loss.data(), f.weight));
  } else {
    const BoundaryPtr& b = pipeline_.boundary(stage_);
    // Backward mode none: no gradient crosses; this stage's part of the graph gets zeros.
    const bool got = in && in->payload;
    at::Tensor g = got ? b->receive_backward(*in->payload, f.ctx) : at::zeros_like(f.sent.data());
    if (got && in->reference.defined()) b->measure_backward(in->reference, g);
    backprop(f.sent, g);
  }
  std::optional<StageMessage> out;
  if (!first()) {
    const BoundaryPtr& b = pipeline_.boundary(stage_ - 1);
    if (b->sends_gradient()) {
      at::Tensor grad = f.input.grad();
      if (!grad.defined()) grad = at::zeros_like(f.input.data());  // the stage did not use its input
      out = StageMessage{b->send_backward(grad, f.ctx, f.raw_in, place), b->measures_error() ? grad : at::Tensor()};
    }
  }
  // Whole: f (its tape and saved tensors) is freed on return. Split: kept for the weights.
  if (split) awaiting_weights_.emplace(mb_index, std::move(f));
  return out;
}

void StageRuntime::backward_weight(int64_t mb_index) {
  auto it = awaiting_weights_.find(mb_index);
  TORCH_CHECK(it != awaiting_weights_.end(), "stage ", stage_, ": weight gradients of micro-batch ", mb_index,
              in_flight_.count(mb_index) ? " before its input gradient (I before W)" : " that is not in flight");
  it->second.weights.run();
  awaiting_weights_.erase(it);  // its tape and saved tensors
}

void StageRuntime::reset() {
  in_flight_.clear();
  awaiting_weights_.clear();
  tally_ = at::Tensor();
  units_ = 0;
}

size_t StageRuntime::held_for_weights_bytes() const {
  size_t n = 0;
  for (const auto& [mb, f] : awaiting_weights_) n += f.weights.held_bytes();
  return n;
}

size_t StageRuntime::held_for_backward_bytes() const {
  size_t n = held_for_weights_bytes();
  for (const auto& [mb, f] : in_flight_)
    if (f.tape) n += f.tape->saved_bytes();
  return n;
}

// ---- a step's micro-batches ----------------------------------------------------------------------

std::vector<std::pair<int64_t, int64_t>> micro_batch_slices(int64_t batch, int64_t micro_batches) {
  TORCH_CHECK(micro_batches >= 1, "train.micro_batches must be >= 1, got ", micro_batches);
  // at::chunk's rule: ceil(B / M) rows per chunk, the last one smaller (so possibly fewer chunks).
  const int64_t size = (batch + micro_batches - 1) / micro_batches;
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t start = 0; start < batch; start += size) out.emplace_back(start, std::min(size, batch - start));
  return out;
}

MicroBatches evaluation_batch(const Batch& batch) {
  MicroBatches one;
  one.batches.push_back(batch);
  CodecContext ctx;
  ctx.token_ids = batch.side.token_ids;
  one.contexts.push_back(ctx);
  return one;
}

MicroBatches split_micro_batches(const Batch& batch, int64_t micro_batches, const StepPosition& at) {
  const int64_t rows = batch.rows();
  TORCH_CHECK(rows > 0 && batch.target.defined() && batch.target.size(0) == rows, "train_step: ", batch.input.sizes(),
              " inputs and ", batch.target.defined() ? batch.target.sizes() : at::IntArrayRef(),
              " targets; expected the same number of rows (> 0)");
  TORCH_CHECK(batch.units.defined() && batch.units.numel() == rows,
              "train_step: the batch needs one loss unit count per row (Batch::units)");
  TORCH_CHECK(!batch.sample_ids.defined() || batch.sample_ids.numel() == rows, "train_step: ", batch.sample_ids.numel(),
              " sample ids for ", rows, " rows");
  MicroBatches out;
  for (const auto& [start, size] : micro_batch_slices(rows, micro_batches)) {
    out.batches.push_back(batch.slice(start, size));
    out.contexts.push_back(micro_batch_context(out.batches.back(), out.size() - 1, at));
  }
  return out;
}

CodecContext micro_batch_context(const Batch& mb, int64_t index, const StepPosition& at) {
  CodecContext c;
  c.micro_batch = index;
  c.epoch = at.epoch;
  c.step = at.step;
  c.progress = at.progress;
  c.sample_ids = mb.sample_ids;
  c.token_ids = mb.side.token_ids;
  return c;
}

StepResult step_result(const at::Tensor& tally, double units, int64_t rows, int micro_batches) {
  TORCH_CHECK(units > 0, "train_step: the batch has no loss units (every target ignored)");
  const Tally t = Tally::from(tally);  // one sync per step
  StepResult r;
  r.units = units;  // from the batch (CPU), equal to the tally's count
  r.loss = t.loss_sum / r.units;
  r.correct = t.correct;
  r.rows = rows;
  r.micro_batches = micro_batches;
  return r;
}

}  // namespace tl
