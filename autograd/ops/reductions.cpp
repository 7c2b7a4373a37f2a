// Reductions: sum, mean, max, var, norm.
//
// Dims convention: negative dims wrap; an empty dim list means "all dims" (as torch's sum(dim=[])
// does). The backward of a reduction over `dims` first restores the reduced dims as size-1 dims
// (when keepdim was false) so the gradient broadcasts against the input.
#include <algorithm>
#include <cmath>

#include "autograd/ops/common.h"

namespace tl {
namespace {
using tensor_list = std::vector<at::Tensor>;

/// Wrapped and sorted dims of a reduction over `dims` of an ndim-dimensional tensor (all dims when
/// empty). A 0-d tensor accepts dim 0 / -1 as ATen does, and reduces over nothing.
std::vector<int64_t> reduction_dims(at::IntArrayRef dims, int64_t ndim, const char* op) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t d = 0; d < ndim; ++d) out.push_back(d);
    return out;
  }
  for (int64_t d : dims) {
    TORCH_CHECK(d >= -std::max<int64_t>(ndim, 1) && d < std::max<int64_t>(ndim, 1), op, ": dim ", d,
                " is out of range for a tensor with ", ndim, " dims (accepted: [", -std::max<int64_t>(ndim, 1), ", ",
                std::max<int64_t>(ndim, 1) - 1, "])");
    if (ndim > 0) out.push_back(d < 0 ? d + ndim : d);
  }
  std::sort(out.begin(), out.end());
  return out;  // duplicates are left for ATen to reject with its own message
}

/// Gradient of a reduction's output -> the keepdim shape (reduced dims restored as size 1).
at::Tensor restore_reduced_dims(at::Tensor g, at::IntArrayRef dims, bool keepdim) {
  if (keepdim) return g;
  for (int64_t d : dims) g = g.unsqueeze(d);  // ascending, so each d indexes the final shape
  return g;
}

/// Number of elements reduced into each output element.
int64_t reduced_count(at::IntArrayRef sizes, at::IntArrayRef dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= sizes[d];
  return n;
}

/// What the backward of a reduction over dims needs: the input's shape, the (wrapped, sorted)
/// dims and keepdim.
struct ReductionSaved {
  Shape shape;
  ops::IntList dims;
  bool keepdim = false;
  void set(const at::Tensor& x, const std::vector<int64_t>& d, bool keep) {
    shape = shape_of(x.sizes());
    dims = ops::int_list(d);
    keepdim = keep;
  }
};

struct SumAllFn : Function<SumAllFn> {
  static constexpr const char* name = "sum";
  static constexpr bool kFreshOutputs = true;
  struct Saved {
    Shape shape;
  };
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& x) {
    s.shape = shape_of(x.sizes());
    return x.sum();
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) { return {g[0].expand(s.shape)}; }
};

// sum and mean over dims share the backward: broadcast the gradient back, scaled by 1/N for mean.
template <bool kMean>
struct SumMeanDimsFn : Function<SumMeanDimsFn<kMean>> {
  static constexpr const char* name = kMean ? "mean" : "sum";
  static constexpr bool kFreshOutputs = true;
  using Saved = ReductionSaved;
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& x, const std::vector<int64_t>& dims,
                            bool keepdim) {
    s.set(x, dims, keepdim);
    if (dims.empty()) return kMean ? x.mean() : x.sum();  // 0-d input: nothing to reduce
    return kMean ? x.mean(dims, keepdim) : x.sum(dims, keepdim);
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) {
    at::Tensor grad_x = restore_reduced_dims(g[0], s.dims, s.keepdim).expand(s.shape);
    if (kMean) grad_x = grad_x / static_cast<double>(reduced_count(s.shape, s.dims));
    return {grad_x};
  }
};
using SumDimsFn = SumMeanDimsFn<false>;
using MeanDimsFn = SumMeanDimsFn<true>;

// Global max. The gradient goes to the first arg max only (torch instead splits it evenly among
// ties; both agree whenever the max is unique).
struct MaxAllFn : Function<MaxAllFn> {
  static constexpr const char* name = "max";
  static constexpr bool kFreshOutputs = true;
  struct Saved {
    Shape shape;
  };
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& x) {
    TORCH_CHECK(x.numel() > 0, "max: the input is empty (shape ", x.sizes(),
                "); max over all elements needs at "
                "least one element");
    at::Tensor index = x.reshape({-1}).argmax();  // 0-d int64: first position of the max (NaN counts as max)
    ctx.save_for_backward({index});
    s.shape = shape_of(x.sizes());
    return x.max();
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) {
    const Shape& shape = s.shape;
    const at::Tensor& index = ctx.saved()[0];
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    at::Tensor grad_x = at::zeros({n}, g[0].options()).scatter(0, index.reshape({1}), g[0].reshape({1}));
    return {grad_x.reshape(shape)};
  }
};

// Max over one dim: the gradient goes to the index at::max returned along that dim.
struct MaxDimFn : Function<MaxDimFn> {
  static constexpr const char* name = "max_dim";
  static constexpr bool kFreshOutputs = true;
  struct Saved {
    Shape shape;
    int64_t dim = 0;
    bool keepdim = false;
  };
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& x, int64_t dim, bool keepdim) {
    auto [values, indices] = at::max(x, dim, keepdim);
    ctx.save_for_backward({indices});
    s.shape = shape_of(x.sizes());
    s.dim = dim;
    s.keepdim = keepdim;
    return values;
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) {
    return {at::value_selecting_reduction_backward(g[0], s.dim, ctx.saved()[0], s.shape, s.keepdim)};
  }
};

