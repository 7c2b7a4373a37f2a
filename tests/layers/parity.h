#pragma once
// Layer parity with libtorch's torch::nn: the reference's parameters and buffers are copied into
// the tapeline module by name (so the names must match one to one), both run forward on the same
// input, the same random output gradient is backpropagated through both, and the output, the
// input gradient, every parameter gradient and every buffer are compared with labelled max-diffs.

#include <torch/torch.h>

#include <functional>
#include <string>

#include "layers/module.h"
#include "tests/common/testing.h"

namespace tl::testing {

inline TensorMap torch_state(torch::nn::Module& ref) {
  TensorMap state;
  for (auto& p : ref.named_parameters()) state[p.key()] = p.value().detach().clone();
  for (auto& b : ref.named_buffers()) state[b.key()] = b.value().detach().clone();
  return state;
}

struct ParityOptions {
  double atol = 1e-5;
  double rtol = 1e-4;
  bool copy_weights = true;  // false: the caller has already made both modules agree
};

/// `ours_fn` / `ref_fn` run the two modules (defaults: ours.forward).
inline void expect_parity(Module& ours, torch::nn::Module& ref, const std::function<Variable(const Variable&)>& ours_fn,
                          const std::function<at::Tensor(const at::Tensor&)>& ref_fn, const at::Tensor& input,
                          const std::string& label, ParityOptions opt = {}) {
  if (opt.copy_weights) ours.load_state_dict(torch_state(ref), /*strict=*/true);
  ours.zero_grad();
  ref.zero_grad();
  const bool floating = at::isFloatingType(input.scalar_type());
  Variable x(input.clone(), floating);
  at::Tensor xr = input.clone();
  if (floating) xr.requires_grad_(true);

  Variable y = ours_fn(x);
  at::Tensor yr = ref_fn(xr);
  EXPECT_TRUE(all_close(y.data(), yr, label + " output", opt.atol, opt.rtol));
  at::Tensor g = at::randn_like(yr);
  y.backward(g);
  yr.backward(g);
  if (floating) {
    EXPECT_TRUE(all_close(x.grad(), xr.grad(), label + " d/d(input)", opt.atol, opt.rtol));
  }

  auto ref_params = ref.named_parameters();
  for (auto& [name, p] : ours.named_parameters()) {
    auto* rp = ref_params.find(name);
    ASSERT_NE(rp, nullptr) << label << ": torch has no parameter " << name;
    EXPECT_TRUE(all_close(p.grad(), rp->grad(), label + " d/d(" + name + ")", opt.atol, opt.rtol));
  }
  auto ref_buffers = ref.named_buffers();
  for (auto& [name, b] : ours.named_buffers()) {
    auto* rb = ref_buffers.find(name);
    ASSERT_NE(rb, nullptr) << label << ": torch has no buffer " << name;
    EXPECT_TRUE(all_close(b.data(), *rb, label + " buffer " + name, opt.atol, opt.rtol));
  }
}

inline void expect_parity(Module& ours, torch::nn::Module& ref,
                          const std::function<at::Tensor(const at::Tensor&)>& ref_fn, const at::Tensor& input,
                          const std::string& label, ParityOptions opt = {}) {
  expect_parity(
      ours, ref, [&](const Variable& x) { return ours.forward(x); }, ref_fn, input, label, opt);
}

}  // namespace tl::testing
