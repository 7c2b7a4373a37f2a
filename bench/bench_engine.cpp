// bench_engine: the same small models trained for the same number of SGD steps with tapeline and
// with libtorch's own autograd (plain at:: ops on requires_grad tensors, torch::autograd::backward,
// no torch::nn), in one process, from the same initial weights on the same data. The ATen kernels
// are the same on both sides, so the ratio measures what each engine adds around them: recording,
// the backward walk, gradient accumulation.
//
//   mlp:  784-512-256-10, ReLU, cross-entropy, batch 128
//   conv: [conv3x3(1->16)+bn+relu+maxpool2] [conv3x3(16->32)+bn+relu+maxpool2] linear(1568->10),
//         cross-entropy, batch 64 of 1x28x28
//
// Each case: warm-up steps, then `repeats` timed runs of `steps` steps per engine, alternating
// which engine goes first; the medians are reported. One JSON line per case:
//   {"bench":"engine","case":"mlp","steps":..,"tapeline_s":..,"reference_s":..,"ratio":..,...}
// tapeline_s and reference_s are the median wall seconds for `steps` steps (ratio = their quotient);
// *_cpu_s and cpu_ratio the same in process CPU time. final_loss_* are the losses
// of the last step of the last run of each engine (same trajectory up to float rounding).
//
// Note [allocator settings]
// Both engines run exactly the same sequence of large tensor allocations and frees (checked with
// an allocation trace, conv case) and a similar number of small ones (~1,250 vs ~1,300 mallocs per
// step), but glibc's adaptive heap trimming returns freed activations to the kernel at the end of
// each step, and how much depends on where the small allocations happened to land. Measured on
// the conv case: ~3,500 vs ~3,100 page faults per step (tapeline vs libtorch), worth several % of
// the step, while the user-space instruction counts are equal (callgrind: 125.0 M vs 125.3 M per
// step). With the thresholds raised, faults drop to ~0 for both and the conv step is ~25% faster
// on both sides. By default the benchmark therefore
// raises glibc's mmap and trim thresholds once, for both engines alike, so freed activations are
// reused instead of returned to the kernel and faulted in again; `--default-malloc` keeps glibc's
// defaults. The JSON says which was used.
//
// Usage: bench_engine [--steps-mlp N] [--steps-conv N] [--repeats N] [--threads N] [--default-malloc]
#include <torch/csrc/autograd/autograd.h>
#include <torch/torch.h>

#include <time.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "autograd/autograd.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr double kLr = 0.01;

// CPU seconds used by this process (all threads). On a shared machine wall time includes the
// time other processes held the cores; CPU time does not, so its ratio is the steadier one.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Timing {
  double wall = 0, cpu = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)), like torch's default Linear/Conv init.
at::Tensor init_uniform(at::IntArrayRef shape, int64_t fan_in) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  return at::empty(shape).uniform_(-bound, bound);
}

// ---- the models' parameters ------------------------------------------------------------------
struct Init {
  std::vector<at::Tensor> params;   // trained
  std::vector<at::Tensor> buffers;  // BN running statistics
};

Init mlp_init() {
  Init in;
  const int64_t dims[] = {784, 512, 256, 10};
  for (int i = 0; i < 3; ++i) {
    in.params.push_back(init_uniform({dims[i + 1], dims[i]}, dims[i]));  // W (out, in)
    in.params.push_back(init_uniform({dims[i + 1]}, dims[i]));           // b (out)
  }
  return in;
}

Init conv_init() {
  Init in;
  in.params = {init_uniform({16, 1, 3, 3}, 9),   at::ones({16}), at::zeros({16}),  // conv1, bn1 gamma/beta
               init_uniform({32, 16, 3, 3}, 144), at::ones({32}), at::zeros({32}),  // conv2, bn2
               init_uniform({10, 1568}, 1568),   init_uniform({10}, 1568)};          // fc
  in.buffers = {at::zeros({16}), at::ones({16}), at::zeros({32}), at::ones({32})};
  return in;
}

// ---- tapeline --------------------------------------------------------------------------------
struct TapelineModel {
  std::vector<tl::Variable> p;
  std::vector<at::Tensor> buf;
  explicit TapelineModel(const Init& in) {
    for (const auto& t : in.params) p.emplace_back(t.clone(), true);
    for (const auto& t : in.buffers) buf.push_back(t.clone());
  }
  void sgd() {
    tl::NoGradGuard no_grad;
    for (auto& v : p) {
      v.mutable_data().add_(v.grad(), -kLr);
      v.zero_grad();
    }
  }
};

