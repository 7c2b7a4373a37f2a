#pragma once
// Helpers shared by the op families (internal to autograd/ops).

#include <ATen/ATen.h>

#include <vector>

#include "autograd/function.h"
#include "autograd/ops.h"

namespace tl::ops {

/// Sum a broadcast gradient back to `shape` (the inverse of broadcasting).
/// The transpose of the last two dims (a view).
inline at::Tensor mT(const at::Tensor& a) { return a.transpose(-2, -1); }

inline at::Tensor sum_to_shape(const at::Tensor& grad, at::IntArrayRef shape) {
  if (grad.sizes().equals(shape)) return grad;
  const int64_t lead = grad.dim() - static_cast<int64_t>(shape.size());
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < lead; ++i) dims.push_back(i);
  for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i) {
    if (shape[i] == 1 && grad.size(lead + i) != 1) dims.push_back(lead + i);
  }
  at::Tensor r = dims.empty() ? grad : grad.sum(dims, /*keepdim=*/true);
  if (lead > 0) r = r.reshape(shape);
  return r.sizes().equals(shape) ? r : r.reshape(shape);
}

/// A short list of ints kept inline (dims, strides, paddings) for typed saved state.
using IntList = c10::SmallVector<int64_t, 6>;
inline IntList int_list(at::IntArrayRef v) { return IntList(v.begin(), v.end()); }

}  // namespace tl::ops
