#include "layers/optim/grad_utils.h"

#include <cmath>
#include <limits>

namespace tl {
namespace {

std::vector<at::Tensor> defined_grads(const std::vector<Variable>& params) {
  std::vector<at::Tensor> grads;
  for (const auto& p : params) {
    at::Tensor g = p.grad();
    if (g.defined()) grads.push_back(g);
  }
  return grads;
}

// Global norm as a 0-d tensor on the first gradient's device (no sync).
at::Tensor total_norm(const std::vector<at::Tensor>& grads, double norm_type) {
  const at::Device dev = grads.front().device();
  std::vector<at::Tensor> norms;
  norms.reserve(grads.size());
  if (std::isinf(norm_type) && norm_type > 0) {
    for (const auto& g : grads) norms.push_back(g.abs().max().to(dev));
    return norms.size() == 1 ? norms[0] : at::stack(norms).max();
  }
  for (const auto& g : grads) norms.push_back(g.norm(norm_type).to(dev));
  return norms.size() == 1 ? norms[0] : at::stack(norms).norm(norm_type);
}

}  // namespace

double grad_norm(const std::vector<Variable>& params, double norm_type) {
  TORCH_CHECK(norm_type > 0.0, "grad_norm: norm_type must be > 0 (inf for max-abs), got ", norm_type);
  NoGradGuard no_grad;
  auto grads = defined_grads(params);
  if (grads.empty()) return 0.0;
  return total_norm(grads, norm_type).item<double>();
}

double clip_grad_norm(const std::vector<Variable>& params, double max_norm, double norm_type, bool error_if_nonfinite) {
  TORCH_CHECK(norm_type > 0.0, "clip_grad_norm: norm_type must be > 0 (inf for max-abs), got ", norm_type);
  TORCH_CHECK(max_norm >= 0.0, "clip_grad_norm: max_norm must be >= 0, got ", max_norm);
  NoGradGuard no_grad;
  auto grads = defined_grads(params);
  if (grads.empty()) return 0.0;
  at::Tensor norm = total_norm(grads, norm_type);  // 0-d
  if (error_if_nonfinite) {
    const double n = norm.item<double>();
    TORCH_CHECK(std::isfinite(n), "clip_grad_norm: the total gradient norm (order ", norm_type, ") is ", n,
                ", so the gradients cannot be clipped; pass error_if_nonfinite=false to scale them anyway");
  }
  // Kept on the device: coef = min(1, max_norm / (norm + 1e-6)).
  at::Tensor coef = at::clamp_max(max_norm / (norm + 1e-6), 1.0);
  for (auto& g : grads) g.mul_(coef.to(g.device()));
  return norm.item<double>();
}

void scale_grads(const std::vector<Variable>& params, double factor) {
  NoGradGuard no_grad;
  for (auto& g : defined_grads(params)) g.mul_(factor);
}

void GradAccumulator::backward(const Variable& loss, double weight) {
  TORCH_CHECK(loss.defined() && loss.numel() == 1, "GradAccumulator::backward: the loss must be a scalar, got shape ",
              loss.defined() ? c10::str(loss.sizes()) : std::string("undefined"));
  TORCH_CHECK(std::isfinite(weight) && weight > 0.0, "GradAccumulator::backward: weight must be finite and > 0, got ",
              weight);
  loss.backward(at::full_like(loss.data(), weight));
  add_weight(weight);
}

void GradAccumulator::add_weight(double weight) {
  TORCH_CHECK(std::isfinite(weight) && weight > 0.0, "GradAccumulator: weight must be finite and > 0, got ", weight);
  total_weight_ += weight;
  ++micro_batches_;
}

double GradAccumulator::finish() {
  TORCH_CHECK(micro_batches_ > 0, "GradAccumulator::finish: no micro-batch was accumulated since the last finish()");
  const double total = total_weight_;
  scale_grads(params_, 1.0 / total);
  total_weight_ = 0.0;
  micro_batches_ = 0;
  return total;
}

}  // namespace tl
