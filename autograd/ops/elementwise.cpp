// Elementwise arithmetic with broadcasting. Gradients of broadcast operands are summed back to the
// operand's shape (sum_to_shape).
#include "autograd/ops/common.h"

namespace tl {
namespace {
using ops::sum_to_shape;
using tensor_list = std::vector<at::Tensor>;

// The operands' shapes, to sum broadcast gradients back.
struct BinaryShapes {
  Shape sa, sb;
  void set(const at::Tensor& a, const at::Tensor& b) {
    sa = shape_of(a.sizes());
    sb = shape_of(b.sizes());
  }
};

struct AddFn : Function<AddFn> {
  static constexpr const char* name = "add";
  static constexpr bool kFreshOutputs = true;
  using Saved = BinaryShapes;
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& a, const at::Tensor& b) {
    s.set(a, b);
    return at::add(a, b);
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) {
    return {ctx.needs_input_grad(0) ? sum_to_shape(g[0], s.sa) : at::Tensor(),
            ctx.needs_input_grad(1) ? sum_to_shape(g[0], s.sb) : at::Tensor()};
  }
};

struct SubFn : Function<SubFn> {
  static constexpr const char* name = "sub";
  static constexpr bool kFreshOutputs = true;
  using Saved = BinaryShapes;
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& a, const at::Tensor& b) {
    s.set(a, b);
    return at::sub(a, b);
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) {
    return {ctx.needs_input_grad(0) ? sum_to_shape(g[0], s.sa) : at::Tensor(),
            ctx.needs_input_grad(1) ? sum_to_shape(-g[0], s.sb) : at::Tensor()};
  }
};

struct MulFn : Function<MulFn> {
  static constexpr const char* name = "mul";
  static constexpr bool kFreshOutputs = true;
  static at::Tensor forward(Context& ctx, const at::Tensor& a, const at::Tensor& b) {
    ctx.save_for_backward({a, b});
    return at::mul(a, b);
  }
  static tensor_list backward(Context& ctx, tensor_list g) {
    const auto& s = ctx.saved();
    return {ctx.needs_input_grad(0) ? sum_to_shape(g[0] * s[1], s[0].sizes()) : at::Tensor(),
            ctx.needs_input_grad(1) ? sum_to_shape(g[0] * s[0], s[1].sizes()) : at::Tensor()};
  }
};

struct DivFn : Function<DivFn> {
  static constexpr const char* name = "div";
  static constexpr bool kFreshOutputs = true;
  static at::Tensor forward(Context& ctx, const at::Tensor& a, const at::Tensor& b) {
    ctx.save_for_backward({a, b});
    return at::div(a, b);
  }
  static tensor_list backward(Context& ctx, tensor_list g) {
    const auto& s = ctx.saved();
    at::Tensor ga, gb;
    if (ctx.needs_input_grad(0)) ga = sum_to_shape(g[0] / s[1], s[0].sizes());
    // d(a/b)/db = -a / b^2
    if (ctx.needs_input_grad(1)) gb = sum_to_shape(-g[0] * s[0] / (s[1] * s[1]), s[1].sizes());
    return {ga, gb};
  }
};

struct AddScalarFn : Function<AddScalarFn> {
  static constexpr const char* name = "add_scalar";
  static constexpr bool kFreshOutputs = true;
  static at::Tensor forward(Context&, const at::Tensor& a, double s) { return at::add(a, s); }
  static tensor_list backward(Context&, tensor_list g) { return {g[0]}; }
};

struct MulScalarFn : Function<MulScalarFn> {
  static constexpr const char* name = "mul_scalar";
  static constexpr bool kFreshOutputs = true;
  struct Saved {
    double s = 0;
  };
  static at::Tensor forward(Context& ctx, Saved& saved, const at::Tensor& a, double s) {
    saved.s = s;
    return at::mul(a, s);
  }
  static tensor_list backward(Context& ctx, const Saved& saved, tensor_list g) { return {g[0] * saved.s}; }
};

struct NegFn : Function<NegFn> {
  static constexpr const char* name = "neg";
  static constexpr bool kFreshOutputs = true;
  static at::Tensor forward(Context&, const at::Tensor& a) { return at::neg(a); }
  static tensor_list backward(Context&, tensor_list g) { return {-g[0]}; }
};

struct PowFn : Function<PowFn> {
  static constexpr const char* name = "pow";
  static constexpr bool kFreshOutputs = true;
  struct Saved {
    double e = 0;
  };
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& a, double e) {
    ctx.save_for_backward({a});
    s.e = e;
    return at::pow(a, e);
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) {
    const double e = s.e;
    if (e == 0.0) return {at::zeros_like(g[0])};
    return {g[0] * e * at::pow(ctx.saved()[0], e - 1.0)};
  }
};

