#pragma once
// Gradient utilities: clipping by global norm and accumulation over micro-batches.

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "autograd/autograd.h"

namespace tl {

/// Scales the gradients of `params` in place so that their global norm (the `norm_type`-norm of
/// all gradient entries together; inf for max-abs) is at most `max_norm`, exactly like
/// torch::nn::utils::clip_grad_norm_: coef = min(1, max_norm / (norm + 1e-6)), every gradient
/// multiplied by coef. Parameters without a gradient are skipped. Returns the norm before
/// clipping (0 when no parameter has a gradient). One device->host sync, for the return value.
/// error_if_nonfinite: throw (before scaling anything) when the norm is inf or NaN.
double clip_grad_norm(const std::vector<Variable>& params, double max_norm, double norm_type = 2.0,
                      bool error_if_nonfinite = false);

/// The global gradient norm without clipping.
double grad_norm(const std::vector<Variable>& params, double norm_type = 2.0);

/// Multiplies every defined gradient by `factor` in place.
void scale_grads(const std::vector<Variable>& params, double factor);

/// Gradient accumulation over micro-batches.
///
/// Note [accumulation weights]: each micro-batch i contributes the gradient of its own loss L_i
/// with a weight w_i; after finish() the parameters hold
///     sum_i w_i * grad(L_i) / sum_i w_i.
/// With L_i the *mean* loss over the micro-batch and w_i its number of samples n_i, that is exactly
/// the gradient of the mean loss over the whole batch, even when micro-batches differ in size
/// (the last one of an epoch). With w_i = 1 it is the plain average over micro-batches. The weight
/// is applied through the backward seed (backward(w_i) instead of backward(1)), so no extra op is
/// recorded and nothing is rescaled until finish() divides once by sum w_i. Gradients already in
/// the parameters before the first backward are treated as part of the sum: call zero_grad first.
/// BatchNorm still normalises with each micro-batch's own statistics, so a model with BatchNorm
/// does not give the full-batch gradient; that difference is inherent to micro-batching.
class GradAccumulator {
 public:
  explicit GradAccumulator(std::vector<Variable> params) : params_(std::move(params)) {}

  /// Backpropagates one micro-batch's (scalar) loss with weight `weight` (> 0), e.g. its sample count.
  void backward(const Variable& loss, double weight = 1.0);
  /// For callers that run the backward themselves (pipeline schedules): records that a backward
  /// seeded with `weight` has been accumulated.
  void add_weight(double weight);
  /// Divides the accumulated gradients by the total weight and resets the count; returns the total.
  /// Throws when nothing was accumulated.
  double finish();

  double total_weight() const { return total_weight_; }
  int64_t micro_batches() const { return micro_batches_; }

 private:
  std::vector<Variable> params_;
  double total_weight_ = 0.0;
  int64_t micro_batches_ = 0;
};

}  // namespace tl
