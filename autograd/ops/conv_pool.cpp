// Convolution and pooling. Every backward is ATen's own kernel (convolution_backward,
// max_pool2d_with_indices_backward, avg_pool2d_backward, _adaptive_avg_pool2d_backward), the same
// ones libtorch's autograd calls, so results agree with torch to the last bit where ATen is
// deterministic.
#include "autograd/ops/common.h"

namespace tl {
namespace {
using tensor_list = std::vector<at::Tensor>;

void check_pair(at::IntArrayRef v, const char* op, const char* what, bool allow_empty = false) {
  TORCH_CHECK(v.size() == 2 || (allow_empty && v.empty()), op, ": ", what, " must have 2 values (h, w)",
              allow_empty ? " or none" : "", ", got ", v);
}

struct Conv2dFn : Function<Conv2dFn> {
  static constexpr const char* name = "conv2d";
  static constexpr bool kFreshOutputs = true;
  struct Saved {
    ops::IntList stride, padding, dilation;
    int64_t groups = 1;
    bool has_bias = false;
  };
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                            at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups) {
    TORCH_CHECK(x.dim() == 4, "conv2d: input must be (N, C, H, W), got shape ", x.sizes());
    TORCH_CHECK(w.dim() == 4, "conv2d: weight must be (O, C/groups, kH, kW), got shape ", w.sizes());
    TORCH_CHECK(groups >= 1 && x.size(1) == w.size(1) * groups && w.size(0) % groups == 0, "conv2d: input has ",
                x.size(1), " channels, weight ", w.sizes(), " with groups=", groups, " expects ", w.size(1) * groups,
                " (and O divisible by groups)");
    TORCH_CHECK(!b.defined() || (b.dim() == 1 && b.size(0) == w.size(0)), "conv2d: bias must have shape (", w.size(0),
                "), got ", b.sizes());
    check_pair(stride, "conv2d", "stride");
    check_pair(padding, "conv2d", "padding");
    check_pair(dilation, "conv2d", "dilation");
    ctx.save_for_backward({x, w});
    s.stride = ops::int_list(stride);
    s.padding = ops::int_list(padding);
    s.dilation = ops::int_list(dilation);
    s.groups = groups;
    s.has_bias = b.defined();
    // (N, O, H', W')
    // Meta tensors (Note [ops on the meta device] in shape.cpp): ATen's convolution has no meta
    // kernel; the output's shape by the usual formula.
    at::Tensor y =
        x.is_meta()
            ? at::empty({x.size(0), w.size(0),
                         (x.size(2) + 2 * padding[0] - dilation[0] * (w.size(2) - 1) - 1) / stride[0] + 1,
                         (x.size(3) + 2 * padding[1] - dilation[1] * (w.size(3) - 1) - 1) / stride[1] + 1},
                        x.options())
            : at::convolution(x, w, b, stride, padding, dilation, /*transposed=*/false, /*output_padding=*/{0, 0},
                              groups);
    // Each output element is a dot product of C/groups * kH * kW pairs; dx and dW cost as much.
    const double f = 2.0 * static_cast<double>(y.numel()) * static_cast<double>(w.size(1) * w.size(2) * w.size(3));
    ctx.set_flops(f, {f, f, static_cast<double>(y.numel())});
    return y;
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) {
    const auto& t = ctx.saved();
    const at::Tensor& x = t[0];
    const at::Tensor& w = t[1];
    const bool has_bias = s.has_bias;
    const std::vector<int64_t> bias_sizes{w.size(0)};
    if (g[0].is_meta()) {
      const at::Tensor none;
      return {ctx.needs_input_grad(0) ? at::empty_like(x) : none, ctx.needs_input_grad(1) ? at::empty_like(w) : none,
              has_bias && ctx.needs_input_grad(2) ? at::empty(bias_sizes, w.options()) : none};
    }
    auto grads = at::convolution_backward(
        g[0], x, w, has_bias ? at::OptionalIntArrayRef(bias_sizes) : c10::nullopt, s.stride, s.padding, s.dilation,
        /*transposed=*/false, /*output_padding=*/{0, 0}, s.groups,
        {ctx.needs_input_grad(0), ctx.needs_input_grad(1), has_bias && ctx.needs_input_grad(2)});
    return {std::get<0>(grads), std::get<1>(grads), std::get<2>(grads)};
  }
};

struct MaxPool2dFn : Function<MaxPool2dFn> {
  static constexpr const char* name = "max_pool2d";
  static constexpr bool kFreshOutputs = true;
  struct Saved {
    ops::IntList kernel, stride, padding, dilation;
    bool ceil_mode = false;
  };
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride,
                            at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode) {
    check_pair(kernel, "max_pool2d", "kernel");
    check_pair(stride, "max_pool2d", "stride", /*allow_empty=*/true);
    check_pair(padding, "max_pool2d", "padding");
    check_pair(dilation, "max_pool2d", "dilation");
    auto [y, indices] = at::max_pool2d_with_indices(x, kernel, stride, padding, dilation, ceil_mode);
    ctx.save_for_backward({x, indices});
    s.kernel = ops::int_list(kernel);
    s.stride = ops::int_list(stride);
    s.padding = ops::int_list(padding);
    s.dilation = ops::int_list(dilation);
    s.ceil_mode = ceil_mode;
    return y;  // (N, C, H', W')
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) {
    const auto& t = ctx.saved();
    return {
        at::max_pool2d_with_indices_backward(g[0], t[0], s.kernel, s.stride, s.padding, s.dilation, s.ceil_mode, t[1])};
  }
};

