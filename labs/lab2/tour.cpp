// Lab 2: inside the engine. A small program the notebook runs to show what the tape records.
//
//   lab2_tour tape        the tape of a small MLP's forward and loss: ops, shapes, bytes saved
//   lab2_tour conv        the same for a small conv net (where the memory goes)
//   lab2_tour gradcheck   finite differences against backward for a few ops, and for an op with a
//                         deliberately wrong backward
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>

#include "autograd/autograd.h"
#include "layers/nn/nn.h"

namespace {
using namespace tl;

std::string mib(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f KiB", bytes / 1024.0);
  return buf;
}

// MLP 784 -> 128 -> 10 on a batch of 32: what does autograd keep for backward?
int tape_mlp() {
  auto gen = at::detail::createCPUGenerator(0);
  Linear fc1(784, 128, true, gen), fc2(128, 10, true, gen);
  at::Tensor x = at::randn({32, 784}, gen);                 // (B, 784) a batch of flattened images
  at::Tensor y = at::randint(0, 10, {32}, gen);             // (B) labels
  Tape tape;
  TapeGuard guard(tape);                                    // record on our own tape
  Variable h = relu(fc1.forward(Variable(x)));              // (B, 128)
  Variable loss = cross_entropy(fc2.forward(h), y);         // ()
  std::cout << "MLP 784 -> 128 -> 10, batch 32\n" << tape.to_string();
  const double params = 4.0 * (784 * 128 + 128 + 128 * 10 + 10);
  std::cout << "parameters: " << mib(params) << "; input batch: " << mib(4.0 * x.numel()) << "\n";
  loss.backward();
  std::cout << "after backward (saved tensors are freed):\n" << tape.to_string();
  return 0;
}

// conv 1 -> 16 -> 32 channels on 28x28 images, batch 32.
int tape_conv() {
  auto gen = at::detail::createCPUGenerator(0);
  Conv2d c1(Conv2dOptions(1, 16, 3).padding(1), gen), c2(Conv2dOptions(16, 32, 3).padding(1).stride(2), gen);
  Linear fc(32 * 14 * 14, 10, true, gen);
  at::Tensor x = at::randn({32, 1, 28, 28}, gen);  // (B, 1, 28, 28)
  at::Tensor y = at::randint(0, 10, {32}, gen);
  Tape tape;
  TapeGuard guard(tape);
  Variable h = relu(c1.forward(Variable(x)));          // (B, 16, 28, 28)
  h = relu(c2.forward(h));                              // (B, 32, 14, 14)
  Variable loss = cross_entropy(fc.forward(flatten(h, 1)), y);
  std::cout << "conv net 1 -> 16 -> 32 channels, 28x28, batch 32\n" << tape.to_string();
  std::cout << "activations dominate: one (32, 16, 28, 28) float tensor is " << mib(4.0 * 32 * 16 * 28 * 28) << "\n";
  return 0;
}

// x^3 with a wrong backward (2 x instead of 3 x^2): what gradcheck is for.
struct WrongCubeFn : Function<WrongCubeFn> {
  static constexpr const char* name = "wrong_cube";
  static at::Tensor forward(Context& ctx, const at::Tensor& x) {
    ctx.save_for_backward({x});
    return x * x * x;
  }
  static std::vector<at::Tensor> backward(Context& ctx, std::vector<at::Tensor> g) {
    return {g[0] * 2 * ctx.saved()[0]};  // the bug: d(x^3)/dx is 3 x^2
  }
};

// Compares d/dx sum(w * f(x)) from backward with central differences, entry by entry (float64).
bool gradcheck(const std::string& label, const std::function<Variable(const Variable&)>& f, at::Tensor x0) {
  auto gen = at::detail::createCPUGenerator(1);
  at::Tensor w = at::randn(f(Variable(x0)).sizes(), gen, at::kDouble);  // a random output weighting
  auto objective = [&](const at::Tensor& x) { return (f(Variable(x)).data() * w).sum().item<double>(); };
  Variable x(x0.clone(), /*requires_grad=*/true);
  Variable out = sum(mul(f(x), Variable(w)));
  out.backward();
  at::Tensor analytic = x.grad();
  const double eps = 1e-6;
  at::Tensor numeric = at::zeros_like(x0);
  for (int64_t i = 0; i < x0.numel(); ++i) {
    at::Tensor xp = x0.clone(), xm = x0.clone();
    xp.view(-1)[i] += eps;
    xm.view(-1)[i] -= eps;
    numeric.view(-1)[i] = (objective(xp) - objective(xm)) / (2 * eps);
  }
  const double err = (analytic - numeric).abs().max().item<double>();
  const bool ok = err <= 1e-5 + 1e-4 * numeric.abs().max().item<double>();
  std::printf("%-28s max |backward - finite difference| = %.2e  %s\n", label.c_str(), err, ok ? "ok" : "MISMATCH");
  return ok;
}

int run_gradcheck() {
  auto gen = at::detail::createCPUGenerator(0);
  at::Tensor x = at::randn({3, 4}, gen, at::kDouble);
  int bad = 0;
  bad += !gradcheck("tanh", [](const Variable& v) { return tanh(v); }, x);
  bad += !gradcheck("softmax(dim=1)", [](const Variable& v) { return softmax(v, 1); }, x);
  bad += !gradcheck("log_softmax(dim=1)", [](const Variable& v) { return log_softmax(v, 1); }, x);
  bad += !gradcheck("x * sigmoid(x) (composed)", [](const Variable& v) { return mul(v, sigmoid(v)); }, x);
  const bool wrong_ok = gradcheck("wrong_cube (a planted bug)", [](const Variable& v) { return WrongCubeFn::apply(v); }, x);
  std::cout << (bad == 0 ? "all real ops agree with finite differences" : "a real op disagrees!") << "; "
            << (wrong_ok ? "the planted bug was NOT caught" : "the planted bug is caught") << "\n";
  return bad == 0 && !wrong_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "tape") return tape_mlp();
  if (cmd == "conv") return tape_conv();
  if (cmd == "gradcheck") return run_gradcheck();
  std::cerr << "usage: lab2_tour tape|conv|gradcheck\n";
  return 2;
}
