// bench_train: images per second of one training step (forward, loss, backward, SGD step) of a
// ResNet split into stages with compression boundaries, against the unsplit model in the same run.
//   - identity boundaries vs unsplit: the cost of splitting (expected ratio ~1.0);
//   - TopK / quantisation / EF boundaries vs identity boundaries: the codecs' overhead;
//   - micro-batches (identity) vs one batch: the cost of running M smaller passes.
// Cases and reference are timed in alternating rounds (ref step, case step, ref step, ...), so
// load from other processes hits both alike; each number is the median over the rounds.
// One JSON line per case:
//   {"bench":"train_step","model":..,"batch":..,"image":..,"stages":..,"case":..,"reference":..,
//    "images_per_s":..,"ref_images_per_s":..,"ratio":..}     ratio = images_per_s / ref_images_per_s
//
// The allocator keeps freed memory (as the tapeline CLI does).
// Usage: bench_train [--rounds N] [--batch B] [--threads N] [--model resnet8|resnet20|resnet18]
//                    [--width W] [--size HW] [--channels C] [--device cpu|cuda]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "layers/models/resnet.h"
#include "layers/optim/sgd.h"
#include "bench/bench_util.h"
#include "parallel/local_executor.h"
#include "tasks/task.h"

namespace {
using namespace tl;
using Clock = std::chrono::steady_clock;

using bench::median;

struct Options {
  int rounds = 15;
  int64_t batch = 128, size = 28, channels = 1, threads = 0;
  std::string model = "resnet8";
  double width = 1.0;
  std::string device = "cpu";
};

// One trainable setup: a model (split or not), its optimizer and a step function.
struct Runner {
  std::shared_ptr<ResNet> model;
  std::shared_ptr<Pipeline> pipeline;  // null: unsplit
  std::unique_ptr<LocalExecutor> executor;  // runs `pipeline`
  std::unique_ptr<SGD> opt;
  int64_t micro_batches = 1;

