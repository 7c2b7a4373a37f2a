// Split backward (Note [split backward] in autograd/engine.cpp): backward_inputs() computes the
// gradients of the given input leaves now and leaves every weight's to DeferredWeightGrads::run();
// the two together give exactly one backward's gradients.
#include <functional>
#include <map>

#include "autograd/function.h"
#include "tests/common/testing.h"

namespace tl {
namespace {
using testing::error_of;

struct Graph {
  std::string name;
  std::vector<int64_t> input_shape;
  std::vector<std::vector<int64_t>> weight_shapes;
  /// (input, weights) -> scalar loss
  std::function<Variable(const Variable&, const variable_list&)> loss;
};

struct Grads {
  at::Tensor input;
  std::vector<at::Tensor> weights;
};

// One backward of g's loss, whole (split = false) or as B then W, from the same numbers each time.
Grads run(const Graph& g, bool split, size_t* held = nullptr) {
  at::manual_seed(3);
  Variable x(at::randn(g.input_shape, at::kDouble), true);
  variable_list w;
  for (const auto& s : g.weight_shapes) w.emplace_back(at::randn(s, at::kDouble), true);
  Variable loss = g.loss(x, w);
  if (!split) {
    loss.backward();
  } else {
    DeferredWeightGrads later = backward_inputs({loss}, {}, {x});
    for (size_t i = 0; i < w.size(); ++i)
      EXPECT_FALSE(w[i].grad().defined()) << g.name << ": weight " << i << " has a gradient before W";
    EXPECT_GT(later.ops(), 0u) << g.name;
    if (held) *held = later.held_bytes();
    later.run();
    EXPECT_EQ(later.ops(), 0u) << g.name;
  }
  Grads out{x.grad(), {}};
  for (const auto& v : w) out.weights.push_back(v.grad());
  return out;
}

void expect_bitwise(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
  ASSERT_EQ(a.defined(), b.defined()) << what;
  if (!a.defined()) return;
  EXPECT_TRUE(a.equal(b)) << what << ": differs by " << (a - b).abs().max().item<double>();
}

TEST(SplitBackward, EveryOpFamilyGivesOneBackwardsGradientsBitForBit) {
  const at::Tensor target = at::tensor({1, 0, 2, 1}, at::kLong);
  const std::vector<Graph> graphs = {
      {"linear with bias", {4, 5}, {{3, 5}, {3}}, [](auto& x, auto& w) { return sum(tanh(linear(x, w[0], w[1]))); }},
      {"matmul and bmm", {2, 4, 5}, {{5, 3}, {2, 3, 6}},
       [](auto& x, auto& w) { return sum(bmm(matmul(x, w[0]), w[1]) * 0.5); }},
      {"conv2d, pools", {2, 3, 6, 6}, {{4, 3, 3, 3}, {4}},
       [](auto& x, auto& w) {
         Variable y = conv2d(x, w[0], w[1], {1, 1}, {1, 1});
         return sum(max_pool2d(relu(y), {2, 2})) + mean(avg_pool2d(y, {2, 2}));
       }},
      {"batch norm (training)", {4, 3, 2, 2}, {{3}, {3}},
       [](auto& x, auto& w) {
         at::Tensor rm = at::zeros({3}, at::kDouble), rv = at::ones({3}, at::kDouble);
         return sum(pow(batch_norm(x, w[0], w[1], rm, rv, true, 0.1, 1e-5), 2.0));
       }},
      {"layer norm, gelu", {4, 6}, {{6}, {6}},
       [](auto& x, auto& w) { return sum(gelu(layer_norm(x, {6}, w[0], w[1])) * x); }},
      {"embedding", {4, 5}, {{7, 5}},
       [](auto& x, auto& w) { return sum(embedding(w[0], at::tensor({1, 3, 3, 6}, at::kLong)) * x); }},
      {"attention", {2, 5, 8}, {{8, 8}, {8, 8}, {8, 8}},
       [](auto& x, auto& w) {
         auto heads = [](const Variable& t) { return transpose(reshape(t, {2, 5, 2, 4}), 1, 2); };
         Variable o = scaled_dot_product_attention(heads(linear(x, w[0])), heads(linear(x, w[1])),
                                                   heads(linear(x, w[2])), at::Tensor(), true);
         return sum(o * o);
       }},
      {"elementwise with weights", {3, 4}, {{3, 4}, {4}},
       [](auto& x, auto& w) { return sum(x * w[0] + x / (w[1] * w[1] + 1.0) - exp(w[0] - x)); }},
      {"cat, split, where", {3, 4}, {{3, 4}},
       [](auto& x, auto& w) {
         variable_list parts = split(cat({x, w[0]}, 1), 2, 1);
         return sum(where(x.data().narrow(1, 0, 2) > 0, parts[0] * parts[3], parts[1] * parts[2]));
       }},
      {"cross entropy, mse", {4, 5}, {{3, 5}},
       [target](auto& x, auto& w) {
         Variable logits = linear(x, w[0]);
         return cross_entropy(logits, target) + mse_loss(logits, Variable(at::zeros({4, 3}, at::kDouble)));
       }},
      {"tied weight used twice", {4, 5}, {{5, 5}},
       [](auto& x, auto& w) { return sum(linear(tanh(linear(x, w[0])), w[0]) * x); }},
  };
  for (const Graph& g : graphs) {
    SCOPED_TRACE(g.name);
    const Grads whole = run(g, false);
    size_t held = 0;
    const Grads parts = run(g, true, &held);
    expect_bitwise(whole.input, parts.input, g.name + ": input");
    for (size_t i = 0; i < whole.weights.size(); ++i)
      expect_bitwise(whole.weights[i], parts.weights[i], g.name + ": weight " + std::to_string(i));
    EXPECT_GT(held, 0u) << g.name << ": B keeps the output gradients and saved tensors of the ops with weights";
  }
}

// A product whose backward must run once (as the boundary's wire must).
struct MulOnce : Function<MulOnce> {
  static constexpr bool kSplitBackward = false;
  static at::Tensor forward(Context& ctx, const at::Tensor& a, const at::Tensor& b) {
    ctx.save_for_backward({a, b});
    return a * b;
  }
  static std::vector<at::Tensor> backward(Context& ctx, std::vector<at::Tensor> g) {
    return {g[0] * ctx.saved()[1], g[0] * ctx.saved()[0]};
  }
};

TEST(SplitBackward, AnOpWithoutWeightsOrOfTheWrongKindRunsWholeInB) {
  // No weight at all: nothing is deferred.
  Variable x(at::randn({3}), true);
  DeferredWeightGrads none = backward_inputs({sum(x * x)}, {}, {x});
  EXPECT_EQ(none.ops(), 0u);
  EXPECT_TRUE(x.grad().defined());

  // An op that declares kSplitBackward = false computes its weight's gradient in B.
  Variable a(at::randn({3}), true), b(at::randn({3}), true);
  DeferredWeightGrads later = backward_inputs({sum(MulOnce::apply(a, b))}, {}, {a});
  EXPECT_EQ(later.ops(), 0u);
  EXPECT_TRUE(b.grad().defined());
  EXPECT_TRUE(b.grad().equal(a.data()));
}

TEST(SplitBackward, WeightHooksRunInWAndFreedOpsAreAClearError) {
  Variable x(at::randn({2, 3}), true), w(at::randn({4, 3}), true);
  int calls = 0;
  w.register_hook([&](const at::Tensor& g) {
    ++calls;
    return g * 2;
  });
  DeferredWeightGrads later;
  {
    Tape tape;
    TapeGuard guard(tape);
    later = backward_inputs({sum(linear(x, w))}, {}, {x});
    EXPECT_EQ(calls, 0);
    later.run();
    EXPECT_EQ(calls, 1);
    EXPECT_TRUE(w.grad().equal(2 * at::ones({2, 4}).t().mm(x.data())));
  }
  // The tape is reset between B and W: W says what happened.
  DeferredWeightGrads orphan;
  {
    Tape tape;
    TapeGuard guard(tape);
    orphan = backward_inputs({sum(linear(x, w))}, {}, {x});
    tape.reset();
  }
  const std::string e = error_of([&] { orphan.run(); });
  EXPECT_NE(e.find("was freed before its weight gradients ran"), std::string::npos) << e;
  // Inputs must be leaves.
  Variable y = x * 2.0;
  const std::string e2 = error_of([&] { backward_inputs({sum(y * 2.0)}, {}, {y}); });
  EXPECT_NE(e2.find("every input must be a leaf"), std::string::npos) << e2;
}

}  // namespace
}  // namespace tl
