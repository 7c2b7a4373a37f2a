// scaled_dot_product_attention: finite differences in float64 and the libtorch-autograd oracle on
// the explicit formula softmax(q k^T / sqrt(D) + mask) v, with bool and float masks, causal
// masking, broadcast heads and seeded dropout.
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <limits>

#include "autograd/attention_path.h"
#include "tests/common/testing.h"

namespace tl {
namespace {
using testing::gradcheck;
using testing::matches_torch;
using Shape = std::vector<int64_t>;

using testing::rnd;
using testing::str;

enum class Mask { None, Bool, Float };

// The reference, written out with libtorch ops on tensors that require grad.
at::Tensor reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                     bool causal, double dropout_p, uint64_t seed) {
  at::Tensor s = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  const double inf = std::numeric_limits<double>::infinity();
  if (mask.defined()) {
    s = mask.scalar_type() == at::kBool ? s.masked_fill(mask.logical_not(), -inf) : s + mask;
  }
  if (causal) {
    s = s.masked_fill(at::ones({s.size(-2), s.size(-1)}, at::TensorOptions(at::kBool)).triu(1), -inf);
  }
  at::Tensor p = at::softmax(s, -1);
  if (dropout_p > 0) {
    at::Tensor m = at::empty_like(p).bernoulli_(1 - dropout_p, at::detail::createCPUGenerator(seed));
    p = p * m / (1 - dropout_p);
  }
  return at::matmul(p, v);
}

TEST(Attention, GradcheckAndOracle) {
  at::manual_seed(0);
  struct Case {
    Shape q, k, v;
    Mask mask;
    Shape mask_shape;
    bool causal;
    double dropout;
  };
  const std::vector<Case> cases = {
      {{1, 2, 3, 4}, {1, 2, 3, 4}, {1, 2, 3, 4}, Mask::None, {}, false, 0.0},
      {{2, 1, 2, 3}, {2, 1, 4, 3}, {2, 1, 4, 2}, Mask::None, {}, false, 0.0},             // Tq != Tk, Dv != D
      {{2, 1, 3, 2}, {2, 1, 4, 2}, {2, 1, 4, 3}, Mask::Bool, {2, 1, 1, 4}, false, 0.0},    // key padding
      {{1, 2, 3, 2}, {1, 2, 3, 2}, {1, 2, 3, 2}, Mask::Float, {3, 3}, false, 0.0},         // additive bias
      {{1, 2, 4, 2}, {1, 2, 4, 2}, {1, 2, 4, 2}, Mask::None, {}, true, 0.0},               // causal
      {{2, 1, 4, 2}, {2, 1, 4, 2}, {2, 1, 4, 2}, Mask::Bool, {2, 1, 1, 4}, true, 0.0},     // causal + padding
      {{1, 2, 3, 2}, {1, 1, 3, 2}, {1, 1, 3, 2}, Mask::None, {}, false, 0.0},              // k, v shared by heads
      {{1, 2, 3, 2}, {1, 2, 3, 2}, {1, 2, 3, 2}, Mask::None, {}, false, 0.3},              // dropout
      {{1, 1, 4, 2}, {1, 1, 4, 2}, {1, 1, 4, 2}, Mask::Bool, {1, 1, 4, 4}, true, 0.2},     // all at once
  };
  for (const auto& c : cases) {
    const std::string label = "sdpa q " + str(c.q) + " k " + str(c.k) + " v " + str(c.v) +
                              (c.mask == Mask::Bool ? " bool mask " : c.mask == Mask::Float ? " float mask " : "") +
                              (c.mask != Mask::None ? str(c.mask_shape) : "") + (c.causal ? " causal" : "") +
                              (c.dropout > 0 ? " dropout " + std::to_string(c.dropout) : "");
    at::Tensor mask;
    if (c.mask == Mask::Bool) {
      mask = at::rand(c.mask_shape) > 0.4;
      mask.select(-1, 0).fill_(true);  // every query keeps at least key 0 (also under causal)
    } else if (c.mask == Mask::Float) {
      mask = rnd(c.mask_shape, at::kFloat);
    }
    const uint64_t seed = 99;
    auto fn = [&](const variable_list& v) {
      return scaled_dot_product_attention(v[0], v[1], v[2], mask, c.causal, c.dropout,
                                          at::detail::createCPUGenerator(seed));
    };
    auto ref = [&](const std::vector<at::Tensor>& t) {
      return reference(t[0], t[1], t[2], mask, c.causal, c.dropout, seed);
    };
    EXPECT_TRUE(gradcheck(fn, {rnd(c.q), rnd(c.k), rnd(c.v)}, label));
    EXPECT_TRUE(matches_torch(fn, ref, {rnd(c.q, at::kFloat), rnd(c.k, at::kFloat), rnd(c.v, at::kFloat)}, label));
  }
  // A realistic size.
  const at::Tensor pad = at::arange(16).view({1, 1, 1, 16}) < at::tensor({12, 16}, at::kLong).view({2, 1, 1, 1});
  EXPECT_TRUE(matches_torch(
      [&](const variable_list& v) { return scaled_dot_product_attention(v[0], v[1], v[2], pad, true); },
      [&](const std::vector<at::Tensor>& t) { return reference(t[0], t[1], t[2], pad, true, 0.0, 0); },
      {rnd({2, 4, 16, 8}, at::kFloat), rnd({2, 4, 16, 8}, at::kFloat), rnd({2, 4, 16, 8}, at::kFloat)},
      "sdpa (2, 4, 16, 8) causal + padding"));
  Variable q(rnd({1, 1, 2, 3}), true), k(rnd({1, 1, 2, 4}), true);
  EXPECT_THROW(scaled_dot_product_attention(q, k, k), c10::Error) << "sdpa: head dim mismatch";
  EXPECT_THROW(scaled_dot_product_attention(q, q, q, at::ones({3, 3}, at::kBool)), c10::Error)
      << "sdpa: mask that does not broadcast";
}

// Note [fused attention]: libtorch's fused attention, forced on the CPU, against the same oracle
// and finite differences; the cases it must leave to the explicit path, and a bad setting.
TEST(Attention, FusedPathMatchesTheExplicitOne) {
  if (!fused_attention_available()) GTEST_SKIP() << "this libtorch (1.x) has no fused attention";
  struct Restore {
    AttentionPath before = attention_path();
    ~Restore() { set_attention_path(before); }
  } restore;
  set_attention_path(AttentionPath::kFused);
  at::manual_seed(1);
  struct Case {
    Shape q, k;
    Mask mask;
    Shape mask_shape;
    bool causal;
  };
  const std::vector<Case> cases = {
      {{1, 2, 3, 4}, {1, 2, 3, 4}, Mask::None, {}, false},
      {{2, 1, 3, 2}, {2, 1, 4, 2}, Mask::Bool, {2, 1, 1, 4}, false},  // key padding, Tq != Tk
      {{1, 2, 3, 2}, {1, 2, 3, 2}, Mask::Float, {3, 3}, false},       // additive bias
      {{1, 2, 4, 2}, {1, 2, 4, 2}, Mask::None, {}, true},             // causal
      {{2, 1, 4, 2}, {2, 1, 4, 2}, Mask::Bool, {2, 1, 1, 4}, true},   // causal + padding: one mask
      {{1, 2, 4, 2}, {1, 2, 4, 2}, Mask::Float, {4, 4}, true},        // causal + bias
  };
  for (const auto& c : cases) {
    const std::string label = "fused sdpa q " + str(c.q) + " k " + str(c.k) +
                              (c.mask == Mask::Bool ? " bool mask" : c.mask == Mask::Float ? " float mask" : "") +
                              (c.causal ? " causal" : "");
    at::Tensor mask;
    if (c.mask == Mask::Bool) {
      mask = at::rand(c.mask_shape) > 0.4;
      mask.select(-1, 0).fill_(true);  // every query keeps key 0
    } else if (c.mask == Mask::Float) {
      mask = rnd(c.mask_shape, at::kFloat);
    }
    auto fn = [&](const variable_list& v) { return scaled_dot_product_attention(v[0], v[1], v[2], mask, c.causal); };
    auto ref = [&](const std::vector<at::Tensor>& t) { return reference(t[0], t[1], t[2], mask, c.causal, 0.0, 0); };
    const int64_t before = fused_attention_calls();
    EXPECT_TRUE(gradcheck(fn, {rnd(c.q), rnd(c.k), rnd(c.k)}, label));
    EXPECT_TRUE(matches_torch(fn, ref, {rnd(c.q, at::kFloat), rnd(c.k, at::kFloat), rnd(c.k, at::kFloat)}, label));
    EXPECT_GT(fused_attention_calls(), before) << label << ": the fused path was not taken";
  }
  // Left to the explicit path: dropout (its mask could not be recomputed), broadcast heads.
  const int64_t before = fused_attention_calls();
  Variable q(rnd({1, 2, 3, 2}, at::kFloat), true), kv(rnd({1, 1, 3, 2}, at::kFloat), true);
  scaled_dot_product_attention(q, q, q, {}, false, 0.3, at::detail::createCPUGenerator(3)).data().sum().item();
  scaled_dot_product_attention(q, kv, kv).data().sum().item();
  EXPECT_EQ(fused_attention_calls(), before);
  // Explicit on the CPU under kAuto: the CPU keeps its arithmetic.
  set_attention_path(AttentionPath::kAuto);
  scaled_dot_product_attention(q, q, q).data().sum().item();
  EXPECT_EQ(fused_attention_calls(), before);
}

}  // namespace
}  // namespace tl
