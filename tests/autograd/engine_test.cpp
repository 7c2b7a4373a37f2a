// The engine itself: graph shapes, retain_graph, grad mode, hooks, detach, accumulation, threads
// and scoped tapes, long chains, and the printed tape.
#include <optional>
#include <thread>

#include "autograd/leaf_final.h"
#include "tests/common/testing.h"

namespace tl {
namespace {

Variable leaf(std::vector<double> v) {
  return Variable(at::tensor(v, at::kDouble), true);
}

TEST(Engine, DiamondSumsBothPaths) {
  Variable x = leaf({1.0, 2.0});
  Variable a = x * 3.0;
  Variable b = x * x;
  sum(a + b).backward();  // d/dx (3x + x^2) = 3 + 2x
  EXPECT_TRUE(testing::all_close(x.grad(), at::tensor({5.0, 7.0}, at::kDouble), "diamond"));
}

TEST(Engine, SharedSubexpressionUsedManyTimes) {
  Variable x = leaf({0.5});
  Variable s = exp(x);
  Variable y = s * s * s;  // e^{3x}
  y.backward(at::ones({1}, at::kDouble));
  EXPECT_NEAR(x.grad().item<double>(), 3 * std::exp(1.5), 1e-12);
}

TEST(Engine, SecondBackwardWithoutRetainIsAClearError) {
  Variable x = leaf({1.0, 2.0});
  Variable y = sum(x * x);
  y.backward({}, /*retain_graph=*/true);
  y.backward();
  EXPECT_TRUE(testing::all_close(x.grad(), at::tensor({4.0, 8.0}, at::kDouble), "two backwards accumulate"));
  try {
    y.backward();
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("retain_graph"), std::string::npos) << e.what();
  }
}

TEST(Engine, NoGradRecordsNothing) {
  Variable x = leaf({1.0});
  Tape tape;
  TapeGuard guard(tape);
  {
    NoGradGuard ng;
    Variable y = x * 2.0;
    EXPECT_FALSE(y.requires_grad());
  }
  EXPECT_EQ(tape.size(), 0u);
  Variable z = x * 2.0;
  EXPECT_TRUE(z.requires_grad());
  EXPECT_EQ(tape.size(), 1u);
}

TEST(Engine, HooksCanReplaceGradients) {
  Variable x = leaf({1.0, 2.0});
  Variable h = x * 2.0;
  int calls = 0;
  h.register_hook([&](const at::Tensor& g) {
    ++calls;
    return g * 10;
  });
  x.register_hook([&](const at::Tensor& g) { return g + 1; });
  sum(h).backward();
  EXPECT_EQ(calls, 1);
  // d sum(2x)/dx = 2, times 10 from the non-leaf hook, plus 1 from the leaf hook.
  EXPECT_TRUE(testing::all_close(x.grad(), at::tensor({21.0, 21.0}, at::kDouble), "hooks"));
}

TEST(Engine, LeafHookSeesTheSummedGradientOnce) {
  Variable x = leaf({1.0});
  int calls = 0;
  x.register_hook([&](const at::Tensor& g) {
    ++calls;
    return at::Tensor();
  });
  sum(x * 2.0 + x * 3.0).backward();
  EXPECT_EQ(calls, 1);
  EXPECT_DOUBLE_EQ(x.grad().item<double>(), 5.0);
}

TEST(Engine, DetachCutsTheGraph) {
  Variable x = leaf({3.0});
  Variable y = x * x;
  Variable d = y.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.is_leaf());
  sum(y * d).backward();  // d is a constant 9: d/dx (x^2 * 9) = 18 x = 54
  EXPECT_DOUBLE_EQ(x.grad().item<double>(), 54.0);
}

TEST(Engine, GradientsAccumulateUntilZeroed) {
  Variable x = leaf({1.0});
  sum(x * 2.0).backward();
  sum(x * 3.0).backward();
  EXPECT_DOUBLE_EQ(x.grad().item<double>(), 5.0);
  x.zero_grad();
  sum(x * 4.0).backward();
  EXPECT_DOUBLE_EQ(x.grad().item<double>(), 4.0);
}

