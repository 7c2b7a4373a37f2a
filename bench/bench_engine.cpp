// bench_engine: the same small models trained for the same number of steps with tapeline and
// with libtorch's own autograd (plain at:: ops on requires_grad tensors, torch::autograd::backward),
// in one process, from the same initial weights on the same data. The ATen kernels are the same on
// both sides, so the ratio measures what each engine adds around them: recording, the backward
// walk, gradient accumulation.
//
// Compute-bound cases (the kernels dominate; the engines should tie):
//   mlp:   784-512-256-10, ReLU, cross-entropy, batch 128, SGD
//   conv:  [conv3x3(1->16)+bn+relu+maxpool2] [conv3x3(16->32)+bn+relu+maxpool2] linear(1568->10),
//          cross-entropy, batch 64 of 1x28x28, SGD
// Dispatch-bound cases (kernels of a microsecond or two: the engine's own work is visible):
//   chain: 1,000 ops on 16x16 tensors, the cycle h = matmul(tanh(h * s + b), w) 250 times, then
//          sum; forward and backward (leaves b, s, w collect 250 gradients each)
//   gpt:   a tiny GPT-2 (d = 64, T = 16, 2 layers, 4 heads, vocabulary 128, batch 4), one
//          training step (forward, cross-entropy, backward, SGD). tapeline runs layers/models'
//          GPT2; the reference is tests/layers/models_reference.h's torch::nn GPT-2 (the one
//          bench_models uses), with the same weights. Its attention is written out (matmul,
//          scale, masked_fill, softmax, matmul) where tapeline records one attention op, so the
//          two sides do not issue the same ATen calls: `aten_calls_*` counts them per step.
//
// Each case: warm-up steps, then `repeats` timed runs of `steps` steps per engine, alternating
// which engine goes first. One JSON line per case:
//   {"bench":"engine","case":"mlp","steps":..,"tapeline_s":..,"reference_s":..,"ratio":..,...}
// tapeline_s / reference_s are the median wall seconds of a run (ratio = their quotient);
// best_tapeline_s / best_reference_s / best_ratio the same for the fastest run of each (the least
// disturbed by other processes on a shared machine); *_cpu_s and cpu_ratio the medians in process
// CPU time. final_loss_* are the losses of the last step of the last run of each engine.
// aten_calls_* are the ATen operator calls of one step on each side (RecordFunction entries
// named aten::*, top-level and nested), counted once outside the timed runs.
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
// Usage: bench_engine [--steps-mlp N] [--steps-conv N] [--steps-chain N] [--steps-gpt N]
//                     [--repeats N] [--threads N] [--only mlp|conv|chain|gpt] [--default-malloc]
//                     [--calls]   (also print each side's ATen calls of one step by name, to stderr)
//                     [--profile tapeline|reference]   (only that engine, steps x repeats steps: for perf)
#include <ATen/record_function.h>
#include <time.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/torch.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "layers/models/gpt2.h"
#include "tests/layers/models_reference.h"

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
  in.params = {init_uniform({16, 1, 3, 3}, 9),    at::ones({16}),          at::zeros({16}),  // conv1, bn1 gamma/beta
               init_uniform({32, 16, 3, 3}, 144), at::ones({32}),          at::zeros({32}),  // conv2, bn2
               init_uniform({10, 1568}, 1568),    init_uniform({10}, 1568)};                 // fc
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
  tl::Variable h = tl::conv2d(x, m.p[0], {}, {1, 1}, {1, 1});                                         // (B, 16, 28, 28)
  h = tl::max_pool2d(tl::relu(tl::batch_norm(h, m.p[1], m.p[2], m.buf[0], m.buf[1], true)), {2, 2});  // (B, 16, 14, 14)
  h = tl::conv2d(h, m.p[3], {}, {1, 1}, {1, 1});                                                      // (B, 32, 14, 14)
  h = tl::max_pool2d(tl::relu(tl::batch_norm(h, m.p[4], m.p[5], m.buf[2], m.buf[3], true)), {2, 2});  // (B, 32, 7, 7)
  return tl::cross_entropy(tl::linear(tl::flatten(h, 1), m.p[6], m.p[7]), y);  // (B, 1568) -> (B, 10)
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

// ---- the dispatch-bound cases ----------------------------------------------------------------
// chain: h = matmul(tanh(h * s + b), w), 250 times (1,000 recorded ops), then sum.
constexpr int kChainCycles = 250;

struct ChainInit {
  at::Tensor x, b, s, w;  // x (16, 16) input; b, s, w (16, 16) leaves
};

ChainInit chain_init() {
  ChainInit in;
  in.x = at::randn({16, 16});
  in.b = at::randn({16, 16}).mul_(0.1);
  in.s = at::empty({16, 16}).uniform_(0.9, 1.1);
  in.w = at::randn({16, 16}).mul_(0.25);  // keeps |h| around 1 through the chain
  return in;
}

