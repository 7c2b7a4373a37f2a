// The epoch loop of a run: train every batch of an epoch through the run's executor, evaluate the
// test set with compression on and off, and collect the epoch's metrics (tasks/runner/experiment.h).
#include <algorithm>
#include <chrono>
#include <cmath>

#include "tasks/runner/experiment.h"

namespace tl {

Experiment::Evaluation Experiment::evaluate(bool compression) {
  // One forward-only pass per test batch through every stage, by the one interpreter (in this
  // process, or this rank's stages); the tally is the last stage's, summed over every rank.
  const Tally t = executor_->evaluate(
      task_->eval_batches(), [this](int64_t b) { return task_->eval_batch(b).to(device_); }, compression);
  if (t.units <= 0) return {};
  return {t.loss(), task_->metric_value(t)};
}

bool Experiment::has_adaptive_codecs() const {
  for (const auto& b : pipeline_->boundaries())
    if (b->forward_codec()->level() || b->backward_codec()->level()) return true;
  return false;
}

namespace {

// Bytes sent so far this epoch by each boundary, forward and backward.
std::vector<std::pair<int64_t, int64_t>> bytes_sent(const Pipeline& p) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& b : p.boundaries()) {
    const BoundaryStats s = b->stats();
    out.emplace_back(s.forward.bytes, s.backward.bytes);
  }
  return out;
}

// levels.csv rows of a step: every codec with a level, and what its direction sent since `before`.
std::vector<LevelRow> level_rows(const Pipeline& p, const std::vector<std::pair<int64_t, int64_t>>& before,
                                 int64_t step, int64_t epoch) {
  const auto after = bytes_sent(p);
  std::vector<LevelRow> rows;
  for (size_t i = 0; i < p.boundaries().size(); ++i) {
    const BoundaryPtr& b = p.boundary(i);
    for (bool forward : {true, false}) {
      const auto level = (forward ? b->forward_codec() : b->backward_codec())->level();
      if (!level) continue;
      LevelRow r;
      r.step = step, r.epoch = epoch + 1, r.boundary = static_cast<int64_t>(i + 1);
      r.direction = forward ? "forward" : "backward";
      r.level = level->value, r.label = level->label;
      r.bytes = forward ? after[i].first - before[i].first : after[i].second - before[i].second;
      rows.push_back(r);
    }
  }
  return rows;
}

}  // namespace

