// Linear algebra: matmul (torch.matmul semantics), bmm and linear.
//
// Backward of C = A B is dA = dC B^T, dB = A^T dC. The cases differ only in how operands are
// promoted and how broadcast batch dimensions are summed back:
//  - 1-D operands are promoted (a: (k) -> (1, k), b: (k) -> (k, 1)) and the matching dim of the
//    gradient is re-inserted, so everything below is the >= 2-D case.
//  - A batched A times a 2-D B (the common "(B, T, C) x (C, D)" shape): dB is one GEMM over the
//    flattened rows, (C, B*T) x (B*T, D), instead of a batched product followed by a sum.
//  - Otherwise batched products at the broadcast shape, summed back with sum_to_shape.
#include "autograd/ops/common.h"

namespace tl {
namespace {
using ops::mT;
using ops::sum_to_shape;
using tensor_list = std::vector<at::Tensor>;

// a^T over the last two dims.

struct MatmulFn : Function<MatmulFn> {
  static constexpr const char* name = "matmul";
  static constexpr bool kFreshOutputs = true;
  static at::Tensor forward(Context& ctx, const at::Tensor& a, const at::Tensor& b) {
    TORCH_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both operands need at least 1 dimension, got shapes ", a.sizes(),
                " and ", b.sizes());
    ctx.save_for_backward({a, b});
    // what matmul would call, one dispatch less
    at::Tensor c = a.dim() == 2 && b.dim() == 2 ? at::mm(a, b) : at::matmul(a, b);
    const double f = 2.0 * static_cast<double>(c.numel()) * static_cast<double>(a.size(-1));  // 2 n p k
    ctx.set_flops(f, {f, f});
    return c;
  }

  static tensor_list backward(Context& ctx, tensor_list g) {
    const auto& s = ctx.saved();
    const at::Tensor& a = s[0];
    const at::Tensor& b = s[1];
    const bool need_a = ctx.needs_input_grad(0), need_b = ctx.needs_input_grad(1);
    at::Tensor grad_a, grad_b;
    if (a.dim() == 2 && b.dim() == 2) {  // (n, k) x (k, p): two GEMMs, nothing to reshape
      if (need_a) grad_a = at::mm(g[0], b.t());  // (n, p) x (p, k)
      if (need_b) grad_b = at::mm(a.t(), g[0]);  // (k, n) x (n, p)
      return {grad_a, grad_b};
    }
    if (a.dim() == 1 && b.dim() == 1) {  // dot product: g is a scalar
      if (need_a) grad_a = g[0] * b;
      if (need_b) grad_b = g[0] * a;
      return {grad_a, grad_b};
    }
    // Promote to >= 2-D and put the gradient in the promoted output shape (..., n, p).
    const at::Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a;   // (..., n, k)
    const at::Tensor b2 = b.dim() == 1 ? b.unsqueeze(-1) : b;  // (..., k, p)
    at::Tensor g2 = g[0];
    if (a.dim() == 1) g2 = g2.unsqueeze(-2);
    if (b.dim() == 1) g2 = g2.unsqueeze(-1);  // (..., n, p)
    const int64_t k = a2.size(-1);
    if (need_a) {
      if (b2.dim() == 2) {
        grad_a = at::matmul(g2, b2.t());  // (..., n, p) x (p, k): matmul folds the batch into rows
      } else {
        grad_a = sum_to_shape(at::matmul(g2, mT(b2)), a2.sizes());
      }
      grad_a = grad_a.reshape(a.sizes());
    }
    if (need_b) {
      if (b2.dim() == 2 && a2.dim() > 2) {
        // One GEMM over all rows: (k, N*n) x (N*n, p).
        grad_b = at::mm(a2.reshape({-1, k}).t(), g2.reshape({-1, g2.size(-1)}));
      } else if (a2.dim() == 2) {
        grad_b = sum_to_shape(at::matmul(a2.t(), g2), b2.sizes());
      } else {
        grad_b = sum_to_shape(at::matmul(mT(a2), g2), b2.sizes());
      }
      grad_b = grad_b.reshape(b.sizes());
    }
    return {grad_a, grad_b};
  }
};

struct BmmFn : Function<BmmFn> {
  static constexpr const char* name = "bmm";
  static constexpr bool kFreshOutputs = true;
  static at::Tensor forward(Context& ctx, const at::Tensor& a, const at::Tensor& b) {
    TORCH_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expected 3-D operands (B, n, m) and (B, m, p), got shapes ",
                a.sizes(), " and ", b.sizes());
    ctx.save_for_backward({a, b});
    at::Tensor c = at::bmm(a, b);  // (B, n, p)
    const double f = 2.0 * static_cast<double>(c.numel()) * static_cast<double>(a.size(2));  // 2 B n p m
    ctx.set_flops(f, {f, f});
    return c;
  }
  static tensor_list backward(Context& ctx, tensor_list g) {
    const auto& s = ctx.saved();
    return {ctx.needs_input_grad(0) ? at::bmm(g[0], mT(s[1])) : at::Tensor(),   // (B, n, m)
            ctx.needs_input_grad(1) ? at::bmm(mT(s[0]), g[0]) : at::Tensor()};  // (B, m, p)
  }
};