TEST(Engine, TwoThreadsRecordIndependentTapes) {
  auto work = [](double scale, double* out) {
    Variable x(at::full({64}, scale, at::kDouble), true);
    Tape tape;
    TapeGuard guard(tape);
    Variable y = x;
    for (int i = 0; i < 2000; ++i) y = y * 1.0001;
    sum(y).backward();
    *out = x.grad()[0].item<double>();
  };
  double a = 0, b = 0;
  std::thread t1(work, 1.0, &a), t2(work, 2.0, &b);
  t1.join();
  t2.join();
  EXPECT_NEAR(a, std::pow(1.0001, 2000), 1e-9);
  EXPECT_NEAR(b, std::pow(1.0001, 2000), 1e-9);
}

TEST(Engine, InterleavedMicroBatchTapesOnOneThread) {
  // 1F1B: forward of micro-batch 0, forward of 1, backward of 0, backward of 1.
  Variable w = leaf({2.0});
  Tape t0, t1;
  Variable y0, y1;
  {
    TapeGuard g(t0);
    y0 = sum(w * 3.0);
  }
  {
    TapeGuard g(t1);
    y1 = sum(w * w);
  }
  EXPECT_EQ(t0.size(), 2u);
  EXPECT_EQ(t1.size(), 2u);
  y0.backward();
  EXPECT_DOUBLE_EQ(w.grad().item<double>(), 3.0);
  t0.reset();  // micro-batch 0 freed as a unit
  y1.backward();
  EXPECT_DOUBLE_EQ(w.grad().item<double>(), 3.0 + 4.0);
}

TEST(Engine, GraphAcrossTapesIsMergedBySequence) {
  Variable x = leaf({2.0});
  Tape a, b;
  Variable h;
  {
    TapeGuard g(a);
    h = x * x;  // recorded on a
  }
  Variable y;
  {
    TapeGuard g(b);
    y = sum(h * 3.0 + h);  // recorded on b, uses h from a
  }
  y.backward();
  EXPECT_DOUBLE_EQ(x.grad().item<double>(), 4.0 * 2.0 * 2.0);
}

TEST(Engine, ResetTapeMakesBackwardAClearError) {
  Variable x = leaf({1.0});
  Tape tape;
  Variable y;
  {
    TapeGuard g(tape);
    y = sum(x * 2.0);
  }
  tape.reset();
  EXPECT_THROW(y.backward(), c10::Error);
}

TEST(Engine, HundredThousandOpChainBackwardAndFree) {
  Variable x(at::ones({1}, at::kFloat), true);
  {
    Tape tape;
    TapeGuard g(tape);
    Variable y = x;
    for (int i = 0; i < 100000; ++i) y = y + 1.0;
    y.backward(at::ones({1}));
    EXPECT_FLOAT_EQ(x.grad().item<float>(), 1.0f);
  }
  // And a chain that is never backwarded is freed without recursion when its tape dies.
  {
    Tape tape;
    TapeGuard g(tape);
    Variable y = x;
    for (int i = 0; i < 100000; ++i) y = y * 1.0;
  }
  SUCCEED();
}

TEST(Engine, DefaultTapeStaysSmallInATrainingLoop) {
  Variable w(at::randn({8}), true);
  for (int i = 0; i < 3000; ++i) {
    sum(w * w).backward();
    // An unused graph that is dropped right away must not pile up either.
    (void)(w * 2.0);
  }
  EXPECT_LT(Tape::current().size(), 10000u);
}

TEST(Engine, InPlaceChangeOfSavedTensorIsDetected) {
  Variable w = leaf({1.0, 2.0});
  Variable x = leaf({3.0, 4.0});
  Variable y = sum(w * x);
  {
    NoGradGuard ng;
    w.mutable_data().add_(1.0);  // an optimizer step before the pending backward
  }
  try {
    y.backward();
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("modified in place"), std::string::npos) << e.what();
  }
}

