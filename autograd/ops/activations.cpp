// Pointwise activations. Backward calls ATen's own backward kernels (the ones torch's autograd
// uses), so values at special points (relu at 0, the gelu approximation) match torch exactly.
// relu, tanh and sigmoid save their output (their derivative is a function of it); gelu and silu
// save their input.
#include "autograd/ops/common.h"

namespace tl {
namespace {
using tensor_list = std::vector<at::Tensor>;

struct ReluFn : Function<ReluFn> {
  static constexpr const char* name = "relu";
  static constexpr bool kFreshOutputs = true;
  static at::Tensor forward(Context& ctx, const at::Tensor& x) {
    at::Tensor y = x.is_meta() ? at::empty_like(x) : at::relu(x);  // Note [ops on the meta device] (shape.cpp)
    ctx.save_for_backward({y});
    return y;
  }
  // grad_x = grad_y where y > 0, else 0 (so the gradient at x = 0 is 0, as in torch).
  static tensor_list backward(Context& ctx, tensor_list g) {
    return {at::threshold_backward(g[0], ctx.saved()[0], /*threshold=*/0)};
  }
};

struct GeluFn : Function<GeluFn> {
  static constexpr const char* name = "gelu";
  static constexpr bool kFreshOutputs = true;
  // "none": x * Phi(x) with Phi the standard normal CDF (erf form);
  // "tanh": 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  static const char* mode(bool tanh_approximate) { return tanh_approximate ? "tanh" : "none"; }
  struct Saved {
    bool tanh_approximate = false;
  };
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& x, bool tanh_approximate) {
    ctx.save_for_backward({x});
    s.tanh_approximate = tanh_approximate;
    return at::gelu(x, mode(tanh_approximate));
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) {
    return {at::gelu_backward(g[0], ctx.saved()[0], mode(s.tanh_approximate))};
  }
};

struct TanhFn : Function<TanhFn> {
  static constexpr const char* name = "tanh";
  static constexpr bool kFreshOutputs = true;
  static at::Tensor forward(Context& ctx, const at::Tensor& x) {
    at::Tensor y = at::tanh(x);
    ctx.save_for_backward({y});
    return y;
  }
  // grad_x = grad_y * (1 - y^2)
  static tensor_list backward(Context& ctx, tensor_list g) { return {at::tanh_backward(g[0], ctx.saved()[0])}; }
};

struct SigmoidFn : Function<SigmoidFn> {
  static constexpr const char* name = "sigmoid";
  static constexpr bool kFreshOutputs = true;
  static at::Tensor forward(Context& ctx, const at::Tensor& x) {
    at::Tensor y = at::sigmoid(x);
    ctx.save_for_backward({y});
    return y;
  }
  // grad_x = grad_y * y * (1 - y)
  static tensor_list backward(Context& ctx, tensor_list g) { return {at::sigmoid_backward(g[0], ctx.saved()[0])}; }
};

struct SiluFn : Function<SiluFn> {
  static constexpr const char* name = "silu";
  static constexpr bool kFreshOutputs = true;
  static at::Tensor forward(Context& ctx, const at::Tensor& x) {
    ctx.save_for_backward({x});
    return at::silu(x);
  }
  // grad_x = grad_y * s (1 + x (1 - s)), s = sigmoid(x)
  static tensor_list backward(Context& ctx, tensor_list g) { return {at::silu_backward(g[0], ctx.saved()[0])}; }
};

}  // namespace

Variable relu(const Variable& x) { return ReluFn::apply(x); }
Variable gelu(const Variable& x, bool tanh_approximate) { return GeluFn::apply(x, tanh_approximate); }
Variable tanh(const Variable& x) { return TanhFn::apply(x); }
Variable sigmoid(const Variable& x) { return SigmoidFn::apply(x); }
Variable silu(const Variable& x) { return SiluFn::apply(x); }

}  // namespace tl
