// Scaled dot-product attention as one recorded op with a hand-written backward (ATen 1.13 has no
// scaled_dot_product_attention, and one node saves less than five).
//
//   S = q k^T / sqrt(D) (+ mask)      (..., Tq, Tk)
//   P = softmax(S, -1)                (..., Tq, Tk)
//   Pd = P * M / (1 - p_drop)         dropout mask M ~ Bernoulli(1 - p_drop)
//   O = Pd v                          (..., Tq, Dv)
//
// Backward: dv = Pd^T dO; dPd = dO v^T; dP = dPd * M / (1 - p_drop);
// dS = P * (dP - rowsum(dP * P)); dq = dS k / sqrt(D); dk = dS^T q / sqrt(D).
// Leading (batch, head) dims broadcast like matmul (e.g. k, v shared across heads); their
// gradients are summed back.
//
// A query row whose keys are all masked has softmax 0/0 = NaN, as in torch's math path (1.13 to
// 2.4); callers with padded queries should mask the outputs of such rows.
#include <ATen/ExpandUtils.h>

#include <cmath>
#include <limits>

#include "autograd/ops/common.h"

namespace tl {
namespace {
using ops::sum_to_shape;
using tensor_list = std::vector<at::Tensor>;

at::Tensor mT(const at::Tensor& a) { return a.transpose(-2, -1); }

struct ScaledDotProductAttentionFn : Function<ScaledDotProductAttentionFn> {
  static constexpr const char* name = "scaled_dot_product_attention";
  static constexpr bool kFreshOutputs = true;
  struct Saved {
    double scale = 1.0;
  };
  static at::Tensor forward(Context& ctx, Saved& saved, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& mask, bool is_causal, double dropout_p,
                            const c10::optional<at::Generator>& gen) {
    TORCH_CHECK(q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2,
                "scaled_dot_product_attention: q, k, v must be (..., T, D), got shapes ", q.sizes(), ", ", k.sizes(),
                ", ", v.sizes());
    TORCH_CHECK(q.size(-1) == k.size(-1), "scaled_dot_product_attention: q and k must have the same last dim, got ",
                q.sizes(), " and ", k.sizes());
    TORCH_CHECK(k.size(-2) == v.size(-2),
                "scaled_dot_product_attention: k and v must have the same number of keys "
                "(dim -2), got ",
                k.sizes(), " and ", v.sizes());
    TORCH_CHECK(!gen || dropout_p == 0.0 || gen->device().type() == q.device().type(),
                "scaled_dot_product_attention: the dropout generator is on ", gen->device(), " but the inputs are on ",
                q.device(), "; give a generator of the inputs' device");
    TORCH_CHECK(dropout_p >= 0.0 && dropout_p <= 1.0, "scaled_dot_product_attention: dropout_p must be in [0, 1], got ",
                dropout_p);
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
    const double neg_inf = -std::numeric_limits<double>::infinity();
    at::Tensor s = at::matmul(q, mT(k));  // (..., Tq, Tk)
    s.mul_(scale);
    if (mask.defined()) {
      TORCH_CHECK(mask.scalar_type() == at::kBool || at::isFloatingType(mask.scalar_type()),
                  "scaled_dot_product_attention: attn_mask must be bool (true = attend) or floating (added to the "
                  "scores), got ",
                  mask.scalar_type());
      const auto shape = at::infer_size(s.sizes(), mask.sizes());
      TORCH_CHECK(s.sizes().equals(shape), "scaled_dot_product_attention: attn_mask of shape ", mask.sizes(),
                  " does not broadcast to the scores' shape ", s.sizes());
      if (mask.scalar_type() == at::kBool) {
        s.masked_fill_(mask.logical_not(), neg_inf);
      } else {
        s.add_(mask);
      }
    }
    if (is_causal) {  // query i attends to keys j <= i (top-left aligned, as torch)
      const int64_t tq = s.size(-2), tk = s.size(-1);
      s.masked_fill_(at::ones({tq, tk}, s.options().dtype(at::kBool)).triu_(1), neg_inf);
    }
    at::Tensor p = at::_softmax(s, -1, /*half_to_float=*/false);  // (..., Tq, Tk)
    at::Tensor drop;
    at::Tensor pd = p;
    if (dropout_p > 0.0) {
      drop = at::empty_like(p);
      if (dropout_p >= 1.0) {
        drop.zero_();
      } else {
        drop.bernoulli_(1.0 - dropout_p, gen).div_(1.0 - dropout_p);
      }
      pd = p * drop;
    }
    ctx.save_for_backward({q, k, v, p, drop});
    saved.scale = scale;
    return at::matmul(pd, v);  // (..., Tq, Dv)
  }

  static tensor_list backward(Context& ctx, const Saved& saved, tensor_list g) {
    const auto& s = ctx.saved();
    const at::Tensor &q = s[0], &k = s[1], &v = s[2], &p = s[3], &drop = s[4];
    const double scale = saved.scale;
    const at::Tensor& go = g[0];  // (..., Tq, Dv)
    at::Tensor grad_q, grad_k, grad_v;
    if (ctx.needs_input_grad(2)) {
      const at::Tensor pd = drop.defined() ? p * drop : p;
      grad_v = sum_to_shape(at::matmul(mT(pd), go), v.sizes());  // (..., Tk, Dv)
    }
    if (ctx.needs_input_grad(0) || ctx.needs_input_grad(1)) {
      at::Tensor dp = at::matmul(go, mT(v));  // (..., Tq, Tk)
      if (drop.defined()) dp.mul_(drop);
      at::Tensor ds = at::_softmax_backward_data(dp, p, p.dim() - 1, p.scalar_type());
      ds.mul_(scale);
      if (ctx.needs_input_grad(0)) grad_q = sum_to_shape(at::matmul(ds, k), q.sizes());      // (..., Tq, D)
      if (ctx.needs_input_grad(1)) grad_k = sum_to_shape(at::matmul(mT(ds), q), k.sizes());  // (..., Tk, D)
    }
    return {grad_q, grad_k, grad_v};
  }
};

}  // namespace

Variable scaled_dot_product_attention(const Variable& q, const Variable& k, const Variable& v,
                                      const at::Tensor& attn_mask, bool is_causal, double dropout_p,
                                      std::optional<at::Generator> generator) {
  const c10::optional<at::Generator> gen = generator ? c10::optional<at::Generator>(*generator) : c10::nullopt;
  return ScaledDotProductAttentionFn::apply(q, k, v, attn_mask, is_causal, dropout_p, gen);
}

}  // namespace tl
