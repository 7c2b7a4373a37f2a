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

namespace {

// g *= T(factor) in place, for a contiguous CPU gradient of dtype T; false for any other.
template <class T>
bool scale_in_place(at::Tensor& g, double factor) {
  if (g.scalar_type() != c10::CppTypeToScalarType<T>::value || !g.is_contiguous() || !g.device().is_cpu()) return false;
  T* v = g.data_ptr<T>();
  const T f = static_cast<T>(factor);
  for (int64_t i = 0, n = g.numel(); i < n; ++i) v[i] *= f;
  return true;
}

}  // namespace

// Note [scaling without a kernel]. A small model's step scales a dozen gradients of a few
// thousand values; each mul_ is a dispatch and a kernel launch on the CPU (about 1.7 us, 27 us of
// the 46 us a 1-layer GPT-2 step spends outside its forward and backward: bench_pipeline
// --overhead). Contiguous float32 and float64 CPU gradients up to kLoopMax values are scaled by
// a plain loop instead: each value times the factor rounded once to the dtype, which is what
// mul_(double) computes on them, bit for bit (the data-parallel sums rely on the same identity:
// Note [scaled into the bucket] in parallel/ranks/data_parallel.cpp). Larger ones keep mul_, whose
// threads pay off there.
void scale_grads(const std::vector<Variable>& params, double factor) {
  constexpr int64_t kLoopMax = int64_t(1) << 18;
  NoGradGuard no_grad;
  for (auto& g : defined_grads(params)) {
    if (g.numel() <= kLoopMax && (scale_in_place<float>(g, factor) || scale_in_place<double>(g, factor))) continue;
    g.mul_(factor);
  }
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