tl::Variable tl_mlp(TapelineModel& m, const at::Tensor& x_in, const at::Tensor& y) {
  tl::Variable x(x_in);
  tl::Variable h = tl::relu(tl::linear(x, m.p[0], m.p[1]));  // (B, 512)
  h = tl::relu(tl::linear(h, m.p[2], m.p[3]));               // (B, 256)
  return tl::cross_entropy(tl::linear(h, m.p[4], m.p[5]), y);
}

tl::Variable tl_conv(TapelineModel& m, const at::Tensor& x_in, const at::Tensor& y) {
  tl::Variable x(x_in);
  tl::Variable h = tl::conv2d(x, m.p[0], {}, {1, 1}, {1, 1});                      // (B, 16, 28, 28)
  h = tl::max_pool2d(tl::relu(tl::batch_norm(h, m.p[1], m.p[2], m.buf[0], m.buf[1], true)), {2, 2});  // (B, 16, 14, 14)
  h = tl::conv2d(h, m.p[3], {}, {1, 1}, {1, 1});                                   // (B, 32, 14, 14)
  h = tl::max_pool2d(tl::relu(tl::batch_norm(h, m.p[4], m.p[5], m.buf[2], m.buf[3], true)), {2, 2});  // (B, 32, 7, 7)
  return tl::cross_entropy(tl::linear(tl::flatten(h, 1), m.p[6], m.p[7]), y);      // (B, 1568) -> (B, 10)
}

// ---- libtorch autograd -----------------------------------------------------------------------
struct TorchModel {
  std::vector<at::Tensor> p;
  std::vector<at::Tensor> buf;
  explicit TorchModel(const Init& in) {
    for (const auto& t : in.params) p.push_back(t.clone().set_requires_grad(true));
    for (const auto& t : in.buffers) buf.push_back(t.clone());
  }
  void sgd() {
    torch::NoGradGuard no_grad;
    for (auto& t : p) {
      t.add_(t.grad(), -kLr);
      t.mutable_grad() = at::Tensor();
    }
  }
};

at::Tensor torch_mlp(TorchModel& m, const at::Tensor& x, const at::Tensor& y) {
  at::Tensor h = at::relu(at::linear(x, m.p[0], m.p[1]));
  h = at::relu(at::linear(h, m.p[2], m.p[3]));
  return at::cross_entropy_loss(at::linear(h, m.p[4], m.p[5]), y);
}

at::Tensor torch_conv(TorchModel& m, const at::Tensor& x, const at::Tensor& y) {
  at::Tensor h = at::conv2d(x, m.p[0], {}, {1, 1}, {1, 1});
  h = at::max_pool2d(at::relu(at::batch_norm(h, m.p[1], m.p[2], m.buf[0], m.buf[1], true, 0.1, 1e-5, true)), {2, 2});
  h = at::conv2d(h, m.p[3], {}, {1, 1}, {1, 1});
  h = at::max_pool2d(at::relu(at::batch_norm(h, m.p[4], m.p[5], m.buf[2], m.buf[3], true, 0.1, 1e-5, true)), {2, 2});
  return at::cross_entropy_loss(at::linear(h.flatten(1), m.p[6], m.p[7]), y);
}

// ---- timing ----------------------------------------------------------------------------------
struct Case {
  std::string name;
  int steps;
  std::function<Init()> init;
  at::Tensor x, y;
  std::function<tl::Variable(TapelineModel&, const at::Tensor&, const at::Tensor&)> tl_loss;
  std::function<at::Tensor(TorchModel&, const at::Tensor&, const at::Tensor&)> torch_loss;
};

// Runs `steps` SGD steps from `init`; returns wall and CPU seconds and stores the last loss.
Timing run_tapeline(const Case& c, const Init& init, int steps, double& last_loss) {
  TapelineModel m(init);
  const double c0 = cpu_seconds();
  const auto t0 = Clock::now();
  for (int s = 0; s < steps; ++s) {
    tl::Variable loss = c.tl_loss(m, c.x, c.y);
    loss.backward();
    m.sgd();
    if (s == steps - 1) last_loss = loss.item<double>();
  }
  return {std::chrono::duration<double>(Clock::now() - t0).count(), cpu_seconds() - c0};
}