struct TlChain {
  tl::Variable x, b, s, w;
  explicit TlChain(const ChainInit& in)
      : x(in.x), b(in.b.clone(), true), s(in.s.clone(), true), w(in.w.clone(), true) {}
  double step() {
    tl::Variable h = x;
    for (int i = 0; i < kChainCycles; ++i) h = tl::matmul(tl::tanh(tl::add(tl::mul(h, s), b)), w);  // (16, 16)
    tl::Variable loss = tl::sum(h);
    loss.backward();
    for (auto* v : {&b, &s, &w}) v->zero_grad();
    return loss.data().item<double>();
  }
};

struct TorchChain {
  at::Tensor x, b, s, w;
  explicit TorchChain(const ChainInit& in)
      : x(in.x),
        b(in.b.clone().set_requires_grad(true)),
        s(in.s.clone().set_requires_grad(true)),
        w(in.w.clone().set_requires_grad(true)) {}
  double step() {
    at::Tensor h = x;
    for (int i = 0; i < kChainCycles; ++i) h = at::matmul(at::tanh(at::add(at::mul(h, s), b)), w);
    at::Tensor loss = at::sum(h);
    torch::autograd::backward({loss});
    for (auto* t : {&b, &s, &w}) t->mutable_grad() = at::Tensor();
    return loss.item<double>();
  }
};

// gpt: tiny GPT-2, B 4, T 16, d 64, 2 layers, 4 heads, vocabulary 128.
constexpr int64_t kGptBatch = 4, kGptT = 16, kGptDim = 64, kGptLayers = 2, kGptHeads = 4, kGptVocab = 128;

tl::GPT2Config tiny_gpt_config() {
  tl::GPT2Config c;
  c.vocab_size = kGptVocab;
  c.n_positions = kGptT;
  c.n_embd = kGptDim;
  c.n_layer = kGptLayers;
  c.n_head = kGptHeads;
  c.dropout = 0.0;  // the reference has no dropout
  return c;
}

struct GptData {
  at::Tensor ids, target;  // (B, T) int64, (B*T) int64
};

struct TlGpt {
  std::shared_ptr<tl::GPT2> model;
  std::vector<tl::Variable> params;
  const GptData* data;
  TlGpt(const tl::TensorMap& weights, const GptData& d)
      : model(std::make_shared<tl::GPT2>(tiny_gpt_config())), data(&d) {
    model->load_state_dict(weights);
    params = model->parameters();
  }
  double step() {
    tl::Variable logits = tl::reshape(model->forward(data->ids), {kGptBatch * kGptT, kGptVocab});  // (B*T, V)
    tl::Variable loss = tl::cross_entropy(logits, data->target);
    loss.backward();
    tl::NoGradGuard no_grad;
    for (auto& p : params) {
      p.mutable_data().add_(p.grad(), -kLr);
      p.zero_grad();
    }
    return loss.data().item<double>();
  }
};

struct TorchGpt {
  tl::reference::GPT2 model;
  std::vector<at::Tensor> params;
  const GptData* data;
  TorchGpt(const tl::TensorMap& weights, const GptData& d)
      : model(kGptVocab, kGptT, kGptDim, kGptLayers, kGptHeads), data(&d) {
    TORCH_CHECK(tl::reference::copy_into(*model, weights).empty(), "bench_engine: reference GPT-2 names differ");
    params = model->parameters();
  }
  double step() {
    at::Tensor logits = model->forward(data->ids).reshape({kGptBatch * kGptT, kGptVocab});
    at::Tensor loss = at::cross_entropy_loss(logits, data->target);
    torch::autograd::backward({loss});
    torch::NoGradGuard no_grad;
    for (auto& p : params) {
      p.add_(p.grad(), -kLr);
      p.mutable_grad() = at::Tensor();
    }
    return loss.item<double>();
  }
};

// ---- timing ----------------------------------------------------------------------------------
// A runner runs `steps` steps of one engine from a fresh copy of the case's initial state and
// returns wall and CPU seconds, storing the last loss. `prepare_step` builds a fresh model, runs
// one step and returns a function running the next (so that counting it leaves construction out).
struct Engine {
  std::function<Timing(int steps, double& last_loss)> run;
  std::function<std::function<void()>()> prepare_step;
};

template <class Model, class... A>
Engine make_engine(A... args) {
  auto run = [=](int steps, double& last_loss) {
    Model m(args...);
    const double c0 = cpu_seconds();
    const auto t0 = Clock::now();
    for (int s = 0; s < steps; ++s) {
      const double loss = m.step();
      if (s == steps - 1) last_loss = loss;
    }
    return Timing{std::chrono::duration<double>(Clock::now() - t0).count(), cpu_seconds() - c0};
  };
  auto prepare = [=] {
    auto m = std::make_shared<Model>(args...);
    m->step();
    return std::function<void()>([m] { m->step(); });
  };
  return {run, prepare};
}

