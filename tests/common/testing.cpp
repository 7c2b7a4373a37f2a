#include "tests/common/testing.h"

#include <torch/csrc/autograd/autograd.h>

#include <sstream>

namespace tl::testing {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what();
  }
  return "";
}

std::string what_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "<no error>";
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  if (!a.sizes().equals(b.sizes())) return std::numeric_limits<double>::infinity();
  if (a.numel() == 0) return 0.0;
  at::Tensor d = (a.to(at::kDouble) - b.to(at::kDouble)).abs();
  d = at::where(d.isnan(), at::full_like(d, std::numeric_limits<double>::infinity()), d);
  // NaN on both sides counts as equal.
  d = at::where(a.to(at::kDouble).isnan().logical_and(b.to(at::kDouble).isnan()), at::zeros_like(d), d);
  return d.max().item<double>();
}

::testing::AssertionResult all_close(const at::Tensor& a_in, const at::Tensor& b_in, const std::string& label,
                                     double atol, double rtol) {
  if (!a_in.defined() || !b_in.defined()) {
    if (a_in.defined() == b_in.defined()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << label << ": one side is undefined (got " << a_in.defined()
                                         << ", expected " << b_in.defined() << ")";
  }
  if (!a_in.sizes().equals(b_in.sizes())) {
    return ::testing::AssertionFailure() << label << ": shape " << a_in.sizes() << " vs expected " << b_in.sizes();
  }
  at::Tensor a = a_in.detach().cpu().to(at::kDouble), b = b_in.detach().cpu().to(at::kDouble);
  if (a.numel() == 0) return ::testing::AssertionSuccess();
  at::Tensor err = (a - b).abs() - (atol + rtol * b.abs());
  err = at::where(a.isnan().logical_xor(b.isnan()), at::full_like(err, 1e30), err);
  err = at::where(a.isnan().logical_and(b.isnan()), at::full_like(err, -1), err);
  auto worst = err.flatten().argmax().item<int64_t>();
  if (err.flatten()[worst].item<double>() <= 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << label << ": max |diff| = " << max_diff(a, b) << " at flat index "
                                       << worst << " (got " << a.flatten()[worst].item<double>() << ", expected "
                                       << b.flatten()[worst].item<double>() << "; atol " << atol << ", rtol "
                                       << rtol << ")";
}

::testing::AssertionResult gradcheck(const TlFn& fn, const std::vector<at::Tensor>& inputs, const std::string& label,
                                     GradcheckOptions opt) {
  variable_list vars;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].scalar_type() != at::kDouble) {
      return ::testing::AssertionFailure() << label << ": gradcheck input " << i << " must be float64";
    }
    vars.emplace_back(inputs[i].clone(), true);
  }
  Variable out = fn(vars);
  const int64_t n_out = out.numel();
  // Analytic Jacobian, one row per output element.
  std::vector<at::Tensor> analytic;  // per input: (n_out, n_in)
  for (const auto& x : inputs) analytic.push_back(at::zeros({n_out, x.numel()}, x.options()));
  for (int64_t r = 0; r < n_out; ++r) {
    for (auto& v : vars) v.zero_grad();
    // Contiguous (zeros_like would keep a permuted output's strides, and view() would fail).
    at::Tensor seed = at::zeros(out.sizes(), out.options());
    seed.view({-1})[r] = 1.0;
    out.backward(seed, /*retain_graph=*/true);
    for (size_t i = 0; i < vars.size(); ++i) {
      if (vars[i].grad().defined()) analytic[i][r] = vars[i].grad().reshape({-1});
    }
  }
  // Numerical Jacobian by central differences.
  NoGradGuard no_grad;
  for (size_t i = 0; i < inputs.size(); ++i) {
    at::Tensor numeric = at::zeros_like(analytic[i]);
    at::Tensor flat = vars[i].mutable_data().view({-1});
    for (int64_t c = 0; c < flat.numel(); ++c) {
      const double orig = flat[c].item<double>();
      flat[c] = orig + opt.eps;
      at::Tensor plus = fn(vars).data().reshape({-1}).clone();
      flat[c] = orig - opt.eps;
      at::Tensor minus = fn(vars).data().reshape({-1}).clone();
      flat[c] = orig;
      numeric.select(1, c).copy_((plus - minus) / (2 * opt.eps));
    }
    auto r = all_close(analytic[i], numeric, label + " d(out)/d(input " + std::to_string(i) + ")", opt.atol, opt.rtol);
    if (!r) return r;
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult matches_torch(const TlFn& fn, const RefFn& ref, const std::vector<at::Tensor>& inputs,
                                         const std::string& label, double atol, double rtol) {
  variable_list vars;
  std::vector<at::Tensor> ref_inputs, ref_leaves;
  std::vector<size_t> leaf_index;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const bool diff = at::isFloatingType(inputs[i].scalar_type());
    vars.emplace_back(inputs[i].detach().clone(), diff);
    at::Tensor r = inputs[i].detach().clone();
    if (diff) {
      r.set_requires_grad(true);
      ref_leaves.push_back(r);
      leaf_index.push_back(i);
    }
    ref_inputs.push_back(r);
  }
  Variable out = fn(vars);
  at::Tensor ref_out = ref(ref_inputs);
  auto r = all_close(out.data(), ref_out, label + " output", atol, rtol);
  if (!r) return r;
  if (ref_leaves.empty()) return ::testing::AssertionSuccess();
  at::Tensor g = at::randn(ref_out.sizes(), ref_out.options().requires_grad(false));
  out.backward(g);
  auto grads = torch::autograd::grad({ref_out}, ref_leaves, {g}, /*retain_graph=*/false, /*create_graph=*/false,
                                     /*allow_unused=*/true);
  for (size_t j = 0; j < ref_leaves.size(); ++j) {
    const size_t i = leaf_index[j];
    at::Tensor mine = vars[i].grad();
    at::Tensor theirs = grads[j];
    if (!theirs.defined()) theirs = at::zeros_like(inputs[i]);
    if (!mine.defined()) mine = at::zeros_like(inputs[i]);
    r = all_close(mine, theirs, label + " grad of input " + std::to_string(i), atol, rtol);
    if (!r) return r;
  }
  return ::testing::AssertionSuccess();
}

const std::string& source_dir() {
  static const std::string dir = TAPELINE_SOURCE_DIR;
  return dir;
}

}  // namespace tl::testing
