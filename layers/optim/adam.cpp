#include "layers/optim/adam.h"

#include <cmath>

namespace tl {

Adam::Adam(std::vector<ParamGroup> groups, const GroupOptions& defaults, bool decoupled_weight_decay)
    : Optimizer(std::move(groups), defaults), decoupled_(decoupled_weight_decay) {
  validate_all();
}

void Adam::validate(const GroupOptions& o, const std::string& where) const {
  TORCH_CHECK(o.beta1 >= 0.0 && o.beta1 < 1.0, where, ": beta1 must be in [0, 1), got ", o.beta1);
  TORCH_CHECK(o.beta2 >= 0.0 && o.beta2 < 1.0, where, ": beta2 must be in [0, 1), got ", o.beta2);
  TORCH_CHECK(std::isfinite(o.eps) && o.eps >= 0.0, where, ": eps must be finite and >= 0, got ", o.eps);
}

std::vector<std::string> Adam::slot_names(const GroupOptions& o) const {
  if (o.amsgrad) return {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  return {"step", "exp_avg", "exp_avg_sq"};
}

void Adam::update(Variable& param, const at::Tensor& grad_in, const GroupOptions& o, SlotMap& slots) {
  at::Tensor& p = param.mutable_data();
  if (slots.empty()) {
    slots["step"] = at::zeros({}, at::TensorOptions().dtype(at::kLong));  // host-side counter
    slots["exp_avg"] = at::zeros_like(p, at::MemoryFormat::Preserve);
    slots["exp_avg_sq"] = at::zeros_like(p, at::MemoryFormat::Preserve);
    if (o.amsgrad) slots["max_exp_avg_sq"] = at::zeros_like(p, at::MemoryFormat::Preserve);
  } else if (o.amsgrad && !slots.count("max_exp_avg_sq")) {
    // amsgrad switched on mid-run (e.g. by load_state_dict): start the running max at v.
    slots["max_exp_avg_sq"] = slots.at("exp_avg_sq").clone();
  }
  at::Tensor& step_t = slots.at("step");
  if (step_t.device().is_cpu()) {
    step_t.add_(1);
  } else {
    step_t = step_t.cpu().add_(1);
  }
  const double step = static_cast<double>(step_t.item<int64_t>());

  at::Tensor grad = grad_in;
  if (o.weight_decay != 0.0) {
    if (decoupled_) {
      p.mul_(1.0 - o.lr * o.weight_decay);
    } else {
      grad = grad.add(p, o.weight_decay);
    }
  }
  at::Tensor& exp_avg = slots.at("exp_avg");        // m, same shape as p
  at::Tensor& exp_avg_sq = slots.at("exp_avg_sq");  // v, same shape as p
  const double bias_correction1 = 1.0 - std::pow(o.beta1, step);
  const double bias_correction2 = 1.0 - std::pow(o.beta2, step);
  exp_avg.mul_(o.beta1).add_(grad, 1.0 - o.beta1);
  exp_avg_sq.mul_(o.beta2).addcmul_(grad, grad, 1.0 - o.beta2);
  at::Tensor denom;
  if (o.amsgrad) {
    at::Tensor& max_sq = slots.at("max_exp_avg_sq");
    at::maximum_out(max_sq, max_sq, exp_avg_sq);
    denom = max_sq.sqrt().div_(std::sqrt(bias_correction2)).add_(o.eps);
  } else {
    denom = exp_avg_sq.sqrt().div_(std::sqrt(bias_correction2)).add_(o.eps);
  }
  p.addcdiv_(exp_avg, denom, -o.lr / bias_correction1);
}

}  // namespace tl
