#include "parallel/executor.h"

#include <algorithm>
#include <chrono>
#include <deque>

#include "autograd/autograd.h"

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

std::optional<Payload> StageRuntime::forward(int64_t mb_index, const Batch& mb, const Payload* received,
                                             const CodecContext& ctx) {
  TORCH_CHECK(!in_flight_.count(mb_index), "stage ", stage_, ": micro-batch ", mb_index, " is already in flight");
  InFlight& f = in_flight_[mb_index];
  f.tape = std::make_unique<Tape>();
  f.ctx = ctx;
  TapeGuard guard(*f.tape);  // this micro-batch's graph on this stage
  Variable x;
  if (first()) {
    x = Variable(mb.input);
  } else {
    TORCH_CHECK(received, "stage ", stage_, ": micro-batch ", mb_index, " has no activation from stage ", stage_ - 1);
    const BoundaryPtr& b = pipeline_.boundary(stage_ - 1);
    at::Tensor zhat = b->receive_forward(*received, ctx);
    f.input = Variable(zhat, /*requires_grad=*/true);  // cut from the sender's graph
    x = b->receiver_transform(f.input, ctx);
    f.raw_in = raw_size(x.data());
    if (previous_ && b->measures_error()) {
      auto it = previous_->in_flight_.find(mb_index);
      if (it != previous_->in_flight_.end() && it->second.boundary_input.defined())
        b->measure_forward(it->second.boundary_input, x.data(), zhat);
    }
  }
  Variable h = std::static_pointer_cast<Stage>(pipeline_.stage(stage_))->forward(x, mb.side);
  units_ += mb.weight();
  if (last()) {
    MicroBatchLoss l = loss_fn_(h, mb);
    f.loss = l.loss;
    f.weight = mb.weight();
    tally_ = tally_.defined() ? tally_ + l.tally : l.tally;
    return std::nullopt;
  }
  const BoundaryPtr& b = pipeline_.boundary(stage_);
  f.raw_out = raw_size(h.data());
  if (next_ && b->measures_error()) f.boundary_input = h.data();
  f.sent = b->sender_transform(h, ctx);
  return b->send_forward(f.sent.data(), ctx, f.raw_out);
}

std::optional<Payload> StageRuntime::backward(int64_t mb_index, const Payload* received) {
  auto it = in_flight_.find(mb_index);
  TORCH_CHECK(it != in_flight_.end(), "stage ", stage_, ": backward of micro-batch ", mb_index, " before its forward");
  InFlight f = std::move(it->second);
  in_flight_.erase(it);
  if (last()) {
    // Seeded with the micro-batch's units: the gradient of its summed loss (Note [accumulation
    // weights] in layers/optim/grad_utils.h); the step divides by the batch's units once.
    if (f.weight > 0) f.loss.backward(at::full_like(f.loss.data(), f.weight));
  } else {
    const BoundaryPtr& b = pipeline_.boundary(stage_);
    // Backward mode none: no gradient crosses; this stage's part of the graph gets zeros.
    at::Tensor g = received ? b->receive_backward(*received, f.ctx) : at::zeros_like(f.sent.data());
    if (next_ && received) {
      auto sent = next_->sent_grads_.find(mb_index);
      if (sent != next_->sent_grads_.end()) {
        b->measure_backward(sent->second, g);
        next_->sent_grads_.erase(sent);
      }
    }
    f.sent.backward(g);
  }
  if (first()) return std::nullopt;
  const BoundaryPtr& b = pipeline_.boundary(stage_ - 1);
  if (!b->sends_gradient()) return std::nullopt;
  at::Tensor grad = f.input.grad();
  if (!grad.defined()) grad = at::zeros_like(f.input.data());  // the stage did not use its input
  if (previous_ && b->measures_error()) sent_grads_[mb_index] = grad;
  return b->send_backward(grad, f.ctx, f.raw_in);  // f (its tape and saved tensors) is freed on return
}

// ---- LocalExecutor -------------------------------------------------------------------------------

