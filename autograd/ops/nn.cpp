// Normalisation, dropout and softmax. Batch norm and layer norm call ATen's fused kernels
// (native_batch_norm / native_layer_norm) and their backward kernels; softmax and log_softmax use
// _softmax_backward_data / _log_softmax_backward_data, whose signature (grad, output, dim,
// input_dtype) is the same in libtorch 1.13 and 2.x.
#include <ATen/WrapDimUtils.h>

#include "autograd/ops/common.h"

namespace tl {
namespace {
using tensor_list = std::vector<at::Tensor>;

c10::optional<at::Tensor> opt(const at::Tensor& t) { return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt; }

// Note [batch norm running statistics]
// In training, native_batch_norm normalises with the batch statistics and updates running_mean
// and running_var in place: r = (1 - momentum) r + momentum * s, with the unbiased batch variance
// for running_var, exactly as torch.nn.BatchNorm. The backward in training only needs the saved
// batch mean and inverse std, so the running statistics are NOT saved for backward: they may be
// updated again by a later micro-batch's forward before this one's backward (1F1B), which must
// not trip the saved-tensor version check. In eval the running statistics are the normalisation
// and are saved (and checked).
struct BatchNormFn : Function<BatchNormFn> {
  static constexpr const char* name = "batch_norm";
  struct Saved {
    bool training = true;
    double eps = 1e-5;
  };
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, const at::Tensor& running_mean, const at::Tensor& running_var,
                            bool training, double momentum, double eps) {
    TORCH_CHECK(x.dim() >= 2, "batch_norm: input must be (N, C, ...), got shape ", x.sizes());
    const int64_t c = x.size(1);
    auto check_vec = [&](const at::Tensor& t, const char* what) {
      TORCH_CHECK(!t.defined() || (t.dim() == 1 && t.size(0) == c), "batch_norm: ", what, " must have shape (", c,
                  ") for an input with ", c, " channels, got ", t.sizes());
    };
    check_vec(weight, "weight");
    check_vec(bias, "bias");
    check_vec(running_mean, "running_mean");
    check_vec(running_var, "running_var");
    TORCH_CHECK(running_mean.defined() == running_var.defined(),
                "batch_norm: give both running_mean and running_var, or neither");
    if (training) {
      TORCH_CHECK(x.numel() / c > 1, "batch_norm: training needs more than 1 value per channel, got input shape ",
                  x.sizes());
    } else {
      TORCH_CHECK(running_mean.defined(), "batch_norm: eval mode needs running_mean and running_var");
    }
    // Meta tensors (Note [ops on the meta device] in shape.cpp): ATen has no meta batch norm.
    auto [y, save_mean, save_invstd] =
        x.is_meta() ? std::make_tuple(at::empty_like(x), at::empty({training ? c : 0}, x.options()),
                                      at::empty({training ? c : 0}, x.options()))
                    : at::native_batch_norm(x, opt(weight), opt(bias), opt(running_mean), opt(running_var), training,
                                            momentum, eps);
    if (training) {
      ctx.save_for_backward({x, weight, save_mean, save_invstd});
    } else {
      ctx.save_for_backward({x, weight, save_mean, save_invstd, running_mean, running_var});
    }
    s.training = training;
    s.eps = eps;
    return y;  // (N, C, ...)
  }
  static tensor_list backward(Context& ctx, const Saved& saved, tensor_list g) {
    const auto& s = ctx.saved();
    const bool training = saved.training;
    const at::Tensor none;
    if (g[0].is_meta())
      return {ctx.needs_input_grad(0) ? at::empty_like(s[0]) : none,
              ctx.needs_input_grad(1) && s[1].defined() ? at::empty_like(s[1]) : none,
              ctx.needs_input_grad(2) && s[1].defined() ? at::empty_like(s[1]) : none};
    auto grads = at::native_batch_norm_backward(
        g[0], s[0], opt(s[1]), opt(training ? none : s[4]), opt(training ? none : s[5]), opt(s[2]), opt(s[3]), training,
        saved.eps, {ctx.needs_input_grad(0), ctx.needs_input_grad(1), ctx.needs_input_grad(2)});
    return {std::get<0>(grads), std::get<1>(grads), std::get<2>(grads)};
  }
};

struct LayerNormFn : Function<LayerNormFn> {
  static constexpr const char* name = "layer_norm";
  static constexpr bool kFreshOutputs = true;
  struct Saved {
    Shape normalized_shape;
  };
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& x, at::IntArrayRef normalized_shape,
                            const at::Tensor& weight, const at::Tensor& bias, double eps) {
    const int64_t k = static_cast<int64_t>(normalized_shape.size());
    TORCH_CHECK(k >= 1 && x.dim() >= k && x.sizes().slice(x.dim() - k).equals(normalized_shape),
                "layer_norm: normalized_shape ", normalized_shape, " must match the trailing dims of the input ",
                x.sizes());
    TORCH_CHECK(!weight.defined() || weight.sizes().equals(normalized_shape), "layer_norm: weight must have shape ",
                normalized_shape, ", got ", weight.sizes());
    TORCH_CHECK(!bias.defined() || bias.sizes().equals(normalized_shape), "layer_norm: bias must have shape ",
                normalized_shape, ", got ", bias.sizes());
    // Meta tensors (Note [ops on the meta device] in shape.cpp): ATen's meta layer norm goes
    // through batch norm, which has none; mean and rstd have the shape the CPU kernel gives them.
    auto [y, mean, rstd] = [&] {
      if (!x.is_meta()) return at::native_layer_norm(x, normalized_shape, opt(weight), opt(bias), eps);
      std::vector<int64_t> stat = x.sizes().vec();
      for (size_t i = stat.size() - static_cast<size_t>(k); i < stat.size(); ++i) stat[i] = 1;
      return std::make_tuple(at::empty_like(x), at::empty(stat, x.options()), at::empty(stat, x.options()));
    }();
    ctx.save_for_backward({x, weight, bias, mean, rstd});
    s.normalized_shape = shape_of(normalized_shape);
    return y;
  }
  static tensor_list backward(Context& ctx, const Saved& saved, tensor_list g) {
    const auto& s = ctx.saved();
    if (g[0].is_meta()) {
      const at::Tensor none;
      return {ctx.needs_input_grad(0) ? at::empty_like(s[0]) : none,
              ctx.needs_input_grad(1) && s[1].defined() ? at::empty_like(s[1]) : none,
              ctx.needs_input_grad(2) && s[2].defined() ? at::empty_like(s[2]) : none};
    }
    auto grads =
        at::native_layer_norm_backward(g[0], s[0], saved.normalized_shape, s[3], s[4], opt(s[1]), opt(s[2]),
                                       {ctx.needs_input_grad(0), ctx.needs_input_grad(1), ctx.needs_input_grad(2)});
    return {std::get<0>(grads), std::get<1>(grads), std::get<2>(grads)};
  }
};

