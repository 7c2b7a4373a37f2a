// Losses. cross_entropy is one recorded op (log_softmax + nll + label smoothing) whose kernels are
// the ones torch's own cross_entropy runs: _log_softmax, nll_loss_forward, and in backward
// nll_loss_backward and _log_softmax_backward_data.
//
// Spatial inputs (N, C, d...) are handled by moving the class dim last and flattening to (M, C)
// rows, M = N * prod(d): every reduction is over rows, so this equals torch's nll_loss2d path.
#include <ATen/ExpandUtils.h>
#include <ATen/core/Reduction.h>

#include "autograd/ops/common.h"

namespace tl {
namespace {
using ops::sum_to_shape;
using tensor_list = std::vector<at::Tensor>;

int64_t to_at(Reduction r) {
  switch (r) {
    case Reduction::None:
      return at::Reduction::None;
    case Reduction::Mean:
      return at::Reduction::Mean;
    case Reduction::Sum:
      return at::Reduction::Sum;
  }
  TORCH_CHECK(false, "loss: unknown reduction ", static_cast<int>(r), "; known: None, Mean, Sum");
}

// (N, C, d...) scores and (N, d...) targets as (M, C) rows and (M) targets. Also accepts an
// unbatched (C) input with a 0-D target, like torch.
struct Rows {
  at::Tensor x;       // (M, C)
  at::Tensor target;  // (M)
};

Rows to_rows(const at::Tensor& x, const at::Tensor& target, const char* op) {
  TORCH_CHECK(target.scalar_type() == at::kLong, op, ": target must hold int64 class indices, got ",
              target.scalar_type());
  TORCH_CHECK(x.dim() >= 1, op, ": input must be (N, C), (N, C, d...) or (C), got a scalar");
  if (x.dim() == 1) {
    TORCH_CHECK(target.dim() == 0, op, ": an unbatched input (C) takes a 0-D target, got target shape ",
                target.sizes());
    return {x.unsqueeze(0), target.reshape({1})};
  }
  std::vector<int64_t> expect{x.size(0)};
  for (int64_t d = 2; d < x.dim(); ++d) expect.push_back(x.size(d));
  TORCH_CHECK(target.sizes().equals(expect), op, ": input of shape ", x.sizes(), " needs a target of shape ",
              at::IntArrayRef(expect), ", got ", target.sizes());
  if (x.dim() == 2) return {x, target};
  return {x.movedim(1, -1).reshape({-1, x.size(1)}), target.reshape({-1})};
}

// Inverse of to_rows for a gradient (M, C) w.r.t. an input of shape `shape`.
at::Tensor from_rows(const at::Tensor& g, at::IntArrayRef shape) {
  if (shape.size() == 1) return g.squeeze(0);
  if (shape.size() == 2) return g;
  std::vector<int64_t> moved{shape[0]};
  for (size_t d = 2; d < shape.size(); ++d) moved.push_back(shape[d]);
  moved.push_back(shape[1]);
  return g.view(moved).movedim(-1, 1);  // (N, C, d...)
}

// A per-row loss (M) back to the target's shape when not reduced.
at::Tensor unreduced(const at::Tensor& loss, const at::Tensor& target, int64_t reduction) {
  return reduction == at::Reduction::None ? loss.view(target.sizes()) : loss;
}

// Note [label smoothing]
// As torch: loss_i = (1 - e) * nll_i + (e / C) * smooth_i with smooth_i = -sum_c log p_ic, both
// zero where target_i == ignore_index. Mean reduction divides the smooth sum by the number of
// non-ignored rows (the same count nll's mean uses). d smooth_i / d log p_ic = -1 for every c, so
// the backward adds -(e / C) * w_i to every class of row i, w_i being the row's weight in the
// reduction (g / count, g, or g_i) on non-ignored rows.
struct CrossEntropyFn : Function<CrossEntropyFn> {
  static constexpr const char* name = "cross_entropy";
  static constexpr bool kFreshOutputs = true;
  struct Saved {
    Shape shape;  // the logits'
    int64_t ignore_index = -100, reduction = 0;
    double smoothing = 0.0;
  };
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& logits, const at::Tensor& target,
                            int64_t ignore_index, double smoothing, int64_t reduction) {
    TORCH_CHECK(smoothing >= 0.0 && smoothing <= 1.0, "cross_entropy: label_smoothing must be in [0, 1], got ",
                smoothing);
    Rows r = to_rows(logits, target, "cross_entropy");
    const int64_t classes = r.x.size(1);
    at::Tensor lsm = at::_log_softmax(r.x, 1, /*half_to_float=*/false);  // (M, C)
    auto [loss, total_weight] = at::nll_loss_forward(lsm, r.target, c10::nullopt, reduction, ignore_index);
    if (smoothing > 0.0) {
      at::Tensor valid = r.target != ignore_index;                             // (M)
      at::Tensor smooth = -lsm.sum(1).masked_fill_(valid.logical_not(), 0.0);  // (M)
      if (reduction == at::Reduction::Mean) smooth = smooth.sum() / valid.sum();
      if (reduction == at::Reduction::Sum) smooth = smooth.sum();
      loss = loss * (1.0 - smoothing) + smooth * (smoothing / static_cast<double>(classes));
    }
    ctx.save_for_backward({lsm, target, total_weight});  // the caller's target, not a view of it
    s.shape = shape_of(logits.sizes());
    s.ignore_index = ignore_index;
    s.smoothing = smoothing;
    s.reduction = reduction;
    return unreduced(loss, target, reduction);  // () or (N, d...)
  }

