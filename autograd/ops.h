#pragma once
// Differentiable ops over Variables. Each family lives in autograd/ops/<family>.cpp with forward
// and backward side by side. All ops accept CPU and CUDA tensors (ATen dispatches); binary
// elementwise ops broadcast like ATen. An undefined Variable passed for an optional input
// (bias, weight) means "none".

#include <ATen/ATen.h>

#include <optional>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/tape.h"
#include "autograd/variable.h"

namespace tl {

// ---- elementwise (ops/elementwise.cpp) -------------------------------------------------------
Variable add(const Variable& a, const Variable& b);
Variable sub(const Variable& a, const Variable& b);
Variable mul(const Variable& a, const Variable& b);
Variable div(const Variable& a, const Variable& b);
Variable add(const Variable& a, double s);
Variable mul(const Variable& a, double s);
Variable neg(const Variable& a);
Variable pow(const Variable& a, double exponent);
Variable exp(const Variable& a);
Variable log(const Variable& a);
Variable sqrt(const Variable& a);
Variable rsqrt(const Variable& a);
Variable abs(const Variable& a);
/// Gradient flows where min <= a <= max (as torch.clamp).
Variable clamp(const Variable& a, std::optional<double> min, std::optional<double> max);

Variable operator+(const Variable& a, const Variable& b);
Variable operator-(const Variable& a, const Variable& b);
Variable operator*(const Variable& a, const Variable& b);
Variable operator/(const Variable& a, const Variable& b);
Variable operator-(const Variable& a);
Variable operator+(const Variable& a, double s);
Variable operator-(const Variable& a, double s);
Variable operator*(const Variable& a, double s);
Variable operator/(const Variable& a, double s);
Variable operator*(double s, const Variable& a);

// ---- activations (ops/activations.cpp) -------------------------------------------------------
Variable relu(const Variable& x);
/// approximate = false: x * Phi(x) (erf form); true: GPT-2's tanh approximation.
Variable gelu(const Variable& x, bool tanh_approximate = false);
Variable tanh(const Variable& x);
Variable sigmoid(const Variable& x);
Variable silu(const Variable& x);

// ---- reductions (ops/reductions.cpp) ---------------------------------------------------------
Variable sum(const Variable& x);
Variable sum(const Variable& x, at::IntArrayRef dims, bool keepdim = false);
Variable mean(const Variable& x);
Variable mean(const Variable& x, at::IntArrayRef dims, bool keepdim = false);
/// Max over all elements; the gradient goes to the (first) arg max.
Variable max(const Variable& x);
/// Max values over `dim`; the gradient goes to the arg max along dim.
Variable max(const Variable& x, int64_t dim, bool keepdim = false);
/// Variance over dims with Bessel's correction when unbiased.
Variable var(const Variable& x, at::IntArrayRef dims, bool unbiased = true, bool keepdim = false);
/// p-norm over dims (all dims when empty).
Variable norm(const Variable& x, double p = 2.0, at::IntArrayRef dims = {}, bool keepdim = false);

// ---- shape (ops/shape.cpp) -------------------------------------------------------------------
Variable reshape(const Variable& x, at::IntArrayRef shape);
Variable view(const Variable& x, at::IntArrayRef shape);
Variable permute(const Variable& x, at::IntArrayRef dims);
Variable transpose(const Variable& x, int64_t dim0, int64_t dim1);
Variable flatten(const Variable& x, int64_t start_dim = 0, int64_t end_dim = -1);
Variable squeeze(const Variable& x, int64_t dim);
Variable unsqueeze(const Variable& x, int64_t dim);
Variable expand(const Variable& x, at::IntArrayRef sizes);
Variable narrow(const Variable& x, int64_t dim, int64_t start, int64_t length);
Variable slice(const Variable& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Variable cat(const variable_list& xs, int64_t dim = 0);
variable_list split(const Variable& x, int64_t split_size, int64_t dim = 0);
variable_list chunk(const Variable& x, int64_t chunks, int64_t dim = 0);
Variable index_select(const Variable& x, int64_t dim, const at::Tensor& index);
Variable gather(const Variable& x, int64_t dim, const at::Tensor& index);
/// weight (V, D), indices (...) int64 -> (..., D). Rows at padding_idx get no gradient (-1: none).
Variable embedding(const Variable& weight, const at::Tensor& indices, int64_t padding_idx = -1);
Variable masked_fill(const Variable& x, const at::Tensor& mask, double value);
/// cond ? a : b, broadcasting.
Variable where(const at::Tensor& condition, const Variable& a, const Variable& b);

// ---- linear algebra (ops/linalg.cpp) ---------------------------------------------------------
/// torch.matmul semantics: 1-D, 2-D and batched (broadcast) operands.
Variable matmul(const Variable& a, const Variable& b);
/// (B, n, m) x (B, m, p) -> (B, n, p)
Variable bmm(const Variable& a, const Variable& b);
/// x (..., in), weight (out, in), bias (out) or undefined -> (..., out)
Variable linear(const Variable& x, const Variable& weight, const Variable& bias = {});

// ---- convolution and pooling (ops/conv_pool.cpp) ---------------------------------------------
/// x (N, C, H, W), weight (O, C/groups, kH, kW), bias (O) or undefined.
Variable conv2d(const Variable& x, const Variable& weight, const Variable& bias = {}, at::IntArrayRef stride = {1, 1},
                at::IntArrayRef padding = {0, 0}, at::IntArrayRef dilation = {1, 1}, int64_t groups = 1);
Variable max_pool2d(const Variable& x, at::IntArrayRef kernel, at::IntArrayRef stride = {},
                    at::IntArrayRef padding = {0, 0}, at::IntArrayRef dilation = {1, 1}, bool ceil_mode = false);
Variable avg_pool2d(const Variable& x, at::IntArrayRef kernel, at::IntArrayRef stride = {},
                    at::IntArrayRef padding = {0, 0}, bool ceil_mode = false, bool count_include_pad = true);
Variable adaptive_avg_pool2d(const Variable& x, at::IntArrayRef output_size);

// ---- normalisation, dropout, softmax (ops/nn.cpp) --------------------------------------------
/// x (N, C, ...). In training, batch statistics are used and running_mean/var (if defined) are
/// updated in place with `momentum`; in eval the running statistics are used.
Variable batch_norm(const Variable& x, const Variable& weight, const Variable& bias, const at::Tensor& running_mean,
                    const at::Tensor& running_var, bool training, double momentum = 0.1, double eps = 1e-5);
Variable layer_norm(const Variable& x, at::IntArrayRef normalized_shape, const Variable& weight = {},
                    const Variable& bias = {}, double eps = 1e-5);
/// Inverted dropout with an explicit generator (undefined: ATen's default generator).
Variable dropout(const Variable& x, double p, bool training, std::optional<at::Generator> generator = std::nullopt);
Variable softmax(const Variable& x, int64_t dim);
Variable log_softmax(const Variable& x, int64_t dim);

// ---- losses (ops/loss.cpp) -------------------------------------------------------------------
enum class Reduction { None, Mean, Sum };
/// logits (N, C) or (N, C, d...), target int64 (N) or (N, d...). Mean over non-ignored targets.
Variable cross_entropy(const Variable& logits, const at::Tensor& target, int64_t ignore_index = -100,
                       double label_smoothing = 0.0, Reduction reduction = Reduction::Mean);
/// log_probs (N, C), target int64 (N).
Variable nll_loss(const Variable& log_probs, const at::Tensor& target, int64_t ignore_index = -100,
                  Reduction reduction = Reduction::Mean);
Variable mse_loss(const Variable& input, const Variable& target, Reduction reduction = Reduction::Mean);

// ---- attention (ops/attention.cpp) -----------------------------------------------------------
/// q (B, H, Tq, D), k, v (B, H, Tk, D) -> (B, H, Tq, D). softmax(q k^T / sqrt(D) + mask) v.
/// attn_mask: bool (true = attend) or float (added), broadcastable to (B, H, Tq, Tk), or
/// undefined. is_causal masks keys after the query position.
Variable scaled_dot_product_attention(const Variable& q, const Variable& k, const Variable& v,
                                      const at::Tensor& attn_mask = {}, bool is_causal = false,
                                      double dropout_p = 0.0, std::optional<at::Generator> generator = std::nullopt);

}  // namespace tl