// The mlp/conv cases as models with a step().
using LossTl = std::function<tl::Variable(TapelineModel&, const at::Tensor&, const at::Tensor&)>;
using LossTorch = std::function<at::Tensor(TorchModel&, const at::Tensor&, const at::Tensor&)>;
struct TlSmall {
  TapelineModel m;
  at::Tensor x, y;
  LossTl loss_fn;
  TlSmall(const Init& in, at::Tensor x, at::Tensor y, LossTl f) : m(in), x(x), y(y), loss_fn(f) {}
  double step() {
    tl::Variable loss = loss_fn(m, x, y);
    loss.backward();
    m.sgd();
    return loss.data().item<double>();
  }
};
struct TorchSmall {
  TorchModel m;
  at::Tensor x, y;
  LossTorch loss_fn;
  TorchSmall(const Init& in, at::Tensor x, at::Tensor y, LossTorch f) : m(in), x(x), y(y), loss_fn(f) {}
  double step() {
    at::Tensor loss = loss_fn(m, x, y);
    torch::autograd::backward({loss});
    m.sgd();
    return loss.item<double>();
  }
};

// ATen operator calls made by fn on this thread (RecordFunction start callbacks named aten::*).
thread_local int64_t aten_calls = 0;
int64_t count_aten_calls(const std::function<void()>& fn) {
  auto handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction& f) -> std::unique_ptr<at::ObserverContext> {
        if (std::strncmp(f.name(), "aten::", 6) == 0) ++aten_calls;  // not the engine's own entries
        return nullptr;
      }).scopes({at::RecordScope::FUNCTION}));
  aten_calls = 0;
  fn();
  const int64_t n = aten_calls;
  at::removeCallback(handle);
  return n;
}

// With --calls: the ATen operators of one step by name (profiling aid), to stderr.
thread_local std::map<std::string, int64_t>* call_names = nullptr;
void print_calls(const char* side, const std::function<void()>& fn) {
  std::map<std::string, int64_t> names;
  call_names = &names;
  auto handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction& f) -> std::unique_ptr<at::ObserverContext> {
        ++(*call_names)[f.name()];
        return nullptr;
      }).scopes({at::RecordScope::FUNCTION}));
  fn();
  at::removeCallback(handle);
  call_names = nullptr;
  std::vector<std::pair<int64_t, std::string>> sorted;
  for (const auto& [n, c] : names) sorted.emplace_back(c, n);
  std::sort(sorted.rbegin(), sorted.rend());
  std::fprintf(stderr, "%s:", side);
  for (const auto& [c, n] : sorted) std::fprintf(stderr, " %s=%lld", n.c_str(), static_cast<long long>(c));
  std::fprintf(stderr, "\n");
}

bool g_print_calls = false;
std::string g_profile_side;  // --profile tapeline|reference: run one engine only (for perf/callgrind)

