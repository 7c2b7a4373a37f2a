#pragma once
// Learning-rate schedules and the scheduler that applies one to an optimizer.
//
// A Schedule is a pure function lr(step, base_lr) of the number of optimizer steps already taken
// (0 before the first step), so the scheduler's whole state is its step count (plus the base lrs
// it captured); resuming from a checkpoint reproduces the exact lr sequence.
//
// Formulas (t = step, b = base lr of the group, m = min_lr, T = total_steps, W = warmup_steps):
//   constant:        b
//   step:            b * gamma^floor(t / step_size)                    (torch StepLR)
//   cosine:          m + (b - m) * (1 + cos(pi * min(t, T) / T)) / 2   (torch CosineAnnealingLR
//                                                                       closed form, held at m after T)
//   warmup_linear:   t < W: b * t / W, then m + (b - m) * max(0, (T - t) / (T - W))
//   warmup_cosine:   t < W: b * t / W, then m + (b - m) * (1 + cos(pi * p)) / 2, p = min(1, (t - W) / (T - W))
// The warm-up starts at 0 at step 0, as in Hugging Face's get_{linear,cosine}_schedule_with_warmup
// (which these equal when m = 0).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "layers/module.h"
#include "layers/optim/optimizer.h"

namespace tl {

class Schedule {
 public:
  virtual ~Schedule() = default;
  /// Learning rate after `step` optimizer steps for a group whose base lr is `base_lr`.
  virtual double lr(int64_t step, double base_lr) const = 0;
  /// One line naming the schedule and its parameters (stored in checkpoint metadata).
  virtual std::string describe() const = 0;
};

/// Kinds a ScheduleConfig names: constant, step, cosine, warmup_linear, warmup_cosine.
struct ScheduleConfig {
  std::string kind = "constant";
  int64_t total_steps = 0;   // cosine, warmup_*
  int64_t warmup_steps = 0;  // warmup_*
  int64_t step_size = 0;     // step
  double gamma = 0.1;        // step
  double min_lr = 0.0;       // cosine, warmup_*
};

/// Builds the schedule a config names; the error lists the known kinds and the fields each needs.
std::shared_ptr<const Schedule> make_schedule(const ScheduleConfig& config);

std::shared_ptr<const Schedule> constant_schedule();
std::shared_ptr<const Schedule> step_schedule(int64_t step_size, double gamma);
std::shared_ptr<const Schedule> cosine_schedule(int64_t total_steps, double min_lr = 0.0);
std::shared_ptr<const Schedule> warmup_linear_schedule(int64_t warmup_steps, int64_t total_steps, double min_lr = 0.0);
std::shared_ptr<const Schedule> warmup_cosine_schedule(int64_t warmup_steps, int64_t total_steps, double min_lr = 0.0);

/// Applies a schedule to every group of an optimizer. Construction captures each group's current
/// lr as its base lr and sets the lr for step 0; call step() once after every optimizer.step().
///   LRScheduler sched(opt, warmup_cosine_schedule(100, 10000));
///   for (...) { loss.backward(); opt.step(); opt.zero_grad(); sched.step(); }
class LRScheduler {
 public:
  LRScheduler(Optimizer& optimizer, std::shared_ptr<const Schedule> schedule);

  /// Advances one step and sets every group's lr.
  void step();
  int64_t step_count() const { return step_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  /// Current lr of group g (what the optimizer will use next).
  double lr(size_t g = 0) const;
  const Schedule& schedule() const { return *schedule_; }

  /// {"step": int64 scalar, "base_lrs": float64 (num_groups,)}.
  TensorMap state_dict() const;
  /// Throws (changing nothing) unless `state` has exactly those entries for this many groups.
  void check_state_dict(const TensorMap& state) const;
  /// Restores step and base lrs and sets the optimizer's lrs accordingly.
  void load_state_dict(const TensorMap& state);

 private:
  void apply();
  Optimizer& optimizer_;
  std::shared_ptr<const Schedule> schedule_;
  std::vector<double> base_lrs_;
  int64_t step_ = 0;
};

}  // namespace tl