struct ExpFn : Function<ExpFn> {
  static constexpr const char* name = "exp";
  static constexpr bool kFreshOutputs = true;
  static at::Tensor forward(Context& ctx, const at::Tensor& a) {
    at::Tensor y = at::exp(a);
    ctx.save_for_backward({y});
    return y;
  }
  static tensor_list backward(Context& ctx, tensor_list g) { return {g[0] * ctx.saved()[0]}; }
};

struct LogFn : Function<LogFn> {
  static constexpr const char* name = "log";
  static constexpr bool kFreshOutputs = true;
  static at::Tensor forward(Context& ctx, const at::Tensor& a) {
    ctx.save_for_backward({a});
    return at::log(a);
  }
  static tensor_list backward(Context& ctx, tensor_list g) { return {g[0] / ctx.saved()[0]}; }
};

struct SqrtFn : Function<SqrtFn> {
  static constexpr const char* name = "sqrt";
  static constexpr bool kFreshOutputs = true;
  static at::Tensor forward(Context& ctx, const at::Tensor& a) {
    at::Tensor y = at::sqrt(a);
    ctx.save_for_backward({y});
    return y;
  }
  static tensor_list backward(Context& ctx, tensor_list g) { return {g[0] / (2 * ctx.saved()[0])}; }
};

struct RsqrtFn : Function<RsqrtFn> {
  static constexpr const char* name = "rsqrt";
  static constexpr bool kFreshOutputs = true;
  static at::Tensor forward(Context& ctx, const at::Tensor& a) {
    at::Tensor y = at::rsqrt(a);
    ctx.save_for_backward({y});
    return y;
  }
  // d/da a^(-1/2) = -1/2 a^(-3/2) = -1/2 y^3
  static tensor_list backward(Context& ctx, tensor_list g) {
    const auto& y = ctx.saved()[0];
    return {g[0] * (-0.5) * y * y * y};
  }
};

struct AbsFn : Function<AbsFn> {
  static constexpr const char* name = "abs";
  static constexpr bool kFreshOutputs = true;
  static at::Tensor forward(Context& ctx, const at::Tensor& a) {
    ctx.save_for_backward({a});
    return at::abs(a);
  }
  static tensor_list backward(Context& ctx, tensor_list g) { return {g[0] * at::sign(ctx.saved()[0])}; }
};

struct ClampFn : Function<ClampFn> {
  static constexpr const char* name = "clamp";
  static constexpr bool kFreshOutputs = true;
  struct Saved {
    std::optional<double> lo, hi;
  };
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& a, std::optional<double> lo,
                            std::optional<double> hi) {
    ctx.save_for_backward({a});
    s.lo = lo;
    s.hi = hi;
    return at::clamp(a, lo ? c10::optional<at::Scalar>(*lo) : c10::nullopt,
                     hi ? c10::optional<at::Scalar>(*hi) : c10::nullopt);
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) {
    const auto& a = ctx.saved()[0];
    at::Tensor pass = at::ones_like(a, at::kBool);
    if (s.lo) pass = pass.logical_and(a >= *s.lo);
    if (s.hi) pass = pass.logical_and(a <= *s.hi);
    return {g[0] * pass};
  }
};

}  // namespace

Variable add(const Variable& a, const Variable& b) { return AddFn::apply(a, b); }
Variable sub(const Variable& a, const Variable& b) { return SubFn::apply(a, b); }
Variable mul(const Variable& a, const Variable& b) { return MulFn::apply(a, b); }
Variable div(const Variable& a, const Variable& b) { return DivFn::apply(a, b); }
Variable add(const Variable& a, double s) { return AddScalarFn::apply(a, s); }
Variable mul(const Variable& a, double s) { return MulScalarFn::apply(a, s); }
Variable neg(const Variable& a) { return NegFn::apply(a); }
Variable pow(const Variable& a, double exponent) { return PowFn::apply(a, exponent); }
Variable exp(const Variable& a) { return ExpFn::apply(a); }
Variable log(const Variable& a) { return LogFn::apply(a); }
Variable sqrt(const Variable& a) { return SqrtFn::apply(a); }
Variable rsqrt(const Variable& a) { return RsqrtFn::apply(a); }
Variable abs(const Variable& a) { return AbsFn::apply(a); }
Variable clamp(const Variable& a, std::optional<double> min, std::optional<double> max) {
  return ClampFn::apply(a, min, max);
}

Variable operator+(const Variable& a, const Variable& b) { return add(a, b); }
Variable operator-(const Variable& a, const Variable& b) { return sub(a, b); }
Variable operator*(const Variable& a, const Variable& b) { return mul(a, b); }
Variable operator/(const Variable& a, const Variable& b) { return div(a, b); }
Variable operator-(const Variable& a) { return neg(a); }
Variable operator+(const Variable& a, double s) { return add(a, s); }
Variable operator-(const Variable& a, double s) { return add(a, -s); }
Variable operator*(const Variable& a, double s) { return mul(a, s); }
Variable operator/(const Variable& a, double s) { return mul(a, 1.0 / s); }
Variable operator*(double s, const Variable& a) { return mul(a, s); }

}  // namespace tl
