// bench_pipeline: the in-process executor's training step against pipeline theory, in one run.
//
// Models cut into 4 stages with identity boundaries, M micro-batches per step:
//   resnet8: ResNet-8 on 1x28x28 images, batch 128, cuts layer1, layer2, layer3
//   gpt2:    GPT-2 (4 layers, d = 256, 4 heads, 256 byte tokens), batch 32 x 64 tokens, cuts h.0..h.2
// For each model and schedule (gpipe, 1f1b), per step:
//   timeline_s  the step on the executor's timeline (each stage's clock advanced by its measured
//               forwards and backwards and by waits for messages; ideal links)
//   ideal_s     sum_i t_i + (M - 1) max_i t_i with t_i = c_i / M and c_i stage i's measured compute
//               in that step: the textbook pipeline time ((M + S - 1) t for equal stages), one pass
//               through every stage plus M - 1 micro-batches on the slowest stage, no overheads.
//               With unequal stages it is not a bound: 1F1B overlaps the slowest stage's backwards
//               with the last micro-batch's trip, and can beat it (efficiency > 1)
//   bound_s     max_i c_i, the busiest stage's compute: no schedule is faster
//   efficiency  ideal_s / timeline_s (target >= 0.85 for 1F1B)
//   wall_s      real seconds of the step here (the stages run one after another in this process)
//   compute_s   sum_i c_i; overhead = wall_s / compute_s - 1 (the executor's bookkeeping, payloads)
//   unsplit_s   the same batch through the unsplit model in one pass (reference for wall_s)
// Then, 1F1B on links of 80 Mbit/s (no latency) at every cut: the timeline step uncompressed and
// with TopK 10% and 4-bit quantisation at the cuts (speedup = uncompressed / compressed).
// Medians over the rounds (steps alternate between the cases of a model). One JSON line each:
//   {"bench":"pipeline","model":..,"schedule":..,"micro_batches":..,"timeline_s":..,"ideal_s":..,
//    "efficiency":..,"wall_s":..,"compute_s":..,"overhead":..,"unsplit_s":..}
//   {"bench":"pipeline_link","model":..,"link":"80 Mbit/s","case":..,"timeline_s":..,"bytes_per_step":..,
//    "reference_timeline_s":..,"speedup":..}
// Usage: bench_pipeline [rounds (default 7)] [micro-batches (default 8)]
#include <malloc.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "layers/models/gpt2.h"
#include "layers/models/resnet.h"
#include "parallel/executor.h"
#include "bench/bench_util.h"
#include "parallel/pipeline.h"
#include "tasks/task.h"

