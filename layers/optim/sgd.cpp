#include "layers/optim/sgd.h"

#include <cmath>

namespace tl {

SGD::SGD(std::vector<ParamGroup> groups, const GroupOptions& defaults) : Optimizer(std::move(groups), defaults) {
  validate_all();
}

void SGD::validate(const GroupOptions& o, const std::string& where) const {
  TORCH_CHECK(std::isfinite(o.momentum) && o.momentum >= 0.0, where, ": momentum must be finite and >= 0, got ",
              o.momentum);
  TORCH_CHECK(std::isfinite(o.dampening), where, ": dampening must be finite, got ", o.dampening);
  TORCH_CHECK(!o.nesterov || (o.momentum > 0.0 && o.dampening == 0.0), where,
              ": Nesterov momentum requires momentum > 0 and dampening = 0 (got momentum ", o.momentum, ", dampening ",
              o.dampening, ")");
}

std::vector<std::string> SGD::slot_names(const GroupOptions& o) const {
  if (o.momentum == 0.0) return {};
  return {"momentum_buffer"};
}

void SGD::update(Variable& param, const at::Tensor& grad, const GroupOptions& o, SlotMap& slots) {
  at::Tensor& p = param.mutable_data();
  at::Tensor d_p = grad;
  if (o.weight_decay != 0.0) d_p = d_p.add(p, o.weight_decay);  // new tensor: the stored grad stays as is
  if (o.momentum != 0.0) {
    auto it = slots.find("momentum_buffer");
    if (it == slots.end()) {
      it = slots.emplace("momentum_buffer", d_p.clone(at::MemoryFormat::Contiguous)).first;
    } else {
      it->second.mul_(o.momentum).add_(d_p, 1.0 - o.dampening);
    }
    const at::Tensor& buf = it->second;
    d_p = o.nesterov ? d_p.add(buf, o.momentum) : buf;
  }
  p.add_(d_p, -o.lr);
}

}  // namespace tl
