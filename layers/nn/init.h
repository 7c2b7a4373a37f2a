#pragma once
// Parameter initialisation, as PyTorch's torch.nn.init. Every function takes an optional
// generator; without one ATen's default generator is used (seed it with at::manual_seed).
// All fill in place under no-grad and return the tensor.
//
// Note [initialisation by name]. Models give each segment's modules a generator of their own,
// fork(gen, path), seeded from gen's seed and the module's dotted path ("layer1.0", "h.3"). A
// module's initial values then depend on the run's seed and its name only, not on which modules
// were built before it, so a rank that builds only its pipeline stages (Note [building only some
// stages] in layers/models/splittable.h) holds the numbers the whole model would.

#include <ATen/ATen.h>

#include <optional>
#include <string>

namespace tl::init {

using Generator = std::optional<at::Generator>;

/// A fresh generator for the module at `path`, seeded from gen's seed (its current_seed(), not
/// its position) and the path. Without a generator: none (ATen's default, drawn in order).
Generator fork(const Generator& gen, const std::string& path);

/// Note [building on the meta device]. The layers create their parameters and buffers with
/// options() (float32 unless told), on the CPU, or on the meta device while a MetaGuard lives on
/// this thread: a model of any size is then built with shapes only (no memory, no initialisation:
/// the fills below skip meta tensors), which is how the planner (tasks/runner/plan.h) builds one.
class MetaGuard {
 public:
  MetaGuard();
  ~MetaGuard();
  MetaGuard(const MetaGuard&) = delete;
  MetaGuard& operator=(const MetaGuard&) = delete;

 private:
  bool was_;
};
/// Whether a MetaGuard lives on this thread.
bool building_on_meta();
/// Options for a new parameter or buffer of `dtype` (none: ATen's default dtype, as at::empty
/// without options): on the CPU, or on the meta device under a MetaGuard.
at::TensorOptions options(std::optional<at::ScalarType> dtype = std::nullopt);

/// fan_in of a weight laid out (out, in, k...): in * prod(k). For a 1-D tensor, its size.
int64_t fan_in(const at::Tensor& weight);

at::Tensor uniform_(at::Tensor t, double low, double high, const Generator& gen = std::nullopt);
at::Tensor normal_(at::Tensor t, double mean, double std, const Generator& gen = std::nullopt);

/// kaiming_uniform_(t, a) with fan_in mode and leaky_relu gain sqrt(2 / (1 + a^2)):
/// U(-b, b), b = gain * sqrt(3 / fan_in). With a = sqrt(5) (the Linear/Conv default) b = 1/sqrt(fan_in).
at::Tensor kaiming_uniform_(at::Tensor t, double a, const Generator& gen = std::nullopt);

/// PyTorch's default for a Linear/Conv layer: weight kaiming_uniform(a = sqrt(5)), bias (if
/// defined) U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
void default_linear_(at::Tensor weight, at::Tensor bias, const Generator& gen = std::nullopt);

}  // namespace tl::init