// y = x W^T + b. Leading dims of x are flattened so forward is one addmm and backward is three
// plain GEMM-shaped ops on (rows, in) / (rows, out) matrices.
struct LinearFn : Function<LinearFn> {
  static constexpr const char* name = "linear";
  static constexpr bool kFreshOutputs = true;
  static at::Tensor forward(Context& ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    TORCH_CHECK(w.dim() == 2, "linear: weight must be 2-D (out_features, in_features), got shape ", w.sizes());
    TORCH_CHECK(x.dim() >= 1 && x.size(-1) == w.size(1), "linear: input of shape ", x.sizes(),
                " does not match weight of shape ", w.sizes(), " (need input (..., ", w.size(1), "))");
    TORCH_CHECK(!b.defined() || (b.dim() == 1 && b.size(0) == w.size(0)), "linear: bias must have shape (", w.size(0),
                "), got ", b.sizes());
    ctx.save_for_backward({x, w});
    const double rows = static_cast<double>(x.numel() / std::max<int64_t>(x.size(-1), 1));
    const double f = 2.0 * rows * static_cast<double>(w.size(0)) * static_cast<double>(w.size(1));  // 2 rows out in
    ctx.set_flops(f, {f, f, rows * static_cast<double>(w.size(0))});  // dx, dW: GEMMs; db: a sum over rows
    if (x.dim() == 2) return b.defined() ? at::addmm(b, x, w.t()) : at::mm(x, w.t());  // (N, out)
    std::vector<int64_t> out_shape = x.sizes().vec();
    out_shape.back() = w.size(0);
    const at::Tensor x2 = x.reshape({-1, x.size(-1)});  // (rows, in)
    at::Tensor y = b.defined() ? at::addmm(b, x2, w.t()) : at::mm(x2, w.t());
    return y.view(out_shape);  // (..., out)
  }
  static tensor_list backward(Context& ctx, tensor_list g) {
    const auto& s = ctx.saved();
    const at::Tensor& x = s[0];
    const at::Tensor& w = s[1];
    const at::Tensor g2 = g[0].dim() == 2 ? g[0] : g[0].reshape({-1, w.size(0)});  // (rows, out)
    at::Tensor grad_x, grad_w, grad_b;
    if (ctx.needs_input_grad(0)) grad_x = at::mm(g2, w).view(x.sizes());  // (rows, in)
    if (ctx.needs_input_grad(1)) {
      const at::Tensor x2 = x.dim() == 2 ? x : x.reshape({-1, x.size(-1)});
      grad_w = at::mm(g2.t(), x2);  // (out, in)
    }
    if (ctx.needs_input_grad(2)) grad_b = g2.sum(0);  // (out)
    return {grad_x, grad_w, grad_b};
  }
};

}  // namespace

Variable matmul(const Variable& a, const Variable& b) { return MatmulFn::apply(a, b); }
Variable bmm(const Variable& a, const Variable& b) { return BmmFn::apply(a, b); }
Variable linear(const Variable& x, const Variable& weight, const Variable& bias) {
  return LinearFn::apply(x, weight, bias);
}

}  // namespace tl
