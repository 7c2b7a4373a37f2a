#pragma once
// Linear: y = x W^T + b.

#include "layers/module.h"
#include "layers/nn/init.h"

namespace tl {

class Linear : public Module {
 public:
  /// weight (out, in) and bias (out) with PyTorch's default initialisation.
  Linear(int64_t in_features, int64_t out_features, bool bias = true, const init::Generator& gen = std::nullopt);
  /// x (..., in) -> (..., out)
  Variable forward(const Variable& x) override;

  const Variable& weight() const { return weight_; }
  /// Undefined when built without bias.
  const Variable& bias() const { return bias_; }
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }

 protected:
  /// For the tensor-parallel layers (layers/nn/tensor_parallel.h): another type name.
  Linear(const char* type_name, int64_t in_features, int64_t out_features, bool bias, const init::Generator& gen);
  /// Error naming the layer unless x is (..., in_features).
  void check_input(const Variable& x) const;

  int64_t in_features_, out_features_;
  Variable weight_;  // (out, in)
  Variable bias_;    // (out)
};

}  // namespace tl
