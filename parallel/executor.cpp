#include "parallel/executor.h"

#include <algorithm>
#include <chrono>
#include <deque>

#include "autograd/autograd.h"
#include "parallel/interpreter.h"

namespace tl {

namespace {
int64_t raw_size(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }
}  // namespace

// ---- StageRuntime --------------------------------------------------------------------------------

StageRuntime::StageRuntime(Pipeline& pipeline, size_t stage, const Pipeline::LossFn& loss_fn)
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
    out = StageMessage{b->send_forward(f.sent.data(), ctx, f.raw_out), keep && b->measures_error() ? h.data() : at::Tensor()};
  }
  if (keep) {
    f.weight = mb.weight();
    units_ += f.weight;
    in_flight_.emplace(mb_index, std::move(f));
  }
  return out;
}

std::optional<StageMessage> StageRuntime::backward(int64_t mb_index, const StageMessage* in) {
  return run_backward(mb_index, in, false);
}

std::optional<StageMessage> StageRuntime::backward_input(int64_t mb_index, const StageMessage* in) {
  return run_backward(mb_index, in, true);
}

std::optional<StageMessage> StageRuntime::run_backward(int64_t mb_index, const StageMessage* in, bool split) {
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
      out = StageMessage{b->send_backward(grad, f.ctx, f.raw_in), b->measures_error() ? grad : at::Tensor()};
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

size_t StageRuntime::held_for_weights_bytes() const {
  size_t n = 0;
  for (const auto& [mb, f] : awaiting_weights_) n += f.weights.held_bytes();
  return n;
}

// ---- LocalExecutor -------------------------------------------------------------------------------

LocalExecutor::LocalExecutor(Pipeline& pipeline)
    : pipeline_(pipeline), layout_(pipeline.layout()), links_(pipeline.boundaries().size()) {}

void LocalExecutor::set_device_model(const DeviceModel& model, bool drives_clock) {
  model_ = model;
  model_clock_ = drives_clock;
}

void LocalExecutor::set_links(std::vector<LinkSpec> links) {
  TORCH_CHECK(links.size() == pipeline_.boundaries().size(), "LocalExecutor: ", links.size(), " link specs for ",
              pipeline_.boundaries().size(), " boundaries");
  links_ = std::move(links);
  link_specs_by_rank_pair(layout_, links_);  // checks that boundaries sharing a link agree
}

namespace {

// Runs every rank's interpreter in turns until all are done; an error if none can proceed.
void run_to_completion(std::vector<std::unique_ptr<RankInterpreter>>& ranks, const std::string& schedule_name) {
  for (size_t done = 0; done < ranks.size();) {
    done = 0;
    bool progressed = false;
    for (auto& r : ranks) {
      if (r->done()) {
        ++done;
        continue;
      }
      const size_t before = r->position();
      const bool finished = r->run();
      progressed = progressed || r->position() != before;
      done += finished;
    }
    if (done == ranks.size()) break;
    TORCH_CHECK(progressed, "executor: the '", schedule_name, "' schedule cannot proceed (a rank waits for a ",
                "message no rank sends)");
  }
}

}  // namespace

StepResult LocalExecutor::train_step(const Batch& batch, int64_t micro_batches, const std::string& schedule_name,
                                     const Pipeline::LossFn& loss_fn, const StepPosition& at, StepTiming* timing) {
  const MicroBatches split = split_micro_batches(batch, micro_batches, at);
  const std::vector<RankSchedule> plan = make_schedule(schedule_name, layout_, split.size());
  LocalChannel channel;
  for (const auto& [pair, spec] : link_specs_by_rank_pair(layout_, links_)) channel.set_link(pair.first, pair.second, spec);
  std::vector<std::unique_ptr<RankInterpreter>> ranks;
  for (int r = 0; r < layout_.ranks; ++r) {
    ranks.push_back(std::make_unique<RankInterpreter>(pipeline_, layout_, r, plan[static_cast<size_t>(r)], split,
                                                      loss_fn, channel, RankInterpreter::Mode::Train));
    ranks.back()->set_device_model(&model_, model_clock_);
  }
  run_to_completion(ranks, schedule_name);
  TORCH_CHECK(channel.in_flight() == 0, "executor: the '", schedule_name, "' schedule left ", channel.in_flight(),
              " messages unreceived");

  // The rank holding the last stage (the last rank, or rank 0 on a V placement) has the tally.
  const RankInterpreter& last = *ranks[static_cast<size_t>(layout_.rank_of(layout_.stages() - 1))];
  const StepResult r = step_result(last.tally(), last.units(), batch.rows(), split.size());
  if (timing) {
    timing->step_s = 0;
    *timing = StepTiming{};
    for (const auto& rank : ranks) {
      timing->step_s = std::max(timing->step_s, rank->clock_s());
      timing->compute_s.push_back(rank->compute_s());
      timing->comm_s.push_back(rank->comm_s());
      timing->forward_s.push_back(rank->forward_s());
      timing->weight_s.push_back(rank->weight_s());
      timing->held_for_weights_bytes.push_back(rank->held_for_weights_peak());
      timing->flops.push_back(rank->flops());
      timing->modelled_s.push_back(rank->modelled_s());
    }
  }
  return r;
}

at::Tensor LocalExecutor::evaluate_batch(const Batch& batch, bool compression, const Pipeline::LossFn& loss_fn) {
  NoGradGuard no_grad;
  ScopedInference inference(pipeline_, compression);
  const MicroBatches one = evaluation_batch(batch);
  const std::vector<RankSchedule> plan = forward_only_schedule(layout_);
  LocalChannel channel;
  std::vector<std::unique_ptr<RankInterpreter>> ranks;
  for (int r = 0; r < layout_.ranks; ++r)
    ranks.push_back(std::make_unique<RankInterpreter>(pipeline_, layout_, r, plan[static_cast<size_t>(r)], one, loss_fn,
                                                      channel, RankInterpreter::Mode::Evaluate));
  run_to_completion(ranks, "evaluation");
  return ranks[static_cast<size_t>(layout_.rank_of(layout_.stages() - 1))]->tally();
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

std::map<std::pair<int, int>, LinkSpec> link_specs_by_rank_pair(const StageLayout& layout,
                                                                const std::vector<LinkSpec>& boundary_links) {
  std::map<std::pair<int, int>, LinkSpec> out;
  std::map<std::pair<int, int>, size_t> first_boundary;
  for (size_t b = 0; b < boundary_links.size(); ++b) {
    const int a = layout.rank_of(static_cast<int>(b)), c = layout.rank_of(static_cast<int>(b) + 1);
    if (a == c) continue;  // both stages on one rank: no link
    const LinkSpec& spec = boundary_links[b];
    for (auto pair : {std::make_pair(a, c), std::make_pair(c, a)}) {
      auto seen = first_boundary.find(pair);
      if (seen == first_boundary.end()) {
        first_boundary[pair] = b;
        out[pair] = spec;
        continue;
      }
      const LinkSpec& other = boundary_links[seen->second];
      TORCH_CHECK(other.bandwidth_mbps == spec.bandwidth_mbps && other.latency_ms == spec.latency_ms, "boundary.",
                  seen->second + 1, " (", other.describe(), ") and boundary.", b + 1, " (", spec.describe(),
                  ") cross the same link, between pipeline ranks ", pair.first, " and ", pair.second,
                  " (pipeline.virtual_stages = ", layout.virtual_stages, "): give them the same bandwidth and latency");
    }
  }
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
  TORCH_CHECK(rows > 0 && batch.target.defined() && batch.target.size(0) == rows, "train_step: ",
              batch.input.sizes(), " inputs and ", batch.target.defined() ? batch.target.sizes() : at::IntArrayRef(),
              " targets; expected the same number of rows (> 0)");
  TORCH_CHECK(batch.units.defined() && batch.units.numel() == rows,
              "train_step: the batch needs one loss unit count per row (Batch::units)");
  TORCH_CHECK(!batch.sample_ids.defined() || batch.sample_ids.numel() == rows, "train_step: ",
              batch.sample_ids.numel(), " sample ids for ", rows, " rows");
  MicroBatches out;
  for (const auto& [start, size] : Pipeline::micro_batch_slices(rows, micro_batches)) {
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

}  // namespace tl
