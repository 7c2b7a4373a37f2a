// Reductions: finite differences in float64 and the libtorch-autograd oracle over dims (negative,
// several, empty = all) with and without keepdim; max's arg-max routing at ties; norm's zero point.
#include <limits>

#include "tests/common/testing.h"

namespace tl {
namespace {
using testing::all_close;
using testing::gradcheck;
using testing::matches_torch;

/// One reduction case: the op under test and the same computation on ATen tensors.
struct Case {
  std::string label;
  std::function<Variable(const Variable&)> tl_fn;
  std::function<at::Tensor(const at::Tensor&)> ref;
  std::vector<int64_t> shape;
};

std::string dims_str(const std::vector<int64_t>& dims, bool keepdim) {
  return "dims=" + c10::str(at::IntArrayRef(dims)) + (keepdim ? " keepdim" : "");
}

/// torch's meaning of our "empty dims = all dims", spelled out for the reference.
std::vector<int64_t> ref_dims(const std::vector<int64_t>& dims, int64_t ndim) {
  if (!dims.empty()) return dims;
  std::vector<int64_t> all;
  for (int64_t d = 0; d < ndim; ++d) all.push_back(d);
  return all;
}

const std::vector<std::pair<std::vector<int64_t>, bool>> kDimCases = {
    {{0}, false}, {{-1}, false}, {{0, 2}, false}, {{1}, true}, {{-1, -3}, true}, {{}, false}, {{}, true}};
const std::vector<int64_t> kShape = {2, 3, 4};

std::vector<Case> sum_mean_var_cases() {
  std::vector<Case> cases;
  const int64_t nd = static_cast<int64_t>(kShape.size());
  cases.push_back(
      {"sum()", [](const Variable& x) { return tl::sum(x); }, [](const at::Tensor& x) { return x.sum(); }, kShape});
  cases.push_back(
      {"mean()", [](const Variable& x) { return tl::mean(x); }, [](const at::Tensor& x) { return x.mean(); }, kShape});
  for (const auto& [dims, keepdim] : kDimCases) {
    const auto rd = ref_dims(dims, nd);
    const bool kd = keepdim;
    cases.push_back({"sum " + dims_str(dims, kd), [dims = dims, kd](const Variable& x) { return tl::sum(x, dims, kd); },
                     [rd, kd](const at::Tensor& x) { return x.sum(rd, kd); }, kShape});
    cases.push_back({"mean " + dims_str(dims, kd),
                     [dims = dims, kd](const Variable& x) { return tl::mean(x, dims, kd); },
                     [rd, kd](const at::Tensor& x) { return x.mean(rd, kd); }, kShape});
    for (bool unbiased : {true, false}) {
      cases.push_back({std::string("var ") + (unbiased ? "unbiased " : "biased ") + dims_str(dims, kd),
                       [dims = dims, kd, unbiased](const Variable& x) { return tl::var(x, dims, unbiased, kd); },
                       [rd, kd, unbiased](const at::Tensor& x) { return at::var(x, rd, unbiased, kd); }, kShape});
    }
  }
  return cases;
}

std::vector<Case> max_cases() {
  std::vector<Case> cases;
  cases.push_back(
      {"max()", [](const Variable& x) { return tl::max(x); }, [](const at::Tensor& x) { return x.max(); }, kShape});
  for (const auto& [dim, keepdim] :
       std::vector<std::pair<int64_t, bool>>{{0, false}, {-1, false}, {1, true}, {-3, true}}) {
    const int64_t d = dim;
    const bool kd = keepdim;
    cases.push_back({"max dim=" + std::to_string(d) + (kd ? " keepdim" : ""),
                     [d, kd](const Variable& x) { return tl::max(x, d, kd); },
                     [d, kd](const at::Tensor& x) { return std::get<0>(at::max(x, d, kd)); }, kShape});
  }
  return cases;
}

std::vector<Case> norm_cases() {
  std::vector<Case> cases;
  const double inf = std::numeric_limits<double>::infinity();
  for (double p : {2.0, 1.0, 3.0, 1.5, 0.5, inf, -inf, 0.0}) {
    for (const auto& [dims, keepdim] :
         std::vector<std::pair<std::vector<int64_t>, bool>>{{{}, false}, {{1}, false}, {{-1, 0}, true}, {{}, true}}) {
      const auto rd = ref_dims(dims, static_cast<int64_t>(kShape.size()));
      const bool kd = keepdim;
      cases.push_back({"norm p=" + std::to_string(p) + " " + dims_str(dims, kd),
                       [p, dims = dims, kd](const Variable& x) { return tl::norm(x, p, dims, kd); },
                       [p, rd, kd](const at::Tensor& x) { return at::linalg_vector_norm(x, p, rd, kd); }, kShape});
    }
  }
  return cases;
}

void run_gradcheck(const std::vector<Case>& cases) {
  for (const auto& c : cases) {
    // Random float64 values: ties (max, inf-norm) and zeros (|x| in norms) have probability 0.
    EXPECT_TRUE(
        gradcheck([&](const variable_list& v) { return c.tl_fn(v[0]); }, {at::randn(c.shape, at::kDouble)}, c.label));
  }
}

void run_oracle(const std::vector<Case>& cases, const at::TensorOptions& opts) {
  for (const auto& c : cases) {
    EXPECT_TRUE(matches_torch([&](const variable_list& v) { return c.tl_fn(v[0]); },
                              [&](const std::vector<at::Tensor>& t) { return c.ref(t[0]); }, {at::randn(c.shape, opts)},
                              c.label + " " + c10::str(opts.device())));
  }
}

TEST(Reductions, SumMeanVarGradcheckAndOracle) {
  at::manual_seed(0);
  const auto cases = sum_mean_var_cases();
  run_gradcheck(cases);
  run_oracle(cases, at::kFloat);
  // A 0-d input: reducing over dim 0 / -1 or over all dims is the identity (as in ATen).
  at::Tensor s = at::randn({}, at::kDouble);
  EXPECT_TRUE(matches_torch([](const variable_list& v) { return tl::sum(v[0], {-1}); },
                            [](const std::vector<at::Tensor>& t) { return t[0].sum({-1}); }, {s}, "sum 0-d dims={-1}"));
  EXPECT_TRUE(matches_torch([](const variable_list& v) { return tl::mean(v[0], {0}, true); },
                            [](const std::vector<at::Tensor>& t) { return t[0].mean({0}, true); }, {s},
                            "mean 0-d dims={0} keepdim"));
}

TEST(Reductions, MaxGradcheckOracleAndTies) {
  at::manual_seed(1);
  const auto cases = max_cases();
  run_gradcheck(cases);
  run_oracle(cases, at::kFloat);

  // Global max with ties: the whole gradient goes to the first arg max (torch would split it).
  Variable x(at::tensor({1.0, 3.0, -2.0, 3.0, 3.0}, at::kDouble), true);
  tl::max(x).backward(at::scalar_tensor(2.0, at::kDouble));
  EXPECT_TRUE(all_close(x.grad(), at::tensor({0.0, 2.0, 0.0, 0.0, 0.0}, at::kDouble), "max() ties", 0, 0));

  // Max over a dim with ties: the gradient goes where at::max's index points, as in torch.
  at::Tensor t = at::tensor({2.0, 5.0, 5.0, 1.0, 4.0, 4.0}, at::kDouble).reshape({2, 3});
  EXPECT_TRUE(matches_torch([](const variable_list& v) { return tl::max(v[0], 1); },
                            [](const std::vector<at::Tensor>& r) { return std::get<0>(at::max(r[0], 1)); }, {t},
                            "max dim=1 ties"));
  Variable y(t.clone(), true);
  tl::sum(tl::max(y, 1)).backward();
  EXPECT_EQ(y.grad().sum().item<double>(), 2.0) << "max dim=1 ties: one element per row gets the gradient";
}

TEST(Reductions, NormGradcheckOracleAndZeroPoint) {
  at::manual_seed(2);
  const auto cases = norm_cases();
  run_gradcheck(cases);
  run_oracle(cases, at::kFloat);

  // Zero-norm rows and zero entries: no NaN, and the same convention as torch.
  at::Tensor z = at::randn({3, 4}, at::kDouble);
  z[1].zero_();
  z[2][0] = 0.0;
  for (double p : {2.0, 1.0, 3.0, 1.5, 0.5}) {
    for (const auto& dims : std::vector<std::vector<int64_t>>{{1}, {}}) {
      const std::string label = "norm p=" + std::to_string(p) + " with zeros dims=" + c10::str(at::IntArrayRef(dims));
      auto fn = [&](const variable_list& v) { return tl::norm(v[0], p, dims); };
      EXPECT_TRUE(matches_torch(
          fn,
          [&](const std::vector<at::Tensor>& t) { return at::linalg_vector_norm(t[0], p, ref_dims(dims, 2), false); },
          {z}, label));
      Variable v(z.clone(), true);
      tl::sum(fn({v})).backward();
      EXPECT_FALSE(v.grad().isnan().any().item<bool>()) << label << ": NaN in the gradient";
    }
  }
  // All zeros, p = 2: the gradient is exactly 0 (torch's subgradient choice).
  Variable zeros(at::zeros({5}, at::kDouble), true);
  tl::norm(zeros).backward();
  EXPECT_TRUE(all_close(zeros.grad(), at::zeros({5}, at::kDouble), "norm p=2 of zeros", 0, 0));
}

TEST(Reductions, CudaOracle) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(3);
  const auto opts = at::TensorOptions(at::kFloat).device(at::kCUDA);
  run_oracle(sum_mean_var_cases(), opts);
  run_oracle(max_cases(), opts);
  run_oracle(norm_cases(), opts);
}

}  // namespace
}  // namespace tl