EpochMetrics Experiment::train_epoch(int64_t epoch, const std::function<void(const StepLog&)>& on_step) {
  pipeline_->train();
  pipeline_->reset_stats();
  EpochMetrics m;
  m.epoch = epoch + 1;
  Tally total;
  auto window_start = std::chrono::steady_clock::now();
  double window_units = 0;
  task_->start_epoch(epoch);
  const int64_t total_steps = config_.train.epochs * steps_per_epoch();  // the run's, for the codecs' progress
  const bool levels = has_adaptive_codecs();
  std::vector<LevelRow> level_rows_here;  // what this process's codecs sent (Note [levels of a multi-process run])
  epoch_levels_.clear();
  while (auto batch = task_->next_train_batch()) {
    optimizer_->zero_grad();
    const auto sent_before = levels ? bytes_sent(*pipeline_) : std::vector<std::pair<int64_t, int64_t>>();
    StepTiming timing;
    const int64_t global = scheduler_->step_count() + 1;
    const StepPosition at = StepPosition::of(epoch, global, total_steps);
    // The result is the last stage's, on every rank.
    const StepResult r = executor_->train_step(batch->to(device_), config_.train.micro_batches, at, &timing);
    TORCH_CHECK(std::isfinite(r.loss), "training diverged at epoch ", epoch + 1, " step ", batch->index + 1,
                ": loss is ", r.loss, "; lower train.lr or use a milder compressor");
    if (config_.train.grad_clip > 0) executor_->clip_grad_norm(config_.train.grad_clip, global);
    optimizer_->step();
    pipeline_->after_optimizer_step();  // every codec's hook (subspace projection, lazy EF carry)
    scheduler_->step();
    m.train_time_s += timing.step_s;
    m.rank_compute_s.resize(timing.compute_s.size()), m.rank_comm_s.resize(timing.comm_s.size());
    for (size_t s = 0; s < timing.compute_s.size(); ++s) {  // averaged over the pipeline ranks run here
      m.compute_s += timing.compute_s[s] / static_cast<double>(timing.compute_s.size());
      m.comm_s += timing.comm_s[s] / static_cast<double>(timing.comm_s.size());
      m.rank_compute_s[s] += timing.compute_s[s], m.rank_comm_s[s] += timing.comm_s[s];
    }
    const Tally step{r.loss * r.units, r.units, r.correct};
    total.loss_sum += step.loss_sum, total.units += step.units, total.correct += step.correct;
    window_units += r.units;
    ++m.steps;
    if (levels) {
      std::vector<LevelRow> rows = level_rows(*pipeline_, sent_before, scheduler_->step_count(), epoch);
      level_rows_here.insert(level_rows_here.end(), rows.begin(), rows.end());
    }
    if (on_step) {
      StepLog log;
      log.step = scheduler_->step_count();
      log.epoch = epoch;
      log.step_in_epoch = batch->index + 1;
      log.steps_in_epoch = task_->train_batches();
      log.loss = r.loss;
      log.metric = task_->metric_value(step);
      log.lr = optimizer_->lr(0);
      double dt = seconds_since(window_start);
      log.units_per_s = dt > 0 ? window_units / dt : 0.0;
      if (dt > 2.0) window_start = std::chrono::steady_clock::now(), window_units = 0;
      on_step(log);
    }
  }
  TORCH_CHECK(total.units > 0, "epoch ", epoch + 1, ": the task produced no training batch");
  if (levels) epoch_levels_ = executor_->gather_levels(std::move(level_rows_here), epoch);
  // Rank 0 gets every rank's part: bytes are counted by each direction's sender. Pipeline time is
  // the slowest rank's; compute and comm are averaged over the ranks (stages), as in process.
  const EpochTotals totals = executor_->finish_epoch(
      RankEpoch{m.train_time_s, m.compute_s, m.comm_s, optimizer_state_bytes(*optimizer_)}, epoch);
  if (!totals.train_time_s.empty()) {
    const double n = static_cast<double>(totals.train_time_s.size());
    m.train_time_s = *std::max_element(totals.train_time_s.begin(), totals.train_time_s.end());
    m.compute_s = m.comm_s = 0;
    m.rank_compute_s = totals.compute_s, m.rank_comm_s = totals.comm_s;
    for (size_t i = 0; i < totals.compute_s.size(); ++i)
      m.compute_s += totals.compute_s[i] / n, m.comm_s += totals.comm_s[i] / n;
    peak_rss_bytes_ = totals.peak_rss_bytes;
    parameter_bytes_ = totals.parameter_bytes;
    optimizer_bytes_ = totals.optimizer_bytes;
  }
  const std::vector<BoundaryStats>& per_boundary = totals.boundaries;  // empty on ranks > 0
  m.bytes_dp = totals.data_parallel.bytes;
  m.bytes_dp_uncompressed = totals.data_parallel.raw_bytes;
  m.bytes_tp = totals.tensor_parallel.bytes;
  m.bytes_tp_uncompressed = totals.tensor_parallel.raw_bytes;
  const BoundaryStats stats = sum_boundary_stats(per_boundary);
  m.bubble = m.train_time_s > 0 ? std::max(0.0, 1.0 - m.compute_s / m.train_time_s) : 0.0;
  m.train_loss = total.loss();
  m.train_metric = task_->metric_value(total);
  m.bytes_forward = stats.forward.bytes;
  m.bytes_backward = stats.backward.bytes;
  m.bytes_uncompressed = stats.forward.raw_bytes + stats.backward.raw_bytes;
  if (stats.forward.measured > 0)
    m.forward_rel_error = stats.forward.rel_error_mean, m.forward_density = stats.forward.density_mean;
  if (stats.backward.measured > 0)
    m.backward_rel_error = stats.backward.rel_error_mean, m.backward_density = stats.backward.density_mean;
  for (size_t i = 0; i < per_boundary.size(); ++i) {
    const BoundaryStats& b = per_boundary[i];
    BoundaryMetrics bm;
    bm.index = static_cast<int64_t>(i + 1);
    bm.bytes_forward = b.forward.bytes;
    bm.bytes_backward = b.backward.bytes;
    if (b.forward.measured > 0)
      bm.forward_rel_error = b.forward.rel_error_mean, bm.forward_density = b.forward.density_mean;
    if (b.backward.measured > 0)
      bm.backward_rel_error = b.backward.rel_error_mean, bm.backward_density = b.backward.density_mean;
    m.boundaries.push_back(bm);
  }
  m.lr = optimizer_->lr(0);
  return m;
}

}  // namespace tl
