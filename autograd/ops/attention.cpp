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
#include <torch/version.h>  // TORCH_VERSION_MAJOR

#if TORCH_VERSION_MAJOR >= 2
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/autograd.h>
#endif

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <string>

#include "autograd/attention_path.h"
#include "autograd/ops/common.h"

namespace tl {

// Note [fused attention]
// The explicit arithmetic below materialises the (..., Tq, Tk) scores and probabilities and keeps
// the probabilities for backward: at GPT-2 small's 1024 tokens that is 400 MB a layer for 8
// sequences in float32, and a dozen kernels. libtorch 2.x's at::scaled_dot_product_attention picks
// a fused kernel on a GPU (FlashAttention, memory-efficient attention) that never writes them. The
// fused path is FusedAttentionFn: its forward calls at::scaled_dot_product_attention and keeps only
// q, k, v (and the mask); its backward runs that forward again under libtorch's own autograd and
// asks it for the gradients (the recomputation FlashAttention's backward does anyway). It is taken
// under AttentionPath::kAuto for CUDA tensors with no dropout (a recomputed dropout mask would not
// be the forward's), 4-D q, k, v with the same leading dims; the explicit path keeps everything
// else, and the CPU, where its arithmetic is what the tests and the grid compare bit for bit. The
// two paths agree to float rounding (Attention.FusedPathMatchesTheExplicitOne); rows whose keys are
// all masked are NaN on the explicit path and may be 0 on a fused kernel. The device model charges
// both the same FLOPs (the products and the softmax).
namespace {
std::atomic<int> path_setting{-1};  // -1: not read yet
std::atomic<int64_t> fused_calls{0};

AttentionPath path_from_env() {
  const char* e = std::getenv("TAPELINE_ATTENTION");
  const std::string v = e ? e : "auto";
  if (v == "auto" || v.empty()) return AttentionPath::kAuto;
  if (v == "explicit") return AttentionPath::kExplicit;
  if (v == "fused") return AttentionPath::kFused;
  TORCH_CHECK(false, "TAPELINE_ATTENTION='", v, "': accepted: auto, explicit, fused");
}
}  // namespace

void set_attention_path(AttentionPath path) { path_setting = static_cast<int>(path); }

AttentionPath attention_path() {
  int p = path_setting.load();
  if (p < 0) {
    static std::once_flag once;
    std::call_once(once, [] {
      int expected = -1;
      path_setting.compare_exchange_strong(expected, static_cast<int>(path_from_env()));
    });
    p = path_setting.load();
  }
  return static_cast<AttentionPath>(p);
}

bool fused_attention_available() { return TORCH_VERSION_MAJOR >= 2; }

int64_t fused_attention_calls() { return fused_calls.load(); }

namespace {
using ops::mT;
using ops::sum_to_shape;
using tensor_list = std::vector<at::Tensor>;

// Note [attention as bmm]
// When q, k and v share their leading (batch, head) dims, every product is one bmm over (N, T, D)
// views with N the product of those dims, and transposed operands are passed as strides (BLAS
// takes them as they are). q, k and v are made (N, T, D) once in forward, copied only if their
// layout needs it (q, k, v cut out of a fused projection do), and the copies are kept for
// backward, so backward copies nothing. at::matmul on the 4-D tensors would reshape (and copy)
// every operand of every product again. Otherwise (broadcast leading dims) matmul it is.
bool same_leading_dims(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t d = q.dim();
  return d >= 3 && k.dim() == d && v.dim() == d && q.sizes().slice(0, d - 2).equals(k.sizes().slice(0, d - 2)) &&
         q.sizes().slice(0, d - 2).equals(v.sizes().slice(0, d - 2));
}

// t (..., T, D) as (N, T, D).
at::Tensor as_batch(const at::Tensor& t) {
  int64_t n = 1;
  for (int64_t i = 0; i + 2 < t.dim(); ++i) n *= t.size(i);
  return t.reshape({n, t.size(-2), t.size(-1)});
}

// (N, A, B) back to the leading dims of `like` (..., *, *) with trailing dims (A, B).
at::Tensor with_leading_dims(const at::Tensor& t, const at::Tensor& like) {
  std::vector<int64_t> shape(like.sizes().begin(), like.sizes().end() - 2);
  shape.push_back(t.size(1));
  shape.push_back(t.size(2));
  return t.view(shape);
}

// q, k, v (..., T, D): what both paths require of their shapes.
void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2,
              "scaled_dot_product_attention: q, k, v must be (..., T, D), got shapes ", q.sizes(), ", ", k.sizes(),
              ", ", v.sizes());
  TORCH_CHECK(q.size(-1) == k.size(-1), "scaled_dot_product_attention: q and k must have the same last dim, got ",
              q.sizes(), " and ", k.sizes());
  TORCH_CHECK(k.size(-2) == v.size(-2),
              "scaled_dot_product_attention: k and v must have the same number of keys "
              "(dim -2), got ",
              k.sizes(), " and ", v.sizes());
}

