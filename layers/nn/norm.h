#pragma once
// Normalisation layers: BatchNorm2d (batch statistics in training, running statistics in eval)
// and LayerNorm (over the trailing dims).

#include "layers/module.h"

namespace tl {

/// Note [micro-batches and BatchNorm]: in training the statistics are those of the batch that
/// goes through forward. Under pipeline parallelism that is the micro-batch, so the result (and
/// the running statistics, updated once per micro-batch) depend on the micro-batch size, as in
/// torch.nn.BatchNorm2d. The running-statistics update is in place and not saved for backward.
class BatchNorm2d : public Module {
 public:
  /// weight ones, bias zeros (affine); buffers running_mean zeros, running_var ones,
  /// num_batches_tracked 0 (int64) when tracking running statistics.
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1, bool affine = true,
                       bool track_running_stats = true);
  /// x (N, C, H, W) -> same shape.
  Variable forward(const Variable& x) override;

  const Variable& weight() const { return weight_; }
  const Variable& bias() const { return bias_; }
  const Variable& running_mean() const { return running_mean_; }
  const Variable& running_var() const { return running_var_; }
  const Variable& num_batches_tracked() const { return num_batches_tracked_; }
  /// Weight of each batch's statistics in the running ones: r = (1 - momentum) r + momentum s.
  double momentum() const { return momentum_; }

 private:
  int64_t num_features_;
  double eps_, momentum_;
  bool track_running_stats_;
  Variable weight_, bias_;                                     // (C)
  Variable running_mean_, running_var_, num_batches_tracked_;  // (C), (C), ()
};

class LayerNorm : public Module {
 public:
  /// Normalises over the trailing dims `normalized_shape`; weight ones, bias zeros.
  explicit LayerNorm(std::vector<int64_t> normalized_shape, double eps = 1e-5, bool elementwise_affine = true);
  explicit LayerNorm(int64_t size, double eps = 1e-5, bool elementwise_affine = true)
      : LayerNorm(std::vector<int64_t>{size}, eps, elementwise_affine) {}
  /// x (..., *normalized_shape) -> same shape.
  Variable forward(const Variable& x) override;

  const Variable& weight() const { return weight_; }
  const Variable& bias() const { return bias_; }
  double eps() const { return eps_; }

 private:
  std::vector<int64_t> normalized_shape_;
  double eps_;
  Variable weight_, bias_;
};

}  // namespace tl