// var = sum((x - mean)^2) / (N - correction);  grad_x = 2 / (N - correction) * grad * (x - mean).
struct VarFn : Function<VarFn> {
  static constexpr const char* name = "var";
  static constexpr bool kFreshOutputs = true;
  struct Saved : ReductionSaved {
    bool unbiased = true;
  };
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& x, const std::vector<int64_t>& dims,
                            bool unbiased, bool keepdim) {
    ctx.save_for_backward({x});
    s.set(x, dims, keepdim);
    s.unbiased = unbiased;
    if (dims.empty()) return at::var(x, unbiased);  // 0-d input
    return at::var(x, at::IntArrayRef(dims), unbiased, keepdim);
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) {
    const at::Tensor& x = ctx.saved()[0];
    const at::IntArrayRef dims = s.dims;
    const int64_t dof = reduced_count(x.sizes(), dims) - (s.unbiased ? 1 : 0);
    at::Tensor centered = dims.empty() ? x - x.mean() : x - x.mean(dims, /*keepdim=*/true);
    // dof <= 0 gives inf/NaN here exactly as the forward (and torch) does.
    return {(2.0 / static_cast<double>(dof)) * restore_reduced_dims(g[0], dims, s.keepdim) * centered};
  }
};

// Vector p-norm ||x||_p over dims. The backward follows torch's norm_backward, including its
// zero-norm convention: where the norm is 0 the gradient is 0 (for p = 2 the true gradient
// x / ||x|| is 0/0 there).
struct NormFn : Function<NormFn> {
  static constexpr const char* name = "norm";
  static constexpr bool kFreshOutputs = true;
  struct Saved : ReductionSaved {
    double p = 2.0;
  };
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& x, double p, const std::vector<int64_t>& dims,
                            bool keepdim) {
    at::Tensor y = at::linalg_vector_norm(x, p, at::IntArrayRef(dims), keepdim);
    ctx.save_for_backward({x, y});
    s.set(x, dims, keepdim);
    s.p = p;
    return y;
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) {
    const at::Tensor& x = ctx.saved()[0];
    const at::IntArrayRef dims = s.dims;
    const bool keepdim = s.keepdim;
    const double p = s.p;
    at::Tensor grad = restore_reduced_dims(g[0], dims, keepdim);
    at::Tensor norm = restore_reduced_dims(ctx.saved()[1], dims, keepdim);
    if (p == 0.0) return {at::zeros_like(x)};  // counts nonzeros: piecewise constant
    if (p == 1.0) return {x.sign() * grad};
    if (p == 2.0) return {grad * (x / norm).masked_fill_(norm == 0, 0)};
    if (std::isinf(p)) {
      // d max|x| (or min|x|): split evenly among the entries attaining it (NaN counts as attaining).
      at::Tensor x_abs = x.abs();
      at::Tensor mask = x_abs.eq(norm).logical_or(x_abs.isnan()).to(grad.scalar_type());
      at::Tensor count = dims.empty() ? mask.sum() : mask.sum(dims, /*keepdim=*/true);
      return {x.sign() * (grad / count) * mask};
    }
    // d/dx_i ||x||_p = sign(x_i) |x_i|^(p-1) / ||x||^(p-1)
    if (p < 1.0) {
      at::Tensor scaled = x.sign() * x.abs().pow_(p - 1).masked_fill_(x == 0, 0);
      return {scaled * grad * norm.pow(1 - p)};
    }
    at::Tensor scaled = p < 2.0 ? x.sign() * x.abs().pow_(p - 1) : x * x.abs().pow_(p - 2);
    at::Tensor scale = (grad / norm.pow(p - 1)).masked_fill_(norm == 0, 0);
    return {scaled * scale};
  }
};

}  // namespace

Variable sum(const Variable& x) { return SumAllFn::apply(x); }
Variable sum(const Variable& x, at::IntArrayRef dims, bool keepdim) {
  return SumDimsFn::apply(x, reduction_dims(dims, x.dim(), "sum"), keepdim);
}
Variable mean(const Variable& x) { return MeanDimsFn::apply(x, reduction_dims({}, x.dim(), "mean"), false); }
Variable mean(const Variable& x, at::IntArrayRef dims, bool keepdim) {
  return MeanDimsFn::apply(x, reduction_dims(dims, x.dim(), "mean"), keepdim);
}
Variable max(const Variable& x) { return MaxAllFn::apply(x); }
Variable max(const Variable& x, int64_t dim, bool keepdim) { return MaxDimFn::apply(x, dim, keepdim); }
Variable var(const Variable& x, at::IntArrayRef dims, bool unbiased, bool keepdim) {
  return VarFn::apply(x, reduction_dims(dims, x.dim(), "var"), unbiased, keepdim);
}
Variable norm(const Variable& x, double p, at::IntArrayRef dims, bool keepdim) {
  return NormFn::apply(x, p, reduction_dims(dims, x.dim(), "norm"), keepdim);
}

}  // namespace tl
