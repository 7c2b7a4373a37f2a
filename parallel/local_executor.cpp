#include "parallel/local_executor.h"

#include <algorithm>
#include <limits>

#include "autograd/autograd.h"
#include "layers/optim/grad_utils.h"
#include "parallel/interpreter.h"

namespace tl {

LocalExecutor::LocalExecutor(Pipeline& pipeline, LossFn loss_fn, ScheduleSettings settings)
    : pipeline_(pipeline),
      loss_fn_(std::move(loss_fn)),
      settings_(std::move(settings)),
      parameters_(pipeline_.parameters()) {
  layout_ = settings_.layout(static_cast<int>(pipeline_.num_stages()));
  if (settings_.links.empty()) settings_.links.assign(pipeline_.boundaries().size(), LinkSpec{});
  TORCH_CHECK(settings_.links.size() == pipeline_.boundaries().size(), "LocalExecutor: ", settings_.links.size(),
              " link specs for ", pipeline_.boundaries().size(), " boundaries");
  links_ = link_specs_by_rank_pair(layout_, settings_.links);  // boundaries sharing a link must agree
}

struct LocalExecutor::Ranks {
  LocalChannel channel;
  std::vector<std::unique_ptr<RankInterpreter>> interpreters;
};

LocalExecutor::~LocalExecutor() = default;

LocalExecutor::Ranks& LocalExecutor::ranks_for(int micro_batches) {
  std::unique_ptr<Ranks>& kept = train_ranks_[micro_batches];
  if (kept) return *kept;
  const std::vector<RankSchedule>& lists = cached_schedule(settings_.schedule, layout_, micro_batches);
  auto ranks = std::make_unique<Ranks>();
  for (const auto& [pair, spec] : links_) ranks->channel.set_link(pair.first, pair.second, spec);
  ranks->channel.set_link_model(settings_.link_model);
  for (int r = 0; r < layout_.ranks; ++r) {
    ranks->interpreters.push_back(std::make_unique<RankInterpreter>(
        pipeline_, layout_, r, lists[static_cast<size_t>(r)], loss_fn_, ranks->channel, RankInterpreter::Mode::Train));
    ranks->interpreters.back()->set_eager_sends(settings_.link_model == LinkModel::Inbound);  // Note [link models]
  }
  kept = std::move(ranks);
  return *kept;
}

LocalExecutor::Ranks& LocalExecutor::evaluation_ranks() {
  if (evaluation_ranks_) return *evaluation_ranks_;
  const std::vector<RankSchedule>& lists = cached_forward_only_schedule(layout_);
  auto ranks = std::make_unique<Ranks>();
  for (int r = 0; r < layout_.ranks; ++r)
    ranks->interpreters.push_back(std::make_unique<RankInterpreter>(pipeline_, layout_, r,
                                                                    lists[static_cast<size_t>(r)], loss_fn_,
                                                                    ranks->channel, RankInterpreter::Mode::Evaluate));
  evaluation_ranks_ = std::move(ranks);
  return *evaluation_ranks_;
}

const StepTiming& LocalExecutor::last_timing() const {
  TORCH_CHECK(stepped_, "LocalExecutor: no train_step has run yet");
  return timing_;
}

int64_t LocalExecutor::model_parameters() const { return static_cast<int64_t>(pipeline_.model()->num_parameters()); }

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

StepResult LocalExecutor::train_step(const Batch& batch, int64_t micro_batches, const StepPosition& at,
                                     StepTiming* timing) {
  const MicroBatches split = split_micro_batches(batch, micro_batches, at);
  // One GradAccumulator over every parameter, so tied parameters (registered in two stages) are
  // divided once: each stage's backward adds its part, seeded with the micro-batch's units.
  GradAccumulator acc(parameters_);
  Ranks& kept = ranks_for(split.size());
  LocalChannel& channel = kept.channel;
  std::vector<std::unique_ptr<RankInterpreter>>& ranks = kept.interpreters;
  channel.reset();
  for (auto& r : ranks) {
    r->set_device_model(&settings_.device, model_clock_);
    r->begin(split);
  }
  run_to_completion(ranks, settings_.schedule);
  TORCH_CHECK(channel.in_flight() == 0, "executor: the '", settings_.schedule, "' schedule left ", channel.in_flight(),
              " messages unreceived");

  // The rank holding the last stage (the last rank, or rank 0 on a V placement) has the tally.
  const RankInterpreter& last = *ranks[static_cast<size_t>(layout_.rank_of(layout_.stages() - 1))];
  StepResult r;
  if (last.tally().defined() && last.tally().is_meta()) {  // a step on shapes (the planner's): no loss to read
    r.units = last.units();
    r.loss = std::numeric_limits<double>::quiet_NaN();
    r.rows = batch.rows();
    r.micro_batches = split.size();
  } else {
    r = step_result(last.tally(), last.units(), batch.rows(), split.size());
  }
  links_used_.clear();
  for (const auto& [pair, spec] : links_)
    if (const Link* l = channel.link(pair.first, pair.second))
      links_used_.push_back({pair.first, pair.second, spec, l->bytes(), l->messages(), l->transmission_s(l->bytes())});
  acc.add_weight(r.units);
  acc.finish();
  timing_ = StepTiming{};
  for (const auto& rank : ranks) {
    timing_.step_s = std::max(timing_.step_s, rank->clock_s());
    timing_.compute_s.push_back(rank->compute_s());
    timing_.comm_s.push_back(rank->comm_s());
    timing_.forward_s.push_back(rank->forward_s());
    timing_.weight_s.push_back(rank->weight_s());
    timing_.held_for_weights_bytes.push_back(rank->held_for_weights_peak());
    timing_.flops.push_back(rank->flops());
    timing_.op_bytes.push_back(rank->op_bytes());
    timing_.kernels.push_back(rank->kernels());
    timing_.modelled_s.push_back(rank->modelled_s());
    timing_.activation_bytes.push_back(rank->activation_peak());
  }
  stepped_ = true;
  if (timing) *timing = timing_;
  return r;
}

double LocalExecutor::clip_grad_norm(double max_norm, int64_t step) {
  return tl::clip_grad_norm(parameters_, max_norm);  // the order the ranks sum in
}

at::Tensor LocalExecutor::evaluate_batch(const Batch& batch, bool compression) {
  NoGradGuard no_grad;
  ScopedInference inference(pipeline_, compression);
  const MicroBatches one = evaluation_batch(batch);
  Ranks& kept = evaluation_ranks();
  std::vector<std::unique_ptr<RankInterpreter>>& ranks = kept.interpreters;
  kept.channel.reset();
  for (auto& r : ranks) r->begin(one);
  run_to_completion(ranks, "evaluation");
  return ranks[static_cast<size_t>(layout_.rank_of(layout_.stages() - 1))]->tally();
}

Tally LocalExecutor::evaluate(int64_t count, const std::function<Batch(int64_t)>& batch_at, bool compression) {
  at::Tensor tally;
  for (int64_t b = 0; b < count; ++b) {
    const at::Tensor t = evaluate_batch(batch_at(b), compression);
    if (t.defined()) tally = tally.defined() ? tally + t : t;
  }
  return tally.defined() ? Tally::from(tally) : Tally{};  // one sync per evaluation
}

EpochTotals LocalExecutor::finish_epoch(const RankEpoch& mine, int64_t epoch) {
  EpochTotals out;
  for (const auto& b : pipeline_.boundaries()) out.boundaries.push_back(b->stats());
  out.train_time_s = {mine.train_time_s};
  out.compute_s = {mine.compute_s};
  out.comm_s = {mine.comm_s};
  out.peak_rss_bytes = {peak_resident_bytes()};
  out.parameter_bytes = {parameter_bytes(pipeline_)};
  out.optimizer_bytes = {mine.optimizer_bytes};
  return out;
}

void LocalExecutor::save_checkpoint(const std::string& path, const CheckpointContents& contents) {
  write_checkpoint(path, contents);
}

}  // namespace tl