void bench(const std::string& name, int steps, int repeats, const Engine& tl_engine, const Engine& ref_engine,
           const char* malloc_mode) {
  double loss_tl = 0, loss_ref = 0;
  if (!g_profile_side.empty()) {
    const Engine& e = g_profile_side == "reference" ? ref_engine : tl_engine;
    const Timing t = e.run(steps * repeats, loss_tl);
    std::printf("{\"bench\":\"engine\",\"case\":\"%s\",\"profile\":\"%s\",\"steps\":%d,\"wall_s\":%.6f,\"cpu_s\":%.6f}\n",
                name.c_str(), g_profile_side.c_str(), steps * repeats, t.wall, t.cpu);
    return;
  }
  tl_engine.run(3, loss_tl);  // warm-up: allocator, kernels' first-call setup
  ref_engine.run(3, loss_ref);
  const int64_t calls_tl = count_aten_calls(tl_engine.prepare_step());
  const int64_t calls_ref = count_aten_calls(ref_engine.prepare_step());
  if (g_print_calls) {
    print_calls("tapeline", tl_engine.prepare_step());
    print_calls("reference", ref_engine.prepare_step());
  }
  std::vector<double> wall_tl, wall_ref, cpu_tl, cpu_ref;
  auto add = [](std::vector<double>& wall, std::vector<double>& cpu, Timing t) {
    wall.push_back(t.wall);
    cpu.push_back(t.cpu);
  };
  for (int r = 0; r < repeats; ++r) {
    if (r % 2 == 0) {
      add(wall_tl, cpu_tl, tl_engine.run(steps, loss_tl));
      add(wall_ref, cpu_ref, ref_engine.run(steps, loss_ref));
    } else {
      add(wall_ref, cpu_ref, ref_engine.run(steps, loss_ref));
      add(wall_tl, cpu_tl, tl_engine.run(steps, loss_tl));
    }
  }
  const double a = median(wall_tl), b = median(wall_ref);
  const double ba = *std::min_element(wall_tl.begin(), wall_tl.end());
  const double bb = *std::min_element(wall_ref.begin(), wall_ref.end());
  const double ca = median(cpu_tl), cb = median(cpu_ref);
  std::printf(
      "{\"bench\":\"engine\",\"case\":\"%s\",\"steps\":%d,\"repeats\":%d,\"threads\":%d,\"tapeline_s\":%.6f,"
      "\"reference_s\":%.6f,\"ratio\":%.4f,\"best_tapeline_s\":%.6f,\"best_reference_s\":%.6f,\"best_ratio\":%.4f,"
      "\"tapeline_cpu_s\":%.6f,\"reference_cpu_s\":%.6f,\"cpu_ratio\":%.4f,\"aten_calls_tapeline\":%lld,"
      "\"aten_calls_reference\":%lld,\"final_loss_tapeline\":%.6f,\"final_loss_reference\":%.6f,\"malloc\":\"%s\"}\n",
      name.c_str(), steps, repeats, at::get_num_threads(), a, b, a / b, ba, bb, ba / bb, ca, cb, ca / cb,
      static_cast<long long>(calls_tl), static_cast<long long>(calls_ref), loss_tl, loss_ref, malloc_mode);
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
    mallopt(M_MMAP_THRESHOLD, 64 << 20);   // fixed (not adaptive): tensors below 64 MiB come from the heap
    mallopt(M_TRIM_THRESHOLD, 512 << 20);  // keep up to 512 MiB of freed heap mapped
    return "tuned";
  }
#endif
  return "default";
}

}  // namespace

const char* str_arg(int argc, char** argv, const char* flag, const char* def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], flag) == 0) return argv[i + 1];
  return def;
}

int main(int argc, char** argv) {
  const int threads = int_arg(argc, argv, "--threads", 0);
  if (threads > 0) at::set_num_threads(threads);
  const int repeats = int_arg(argc, argv, "--repeats", 7);
  const char* malloc_mode = configure_malloc(flag_arg(argc, argv, "--default-malloc"));
  const std::string only = str_arg(argc, argv, "--only", "");
  g_print_calls = flag_arg(argc, argv, "--calls");
  g_profile_side = str_arg(argc, argv, "--profile", "");
  TORCH_CHECK(g_profile_side.empty() || g_profile_side == "tapeline" || g_profile_side == "reference",
              "bench_engine: --profile takes tapeline or reference, got '", g_profile_side, "'");
  auto wanted = [&](const char* name) { return only.empty() || only == name; };
  at::manual_seed(0);

  if (wanted("mlp")) {
    const Init in = mlp_init();
    const at::Tensor x = at::randn({128, 784}), y = at::randint(10, {128}, at::TensorOptions(at::kLong));
    bench("mlp", int_arg(argc, argv, "--steps-mlp", 20), repeats, make_engine<TlSmall>(in, x, y, LossTl(tl_mlp)),
          make_engine<TorchSmall>(in, x, y, LossTorch(torch_mlp)), malloc_mode);
  }
  if (wanted("conv")) {
    const Init in = conv_init();
    const at::Tensor x = at::randn({64, 1, 28, 28}), y = at::randint(10, {64}, at::TensorOptions(at::kLong));
    bench("conv", int_arg(argc, argv, "--steps-conv", 10), repeats, make_engine<TlSmall>(in, x, y, LossTl(tl_conv)),
          make_engine<TorchSmall>(in, x, y, LossTorch(torch_conv)), malloc_mode);
  }
  if (wanted("chain")) {
    const ChainInit in = chain_init();
    bench("chain1000_16x16", int_arg(argc, argv, "--steps-chain", 20), repeats, make_engine<TlChain>(in),
          make_engine<TorchChain>(in), malloc_mode);
  }
  if (wanted("gpt")) {
    at::manual_seed(1);
    const tl::TensorMap weights = tl::GPT2(tiny_gpt_config()).state_dict();
    GptData d{at::randint(kGptVocab, {kGptBatch, kGptT}, at::kLong),
              at::randint(kGptVocab, {kGptBatch * kGptT}, at::kLong)};
    bench("gpt_tiny_d64_t16_l2", int_arg(argc, argv, "--steps-gpt", 20), repeats, make_engine<TlGpt>(weights, d),
          make_engine<TorchGpt>(weights, d), malloc_mode);
  }
  return 0;
}