namespace {
using namespace tl;
using Clock = std::chrono::steady_clock;

using bench::median;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// A model, its batch and its loss.
struct Workload {
  std::string name;
  std::function<ModulePtr()> make;  // same weights every call
  std::vector<std::string> cuts;
  Batch batch;
  Pipeline::LossFn loss;
};

/// What one timed step of a pipeline gives.
struct Sample {
  double timeline = 0, ideal = 0, bound = 0, wall = 0, compute = 0, bytes = 0;
};

Sample step(Pipeline& p, const Workload& w, int64_t m) {
  for (auto& param : p.parameters()) param.zero_grad();
  p.reset_stats();
  const auto t0 = Clock::now();
  p.train_step(w.batch, m, w.loss);
  Sample s;
  s.wall = seconds_since(t0);
  const StepTiming& t = p.last_timing();
  s.timeline = t.step_s;
  double sum = 0, slowest = 0;
  for (double c : t.compute_s) sum += c, slowest = std::max(slowest, c);
  const double md = static_cast<double>(m);
  s.ideal = sum / md + (md - 1) * slowest / md;
  s.compute = sum;
  s.bound = slowest;
  const BoundaryStats st = p.total_stats();
  s.bytes = static_cast<double>(st.forward.bytes + st.backward.bytes);
  return s;
}

std::shared_ptr<Pipeline> build(const Workload& w, const std::string& fwd, const std::string& bwd) {
  BoundarySpec spec;
  spec.forward = fwd;
  spec.backward = bwd;
  return Pipeline::build(w.make(), w.cuts, std::vector<BoundarySpec>(w.cuts.size(), spec));
}

double unsplit_step(Module& model, const Workload& w) {
  for (auto& param : model.parameters()) param.zero_grad();
  const auto t0 = Clock::now();
  Variable out = model.forward(Variable(w.batch.input));
  w.loss(out, w.batch).loss.backward();
  return seconds_since(t0);
}

void schedules(const Workload& w, int rounds, int64_t m) {
  auto gpipe = build(w, "identity", "identity"), one_f = build(w, "identity", "identity");
  gpipe->set_schedule("gpipe");
  one_f->set_schedule("1f1b");
  ModulePtr unsplit = w.make();
  std::vector<Sample> g, f;
  std::vector<double> u;
  for (int r = -1; r < rounds; ++r) {  // round -1: warm-up
    Sample a = step(*gpipe, w, m), b = step(*one_f, w, m);
    const double c = unsplit_step(*unsplit, w);
    if (r < 0) continue;
    g.push_back(a), f.push_back(b), u.push_back(c);
  }
  for (const auto& [name, v] : {std::make_pair("gpipe", &g), std::make_pair("1f1b", &f)}) {
    std::vector<double> tl, ideal, bound, eff, wall, compute;
    for (const Sample& s : *v)
      tl.push_back(s.timeline), ideal.push_back(s.ideal), bound.push_back(s.bound), eff.push_back(s.ideal / s.timeline),
          wall.push_back(s.wall), compute.push_back(s.compute);
    std::printf(
        "{\"bench\":\"pipeline\",\"model\":\"%s\",\"schedule\":\"%s\",\"stages\":%zu,\"micro_batches\":%lld,"
        "\"threads\":%d,\"timeline_s\":%.5f,\"ideal_s\":%.5f,\"bound_s\":%.5f,\"efficiency\":%.3f,\"wall_s\":%.5f,\"compute_s\":%.5f,"
        "\"overhead\":%.3f,\"unsplit_s\":%.5f}\n",
        w.name.c_str(), name, w.cuts.size() + 1, static_cast<long long>(m), at::get_num_threads(), median(tl),
        median(ideal), median(bound), median(eff), median(wall), median(compute), median(wall) / median(compute) - 1.0, median(u));
    std::fflush(stdout);
  }
}

void links(const Workload& w, int rounds, int64_t m) {
  struct Case {
    std::string name, fwd, bwd;
  };
  const std::vector<Case> cases = {{"uncompressed", "identity", "identity"},
                                   {"topk(0.1) fwd+bwd", "topk(0.1)", "topk(0.1)"},
                                   {"quant(4) fwd, quant(8) bwd", "quant(bits=4, scale=channel)", "quant(8)"}};
  std::vector<std::shared_ptr<Pipeline>> ps;
  for (const Case& c : cases) {
    ps.push_back(build(w, c.fwd, c.bwd));
    ps.back()->set_schedule("1f1b");
    LinkSpec link;
    link.bandwidth_mbps = 80;
    ps.back()->set_links(std::vector<LinkSpec>(w.cuts.size(), link));
  }
  std::vector<std::vector<double>> t(cases.size()), bytes(cases.size());
  for (int r = -1; r < rounds; ++r)
    for (size_t i = 0; i < cases.size(); ++i) {
      const Sample s = step(*ps[i], w, m);
      if (r >= 0) t[i].push_back(s.timeline), bytes[i].push_back(s.bytes);
    }
  const double ref = median(t[0]);
  for (size_t i = 0; i < cases.size(); ++i) {
    std::printf(
        "{\"bench\":\"pipeline_link\",\"model\":\"%s\",\"schedule\":\"1f1b\",\"micro_batches\":%lld,\"link\":\"80 "
        "Mbit/s, 0 ms\",\"case\":\"%s\",\"timeline_s\":%.4f,\"bytes_per_step\":%.0f,\"reference_timeline_s\":%.4f,"
        "\"speedup\":%.2f}\n",
        w.name.c_str(), static_cast<long long>(m), cases[i].name.c_str(), median(t[i]), median(bytes[i]), ref,
        ref / median(t[i]));
    std::fflush(stdout);
  }
}

Workload resnet8() {
  Workload w;
  w.name = "resnet8";
  w.make = [] { return ModulePtr(make_resnet("resnet8", 1, 10, 1.0, at::detail::createCPUGenerator(1))); };
  w.cuts = {"layer1", "layer2", "layer3"};
  const int64_t b = 128;
  w.batch.input = at::randn({b, 1, 28, 28});
  w.batch.target = at::randint(10, {b}, at::kLong);
  w.batch.sample_ids = at::arange(b, at::kLong);
  w.batch.units = at::ones({b}, at::kLong);
  w.loss = classification_loss;
  return w;
}

Workload gpt2() {
  Workload w;
  w.name = "gpt2_4x256";
  const int64_t b = 32, t = 64;
  w.make = [t] {
    GPT2Config c;
    c.vocab_size = 256;
    c.n_positions = t;
    c.n_embd = 256;
    c.n_layer = 4;
    c.n_head = 4;
    c.dropout = 0.0;
    return ModulePtr(std::make_shared<GPT2>(c, at::detail::createCPUGenerator(2)));
  };
  w.cuts = {"h.0", "h.1", "h.2"};
  w.batch.input = at::randint(256, {b, t}, at::kLong);
  w.batch.target = at::randint(256, {b, t}, at::kLong);
  w.batch.side.token_ids = w.batch.input;
  w.batch.sample_ids = at::arange(b, at::kLong);
  w.batch.units = at::full({b}, t, at::kLong);
  w.loss = next_token_loss;
  return w;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 7;
  const int64_t m = argc > 2 ? std::max(1, std::atoi(argv[2])) : 8;
  // As the tapeline CLI does: keep freed memory in the heap (no page faults per step).
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  at::manual_seed(0);
  for (const Workload& w : {resnet8(), gpt2()}) {
    schedules(w, rounds, m);
    links(w, rounds, m);
  }
  return 0;
}
