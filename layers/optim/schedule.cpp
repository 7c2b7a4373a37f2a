#include "layers/optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace tl {
namespace {

constexpr double kPi = 3.14159265358979323846;

class Constant : public Schedule {
 public:
  double lr(int64_t, double b) const override { return b; }
  std::string describe() const override { return "constant"; }
};

class StepDecay : public Schedule {
 public:
  StepDecay(int64_t step_size, double gamma) : step_size_(step_size), gamma_(gamma) {}
  double lr(int64_t t, double b) const override {
    return b * std::pow(gamma_, static_cast<double>(std::max<int64_t>(t, 0) / step_size_));
  }
  std::string describe() const override {
    std::ostringstream os;
    os << "step(step_size=" << step_size_ << ", gamma=" << gamma_ << ")";
    return os.str();
  }

 private:
  int64_t step_size_;
  double gamma_;
};

// Half a cosine from 1 at p = 0 to 0 at p = 1.
double cosine_factor(double p) { return 0.5 * (1.0 + std::cos(kPi * std::clamp(p, 0.0, 1.0))); }

class Cosine : public Schedule {
 public:
  Cosine(int64_t total, double min_lr) : total_(total), min_lr_(min_lr) {}
  double lr(int64_t t, double b) const override {
    return min_lr_ + (b - min_lr_) * cosine_factor(static_cast<double>(t) / static_cast<double>(total_));
  }
  std::string describe() const override {
    std::ostringstream os;
    os << "cosine(total_steps=" << total_ << ", min_lr=" << min_lr_ << ")";
    return os.str();
  }

 private:
  int64_t total_;
  double min_lr_;
};

class Warmup : public Schedule {
 public:
  Warmup(int64_t warmup, int64_t total, double min_lr, bool cosine)
      : warmup_(warmup), total_(total), min_lr_(min_lr), cosine_(cosine) {}
  double lr(int64_t t, double b) const override {
    if (t < warmup_) return b * static_cast<double>(std::max<int64_t>(t, 0)) / static_cast<double>(warmup_);
    const double p = static_cast<double>(t - warmup_) / static_cast<double>(total_ - warmup_);
    const double f = cosine_ ? cosine_factor(p) : std::max(0.0, 1.0 - p);
    return min_lr_ + (b - min_lr_) * f;
  }
  std::string describe() const override {
    std::ostringstream os;
    os << (cosine_ ? "warmup_cosine" : "warmup_linear") << "(warmup_steps=" << warmup_ << ", total_steps=" << total_
       << ", min_lr=" << min_lr_ << ")";
    return os.str();
  }

 private:
  int64_t warmup_, total_;
  double min_lr_;
  bool cosine_;
};

void check_min_lr(const char* kind, double min_lr) {
  TORCH_CHECK(std::isfinite(min_lr) && min_lr >= 0.0, kind, " schedule: min_lr must be finite and >= 0, got ", min_lr);
}

}  // namespace

std::shared_ptr<const Schedule> constant_schedule() { return std::make_shared<Constant>(); }

std::shared_ptr<const Schedule> step_schedule(int64_t step_size, double gamma) {
  TORCH_CHECK(step_size > 0, "step schedule: step_size must be > 0, got ", step_size);
  TORCH_CHECK(std::isfinite(gamma) && gamma >= 0.0, "step schedule: gamma must be finite and >= 0, got ", gamma);
  return std::make_shared<StepDecay>(step_size, gamma);
}

std::shared_ptr<const Schedule> cosine_schedule(int64_t total_steps, double min_lr) {
  TORCH_CHECK(total_steps > 0, "cosine schedule: total_steps must be > 0, got ", total_steps);
  check_min_lr("cosine", min_lr);
  return std::make_shared<Cosine>(total_steps, min_lr);
}

std::shared_ptr<const Schedule> warmup_linear_schedule(int64_t warmup_steps, int64_t total_steps, double min_lr) {
  TORCH_CHECK(warmup_steps >= 0 && total_steps > warmup_steps,
              "warmup_linear schedule: need 0 <= warmup_steps < total_steps, got warmup_steps ", warmup_steps,
              ", total_steps ", total_steps);
  check_min_lr("warmup_linear", min_lr);
  return std::make_shared<Warmup>(warmup_steps, total_steps, min_lr, false);
}