// The mask: bool (true = attend) or floating (added), broadcasting to the scores' shape (..., Tq, Tk).
void check_mask(const at::Tensor& mask, at::IntArrayRef scores) {
  TORCH_CHECK(mask.scalar_type() == at::kBool || at::isFloatingType(mask.scalar_type()),
              "scaled_dot_product_attention: attn_mask must be bool (true = attend) or floating (added to the "
              "scores), got ",
              mask.scalar_type());
  const auto shape = at::infer_size(scores, mask.sizes());
  TORCH_CHECK(scores.equals(shape), "scaled_dot_product_attention: attn_mask of shape ", mask.sizes(),
              " does not broadcast to the scores' shape ", scores);
}

// Note [op costs]: the two products, 2 Tq Tk D each per batch-head, and about 5 FLOPs per score for
// scale, mask and softmax. In backward, dq needs dP = dO V^T and dS K; dk and dv one each. Both
// paths are charged alike (Note [fused attention]).
void set_attention_flops(Context& ctx, double scores, int64_t d) {  // scores: N Tq Tk
  const double product = 2.0 * scores * static_cast<double>(d);
  ctx.set_flops(2.0 * product + 5.0 * scores, {2.0 * product + 5.0 * scores, product, product});
}

struct ScaledDotProductAttentionFn : Function<ScaledDotProductAttentionFn> {
  static constexpr const char* name = "scaled_dot_product_attention";
  static constexpr bool kFreshOutputs = true;
  struct Saved {
    double scale = 1.0;
    bool batched = false;  // Note [attention as bmm]
  };
  static at::Tensor forward(Context& ctx, Saved& saved, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& mask, bool is_causal, double dropout_p,
                            const c10::optional<at::Generator>& gen) {
    check_qkv(q, k, v);
    TORCH_CHECK(!gen || dropout_p == 0.0 || gen->device().type() == q.device().type(),
                "scaled_dot_product_attention: the dropout generator is on ", gen->device(), " but the inputs are on ",
                q.device(), "; give a generator of the inputs' device");
    TORCH_CHECK(dropout_p >= 0.0 && dropout_p <= 1.0, "scaled_dot_product_attention: dropout_p must be in [0, 1], got ",
                dropout_p);
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
    const double neg_inf = -std::numeric_limits<double>::infinity();
    const bool batched = same_leading_dims(q, k, v);  // Note [attention as bmm]
    at::Tensor q3, k3, v3;                            // (N, T, D) when batched
    at::Tensor s;                                     // (..., Tq, Tk)
    if (batched) {
      q3 = as_batch(q), k3 = as_batch(k), v3 = as_batch(v);
      s = with_leading_dims(at::bmm(q3, k3.transpose(1, 2)), q);
    } else {
      s = at::matmul(q, mT(k));
    }
    s.mul_(scale);
    if (mask.defined()) {
      check_mask(mask, s.sizes());
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
      } else if (!drop.is_meta()) {  // meta: shapes only (Note [ops on the meta device] in shape.cpp)
        drop.bernoulli_(1.0 - dropout_p, gen).div_(1.0 - dropout_p);
      }
      pd = p * drop;
    }
    // q, k, v themselves (their in-place changes are checked), and their (N, T, D) copies if any.
    auto copy_of = [](const at::Tensor& t3, const at::Tensor& t) { return t3.is_alias_of(t) ? at::Tensor() : t3; };
    if (batched) {
      ctx.save_for_backward({q, k, v, p, drop, copy_of(q3, q), copy_of(k3, k), copy_of(v3, v)});
    } else {
      ctx.save_for_backward({q, k, v, p, drop});
    }
    saved.scale = scale;
    saved.batched = batched;
    set_attention_flops(ctx, static_cast<double>(p.numel()), q.size(-1));
    if (batched) return at::bmm(as_batch(pd), v3).view(out_shape(q, v));  // (..., Tq, Dv)
    return at::matmul(pd, v);                                             // (..., Tq, Dv)
  }

  // (..., Tq, Dv)
  static std::vector<int64_t> out_shape(const at::Tensor& q, const at::Tensor& v) {
    std::vector<int64_t> shape = q.sizes().vec();
    shape.back() = v.size(-1);
    return shape;
  }

  static tensor_list backward(Context& ctx, const Saved& saved, tensor_list g) {
    const auto& s = ctx.saved();
    const at::Tensor &q = s[0], &k = s[1], &v = s[2], &p = s[3], &drop = s[4];
    const double scale = saved.scale;
    const at::Tensor& go = g[0];  // (..., Tq, Dv)
    at::Tensor grad_q, grad_k, grad_v;
    if (saved.batched) {                                          // Note [attention as bmm]
      const at::Tensor q3 = s[5].defined() ? s[5] : as_batch(q);  // (N, Tq, D)
      const at::Tensor k3 = s[6].defined() ? s[6] : as_batch(k);  // (N, Tk, D)
      const at::Tensor v3 = s[7].defined() ? s[7] : as_batch(v);  // (N, Tk, Dv)
      const at::Tensor go3 = as_batch(go);                        // (N, Tq, Dv)
      if (ctx.needs_input_grad(2)) {
        const at::Tensor pd = drop.defined() ? p * drop : p;
        grad_v = at::bmm(as_batch(pd).transpose(1, 2), go3).view(v.sizes());  // (..., Tk, Dv)
      }
      if (ctx.needs_input_grad(0) || ctx.needs_input_grad(1)) {
        at::Tensor dp = with_leading_dims(at::bmm(go3, v3.transpose(1, 2)), p);  // (..., Tq, Tk)
        if (drop.defined()) dp.mul_(drop);
        at::Tensor ds = at::_softmax_backward_data(dp, p, p.dim() - 1, p.scalar_type());
        ds.mul_(scale);
        const at::Tensor ds3 = as_batch(ds);                                                     // (N, Tq, Tk)
        if (ctx.needs_input_grad(0)) grad_q = at::bmm(ds3, k3).view(q.sizes());                  // (..., Tq, D)
        if (ctx.needs_input_grad(1)) grad_k = at::bmm(ds3.transpose(1, 2), q3).view(k.sizes());  // (..., Tk, D)
      }
      return {grad_q, grad_k, grad_v};
    }
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


// Note [fused attention]: libtorch's attention, forward and (recomputed) backward.
#if TORCH_VERSION_MAJOR >= 2
struct FusedAttentionFn : Function<FusedAttentionFn> {
  static constexpr const char* name = "scaled_dot_product_attention";
  static constexpr bool kFreshOutputs = true;
  struct Saved {
    bool causal = false;
  };
  // mask: bool (true = attend) or float (added), broadcastable to (B, H, Tq, Tk), or undefined;
  // causal is folded into it when both are given (libtorch refuses a mask with is_causal).
  static at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                           bool causal) {
    c10::optional<at::Tensor> m;
    if (mask.defined()) m = mask;
    return at::scaled_dot_product_attention(q, k, v, m, 0.0, causal);
  }
  static at::Tensor forward(Context& ctx, Saved& saved, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& mask, bool is_causal) {
    at::Tensor m = mask;
    bool causal = is_causal;
    if (causal && m.defined()) {  // query i attends to keys j <= i (top-left aligned)
      const int64_t tq = q.size(-2), tk = k.size(-2);
      const at::Tensor keep = at::ones({tq, tk}, q.options().dtype(at::kBool)).tril_();  // (Tq, Tk)
      m = m.scalar_type() == at::kBool
              ? m.logical_and(keep)
              : m.masked_fill(keep.logical_not(), -std::numeric_limits<double>::infinity());
      causal = false;
    }
    saved.causal = causal;
    ctx.save_for_backward({q, k, v, m});
    ++fused_calls;
    set_attention_flops(ctx, static_cast<double>(q.size(0) * q.size(1) * q.size(2) * k.size(2)), q.size(-1));
    return attend(q, k, v, m, causal);  // (B, H, Tq, Dv)
  }
  static tensor_list backward(Context& ctx, const Saved& saved, tensor_list g) {
    const auto& s = ctx.saved();
    // libtorch's autograd on, below which tapeline's ops run (Note [ATen's autograd is not involved]).
    c10::impl::LocalDispatchKeySet keys = c10::impl::tls_local_dispatch_key_set();
    keys.excluded_ = keys.excluded_ - c10::autograd_dispatch_keyset_with_ADInplaceOrView;
    const c10::impl::ForceDispatchKeyGuard dispatch(keys);
    const c10::AutoGradMode grad_mode(true);
    tensor_list inputs, wanted;
    for (size_t i = 0; i < 3; ++i) inputs.push_back(s[i].detach().requires_grad_(ctx.needs_input_grad(i)));
    for (size_t i = 0; i < 3; ++i)
      if (ctx.needs_input_grad(i)) wanted.push_back(inputs[i]);
    const at::Tensor out = attend(inputs[0], inputs[1], inputs[2], s[3], saved.causal);
    const tensor_list got = torch::autograd::grad({out}, wanted, {g[0]}, /*retain_graph=*/false,
                                                  /*create_graph=*/false, /*allow_unused=*/true);
    tensor_list grads(3);
    for (size_t i = 0, j = 0; i < 3; ++i)
      if (ctx.needs_input_grad(i)) grads[i] = got[j++];
    return grads;
  }
};
#endif