double StepTiming::bubble() const {
  double compute = 0;
  for (double c : compute_s) compute += c;
  const double total = step_s * static_cast<double>(compute_s.size());
  return total > 0 ? std::max(0.0, 1.0 - compute / total) : 0.0;
}

LocalExecutor::LocalExecutor(Pipeline& pipeline) : pipeline_(pipeline), links_(pipeline.boundaries().size()) {}

void LocalExecutor::set_links(std::vector<LinkSpec> links) {
  TORCH_CHECK(links.size() == pipeline_.boundaries().size(), "LocalExecutor: ", links.size(), " link specs for ",
              pipeline_.boundaries().size(), " boundaries");
  links_ = std::move(links);
}

StepResult LocalExecutor::train_step(const Batch& batch, int64_t micro_batches, const std::string& schedule_name,
                                     const Pipeline::LossFn& loss_fn, int64_t epoch, StepTiming* timing) {
  const MicroBatches split = split_micro_batches(batch, micro_batches, epoch);
  const std::vector<Batch>& mbs = split.batches;
  const std::vector<CodecContext>& ctxs = split.contexts;
  const int stages = static_cast<int>(pipeline_.num_stages());
  const int m = split.size();
  const std::vector<RankSchedule> plan = make_schedule(schedule_name, stages, m);

  std::vector<std::unique_ptr<StageRuntime>> rt;
  for (int s = 0; s < stages; ++s) rt.push_back(std::make_unique<StageRuntime>(pipeline_, s, loss_fn));
  for (int s = 0; s < stages; ++s)
    rt[s]->set_neighbours(s > 0 ? rt[s - 1].get() : nullptr, s + 1 < stages ? rt[s + 1].get() : nullptr);

  // A message on a link: the payload (nullopt: backward mode none, nothing on the wire) and its
  // delivery time on the virtual timeline.
  struct Message {
    int micro_batch;
    std::optional<Payload> payload;
    double delivered_s;
  };
  // outbox[s]: what stage s computed and has not sent yet; to_next[s] / to_prev[s]: messages on
  // the link after / before stage s, in send order (a link delivers in order).
  std::vector<std::map<int, std::optional<Payload>>> out_act(stages), out_grad(stages);
  std::vector<std::deque<Message>> acts(stages), grads(stages);  // acts[s]: s -> s+1; grads[s]: s+1 -> s
  std::vector<std::map<int, Message>> got_act(stages), got_grad(stages);
  std::deque<Link> fwd_links, bwd_links;  // full duplex: one queue per direction (Link is not movable)
  for (const auto& spec : links_) fwd_links.emplace_back(spec), bwd_links.emplace_back(spec);
  std::vector<double> clock(stages, 0.0), compute(stages, 0.0), comm(stages, 0.0);
  std::vector<size_t> next(stages, 0);

  auto elapsed = [](std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  auto transmit = [](Link& link, double sent_s, const std::optional<Payload>& p) {
    return p ? link.transmit(sent_s, static_cast<int64_t>(p->nbytes())) : sent_s;
  };

  size_t remaining = 0;
  for (const auto& list : plan) remaining += list.size();
  while (remaining > 0) {
    bool progressed = false;
    for (int s = 0; s < stages; ++s) {
      while (next[s] < plan[s].size()) {  // this stage's actions until it waits for a message
        const Action& a = plan[s][next[s]];
        const int mb = a.micro_batch;
        bool ready = true;
        switch (a.type) {
          case ActionType::Forward: {
            auto t0 = std::chrono::steady_clock::now();
            const Payload* in = s > 0 ? &*got_act[s].at(mb).payload : nullptr;
            std::optional<Payload> out = rt[s]->forward(mb, mbs[mb], in, ctxs[mb]);
            got_act[s].erase(mb);
            if (s + 1 < stages) out_act[s][mb] = std::move(out);
            const double dt = elapsed(t0);
            clock[s] += dt, compute[s] += dt;
            break;
          }
          case ActionType::Backward: {
            if (s > 0) apply_epilogue_flag(pipeline_, plan[s], next[s], mb);
            auto t0 = std::chrono::steady_clock::now();
            const Payload* in = nullptr;
            auto got = got_grad[s].find(mb);
            if (got != got_grad[s].end() && got->second.payload) in = &*got->second.payload;
            std::optional<Payload> out = rt[s]->backward(mb, in);
            if (got != got_grad[s].end()) got_grad[s].erase(got);
            if (s > 0) out_grad[s][mb] = std::move(out);
            const double dt = elapsed(t0);
            clock[s] += dt, compute[s] += dt;
            break;
          }
          case ActionType::SendActivation: {
            std::optional<Payload> p = std::move(out_act[s].at(mb));
            out_act[s].erase(mb);
            const double at_s = transmit(fwd_links[s], clock[s], p);
            acts[s].push_back({mb, std::move(p), at_s});
            break;
          }
          case ActionType::SendGrad: {
            std::optional<Payload> p = std::move(out_grad[s].at(mb));
            out_grad[s].erase(mb);
            const double at_s = transmit(bwd_links[s - 1], clock[s], p);
            grads[s - 1].push_back({mb, std::move(p), at_s});
            break;
          }
          case ActionType::RecvActivation:
          case ActionType::RecvGrad: {
            const bool act = a.type == ActionType::RecvActivation;
            std::deque<Message>& link = act ? acts[s - 1] : grads[s];
            if (link.empty()) {
              ready = false;  // the sender has not got there yet
              break;
            }
            Message msg = std::move(link.front());
            link.pop_front();
            TORCH_CHECK(msg.micro_batch == mb, "executor: stage ", s, " expected ", act ? "activation" : "gradient",
                        " ", mb, " but the link delivers ", msg.micro_batch, " (the '", schedule_name,
                        "' schedule's sends and receives disagree)");
            if (msg.delivered_s > clock[s]) comm[s] += msg.delivered_s - clock[s], clock[s] = msg.delivered_s;
            (act ? got_act[s] : got_grad[s]).emplace(mb, std::move(msg));
            break;
          }
        }
        if (!ready) break;
        ++next[s];
        --remaining;
        progressed = true;
      }
    }
    TORCH_CHECK(progressed, "executor: the '", schedule_name, "' schedule cannot proceed (a stage waits for a ",
                "message no stage sends)");
  }
  for (int s = 0; s + 1 < stages; ++s) pipeline_.boundary(s)->set_backward_compression_enabled(true);

  StepResult r;
  const StageRuntime& last = *rt.back();
  TORCH_CHECK(last.units() > 0, "train_step: the batch has no loss units (every target ignored)");
  const Tally t = Tally::from(last.tally());  // one sync per step
  r.units = last.units();  // from the batch (CPU), equal to the tally's count
  r.loss = t.loss_sum / r.units;
  r.correct = t.correct;
  r.rows = batch.rows();
  r.micro_batches = m;
  if (timing) {
    timing->step_s = *std::max_element(clock.begin(), clock.end());
    timing->compute_s = compute;
    timing->comm_s = comm;
  }
  return r;
}

void apply_epilogue_flag(Pipeline& pipeline, const RankSchedule& list, size_t at, int micro_batch) {
  const BoundaryPtr& b = pipeline.boundary(list[at].stage - 1);
  bool compress = true;
  for (size_t i = at + 1; i < list.size(); ++i)
    if (list[i].type == ActionType::SendGrad && list[i].micro_batch == micro_batch) {
      compress = list[i].compress_backward;
      break;
    }
  b->set_backward_compression_enabled(!b->epilogue_only() || compress);
}

MicroBatches split_micro_batches(const Batch& batch, int64_t micro_batches, int64_t epoch) {
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
    out.contexts.push_back(micro_batch_context(out.batches.back(), out.size() - 1, epoch));
  }
  return out;
}

CodecContext micro_batch_context(const Batch& mb, int64_t index, int64_t epoch) {
  CodecContext c;
  c.micro_batch = index;
  c.epoch = epoch;
  c.sample_ids = mb.sample_ids;
  c.token_ids = mb.side.token_ids;
  return c;
}

}  // namespace tl
