// conv2d and pooling: finite differences in float64 and the libtorch-autograd oracle over strides,
// paddings, dilations, groups, ceil mode.
#include "tests/common/testing.h"

namespace tl {
namespace {
using testing::gradcheck;
using testing::matches_torch;
using Shape = std::vector<int64_t>;

using testing::rnd;

// Distinct values at least 0.05 apart (a shuffled ramp), so max-pool has no ties and finite
// differences with eps 1e-6 never move the arg max: max is smooth at such points.
at::Tensor distinct(at::IntArrayRef s, at::ScalarType t = at::kDouble) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return (at::randperm(n, at::TensorOptions(at::kLong)).to(t) * 0.05 - 0.025 * n).reshape(s);
}

using testing::str;

TEST(ConvPool, Conv2dGradcheckAndOracle) {
  at::manual_seed(0);
  struct Case {
    Shape x, w;
    bool bias;
    Shape stride, padding, dilation;
    int64_t groups;
  };
  const std::vector<Case> cases = {
      {{2, 2, 5, 5}, {3, 2, 3, 3}, true, {1, 1}, {0, 0}, {1, 1}, 1},
      {{1, 2, 6, 5}, {2, 2, 3, 2}, true, {2, 1}, {1, 0}, {1, 1}, 1},   // asymmetric stride/padding
      {{1, 2, 7, 7}, {2, 2, 3, 3}, false, {1, 1}, {2, 2}, {2, 2}, 1},  // dilation
      {{1, 4, 5, 5}, {4, 2, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 2},   // groups
      {{2, 3, 4, 4}, {3, 1, 3, 3}, false, {2, 2}, {1, 1}, {1, 1}, 3},  // depthwise, stride 2
      {{1, 3, 4, 4}, {2, 3, 1, 1}, true, {1, 1}, {0, 0}, {1, 1}, 1},   // 1x1
  };
  for (const auto& c : cases) {
    const std::string label = "conv2d x " + str(c.x) + " w " + str(c.w) + " stride " + str(c.stride) + " pad " +
                              str(c.padding) + " dil " + str(c.dilation) + " groups " + std::to_string(c.groups) +
                              (c.bias ? " +bias" : "");
    auto fn = [&](const variable_list& v) {
      return conv2d(v[0], v[1], c.bias ? v[2] : Variable(), c.stride, c.padding, c.dilation, c.groups);
    };
    auto ref = [&](const std::vector<at::Tensor>& t) {
      return at::conv2d(t[0], t[1], c.bias ? t[2] : at::Tensor(), c.stride, c.padding, c.dilation, c.groups);
    };
    auto inputs = [&](at::ScalarType t, int64_t scale) {
      Shape x = c.x;
      x[0] *= scale;
      x[2] *= scale;
      x[3] *= scale;
      std::vector<at::Tensor> in = {rnd(x, t), rnd(c.w, t)};
      if (c.bias) in.push_back(rnd({c.w[0]}, t));
      return in;
    };
    EXPECT_TRUE(gradcheck(fn, inputs(at::kDouble, 1), label));
    EXPECT_TRUE(matches_torch(fn, ref, inputs(at::kFloat, 2), label));
  }
  // Only the input requires grad (frozen conv): no weight gradient is computed or returned.
  Variable x(rnd({1, 2, 5, 5}), true), w(rnd({3, 2, 3, 3}), false);
  conv2d(x, w).backward(at::ones({1, 3, 3, 3}, at::kDouble));
  EXPECT_TRUE(x.grad().defined()) << "conv2d: input grad missing";
  EXPECT_FALSE(w.grad().defined()) << "conv2d: frozen weight got a grad";
  EXPECT_THROW(conv2d(Variable(rnd({1, 3, 5, 5}), true), Variable(rnd({2, 2, 3, 3}), true)), c10::Error)
      << "conv2d: channel mismatch must be an error";
}

TEST(ConvPool, PoolingGradcheckAndOracle) {
  at::manual_seed(1);
  struct MaxCase {
    Shape x, kernel, stride, padding, dilation;
    bool ceil;
  };
  const std::vector<MaxCase> max_cases = {
      {{2, 2, 4, 4}, {2, 2}, {}, {0, 0}, {1, 1}, false},
      {{1, 2, 5, 5}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, false},
      {{1, 1, 7, 6}, {2, 3}, {1, 2}, {0, 1}, {2, 1}, false},  // dilation, asymmetric
      {{1, 2, 5, 5}, {2, 2}, {2, 2}, {0, 0}, {1, 1}, true},   // ceil mode
  };
  for (const auto& c : max_cases) {
    const std::string label = "max_pool2d x " + str(c.x) + " k " + str(c.kernel) + " s " + str(c.stride) + " p " +
                              str(c.padding) + " d " + str(c.dilation) + (c.ceil ? " ceil" : "");
    auto fn = [&](const variable_list& v) { return max_pool2d(v[0], c.kernel, c.stride, c.padding, c.dilation, c.ceil); };
    auto ref = [&](const std::vector<at::Tensor>& t) {
      return at::max_pool2d(t[0], c.kernel, c.stride, c.padding, c.dilation, c.ceil);
    };
    // Max is piecewise linear: with no ties the finite differences are exact up to rounding.
    EXPECT_TRUE(gradcheck(fn, {distinct(c.x)}, label, {1e-6, 1e-6, 1e-5}));
    EXPECT_TRUE(matches_torch(fn, ref, {distinct(c.x, at::kFloat)}, label));
  }
  struct AvgCase {
    Shape x, kernel, stride, padding;
    bool ceil, count_pad;
  };
  const std::vector<AvgCase> avg_cases = {
      {{2, 2, 4, 4}, {2, 2}, {}, {0, 0}, false, true},
      {{1, 2, 5, 5}, {3, 3}, {2, 2}, {1, 1}, false, false},  // padding not counted
      {{1, 2, 5, 5}, {3, 3}, {2, 2}, {1, 1}, false, true},   // padding counted
      {{1, 1, 5, 6}, {2, 3}, {2, 2}, {0, 1}, true, true},    // ceil mode
  };
  for (const auto& c : avg_cases) {
    const std::string label = "avg_pool2d x " + str(c.x) + " k " + str(c.kernel) + " s " + str(c.stride) + " p " +
                              str(c.padding) + (c.ceil ? " ceil" : "") + (c.count_pad ? " count_pad" : "");
    auto fn = [&](const variable_list& v) { return avg_pool2d(v[0], c.kernel, c.stride, c.padding, c.ceil, c.count_pad); };
    auto ref = [&](const std::vector<at::Tensor>& t) {
      return at::avg_pool2d(t[0], c.kernel, c.stride, c.padding, c.ceil, c.count_pad);
    };
    EXPECT_TRUE(gradcheck(fn, {rnd(c.x)}, label));
    EXPECT_TRUE(matches_torch(fn, ref, {rnd(c.x, at::kFloat)}, label));
  }
  struct AdaptiveCase {
    Shape x, out;
  };
  const std::vector<AdaptiveCase> adaptive_cases = {
      {{2, 2, 4, 5}, {1, 1}}, {{1, 2, 5, 7}, {2, 3}}, {{1, 1, 4, 4}, {3, 3}}, {{2, 5, 6}, {2, 2}}, {{3, 4, 4}, {1, 1}}};
  for (const auto& c : adaptive_cases) {
    const std::string label = "adaptive_avg_pool2d x " + str(c.x) + " out " + str(c.out);
    auto fn = [&](const variable_list& v) { return adaptive_avg_pool2d(v[0], c.out); };
    auto ref = [&](const std::vector<at::Tensor>& t) { return at::adaptive_avg_pool2d(t[0], c.out); };
    EXPECT_TRUE(gradcheck(fn, {rnd(c.x)}, label));
    EXPECT_TRUE(matches_torch(fn, ref, {rnd(c.x, at::kFloat)}, label));
  }
}

}  // namespace
}  // namespace tl
