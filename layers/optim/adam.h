#pragma once
// Adam and AdamW, exactly as torch.optim (and torch::optim) compute them. At step t:
//   g = grad (+ weight_decay * p for Adam: L2 decay folded into the gradient)
//   p *= 1 - lr * weight_decay            (AdamW only: decoupled decay, before the update)
//   m = beta1 m + (1 - beta1) g
//   v = beta2 v + (1 - beta2) g^2          (amsgrad: vmax = max(vmax, v), used below for v)
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// Note eps is added after the bias correction of sqrt(v), as torch does. State per parameter:
// step (int64 scalar), exp_avg, exp_avg_sq, max_exp_avg_sq (amsgrad only).

#include "layers/optim/optimizer.h"

namespace tl {

class Adam : public Optimizer {
 public:
  /// Uses defaults.lr, weight_decay, beta1, beta2, eps, amsgrad.
  Adam(std::vector<ParamGroup> groups, const GroupOptions& defaults) : Adam(std::move(groups), defaults, false) {}
  Adam(std::vector<Variable> params, const GroupOptions& defaults) : Adam(one_group(std::move(params)), defaults) {}
  std::string name() const override { return decoupled_ ? "AdamW" : "Adam"; }

 protected:
  Adam(std::vector<ParamGroup> groups, const GroupOptions& defaults, bool decoupled_weight_decay);
  void update(Variable& param, const at::Tensor& grad, const GroupOptions& opt, SlotMap& slots) override;
  std::vector<std::string> slot_names(const GroupOptions& opt) const override;
  std::vector<std::string> option_names() const override { return {"beta1", "beta2", "eps", "amsgrad"}; }
  void validate(const GroupOptions& opt, const std::string& where) const override;
  static std::vector<ParamGroup> one_group(std::vector<Variable> params) {
    ParamGroup g;
    g.params = std::move(params);
    return {g};
  }

 private:
  bool decoupled_;
};

/// Adam with decoupled weight decay (Loshchilov & Hutter). Note torch's AdamW default
/// weight_decay is 1e-2; GroupOptions' default is 0, so set it explicitly.
class AdamW : public Adam {
 public:
  AdamW(std::vector<ParamGroup> groups, const GroupOptions& defaults) : Adam(std::move(groups), defaults, true) {}
  AdamW(std::vector<Variable> params, const GroupOptions& defaults) : AdamW(one_group(std::move(params)), defaults) {}
};

}  // namespace tl
