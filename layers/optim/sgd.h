#pragma once
// SGD with momentum, dampening, Nesterov and (L2) weight decay: exactly torch.optim.SGD.
//   g = grad + weight_decay * p
//   buf = g                                  (first step)
//   buf = momentum * buf + (1 - dampening) g (later steps)
//   g = nesterov ? g + momentum * buf : buf  (when momentum != 0)
//   p -= lr * g

#include "layers/optim/optimizer.h"

namespace tl {

class SGD : public Optimizer {
 public:
  /// Uses defaults.lr, weight_decay, momentum, dampening, nesterov.
  SGD(std::vector<ParamGroup> groups, const GroupOptions& defaults);
  SGD(std::vector<Variable> params, const GroupOptions& defaults) : SGD(one_group(std::move(params)), defaults) {}
  std::string name() const override { return "SGD"; }

 protected:
  void update(Variable& param, const at::Tensor& grad, const GroupOptions& opt, SlotMap& slots) override;
  std::vector<std::string> slot_names(const GroupOptions& opt) const override;
  std::vector<std::string> option_names() const override { return {"momentum", "dampening", "nesterov"}; }
  void validate(const GroupOptions& opt, const std::string& where) const override;

 private:
  static std::vector<ParamGroup> one_group(std::vector<Variable> params) {
    ParamGroup g;
    g.params = std::move(params);
    return {g};
  }
};

}  // namespace tl