struct AvgPool2dFn : Function<AvgPool2dFn> {
  static constexpr const char* name = "avg_pool2d";
  static constexpr bool kFreshOutputs = true;
  struct Saved {
    ops::IntList kernel, stride, padding;
    bool ceil_mode = false, count_include_pad = true;
  };
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride,
                            at::IntArrayRef padding, bool ceil_mode, bool count_include_pad) {
    check_pair(kernel, "avg_pool2d", "kernel");
    check_pair(stride, "avg_pool2d", "stride", /*allow_empty=*/true);
    check_pair(padding, "avg_pool2d", "padding");
    ctx.save_for_backward({x});  // the backward kernel reads its shape and memory format
    s.kernel = ops::int_list(kernel);
    s.stride = ops::int_list(stride);
    s.padding = ops::int_list(padding);
    s.ceil_mode = ceil_mode;
    s.count_include_pad = count_include_pad;
    return at::avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad, c10::nullopt);
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) {
    return {at::avg_pool2d_backward(g[0], ctx.saved()[0], s.kernel, s.stride, s.padding, s.ceil_mode,
                                    s.count_include_pad, c10::nullopt)};
  }
};

// A (1, 1) output is a mean over H and W (as in ATen's own adaptive_avg_pool2d), whose backward
// is a broadcast; other sizes use the adaptive kernels.
struct AdaptiveAvgPool2dFn : Function<AdaptiveAvgPool2dFn> {
  static constexpr const char* name = "adaptive_avg_pool2d";
  static constexpr bool kFreshOutputs = true;
  struct Saved {
    bool global = false;
    Shape shape;  // the input's, when global
  };
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& x, at::IntArrayRef output_size) {
    TORCH_CHECK(x.dim() == 3 || x.dim() == 4, "adaptive_avg_pool2d: input must be (N, C, H, W) or (C, H, W), got ",
                x.sizes());
    check_pair(output_size, "adaptive_avg_pool2d", "output_size");
    TORCH_CHECK(output_size[0] > 0 && output_size[1] > 0, "adaptive_avg_pool2d: output_size must be positive, got ",
                output_size);
    const bool global = output_size[0] == 1 && output_size[1] == 1;
    s.global = global;
    if (global) {
      s.shape = shape_of(x.sizes());
      return x.mean({-2, -1}, /*keepdim=*/true);  // (N, C, 1, 1)
    }
    ctx.save_for_backward({x});
    return at::_adaptive_avg_pool2d(x, output_size);  // (N, C, oH, oW)
  }
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) {
    if (s.global) {
      const Shape& shape = s.shape;
      const double area = static_cast<double>(shape[shape.size() - 1] * shape[shape.size() - 2]);
      return {(g[0] / area).expand(shape)};
    }
    return {at::_adaptive_avg_pool2d_backward(g[0], ctx.saved()[0])};
  }
};

}  // namespace

Variable conv2d(const Variable& x, const Variable& weight, const Variable& bias, at::IntArrayRef stride,
                at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups) {
  return Conv2dFn::apply(x, weight, bias, stride, padding, dilation, groups);
}
Variable max_pool2d(const Variable& x, at::IntArrayRef kernel, at::IntArrayRef stride, at::IntArrayRef padding,
                    at::IntArrayRef dilation, bool ceil_mode) {
  return MaxPool2dFn::apply(x, kernel, stride, padding, dilation, ceil_mode);
}
Variable avg_pool2d(const Variable& x, at::IntArrayRef kernel, at::IntArrayRef stride, at::IntArrayRef padding,
                    bool ceil_mode, bool count_include_pad) {
  return AvgPool2dFn::apply(x, kernel, stride, padding, ceil_mode, count_include_pad);
}
Variable adaptive_avg_pool2d(const Variable& x, at::IntArrayRef output_size) {
  return AdaptiveAvgPool2dFn::apply(x, output_size);
}

}  // namespace tl
