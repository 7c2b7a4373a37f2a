// Activations: finite differences in float64, the libtorch-autograd oracle on several shapes
// (float32), values and gradients at the special points (relu at 0), and the two gelu forms
// against their closed-form definitions.
#include <cmath>

#include "tests/common/testing.h"

namespace tl {
namespace {
using testing::all_close;
using testing::gradcheck;
using testing::matches_torch;

struct Activation {
  const char* name;
  std::function<Variable(const Variable&)> tl_fn;
  std::function<at::Tensor(const at::Tensor&)> ref;
};

std::vector<Activation> activations() {
  return {
      {"relu", [](const Variable& x) { return tl::relu(x); }, [](const at::Tensor& x) { return at::relu(x); }},
      {"gelu", [](const Variable& x) { return tl::gelu(x); }, [](const at::Tensor& x) { return at::gelu(x); }},
      {"gelu_tanh", [](const Variable& x) { return tl::gelu(x, /*tanh_approximate=*/true); },
       [](const at::Tensor& x) { return at::gelu(x, "tanh"); }},
      {"tanh", [](const Variable& x) { return tl::tanh(x); }, [](const at::Tensor& x) { return at::tanh(x); }},
      {"sigmoid", [](const Variable& x) { return tl::sigmoid(x); }, [](const at::Tensor& x) { return at::sigmoid(x); }},
      {"silu", [](const Variable& x) { return tl::silu(x); }, [](const at::Tensor& x) { return at::silu(x); }},
  };
}

void run_oracle(const at::TensorOptions& opts) {
  const std::vector<std::vector<int64_t>> shapes = {{7}, {3, 5}, {2, 3, 4}, {}};
  for (const auto& op : activations()) {
    auto fn = [&](const variable_list& v) { return op.tl_fn(v[0]); };
    auto ref = [&](const std::vector<at::Tensor>& t) { return op.ref(t[0]); };
    for (const auto& shape : shapes) {
      const std::string label =
          std::string(op.name) + " " + c10::str(at::IntArrayRef(shape)) + " " + c10::str(opts.device());
      EXPECT_TRUE(matches_torch(fn, ref, {3 * at::randn(shape, opts)}, label));
    }
    // Special points: 0 (relu's kink, where torch's gradient is 0), large magnitudes (saturation).
    at::Tensor special = at::tensor({0.0, -0.0, 1e-8, -1e-8, 8.0, -8.0, 30.0, -30.0}, opts);
    EXPECT_TRUE(matches_torch(fn, ref, {special}, std::string(op.name) + " special points " + c10::str(opts.device())));
  }
}

TEST(Activations, GradcheckFloat64) {
  at::manual_seed(0);
  for (const auto& op : activations()) {
    at::Tensor x = at::randn({3, 5}, at::kDouble);
    // Keep finite differences away from relu's kink at 0.
    x = at::where(x.abs() < 0.05, x + 0.2, x);
    EXPECT_TRUE(gradcheck([&](const variable_list& v) { return op.tl_fn(v[0]); }, {x}, op.name));
  }
}

TEST(Activations, OracleAgainstTorchAutograd) {
  at::manual_seed(1);
  run_oracle(at::TensorOptions(at::kFloat));
  run_oracle(at::TensorOptions(at::kDouble));
}

TEST(Activations, ClosedFormsAndKinks) {
  at::Tensor x = at::linspace(-6, 6, 97, at::kDouble);
  Variable v(x, true);
  // erf form: x * Phi(x)
  at::Tensor erf_form = x * 0.5 * (1 + at::erf(x / std::sqrt(2.0)));
  EXPECT_TRUE(all_close(tl::gelu(v).data(), erf_form, "gelu erf form", 1e-12, 1e-12));
  // tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  at::Tensor tanh_form = 0.5 * x * (1 + at::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x.pow(3))));
  EXPECT_TRUE(all_close(tl::gelu(v, true).data(), tanh_form, "gelu tanh form", 1e-12, 1e-12));
  // The two differ (so the flag is really wired through).
  EXPECT_GT(testing::max_diff(erf_form, tanh_form), 1e-5);

  // relu: gradient 0 at and below 0, 1 above.
  Variable r(at::tensor({-1.0, 0.0, 2.0}, at::kDouble), true);
  tl::sum(tl::relu(r)).backward();
  EXPECT_TRUE(all_close(r.grad(), at::tensor({0.0, 0.0, 1.0}, at::kDouble), "relu grad at -1, 0, 2", 0, 0));
}

TEST(Activations, CudaOracle) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(2);
  run_oracle(at::TensorOptions(at::kFloat).device(at::kCUDA));
}

}  // namespace
}  // namespace tl
