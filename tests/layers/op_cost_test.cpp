// The engine's FLOP and byte counts (Note [op costs] in autograd/cost.h) against hand-computed
// formulas for a GPT-2 block and a ResNet basic block.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "autograd/autograd.h"
#include "autograd/cost.h"
#include "layers/models/resnet.h"
#include "layers/nn/transformer.h"

namespace tl {
namespace {

// FLOPs per op name over the nodes of a tape.
std::map<std::string, double> flops_by_op(const Tape& tape) {
  std::map<std::string, double> out;
  for (const auto& n : tape.nodes()) out[n->name()] += n->cost_.flops;
  return out;
}

TEST(OpCost, Gpt2BlockMatchesTheFormulas) {
  const int64_t B = 2, T = 16, d = 32, H = 4;
  TransformerBlock block(TransformerBlockOptions(d, H).causal(true).fused_qkv(true));
  Variable x(at::randn({B, T, d}), /*requires_grad=*/true);
  Tape tape;
  CostMeter forward_meter, backward_meter;
  Variable y;
  {
    TapeGuard tg(tape);
    CostMeterGuard mg(forward_meter);
    y = block.forward(x);
  }
  // GEMMs: qkv (d -> 3d), attention output (d -> d), MLP (d -> 4d -> d): 2 B T (3 + 1 + 4 + 4) d^2.
  const double btd = double(B * T * d);
  const double gemm = 24.0 * btd * d;
  // Attention: Q K^T and P V, 2 B H T T (d / H) each, plus 5 per score (B H T T).
  const double scores = double(B * H * T * T);
  const double attention = 4.0 * double(B) * T * T * d + 5.0 * scores;
  const auto by_op = flops_by_op(tape);
  EXPECT_DOUBLE_EQ(by_op.at("linear"), gemm);
  EXPECT_DOUBLE_EQ(by_op.at("scaled_dot_product_attention"), attention);
  // Everything else is elementwise, one FLOP per element of its largest operand: two LayerNorms,
  // two residual adds, GELU on 4d, and head reshapes; between 5 and 30 passes over (B, T, d).
  const double rest = forward_meter.total().flops - gemm - attention;
  EXPECT_GE(rest, 5 * btd);
  EXPECT_LE(rest, 30 * btd);
  // Bytes: at least every weight once and the input and output (float32).
  double weights = 0;
  for (const auto& p : block.parameters()) weights += tensor_bytes(p.data());
  EXPECT_GE(forward_meter.total().bytes, weights + 2 * 4 * btd);
  EXPECT_GE(forward_meter.total().kernels, 10);
  // The tape printout shows them.
  EXPECT_NE(tape.to_string().find("FLOPs"), std::string::npos);

  {
    CostMeterGuard mg(backward_meter);
    sum(y).backward();
  }
  // Backward: dX and dW of every linear (the forward's twice), the biases' sums (3d + d + 4d + d
  // per row), attention dq (both products again), dk and dv (one product each).
  const double gemm_backward = 2 * gemm + 9 * btd;
  const double attention_backward = 8.0 * double(B) * T * T * d + 5.0 * scores;
  const double rest_backward = backward_meter.total().flops - gemm_backward - attention_backward;
  EXPECT_GE(rest_backward, 5 * btd);
  EXPECT_LE(rest_backward, 40 * btd);
}

TEST(OpCost, ResNetBasicBlockMatchesTheFormulas) {
  const int64_t N = 2, C = 8, Hs = 10, W = 10;
  BasicBlock block(C, C, /*stride=*/1);
  Variable x(at::randn({N, C, Hs, W}), true);
  Tape tape;
  CostMeter meter;
  {
    TapeGuard tg(tape);
    CostMeterGuard mg(meter);
    block.forward(x);
  }
  // Two 3x3 convolutions, C -> C, same size: 2 (N C H W) (C 9) each.
  const double nchw = double(N * C * Hs * W);
  const auto by_op = flops_by_op(tape);
  EXPECT_DOUBLE_EQ(by_op.at("conv2d"), 2 * 2 * nchw * C * 9);
  // Two batch norms, the residual add and two ReLUs: one FLOP per element each.
  EXPECT_DOUBLE_EQ(meter.total().flops - by_op.at("conv2d"), 5 * nchw);
}

TEST(OpCost, ViewsCostNothing) {
  Variable x(at::randn({4, 6}), true);
  CostMeter meter;
  {
    CostMeterGuard mg(meter);
    Variable y = transpose(reshape(x, {6, 4}), 0, 1);
    (void)y;
  }
  EXPECT_EQ(meter.total().kernels, 0);
  EXPECT_EQ(meter.total().bytes, 0);
}

}  // namespace
}  // namespace tl