std::shared_ptr<const Schedule> warmup_cosine_schedule(int64_t warmup_steps, int64_t total_steps, double min_lr) {
  TORCH_CHECK(warmup_steps >= 0 && total_steps > warmup_steps,
              "warmup_cosine schedule: need 0 <= warmup_steps < total_steps, got warmup_steps ", warmup_steps,
              ", total_steps ", total_steps);
  check_min_lr("warmup_cosine", min_lr);
  return std::make_shared<Warmup>(warmup_steps, total_steps, min_lr, true);
}

std::shared_ptr<const Schedule> make_schedule(const ScheduleConfig& c) {
  if (c.kind == "constant") return constant_schedule();
  if (c.kind == "step") return step_schedule(c.step_size, c.gamma);
  if (c.kind == "cosine") return cosine_schedule(c.total_steps, c.min_lr);
  if (c.kind == "warmup_linear") return warmup_linear_schedule(c.warmup_steps, c.total_steps, c.min_lr);
  if (c.kind == "warmup_cosine") return warmup_cosine_schedule(c.warmup_steps, c.total_steps, c.min_lr);
  TORCH_CHECK(false, "unknown lr schedule '", c.kind,
              "'; known: constant, step (step_size, gamma), cosine (total_steps, min_lr), "
              "warmup_linear and warmup_cosine (warmup_steps, total_steps, min_lr)");
}

LRScheduler::LRScheduler(Optimizer& optimizer, std::shared_ptr<const Schedule> schedule)
    : optimizer_(optimizer), schedule_(std::move(schedule)) {
  TORCH_CHECK(schedule_, "LRScheduler: schedule is null");
  for (size_t g = 0; g < optimizer_.num_groups(); ++g) base_lrs_.push_back(optimizer_.lr(g));
  apply();
}

void LRScheduler::apply() {
  for (size_t g = 0; g < base_lrs_.size(); ++g) optimizer_.set_lr(g, schedule_->lr(step_, base_lrs_[g]));
}

void LRScheduler::step() {
  ++step_;
  apply();
}

double LRScheduler::lr(size_t g) const { return optimizer_.lr(g); }

TensorMap LRScheduler::state_dict() const {
  TensorMap out;
  out["step"] = at::scalar_tensor(step_, at::TensorOptions().dtype(at::kLong));
  out["base_lrs"] = at::tensor(base_lrs_, at::TensorOptions().dtype(at::kDouble));
  return out;
}

void LRScheduler::check_state_dict(const TensorMap& state) const {
  std::vector<std::string> problems;
  for (const auto& [k, _] : state)
    if (k != "step" && k != "base_lrs") problems.push_back("unexpected entry '" + k + "'");
  auto step = state.find("step");
  if (step == state.end()) {
    problems.push_back("missing 'step'");
  } else if (step->second.numel() != 1 || at::isFloatingType(step->second.scalar_type()) ||
             step->second.item<int64_t>() < 0) {
    problems.push_back("'step' must be one non-negative integer");
  }
  auto base = state.find("base_lrs");
  if (base == state.end()) {
    problems.push_back("missing 'base_lrs'");
  } else if (base->second.dim() != 1 || base->second.numel() != static_cast<int64_t>(base_lrs_.size()) ||
             !at::isFloatingType(base->second.scalar_type())) {
    problems.push_back("'base_lrs' must be a floating-point vector of " + std::to_string(base_lrs_.size()) +
                       " entries (one per optimizer group), got " + c10::toString(base->second.scalar_type()) + " " +
                       c10::str(base->second.sizes()));
  } else {
    at::Tensor b = base->second.to(at::kCPU, at::kDouble);
    if (!(b.isfinite().all().item<bool>() && b.ge(0).all().item<bool>()))
      problems.push_back("'base_lrs' must be finite and >= 0, got " + c10::str(b));
  }
  if (problems.empty()) return;
  std::string msg;
  for (const auto& p : problems) msg += "\n  " + p;
  TORCH_CHECK(false, "LRScheduler: state dict does not fit (", schedule_->describe(), ", ", base_lrs_.size(),
              " groups):", msg);
}

void LRScheduler::load_state_dict(const TensorMap& state) {
  check_state_dict(state);
  at::Tensor base = state.at("base_lrs").to(at::kCPU, at::kDouble).contiguous();
  std::vector<double> lrs(base.data_ptr<double>(), base.data_ptr<double>() + base.numel());
  base_lrs_ = std::move(lrs);
  step_ = state.at("step").item<int64_t>();
  apply();
}

}  // namespace tl