TEST(Engine, BackwardOfNonScalarNeedsAGradient) {
  Variable x = leaf({1.0, 2.0});
  EXPECT_THROW((x * 2.0).backward(), c10::Error);
  Variable c(at::ones({1}));
  EXPECT_THROW(c.backward(), c10::Error);  // does not require grad
}

TEST(Engine, PrintedTapeOfASmallModel) {
  Variable w1(at::randn({4, 3}), true), w2(at::randn({2, 4}), true);
  Variable x(at::randn({5, 3}));
  Tape tape;
  TapeGuard g(tape);
  Variable h = x * 1.0;  // no grad needed: not recorded
  Variable y = sum(mul(h, h) * 0.5);
  (void)w1;
  (void)w2;
  EXPECT_EQ(tape.size(), 0u);
  Variable z = sum(mul(x, Variable(at::randn({5, 3}), true)));
  const std::string s = tape.to_string();
  EXPECT_NE(s.find("mul"), std::string::npos) << s;
  EXPECT_NE(s.find("[5, 3]"), std::string::npos) << s;
  EXPECT_NE(s.find("saved 120 B"), std::string::npos) << s;  // two (5,3) float tensors
  EXPECT_NE(s.find("total saved for backward"), std::string::npos) << s;
}

// Note [leaves released when final]: in a two-layer MLP, the second layer's weight is released
// while the first layer's backward has not run (its weight has no gradient yet), every leaf is
// heard of once, and the gradients are bit for bit those of a pass without the scope.
TEST(Engine, LeavesAreReleasedAsSoonAsTheirGradientIsFinal) {
  auto run = [](bool listen, std::vector<std::string>* heard, bool* w1_pending_at_w2) {
    at::manual_seed(3);
    Variable x(at::randn({4, 5}, at::kDouble), false);
    Variable w1(at::randn({5, 6}, at::kDouble), true), b1(at::randn({6}, at::kDouble), true);
    Variable w2(at::randn({6, 3}, at::kDouble), true);
    w1.set_name("w1"), b1.set_name("b1"), w2.set_name("w2");
    Variable y = matmul(relu(matmul(x, w1) + b1), w2);
    Variable loss = sum(y * y) + sum(w2);  // w2 used twice: released after its lower use
    std::optional<LeafFinalScope> scope;
    if (listen)
      scope.emplace([&](VariableImpl* leaf) {
        heard->push_back(leaf->name);
        if (leaf->name == "w2") *w1_pending_at_w2 = !w1.grad().defined();
        // Its gradient is already in .grad when heard of.
        EXPECT_TRUE(leaf->grad.defined()) << leaf->name;
      });
    loss.backward();
    return std::vector<at::Tensor>{w1.grad(), b1.grad(), w2.grad()};
  };
  std::vector<std::string> heard;
  bool w1_pending = false;
  const auto plain = run(false, nullptr, nullptr);
  const auto released = run(true, &heard, &w1_pending);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(at::equal(plain[i], released[i])) << i;
  EXPECT_EQ(heard, (std::vector<std::string>{"w2", "b1", "w1"}));
  EXPECT_TRUE(w1_pending);
  // Without a scope nothing is heard, and a scope ends with its object.
  EXPECT_EQ(LeafFinalScope::current(), nullptr);
}

// A leaf reached from a node of another tape recorded before its last use on the walked tape would
// get a gradient after its release: an error naming it, not an incomplete gradient handed on.
TEST(Engine, AGradientAfterALeafsReleaseIsAnError) {
  Variable w = leaf({1.0, 2.0});
  w.set_name("w");
  Tape other;
  Variable early;
  {
    TapeGuard guard(other);
    early = w * 2.0;  // recorded on another tape, first
  }
  Variable y = sum(w * 3.0 + early);  // the walked tape: its only use of w is after `early`
  std::vector<std::string> heard;
  LeafFinalScope scope([&](VariableImpl* l) { heard.push_back(l->name); });
  try {
    y.backward();
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("leaf 'w' got a gradient after it was released"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(heard, std::vector<std::string>{"w"});  // released once, before the late gradient
}

}  // namespace
}  // namespace tl
