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

  /// Keeps rank `rank` of `size`'s part of the weight along `shard.dim` (0: output features,
  /// column-parallel, the bias split alike; 1: input features, row-parallel, the bias kept whole
  /// for the caller to add after the all-reduce). Marks what it split (Module::mark_sharded).
  void shard(TensorShard shard, int64_t rank, int64_t size);

  const Variable& weight() const { return weight_; }
  /// Undefined when built without bias.
  const Variable& bias() const { return bias_; }
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }

 private:
  int64_t in_features_, out_features_;
  Variable weight_;  // (out, in)
  Variable bias_;    // (out)
};

}  // namespace tl
