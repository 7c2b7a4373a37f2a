// batch_norm (training and eval, running statistics), layer_norm, dropout, softmax, log_softmax:
// finite differences in float64 and the libtorch-autograd oracle.
#include <ATen/CPUGeneratorImpl.h>

#include "tests/common/testing.h"

namespace tl {
namespace {
using testing::all_close;
using testing::gradcheck;
using testing::matches_torch;
using Shape = std::vector<int64_t>;

using testing::pos;
using testing::rnd;
using testing::str;

TEST(Nn, BatchNormTrainEvalAndRunningStats) {
  at::manual_seed(0);
  const std::vector<Shape> shapes = {{4, 3}, {2, 3, 5}, {2, 2, 3, 3}};
  for (const auto& shape : shapes) {
    const int64_t c = shape[1];
    for (bool affine : {true, false}) {
      for (bool training : {true, false}) {
        const std::string label = std::string("batch_norm ") + (training ? "train " : "eval ") + str(shape) +
                                  (affine ? " affine" : " no-affine");
        // Finite differences: training without running stats (they would drift between the
        // perturbed evaluations), eval with fixed ones.
        const at::Tensor rm64 = rnd({c}), rv64 = pos({c});
        auto gfn = [&](const variable_list& v) {
          return batch_norm(v[0], affine ? v[1] : Variable(), affine ? v[2] : Variable(),
                            training ? at::Tensor() : rm64, training ? at::Tensor() : rv64, training, 0.1, 1e-5);
        };
        std::vector<at::Tensor> in64 = {rnd(shape)};
        if (affine) in64.insert(in64.end(), {rnd({c}), rnd({c})});
        EXPECT_TRUE(gradcheck(gfn, in64, label, {1e-6, 1e-5, 1e-4}));

        // Oracle, running statistics included: each side updates its own copy.
        at::Tensor rm_tl = rnd({c}, at::kFloat), rv_tl = pos({c}, at::kFloat);
        at::Tensor rm_ref = rm_tl.clone(), rv_ref = rv_tl.clone();
        const at::Tensor rm0 = rm_tl.clone(), rv0 = rv_tl.clone();
        auto fn = [&](const variable_list& v) {
          return batch_norm(v[0], affine ? v[1] : Variable(), affine ? v[2] : Variable(), rm_tl, rv_tl, training,
                            0.3, 1e-5);
        };
        auto ref = [&](const std::vector<at::Tensor>& t) {
          return at::batch_norm(t[0], affine ? t[1] : at::Tensor(), affine ? t[2] : at::Tensor(), rm_ref, rv_ref,
                                training, 0.3, 1e-5, /*cudnn_enabled=*/false);
        };
        Shape big = shape;
        big[0] *= 4;
        std::vector<at::Tensor> in32 = {rnd(big, at::kFloat) * 2 + 1};
        if (affine) in32.insert(in32.end(), {rnd({c}, at::kFloat), rnd({c}, at::kFloat)});
        EXPECT_TRUE(matches_torch(fn, ref, in32, label));
        EXPECT_TRUE(all_close(rm_tl, rm_ref, label + " running_mean"));
        EXPECT_TRUE(all_close(rv_tl, rv_ref, label + " running_var"));
        if (training) {
          // r = (1 - m) r + m * batch statistic, with the unbiased variance for running_var.
          std::vector<int64_t> dims = {0};
          for (int64_t d = 2; d < static_cast<int64_t>(big.size()); ++d) dims.push_back(d);
          const at::Tensor x = in32[0];
          EXPECT_TRUE(all_close(rm_tl, rm0 * 0.7 + x.mean(dims) * 0.3, label + " running_mean formula"));
          EXPECT_TRUE(all_close(rv_tl, rv0 * 0.7 + x.var(dims, /*unbiased=*/true) * 0.3, label + " running_var formula"));
        } else {
          EXPECT_TRUE(all_close(rm_tl, rm0, label + " eval leaves running_mean")) << "eval must not update";
          EXPECT_TRUE(all_close(rv_tl, rv0, label + " eval leaves running_var"));
        }
      }
    }
  }
  // Two micro-batches forward before either backward (1F1B): the second forward updates the
  // running statistics in place, which must not invalidate the first one's backward.
  at::Tensor rm = at::zeros({3}), rv = at::ones({3});
  Variable x1(rnd({4, 3}, at::kFloat), true), x2(rnd({4, 3}, at::kFloat), true);
  Variable y1 = batch_norm(x1, {}, {}, rm, rv, true);
  Variable y2 = batch_norm(x2, {}, {}, rm, rv, true);
  EXPECT_NO_THROW(y1.backward(at::randn({4, 3})));
  EXPECT_NO_THROW(y2.backward(at::randn({4, 3})));
  EXPECT_THROW(batch_norm(Variable(rnd({1, 3}), true), {}, {}, {}, {}, true), c10::Error)
      << "batch_norm: one value per channel in training must be an error";
}

TEST(Nn, LayerNormSoftmaxLogSoftmax) {
  at::manual_seed(1);
  struct LnCase {
    Shape x, normalized;
    bool affine;
  };
  const std::vector<LnCase> ln_cases = {{{3, 4}, {4}, true}, {{2, 3, 4}, {3, 4}, true}, {{2, 5}, {5}, false},
                                        {{2, 2, 3}, {3}, true}};
  for (const auto& c : ln_cases) {
    const std::string label = "layer_norm x " + str(c.x) + " over " + str(c.normalized) + (c.affine ? " affine" : "");
    auto fn = [&](const variable_list& v) {
      return layer_norm(v[0], c.normalized, c.affine ? v[1] : Variable(), c.affine ? v[2] : Variable(), 1e-5);
    };
    auto ref = [&](const std::vector<at::Tensor>& t) {
      return at::layer_norm(t[0], c.normalized, c.affine ? t[1] : at::Tensor(), c.affine ? t[2] : at::Tensor(), 1e-5);
    };
    auto inputs = [&](at::ScalarType t) {
      std::vector<at::Tensor> in = {rnd(c.x, t)};
      if (c.affine) in.insert(in.end(), {rnd(c.normalized, t), rnd(c.normalized, t)});
      return in;
    };
    EXPECT_TRUE(gradcheck(fn, inputs(at::kDouble), label));
    EXPECT_TRUE(matches_torch(fn, ref, inputs(at::kFloat), label));
  }
  EXPECT_THROW(layer_norm(Variable(rnd({2, 3}), true), {4}), c10::Error) << "layer_norm: shape mismatch";

  struct SmCase {
    Shape x;
    int64_t dim;
  };
  const std::vector<SmCase> sm_cases = {{{3, 4}, 1}, {{3, 4}, 0}, {{2, 3, 4}, -1}, {{2, 3, 4}, 1}, {{5}, 0}};
  for (const auto& c : sm_cases) {
    const std::string suffix = " x " + str(c.x) + " dim " + std::to_string(c.dim);
    auto sm = [&](const variable_list& v) { return softmax(v[0], c.dim); };
    auto lsm = [&](const variable_list& v) { return log_softmax(v[0], c.dim); };
    EXPECT_TRUE(gradcheck(sm, {rnd(c.x)}, "softmax" + suffix));
    EXPECT_TRUE(gradcheck(lsm, {rnd(c.x)}, "log_softmax" + suffix));
    EXPECT_TRUE(matches_torch(sm, [&](const std::vector<at::Tensor>& t) { return at::softmax(t[0], c.dim); },
                              {rnd(c.x, at::kFloat) * 3}, "softmax" + suffix));
    EXPECT_TRUE(matches_torch(lsm, [&](const std::vector<at::Tensor>& t) { return at::log_softmax(t[0], c.dim); },
                              {rnd(c.x, at::kFloat) * 3}, "log_softmax" + suffix));
  }
}

TEST(Nn, DropoutGeneratorEvalAndOracle) {
  at::manual_seed(2);
  const double p = 0.3;
  const at::Tensor x0 = rnd({100, 100}, at::kFloat);
  // Identity in eval and for p = 0: the input itself comes back and nothing is recorded.
  Variable x(x0, true);
  EXPECT_EQ(dropout(x, p, /*training=*/false).impl(), x.impl()) << "dropout eval must be the identity";
  EXPECT_EQ(dropout(x, 0.0, /*training=*/true).impl(), x.impl()) << "dropout p=0 must be the identity";

  // A seeded generator makes the mask reproducible; another seed gives another mask.
  Variable y1 = dropout(x, p, true, at::detail::createCPUGenerator(123));
  Variable y2 = dropout(x, p, true, at::detail::createCPUGenerator(123));
  Variable y3 = dropout(x, p, true, at::detail::createCPUGenerator(124));
  EXPECT_TRUE(at::equal(y1.data(), y2.data())) << "dropout: same seed, different masks";
  EXPECT_FALSE(at::equal(y1.data(), y3.data())) << "dropout: different seeds, same mask";
  // Each element is dropped (0) or scaled by 1 / (1 - p); about 1 - p of them are kept.
  const at::Tensor kept = y1.data() != 0;
  EXPECT_TRUE(all_close(y1.data(), at::where(kept, x0 / (1 - p), at::zeros_like(x0)), "dropout values"));
  const double frac = kept.to(at::kDouble).mean().item<double>();
  EXPECT_NEAR(frac, 1 - p, 0.02) << "dropout: kept fraction";
  // The gradient is the same scaled mask.
  y1.backward(at::ones_like(x0));
  EXPECT_TRUE(all_close(x.grad(), kept.to(at::kFloat) / (1 - p), "dropout grad"));

  // Finite differences with the mask fixed by reseeding per evaluation.
  auto fd = [&](const variable_list& v) { return dropout(v[0], 0.4, true, at::detail::createCPUGenerator(7)); };
  EXPECT_TRUE(gradcheck(fd, {rnd({3, 4})}, "dropout p=0.4"));
  // Oracle: torch's dropout draws its mask from the default generator the same way.
  auto fn = [&](const variable_list& v) {
    at::manual_seed(11);
    return dropout(v[0], 0.25, true);
  };
  auto ref = [&](const std::vector<at::Tensor>& t) {
    at::manual_seed(11);
    return at::dropout(t[0], 0.25, true);
  };
  EXPECT_TRUE(matches_torch(fn, ref, {rnd({6, 7}, at::kFloat)}, "dropout vs at::dropout"));

  Variable z(rnd({5}, at::kFloat), true);
  Variable zero = dropout(z, 1.0, true);
  EXPECT_TRUE(all_close(zero.data(), at::zeros({5}), "dropout p=1 output"));
  zero.backward(at::ones({5}));
  EXPECT_TRUE(all_close(z.grad(), at::zeros({5}), "dropout p=1 grad"));
  EXPECT_THROW(dropout(z, 1.5, true), c10::Error) << "dropout: p outside [0, 1] must be an error";
}

}  // namespace
}  // namespace tl