#if TORCH_VERSION_MAJOR >= 2  // libtorch 1.x has no fused attention: nothing asks
bool takes_fused_path(const Variable& q, const Variable& k, const Variable& v, double dropout_p) {
  if (!fused_attention_available() || dropout_p > 0.0) return false;
  const AttentionPath path = attention_path();
  if (path == AttentionPath::kExplicit) return false;
  if (path == AttentionPath::kAuto && !q.data().is_cuda()) return false;
  return q.data().dim() == 4 && same_leading_dims(q.data(), k.data(), v.data()) &&
         at::isFloatingType(q.data().scalar_type()) && !q.data().is_meta();
}
#endif

}  // namespace

Variable scaled_dot_product_attention(const Variable& q, const Variable& k, const Variable& v,
                                      const at::Tensor& attn_mask, bool is_causal, double dropout_p,
                                      std::optional<at::Generator> generator) {
#if TORCH_VERSION_MAJOR >= 2
  if (takes_fused_path(q, k, v, dropout_p)) {
    check_qkv(q.data(), k.data(), v.data());
    if (attn_mask.defined())
      check_mask(attn_mask, {q.data().size(0), q.data().size(1), q.data().size(2), k.data().size(2)});
    return FusedAttentionFn::apply(q, k, v, attn_mask, is_causal);
  }
#endif
  const c10::optional<at::Generator> gen = generator ? c10::optional<at::Generator>(*generator) : c10::nullopt;
  return ScaledDotProductAttentionFn::apply(q, k, v, attn_mask, is_causal, dropout_p, gen);
}

}  // namespace tl
