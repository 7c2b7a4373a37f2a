// cross_entropy (ignore_index, label smoothing, spatial inputs, reductions), nll_loss, mse_loss:
// finite differences in float64 and the libtorch-autograd oracle (at::cross_entropy_loss, ...).
#include "tests/common/testing.h"

namespace tl {
namespace {
using testing::gradcheck;
using testing::matches_torch;
using Shape = std::vector<int64_t>;

using testing::rnd;
using testing::str;

const char* red_name(Reduction r) { return r == Reduction::Mean ? "mean" : r == Reduction::Sum ? "sum" : "none"; }
int64_t red_at(Reduction r) {
  return r == Reduction::Mean ? at::Reduction::Mean : r == Reduction::Sum ? at::Reduction::Sum : at::Reduction::None;
}

// Targets for input shape (N, C, d...) (or (C)): random classes, every third one set to
// `ignore` when ignoring is on (the first always kept so a mean is defined).
at::Tensor targets(const Shape& x, bool with_ignored, int64_t ignore) {
  const int64_t classes = x.size() == 1 ? x[0] : x[1];
  Shape t;
  if (x.size() > 1) {
    t.push_back(x[0]);
    t.insert(t.end(), x.begin() + 2, x.end());
  }
  at::Tensor target = at::randint(classes, t, at::TensorOptions(at::kLong));
  if (with_ignored && target.numel() > 1) {
    auto flat = target.view({-1});
    for (int64_t i = 1; i < flat.numel(); i += 3) flat[i] = ignore;
  }
  return target;
}

TEST(Loss, CrossEntropyGradcheckAndOracle) {
  at::manual_seed(0);
  struct Case {
    Shape x;
    Reduction red;
    bool ignored;
    int64_t ignore_index;
    double smoothing;
  };
  std::vector<Case> cases;
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    cases.push_back({{4, 5}, red, false, -100, 0.0});
    cases.push_back({{6, 4}, red, true, -100, 0.0});
    cases.push_back({{5, 3}, red, false, -100, 0.2});
    cases.push_back({{6, 4}, red, true, 2, 0.1});  // ignore_index is a valid class id
    cases.push_back({{2, 3, 4}, red, true, -1, 0.15});
    cases.push_back({{2, 3, 2, 2}, red, false, -100, 0.0});
    cases.push_back({{2, 3, 2, 2}, red, true, -100, 0.3});
    cases.push_back({{4}, red, false, -100, 0.1});  // unbatched
  }
  for (const auto& c : cases) {
    const std::string label = std::string("cross_entropy x ") + str(c.x) + " " + red_name(c.red) +
                              (c.ignored ? " ignore " + std::to_string(c.ignore_index) : "") + " smoothing " +
                              std::to_string(c.smoothing);
    const at::Tensor target = targets(c.x, c.ignored, c.ignore_index);
    auto fn = [&](const variable_list& v) { return cross_entropy(v[0], target, c.ignore_index, c.smoothing, c.red); };
    auto ref = [&](const std::vector<at::Tensor>& t) {
      return at::cross_entropy_loss(t[0], target, {}, red_at(c.red), c.ignore_index, c.smoothing);
    };
    EXPECT_TRUE(gradcheck(fn, {rnd(c.x)}, label));
    EXPECT_TRUE(matches_torch(fn, ref, {rnd(c.x, at::kFloat) * 2}, label));
  }
  // A realistic size: (128, 10) as in the MLP benchmark.
  const at::Tensor target = at::randint(10, {128}, at::TensorOptions(at::kLong));
  EXPECT_TRUE(matches_torch([&](const variable_list& v) { return cross_entropy(v[0], target); },
                            [&](const std::vector<at::Tensor>& t) { return at::cross_entropy_loss(t[0], target); },
                            {rnd({128, 10}, at::kFloat)}, "cross_entropy (128, 10)"));
  Variable x(rnd({3, 4}), true);
  EXPECT_THROW(cross_entropy(x, at::zeros({4}, at::kLong)), c10::Error) << "cross_entropy: batch mismatch";
  EXPECT_THROW(cross_entropy(x, at::zeros({3}, at::kInt)), c10::Error) << "cross_entropy: int32 target";
  EXPECT_THROW(cross_entropy(x, at::zeros({3}, at::kLong), -100, 1.5), c10::Error) << "cross_entropy: smoothing > 1";
}

TEST(Loss, NllAndMseGradcheckAndOracle) {
  at::manual_seed(1);
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    for (bool ignored : {false, true}) {
      for (const Shape& shape : {Shape{5, 3}, Shape{2, 3, 2, 2}}) {
        const std::string label = std::string("nll_loss ") + str(shape) + " " + red_name(red) + (ignored ? " ignore" : "");
        const at::Tensor target = targets(shape, ignored, -100);
        auto fn = [&](const variable_list& v) { return nll_loss(v[0], target, -100, red); };
        auto ref = [&](const std::vector<at::Tensor>& t) { return at::nll_loss_nd(t[0], target, {}, red_at(red), -100); };
        EXPECT_TRUE(gradcheck(fn, {rnd(shape)}, label));
        EXPECT_TRUE(matches_torch(fn, ref, {at::log_softmax(rnd(shape, at::kFloat), 1)}, label));
      }
    }
  }
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    for (const auto& [sa, sb] : std::vector<std::pair<Shape, Shape>>{{{3, 4}, {3, 4}}, {{2, 3, 4}, {4}}, {{3, 1}, {1, 4}}}) {
      const std::string label = std::string("mse_loss ") + str(sa) + " vs " + str(sb) + " " + red_name(red);
      auto fn = [&](const variable_list& v) { return mse_loss(v[0], v[1], red); };
      auto ref = [&](const std::vector<at::Tensor>& t) {
        const auto shape = at::infer_size(t[0].sizes(), t[1].sizes());
        return at::mse_loss(t[0].expand(shape), t[1].expand(shape), red_at(red));
      };
      EXPECT_TRUE(gradcheck(fn, {rnd(sa), rnd(sb)}, label));
      EXPECT_TRUE(matches_torch(fn, ref, {rnd(sa, at::kFloat), rnd(sb, at::kFloat)}, label));
    }
  }
  EXPECT_THROW(mse_loss(Variable(rnd({3, 4}), true), Variable(rnd({3, 5}), true)), c10::Error)
      << "mse_loss: incompatible shapes";
}

}  // namespace
}  // namespace tl