// Inverted dropout: y = x * m / (1 - p), m ~ Bernoulli(1 - p). The scaled mask is saved.
struct DropoutFn : Function<DropoutFn> {
  static constexpr const char* name = "dropout";
  static constexpr bool kFreshOutputs = true;
  static at::Tensor forward(Context& ctx, const at::Tensor& x, double p, const c10::optional<at::Generator>& gen) {
    TORCH_CHECK(!gen || gen->device().type() == x.device().type(), "dropout: the generator is on ", gen->device(),
                " but the input is on ", x.device(),
                "; give a generator of the input's device (a CPU generator "
                "never draws a mask for a CUDA tensor)");
    at::Tensor mask = at::empty_like(x, at::MemoryFormat::Contiguous);
    if (p >= 1.0) {
      mask.zero_();
    } else if (!mask.is_meta()) {  // meta: shapes only (Note [ops on the meta device] in shape.cpp)
      mask.bernoulli_(1.0 - p, gen).div_(1.0 - p);
    }
    ctx.save_for_backward({mask});
    return x * mask;
  }
  static tensor_list backward(Context& ctx, tensor_list g) { return {g[0] * ctx.saved()[0]}; }
};

struct SoftmaxFn : Function<SoftmaxFn> {
  static constexpr const char* name = "softmax";
  static constexpr bool kFreshOutputs = true;
  struct Saved {
    int64_t dim = 0;
  };
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& x, int64_t dim) {
    dim = at::maybe_wrap_dim(dim, x.dim());
    at::Tensor y = at::_softmax(x, dim, /*half_to_float=*/false);
    ctx.save_for_backward({y});
    s.dim = dim;
    return y;
  }
  // dx = y * (g - sum(g * y, dim))
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) {
    const at::Tensor& y = ctx.saved()[0];
    return {at::_softmax_backward_data(g[0], y, s.dim, y.scalar_type())};
  }
};

struct LogSoftmaxFn : Function<LogSoftmaxFn> {
  static constexpr const char* name = "log_softmax";
  static constexpr bool kFreshOutputs = true;
  struct Saved {
    int64_t dim = 0;
  };
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& x, int64_t dim) {
    dim = at::maybe_wrap_dim(dim, x.dim());
    at::Tensor y = at::_log_softmax(x, dim, /*half_to_float=*/false);
    ctx.save_for_backward({y});
    s.dim = dim;
    return y;
  }
  // dx = g - exp(y) * sum(g, dim)
  static tensor_list backward(Context& ctx, const Saved& s, tensor_list g) {
    const at::Tensor& y = ctx.saved()[0];
    return {at::_log_softmax_backward_data(g[0], y, s.dim, y.scalar_type())};
  }
};

}  // namespace

Variable batch_norm(const Variable& x, const Variable& weight, const Variable& bias, const at::Tensor& running_mean,
                    const at::Tensor& running_var, bool training, double momentum, double eps) {
  return BatchNormFn::apply(x, weight, bias, running_mean, running_var, training, momentum, eps);
}

Variable layer_norm(const Variable& x, at::IntArrayRef normalized_shape, const Variable& weight, const Variable& bias,
                    double eps) {
  return LayerNormFn::apply(x, normalized_shape, weight, bias, eps);
}

Variable dropout(const Variable& x, double p, bool training, std::optional<at::Generator> generator) {
  TORCH_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability must be in [0, 1], got ", p);
  if (!training || p == 0.0) return x;  // identity: nothing recorded, as torch returns its input
  const c10::optional<at::Generator> gen = generator ? c10::optional<at::Generator>(*generator) : c10::nullopt;
  return DropoutFn::apply(x, p, gen);
}

Variable softmax(const Variable& x, int64_t dim) { return SoftmaxFn::apply(x, dim); }
Variable log_softmax(const Variable& x, int64_t dim) { return LogSoftmaxFn::apply(x, dim); }

}  // namespace tl