Timing run_reference(const Case& c, const Init& init, int steps, double& last_loss) {
  TorchModel m(init);
  const double c0 = cpu_seconds();
  const auto t0 = Clock::now();
  for (int s = 0; s < steps; ++s) {
    at::Tensor loss = c.torch_loss(m, c.x, c.y);
    torch::autograd::backward({loss});
    m.sgd();
    if (s == steps - 1) last_loss = loss.item<double>();
  }
  return {std::chrono::duration<double>(Clock::now() - t0).count(), cpu_seconds() - c0};
}

void bench(const Case& c, int repeats, const char* malloc_mode) {
  const Init init = c.init();
  double loss_tl = 0, loss_ref = 0;
  run_tapeline(c, init, 3, loss_tl);  // warm-up: allocator, kernels' first-call setup
  run_reference(c, init, 3, loss_ref);
  std::vector<double> wall_tl, wall_ref, cpu_tl, cpu_ref;
  auto add = [](std::vector<double>& wall, std::vector<double>& cpu, Timing t) {
    wall.push_back(t.wall);
    cpu.push_back(t.cpu);
  };
  for (int r = 0; r < repeats; ++r) {
    if (r % 2 == 0) {
      add(wall_tl, cpu_tl, run_tapeline(c, init, c.steps, loss_tl));
      add(wall_ref, cpu_ref, run_reference(c, init, c.steps, loss_ref));
    } else {
      add(wall_ref, cpu_ref, run_reference(c, init, c.steps, loss_ref));
      add(wall_tl, cpu_tl, run_tapeline(c, init, c.steps, loss_tl));
    }
  }
  const double a = median(wall_tl), b = median(wall_ref);
  const double ca = median(cpu_tl), cb = median(cpu_ref);
  std::printf(
      "{\"bench\":\"engine\",\"case\":\"%s\",\"steps\":%d,\"repeats\":%d,\"threads\":%d,\"tapeline_s\":%.6f,"
      "\"reference_s\":%.6f,\"ratio\":%.4f,\"tapeline_cpu_s\":%.6f,\"reference_cpu_s\":%.6f,\"cpu_ratio\":%.4f,"
      "\"final_loss_tapeline\":%.6f,\"final_loss_reference\":%.6f,\"malloc\":\"%s\"}\n",
      c.name.c_str(), c.steps, repeats, at::get_num_threads(), a, b, a / b, ca, cb, ca / cb, loss_tl, loss_ref,
      malloc_mode);
  std::fflush(stdout);
}

int int_arg(int argc, char** argv, const char* flag, int def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], flag) == 0) return std::atoi(argv[i + 1]);
  return def;
}

bool flag_arg(int argc, char** argv, const char* flag) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], flag) == 0) return true;
  return false;
}

// See Note [allocator settings]. Returns the mode for the JSON line.
const char* configure_malloc(bool keep_default) {
#ifdef __GLIBC__
  if (!keep_default) {
    mallopt(M_MMAP_THRESHOLD, 64 << 20);  // fixed (not adaptive): tensors below 64 MiB come from the heap
    mallopt(M_TRIM_THRESHOLD, 512 << 20);  // keep up to 512 MiB of freed heap mapped
    return "tuned";
  }
#endif
  return "default";
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = int_arg(argc, argv, "--threads", 0);
  if (threads > 0) at::set_num_threads(threads);
  const int repeats = int_arg(argc, argv, "--repeats", 7);
  const char* malloc_mode = configure_malloc(flag_arg(argc, argv, "--default-malloc"));
  at::manual_seed(0);

  Case mlp{"mlp", int_arg(argc, argv, "--steps-mlp", 20), mlp_init, at::randn({128, 784}),
           at::randint(10, {128}, at::TensorOptions(at::kLong)), tl_mlp, torch_mlp};
  Case conv{"conv", int_arg(argc, argv, "--steps-conv", 10), conv_init, at::randn({64, 1, 28, 28}),
            at::randint(10, {64}, at::TensorOptions(at::kLong)), tl_conv, torch_conv};
  bench(mlp, repeats, malloc_mode);
  bench(conv, repeats, malloc_mode);
  return 0;
}