  double step(const at::Tensor& x, const at::Tensor& y, const at::Tensor& ids, at::Device device) {
    auto t0 = Clock::now();
    opt->zero_grad();
    if (pipeline) {
      Batch b;
      b.input = x, b.target = y, b.sample_ids = ids, b.units = at::ones({x.size(0)}, at::kLong);
      executor->train_step(b, micro_batches, {});
    } else {
      Variable loss = cross_entropy(model->forward(Variable(x)), y);
      loss.backward();
    }
    opt->step();
    if (pipeline) pipeline->after_optimizer_step();
    if (device.is_cuda()) (void)x.sum().item<float>();  // wait for the device
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
};

Runner make_runner(const Options& o, at::Device device, const std::vector<std::string>& cuts, const std::string& fwd,
                   const std::string& bwd, int64_t micro_batches) {
  Runner r;
  at::Generator gen = at::detail::createCPUGenerator(1);
  r.model = make_resnet(o.model, o.channels, 10, o.width, gen);
  r.micro_batches = micro_batches;
  Module* params = r.model.get();
  if (!fwd.empty()) {
    BoundarySpec s;
    s.forward = fwd;
    s.backward = bwd;
    r.pipeline = Pipeline::build(r.model, cuts, std::vector<BoundarySpec>(cuts.size(), s));
    r.executor = std::make_unique<LocalExecutor>(*r.pipeline, classification_loss);
    params = r.pipeline.get();
  }
  params->to(device);
  GroupOptions g;
  g.lr = 0.01;
  g.momentum = 0.9;
  g.weight_decay = 5e-4;
  r.opt = std::make_unique<SGD>(weight_decay_groups(*params, 5e-4), g);
  return r;
}

void emit(const Options& o, size_t stages, const std::string& name, const std::string& ref_name, double t,
          double t_ref) {
  const double ips = static_cast<double>(o.batch) / t, ref = static_cast<double>(o.batch) / t_ref;
  std::printf(
      "{\"bench\":\"train_step\",\"device\":\"%s\",\"model\":\"%s\",\"width\":%g,\"batch\":%lld,\"image\":\"%lldx%lldx%"
      "lld\","
      "\"threads\":%d,\"stages\":%zu,\"case\":\"%s\",\"reference\":\"%s\",\"images_per_s\":%.1f,\"ref_images_per_s\":%."
      "1f,"
      "\"ratio\":%.3f}\n",
      o.device.c_str(), o.model.c_str(), o.width, (long long)o.batch, (long long)o.channels, (long long)o.size,
      (long long)o.size, at::get_num_threads(), stages, name.c_str(), ref_name.c_str(), ips, ref, ips / ref);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--rounds")
      o.rounds = std::stoi(v);
    else if (k == "--batch")
      o.batch = std::stoll(v);
    else if (k == "--threads")
      o.threads = std::stoll(v);
    else if (k == "--model")
      o.model = v;
    else if (k == "--width")
      o.width = std::stod(v);
    else if (k == "--size")
      o.size = std::stoll(v);
    else if (k == "--channels")
      o.channels = std::stoll(v);
    else if (k == "--device")
      o.device = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  // As in the tapeline CLI (Note [allocator] in tasks/runner/cli/tapeline.cpp): keep freed memory in the
  // heap so that per-step buffers do not start with page faults.
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  if (o.threads > 0) at::set_num_threads(static_cast<int>(o.threads));
  at::Device device = at::kCPU;
  try {
    device = at::Device(o.device);
  } catch (const c10::Error&) {
    std::fprintf(stderr, "bench_train: --device '%s' is not a device; accepted: cpu, cuda, cuda:N\n", o.device.c_str());
    return 2;
  }
  if (device.is_cuda() && !at::hasCUDA()) {
    std::printf("{\"bench\":\"train_step\",\"device\":\"%s\",\"skipped\":\"no CUDA device\"}\n", o.device.c_str());
    return 0;
  }
  at::manual_seed(0);
  at::Tensor x = at::randn({o.batch, o.channels, o.size, o.size}).to(device);
  at::Tensor y = at::randint(0, 10, {o.batch}, at::kLong).to(device);
  at::Tensor ids = at::arange(o.batch, at::kLong);
  const std::vector<std::string> cuts = {"layer1", "layer2", "layer3"};  // 4 stages (Rudakov et al.)

  struct Case {
    std::string name, fwd, bwd;
    int64_t micro_batches;
    std::string reference;  // "unsplit" or "identity"
  };
  const std::vector<Case> cases = {
      {"split4 identity", "identity", "identity", 1, "unsplit"},
      {"split4 identity, 4 micro-batches", "identity", "identity", 4, "identity"},
      {"split4 topk(0.1) fwd+bwd", "topk(0.1)", "topk(0.1)", 1, "identity"},
      {"split4 topk(0.3) fwd+bwd", "topk(0.3)", "topk(0.3)", 1, "identity"},
      {"split4 quant(4) fwd+bwd", "quant(4)", "quant(4)", 1, "identity"},
      {"split4 quant(8) fwd, identity bwd", "quant(8)", "identity", 1, "identity"},
      {"split4 ef(topk(0.1)) fwd+bwd", "ef(topk(0.1))", "ef(topk(0.1))", 1, "identity"},
  };
  Runner unsplit = make_runner(o, device, cuts, "", "", 1);
  Runner identity = make_runner(o, device, cuts, "identity", "identity", 1);
  for (const Case& c : cases) {
    Runner run = make_runner(o, device, cuts, c.fwd, c.bwd, c.micro_batches);
    Runner& ref = c.reference == "unsplit" ? unsplit : identity;
    for (int w = 0; w < 2; ++w) ref.step(x, y, ids, device), run.step(x, y, ids, device);  // warm-up
    std::vector<double> t_ref, t_case;
    for (int r = 0; r < o.rounds; ++r) {
      t_ref.push_back(ref.step(x, y, ids, device));
      t_case.push_back(run.step(x, y, ids, device));
    }
    emit(o, cuts.size() + 1, c.name, c.reference == "unsplit" ? "unsplit model" : "split4 identity", median(t_case),
         median(t_ref));
  }
  return 0;
}
