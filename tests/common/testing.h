#pragma once
// Test helpers: the three tiers of docs/ARCHITECTURE.md.
//  - gradcheck: full-Jacobian finite differences in float64 against the engine's backward.
//  - oracle: the same computation through libtorch's own autograd (torch::autograd::grad on the
//    same ATen ops), outputs and every input gradient compared with labelled max-diffs.
//  - expect_close: labelled comparison used by everything else.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "autograd/ops.h"

namespace tl::testing {

using TlFn = std::function<Variable(const variable_list&)>;
using RefFn = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

/// The message of the c10::Error that fn throws ("" if it throws none).
std::string error_of(const std::function<void()>& fn);
/// The same without the backtrace, and "<no error>" if fn throws none.
std::string what_of(const std::function<void()>& fn);

/// Standard-normal values of shape s (double unless t says otherwise), from ATen's generator.
inline at::Tensor rnd(at::IntArrayRef s, at::ScalarType t = at::kDouble) { return at::randn(s, at::TensorOptions(t)); }
/// Uniform values in [0.5, 1.5) (inputs of log, sqrt, division).
inline at::Tensor pos(at::IntArrayRef s, at::ScalarType t = at::kDouble) {
  return at::rand(s, at::TensorOptions(t)) + 0.5;
}
/// A shape as text: "[2, 3]".
inline std::string str(at::IntArrayRef s) { return c10::str(s); }

/// The repository's root (CMake's source directory), for tests that read configs/ or scripts/.
/// Compiled into testing.cpp alone, so every other test object is the same in any checkout.
const std::string& source_dir();
/// The repository's configs/ folder.
inline std::filesystem::path configs_dir() { return std::filesystem::path(source_dir()) / "configs"; }

/// Max |a - b| (inf if shapes differ or a value is NaN on one side only).
double max_diff(const at::Tensor& a, const at::Tensor& b);

/// EXPECT that a and b agree within atol + rtol * |b|; the failure message names `label` and
/// prints the max difference and where it is.
::testing::AssertionResult all_close(const at::Tensor& a, const at::Tensor& b, const std::string& label,
                                     double atol = 1e-5, double rtol = 1e-4);

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-4;
};

/// Finite-difference Jacobian (central differences, float64) of fn at `inputs` compared with the
/// Jacobian the engine computes by one backward per output element. Every input must be float64
/// and is treated as requiring grad.
::testing::AssertionResult gradcheck(const TlFn& fn, const std::vector<at::Tensor>& inputs,
                                     const std::string& label, GradcheckOptions opt = {});

/// Runs fn (tapeline) and ref (libtorch autograd on the same ATen ops) on copies of `inputs`,
/// backpropagates the same random output gradient through both, and compares the outputs and
/// every input gradient. Inputs with a non-floating dtype are passed through without grad.
::testing::AssertionResult matches_torch(const TlFn& fn, const RefFn& ref, const std::vector<at::Tensor>& inputs,
                                         const std::string& label, double atol = 1e-5, double rtol = 1e-4);

}  // namespace tl::testing
