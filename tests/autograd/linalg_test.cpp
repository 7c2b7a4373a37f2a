// matmul, bmm, linear: finite differences in float64 and the libtorch-autograd oracle, over 1-D,
// 2-D and broadcast-batched operand shapes.
#include "tests/common/testing.h"

namespace tl {
namespace {
using testing::gradcheck;
using testing::matches_torch;
using Shape = std::vector<int64_t>;

using testing::rnd;

std::string str(const Shape& s) { return c10::str(at::IntArrayRef(s)); }

TEST(Linalg, MatmulShapesGradcheckAndOracle) {
  at::manual_seed(0);
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{3}, {3}},                // dot
      {{3}, {3, 4}},             // vector x matrix
      {{2, 3}, {3}},             // matrix x vector
      {{2, 3}, {3, 4}},          // mm
      {{2, 2, 3}, {3, 4}},       // batched x 2-D (folded rows)
      {{2, 3}, {2, 3, 4}},       // 2-D x batched (broadcast a)
      {{4}, {2, 4, 3}},          // vector x batched
      {{2, 3, 4}, {4}},          // batched x vector
      {{2, 1, 2, 3}, {3, 3, 2}}, // broadcast batch dims on both sides
      {{1, 2, 3}, {2, 3, 2}},    // batch dim of size 1 broadcast
  };
  for (const auto& [sa, sb] : cases) {
    const std::string label = "matmul " + str(sa) + " x " + str(sb);
    auto fn = [](const variable_list& v) { return matmul(v[0], v[1]); };
    EXPECT_TRUE(gradcheck(fn, {rnd(sa), rnd(sb)}, label));
    EXPECT_TRUE(matches_torch(fn, [](const std::vector<at::Tensor>& t) { return at::matmul(t[0], t[1]); },
                              {rnd(sa, at::kFloat), rnd(sb, at::kFloat)}, label));
  }
  // Larger, to exercise the GEMM paths for real: (B, T, C) x (C, D) and a broadcast batch.
  auto fn = [](const variable_list& v) { return matmul(v[0], v[1]); };
  auto ref = [](const std::vector<at::Tensor>& t) { return at::matmul(t[0], t[1]); };
  EXPECT_TRUE(matches_torch(fn, ref, {rnd({4, 17, 32}, at::kFloat), rnd({32, 24}, at::kFloat)}, "matmul big folded"));
  EXPECT_TRUE(matches_torch(fn, ref, {rnd({3, 1, 9, 16}, at::kFloat), rnd({5, 16, 7}, at::kFloat)},
                            "matmul big broadcast"));
  // Only one operand requiring grad.
  Variable a(rnd({2, 3}), true);
  Variable b(rnd({3, 4}), false);
  matmul(a, b).backward(at::ones({2, 4}, at::kDouble));
  EXPECT_TRUE(testing::all_close(a.grad(), at::ones({2, 4}, at::kDouble).mm(b.data().t()), "matmul grad a only"));
  EXPECT_FALSE(b.grad().defined()) << "matmul: b does not require grad but received one";
}

TEST(Linalg, BmmAndLinearGradcheckAndOracle) {
  at::manual_seed(1);
  {
    auto fn = [](const variable_list& v) { return bmm(v[0], v[1]); };
    EXPECT_TRUE(gradcheck(fn, {rnd({2, 3, 4}), rnd({2, 4, 2})}, "bmm"));
    EXPECT_TRUE(matches_torch(fn, [](const std::vector<at::Tensor>& t) { return at::bmm(t[0], t[1]); },
                              {rnd({3, 5, 6}, at::kFloat), rnd({3, 6, 4}, at::kFloat)}, "bmm"));
  }
  struct Case {
    Shape x;
    int64_t out;
    bool bias;
  };
  const std::vector<Case> cases = {{{4, 3}, 5, true}, {{4, 3}, 2, false}, {{2, 3, 3}, 4, true},
                                   {{3}, 2, true},    {{2, 1, 2, 3}, 2, false}};
  for (const auto& c : cases) {
    const int64_t in = c.x.back();
    const std::string label = "linear x " + str(c.x) + " out " + std::to_string(c.out) + (c.bias ? " +bias" : "");
    auto fn = [&](const variable_list& v) { return linear(v[0], v[1], c.bias ? v[2] : Variable()); };
    auto ref = [&](const std::vector<at::Tensor>& t) {
      return at::linear(t[0], t[1], c.bias ? t[2] : at::Tensor());
    };
    std::vector<at::Tensor> in64 = {rnd(c.x), rnd({c.out, in})};
    std::vector<at::Tensor> in32 = {rnd(c.x, at::kFloat), rnd({c.out, in}, at::kFloat)};
    if (c.bias) {
      in64.push_back(rnd({c.out}));
      in32.push_back(rnd({c.out}, at::kFloat));
    }
    EXPECT_TRUE(gradcheck(fn, in64, label));
    EXPECT_TRUE(matches_torch(fn, ref, in32, label));
  }
  EXPECT_TRUE(matches_torch(
      [](const variable_list& v) { return linear(v[0], v[1], v[2]); },
      [](const std::vector<at::Tensor>& t) { return at::linear(t[0], t[1], t[2]); },
      {rnd({8, 12, 64}, at::kFloat), rnd({48, 64}, at::kFloat), rnd({48}, at::kFloat)}, "linear big 3-D"));
  Variable x(rnd({2, 3}), true), w(rnd({4, 5}), true);
  EXPECT_THROW(linear(x, w), c10::Error) << "linear: mismatched in_features must be an error";
}

}  // namespace
}  // namespace tl