  static tensor_list backward(Context& ctx, const Saved& saved, tensor_list g) {
    const auto& s = ctx.saved();
    const at::Tensor& lsm = s[0];                   // (M, C)
    const at::Tensor target = s[1].dim() == 1 ? s[1] : s[1].reshape({-1});  // (M)
    const int64_t ignore_index = saved.ignore_index;
    const int64_t reduction = saved.reduction;
    const double smoothing = saved.smoothing;
    const at::Tensor grad = reduction == at::Reduction::None ? g[0].reshape({-1}) : g[0];  // (M) or ()
    at::Tensor grad_lsm = at::nll_loss_backward(smoothing > 0.0 ? grad * (1.0 - smoothing) : grad, lsm, target,
                                                c10::nullopt, reduction, ignore_index, s[2]);  // (M, C)
    if (smoothing > 0.0) {
      at::Tensor valid = (target != ignore_index).to(lsm.scalar_type());  // (M)
      at::Tensor w = reduction == at::Reduction::Mean ? grad / valid.sum() : grad;
      const double e = smoothing / static_cast<double>(lsm.size(1));
      grad_lsm.sub_((valid * w * e).unsqueeze(1));
    }
    at::Tensor grad_rows = at::_log_softmax_backward_data(grad_lsm, lsm, 1, lsm.scalar_type());
    return {from_rows(grad_rows, saved.shape)};
  }
};

struct NllLossFn : Function<NllLossFn> {
  static constexpr const char* name = "nll_loss";
  static constexpr bool kFreshOutputs = true;
  struct Saved {
    Shape shape;  // the input's
    int64_t ignore_index = -100, reduction = 0;
  };
  static at::Tensor forward(Context& ctx, Saved& s, const at::Tensor& log_probs, const at::Tensor& target,
                            int64_t ignore_index, int64_t reduction) {
    Rows r = to_rows(log_probs, target, "nll_loss");
    auto [loss, total_weight] = at::nll_loss_forward(r.x, r.target, c10::nullopt, reduction, ignore_index);
    ctx.save_for_backward({log_probs, target, total_weight});  // the caller's tensors; rows again in backward
    s.shape = shape_of(log_probs.sizes());
    s.ignore_index = ignore_index;
    s.reduction = reduction;
    return unreduced(loss, target, reduction);
  }
  static tensor_list backward(Context& ctx, const Saved& saved, tensor_list g) {
    const auto& s = ctx.saved();
    const int64_t reduction = saved.reduction;
    const at::Tensor grad = reduction == at::Reduction::None ? g[0].reshape({-1}) : g[0];
    const Rows r = to_rows(s[0], s[1], "nll_loss");
    at::Tensor grad_rows =
        at::nll_loss_backward(grad, r.x, r.target, c10::nullopt, reduction, saved.ignore_index, s[2]);  // (M, C)
    return {from_rows(grad_rows, saved.shape)};
  }
};

// Broadcast operands are expanded to the common shape (torch warns and does the same); gradients
// are summed back. d/da mean((a - b)^2) = 2 (a - b) / n and d/db = -d/da.
struct MseLossFn : Function<MseLossFn> {
  static constexpr const char* name = "mse_loss";
  static constexpr bool kFreshOutputs = true;
  struct Saved {
    Shape sa, sb;
    int64_t reduction = 0;
  };
  // The operands themselves are saved (not their expanded views), so an in-place change of one is
  // seen (Note [ATen's autograd is not involved], function.h).
  static at::Tensor forward(Context& ctx, Saved& saved, const at::Tensor& a, const at::Tensor& b, int64_t reduction) {
    ctx.save_for_backward({a, b});
    saved.sa = shape_of(a.sizes());
    saved.sb = shape_of(b.sizes());
    saved.reduction = reduction;
    if (a.sizes().equals(b.sizes())) return at::mse_loss(a, b, reduction);
    const auto shape = at::infer_size(a.sizes(), b.sizes());  // errors on incompatible shapes
    return at::mse_loss(a.expand(shape), b.expand(shape), reduction);
  }
  static tensor_list backward(Context& ctx, const Saved& saved, tensor_list g) {
    const auto& s = ctx.saved();
    at::Tensor a = s[0], b = s[1];
    if (!a.sizes().equals(b.sizes())) {
      const auto shape = at::infer_size(a.sizes(), b.sizes());
      a = a.expand(shape);
      b = b.expand(shape);
    }
    at::Tensor grad_a = at::mse_loss_backward(g[0], a, b, saved.reduction);
    return {ctx.needs_input_grad(0) ? sum_to_shape(grad_a, saved.sa) : at::Tensor(),
            ctx.needs_input_grad(1) ? sum_to_shape(-grad_a, saved.sb) : at::Tensor()};
  }
};

}  // namespace

Variable cross_entropy(const Variable& logits, const at::Tensor& target, int64_t ignore_index, double label_smoothing,
                       Reduction reduction) {
  return CrossEntropyFn::apply(logits, target, ignore_index, label_smoothing, to_at(reduction));
}

Variable nll_loss(const Variable& log_probs, const at::Tensor& target, int64_t ignore_index, Reduction reduction) {
  return NllLossFn::apply(log_probs, target, ignore_index, to_at(reduction));
}

Variable mse_loss(const Variable& input, const Variable& target, Reduction reduction) {
  return MseLossFn::apply(input, target, to_at(reduction));
}

}  // namespace tl
