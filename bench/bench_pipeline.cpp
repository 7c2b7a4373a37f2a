// bench_pipeline: GPipe, 1F1B, interleaved, ZB-H1 and ZB-V training steps against pipeline theory, in one process and in
// one process per stage.
//
// Models, M micro-batches per step (default 8), identity boundaries unless said otherwise:
//   resnet8:  ResNet-8 on 1x28x28 images, batch 128; 4 stages: cuts layer1, layer2, layer3;
//             2 stages: cut layer1
//   gpt2:     GPT-2 (4 layers, d = 256, 4 heads, 256 byte tokens), batch 32 x 64 tokens;
//             4 stages: cuts h.0, h.1, h.2; 2 stages: cut h.1
//   resnet18: not in the default run (--models resnet18): CIFAR-style ResNet-18 on 1x28x28, batch
//             32; 4 stages: cuts layer1, layer2, layer3; 2 stages: cut layer2. One step is ~1.5 s
//             of compute on 1 thread (~9x ResNet-8's), so its cases (in process, links, 4 and 2
//             processes, 8 rounds each) alone take ~3 min on 2 cores: the default run leaves it out.
// Everything runs on 1 thread: ATen's (at::set_num_threads(1)) and OpenBLAS's (its own pthread pool,
// which at::set_num_threads does not reach; without this GPT-2's matmuls use every core "on 1
// thread"), in process and in every rank, so that the in-process compute is the ranks' reference.
//
// 0. Calibration of the timeline's device model (parallel/device_model.h): this machine's GEMM FLOP/s
//    and elementwise bytes/s on 1 thread against the cpu preset's, then per stage of the 4-stage
//    1F1B step the measured compute, the compute modelled on the cpu preset from the counted FLOPs
//    and bytes (ratio = measured / modelled), and the same step modelled on the h100 preset. On a
//    GPU machine the same lines are how a GPU preset is checked (docs/TIME.md).
// 1. In process (LocalExecutor: the stages run one after another here), 4 stages, per schedule:
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
//   compute_s   sum_i c_i (stage_compute_s: each c_i); overhead = wall_s / compute_s - 1 (the
//               executor's bookkeeping, payloads)
//   unsplit_s   the same batch through the unsplit model in one pass (reference for wall_s)
// With 4 stages, also interleaved 1F1B on 2 ranks holding 2 stages each (pipeline.virtual_stages =
// 2): timeline_s, and ideal_s = C + (P - 1) C / (M v) with C the busier rank's compute (the
// textbook interleaved step: v times less bubble than 1F1B on P ranks), efficiency, and the
// bubble against 1F1B's on the same 4 stages.
// With 4 stages, also ZB-H1 (pipeline.schedule = zbh1: each backward split into I and W, Note
// [ZB-H1] in parallel/schedule_generators.cpp): timeline_s against 1F1B's of the same rounds (speedup), the
// bubbles, ideal_s = the event simulation of the ZB-H1 lists with each stage's measured forward, I
// and W (free links), efficiency, W's share of the backward, and the most bytes a rank held
// between I and W.
// Then 1F1B and ZB-H1 on links of 80 Mbit/s (no latency) at every cut: the timeline step
// uncompressed and with TopK 10% and 4-bit quantisation at the cuts (speedup = the same schedule
// uncompressed / compressed; speedup_over_1f1b = 1F1B / ZB-H1 of the same case), and TopK 10% on
// the backward only, epilogue-only by Optimus-CC's rule and by the critical path. And the
// 2-stage splits in process (the references of the 2-process runs; no unsplit pass).
// Then schedules on the same 2 ranks: 1F1B and ZB-H1 on the 2-stage split, interleaved 1F1B and
// ZB-V (pipeline.schedule = zbv, Note [ZB-V]) on the 4-stage split with 2 stages per rank; free
// links, then 80 Mbit/s under each codec case: timeline_s, compute_s, bubble, bytes_per_step (every
// boundary's payloads), link_bytes_per_step (the cuts between ranks only: ZB-V's middle cut stays
// on rank 1) and speedup_over_1f1b (1F1B of the same link and case / this schedule).
//
// 2. Multi-process (DistExecutor on a Gloo Transport with its communication thread, as `tapeline
// train --nproc N` runs): bench_pipeline launches N ranks of itself (parallel/ranks/launch.h, with a
// hidden --rank-worker argument and OPENBLAS/OMP_NUM_THREADS=1); every rank builds the same models,
// batches and Pipelines (same seeds) and runs its stage of the same steps: a barrier, then
// DistExecutor::train_step (the rank's action list, the last stage's tally broadcast, GPT-2's tied
// embedding gradients all-reduced). Each rank measures per step its wall time (barrier exit to
// return), its compute (StepTiming.compute_s), its waits in recv (comm_s) and its CPU times; rank 0
// gathers them (Transport::gather_bytes) after the rounds and prints, medians over rounds:
//   wall_s      the step: max over ranks of their wall times
//   ideal_s     the formula above with c_i = rank i's measured compute in that step
//   efficiency  ideal_s / wall_s
//   rank_compute_s, rank_comm_s, rank_other_s: per rank, compute, recv waits and the rest (payload
//               (de)serialisation, and the end-of-step tally broadcast and tied all-reduce, where a
//               rank that finished its list early waits for the others)
//   rank_thread_cpu_s  per rank, CPU time of the rank's main thread in the step (its compute,
//               payload (de)serialisation, bookkeeping): against rank_compute_s (wall) it shows
//               how long the rank waited for a core inside its own compute
//   cpu_s       sum over ranks of process CPU time in the step (main threads, Gloo's threads and
//               the communication threads); cpu_s / inproc_compute_s - 1 is the CPU the
//               processes spend beyond the in-process compute
//   inproc_*    the in-process run of the same split: timeline_s, ideal_s, wall_s, compute_s
//   cores_bound_s  inproc_compute_s / min(cores, N): with 1 thread per rank, no step on this
//               machine is shorter (all ranks' compute has to fit on the cores)
//   vs_inproc_timeline  inproc timeline_s / wall_s (1 = the processes achieve what the in-process
//               timeline predicts for a pipeline of processes, each on its own core)
//   speedup_vs_inproc_wall  inproc wall_s / wall_s (the stages one after another in one process)
//   loadavg_1m  the machine's load when the line was printed (other processes share the cores)
// The schedules: GPipe, 1F1B and ZB-H1 (without an in-process reference, inproc_* and the ratios
// to it are null: the in-process ZB-H1 row is for 4 stages; compare its wall_s with 1F1B's), and
// with 2 processes also interleaved 1F1B and ZB-V on the 4-stage split (ideal_s and efficiency
// null: the formula is 1F1B's; their references are the in-process 2-rank rows).
// What the numbers mean on a small machine: with N ranks on fewer than N cores (4 ranks on 2 cores)
// the stages cannot all run at once. A rank's compute_s is wall time and includes the time it
// waited for a core while inside a forward or backward (rank_thread_cpu_s is what it computed), so
// ideal_s (from those c_i) is inflated against inproc_ideal_s, and wall_s cannot get below
// cores_bound_s, which can exceed the in-process timeline (GPT-2: the 4 stages' compute does not
// fit on 2 cores in one timeline's time). The 4-process rows measure the runtime under
// oversubscription, not pipeline parallelism; the 2-process rows (2 stages x 2 processes on 2
// cores) are the case that fits the cores, as long as nothing else runs on the machine.
// Then 4 processes, 1F1B, 80 Mbit/s links emulated at the receivers (TransportOptions.link_from, as
// tasks/runner/trainer.cpp sets them: rank r receives activations from r - 1 over link r - 1 and
// gradients from r + 1 over link r): wall step uncompressed, TopK 10% and 4-bit, speedup, the
// in-process timeline's prediction for the same case (predicted_s, predicted_speedup;
// vs_predicted = predicted_s / wall_s), per rank the time slept for emulated deliveries, and
// cores_bound_s as above for that case. A rank waiting for a delivery sleeps, so slow-link rows
// suffer less from oversubscription; compressed rows are short enough to be CPU-bound on 2 cores.
//
// Steps alternate between the cases of a model, round by round; round -1 is a warm-up. One JSON
// line each:
//   {"bench":"pipeline","model":..,"schedule":..,"stages":..,"micro_batches":..,"threads":1,
//    "blas_threads":1,"timeline_s":..,"ideal_s":..,"efficiency":..,"wall_s":..,"compute_s":..,
//    "stage_compute_s":[..],"overhead":..,"unsplit_s":..}
//   {"bench":"pipeline_link","model":..,"link":"80 Mbit/s","case":..,"timeline_s":..,"bytes_per_step":..,
//    "reference_timeline_s":..,"speedup":..}
//   {"bench":"pipeline_2ranks","model":..,"schedule":..,"ranks":2,"stages":..,"virtual_stages":..,
//    "link":..,"case":..,"timeline_s":..,"compute_s":..,"bubble":..,"bytes_per_step":..,
//    "link_bytes_per_step":..,"timeline_1f1b_s":..,"speedup_over_1f1b":..}
//   {"bench":"pipeline_mp","model":..,"schedule":..,"processes":N,"stages":N,"wall_s":..,"ideal_s":..,
//    "efficiency":..,"rank_compute_s":[..],..,"vs_inproc_timeline":..,"speedup_vs_inproc_wall":..}
//   {"bench":"pipeline_mp_link","model":..,"processes":4,"case":..,"wall_s":..,"bytes_per_step":..,
//    "reference_wall_s":..,"speedup":..,"predicted_s":..,"predicted_speedup":..,"vs_predicted":..}
// The default run (ResNet-8 and GPT-2, 7 rounds, 4 and 2 processes) takes ~3-4 min on 2 cores.
// Usage: bench_pipeline [rounds (default 7)] [micro-batches (default 8)]
//          [--models resnet8,gpt2[,resnet18]] [--mp 4,2 | --mp none] [--mp-rounds R (default: rounds)]
//          [--no-links]
#include <dlfcn.h>
#include <malloc.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <numeric>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "layers/models/gpt2.h"
#include "layers/models/resnet.h"
#include "parallel/ranks/launch.h"
#include "parallel/ranks/rendezvous.h"
#include "parallel/ranks/runtime.h"
#include "parallel/ranks/transport.h"
#include "parallel/executor.h"
#include "parallel/pipeline.h"
#include "parallel/simulate.h"
#include "tasks/task.h"

namespace {
using namespace tl;
using Clock = std::chrono::steady_clock;

using bench::median;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The 1-minute load average (other processes on the machine: the numbers are only as quiet as it).
double loadavg_1m() {
  double l = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = -1;
    std::fclose(f);
  }
  return l;
}

int g_blas_threads = 0;  // as set in main, for the JSON lines

// OpenBLAS (the BLAS of Debian's libtorch) keeps its own pthread pool, one thread per core, which
// at::set_num_threads does not reach: GPT-2's matmuls would use every core "with 1 thread". Sets
// its thread count where it is loaded; returns it (0 where there is no OpenBLAS).
int set_blas_threads(int n) {
  using Set = void (*)(int);
  using Get = int (*)();
  if (auto set = reinterpret_cast<Set>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) set(n);
  auto get = reinterpret_cast<Get>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return get ? get() : 0;
}

double cpu_s(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// A model, its batch and its loss.
struct Workload {
  std::string name;
  std::function<ModulePtr()> make;                  // same weights every call
  std::map<int, std::vector<std::string>> cuts;     // by number of stages
  Batch batch;
  Pipeline::LossFn loss;
};

/// The benchmark's options (also passed to the rank workers).
struct Options {
  int rounds = 7;
  int64_t m = 8;
  std::vector<std::string> models = {"resnet8", "gpt2"};
  std::vector<int> mp = {4, 2};  // process counts of the multi-process part
  int mp_rounds = -1;            // -1: rounds
  bool links = true;
  bool calibrate_only = false;  // --calibrate: the device model's calibration lines only
  // Rank workers only.
  bool worker = false;
  std::map<std::string, double> refs;  // in-process results, "model/stages/schedule/field"
};

/// The 80 Mbit/s cases (forward, backward codec).
struct LinkCase {
  std::string name, fwd, bwd;
  int epilogue = 0;  // epilogue-only backward: 0 off, 1 Optimus-CC's rule, 2 the critical path
};
const std::vector<LinkCase>& link_cases() {
  static const std::vector<LinkCase> cases = {{"uncompressed", "identity", "identity"},
                                              {"topk(0.1) fwd+bwd", "topk(0.1)", "topk(0.1)"},
                                              {"quant(4) fwd, quant(8) bwd", "quant(bits=4, scale=channel)", "quant(8)"}};
  return cases;
}
LinkSpec bench_link() {
  LinkSpec l;
  l.bandwidth_mbps = 80;
  return l;
}

std::string ref_key(const std::string& model, int stages, const std::string& what, const std::string& field) {
  return model + "/" + std::to_string(stages) + "/" + what + "/" + field;
}

/// A number for a JSON line; null where it is not known (NaN: no in-process reference).
std::string json_number(double x, const char* fmt = "%.5f") {
  if (std::isnan(x)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, x);
  return buf;
}

std::string json_array(const std::vector<double>& v, const char* fmt = "%.5f") {
  std::string s = "[";
  char buf[64];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof(buf), fmt, v[i]);
    s += (i ? "," : "") + std::string(buf);
  }
  return s + "]";
}

// ---- in process -----------------------------------------------------------------------------------

/// What one timed step of a pipeline gives.
struct Sample {
  double timeline = 0, ideal = 0, bound = 0, wall = 0, compute = 0, bytes = 0;
  double link_bytes = 0;  // of the cuts between two ranks (a cut inside a rank sends nothing)
  std::vector<double> stage_compute, stage_forward, stage_weight;
  size_t held_for_weights = 0;  // the most any rank held between I and W
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
  s.stage_compute = t.compute_s;
  s.stage_forward = t.forward_s;
  s.stage_weight = t.weight_s;
  for (size_t b : t.held_for_weights_bytes) s.held_for_weights = std::max(s.held_for_weights, b);
  const BoundaryStats st = p.total_stats();
  s.bytes = static_cast<double>(st.forward.bytes + st.backward.bytes);
  const StageLayout layout = p.layout();
  for (size_t b = 0; b < p.boundaries().size(); ++b)
    if (layout.rank_of(static_cast<int>(b)) != layout.rank_of(static_cast<int>(b) + 1)) {
      const BoundaryStats& bs = p.boundaries()[b]->stats();
      s.link_bytes += static_cast<double>(bs.forward.bytes + bs.backward.bytes);
    }
  return s;
}

std::shared_ptr<Pipeline> build(const Workload& w, int stages, const std::string& fwd, const std::string& bwd) {
  BoundarySpec spec;
  spec.forward = fwd;
  spec.backward = bwd;
  const std::vector<std::string>& cuts = w.cuts.at(stages);
  auto p = Pipeline::build(w.make(), cuts, std::vector<BoundarySpec>(cuts.size(), spec));
  // A timing benchmark: no error statistics (across processes they would add a reference message
  // per compressed message: Note [reference tensors] in parallel/channel.h).
  p->set_measure_error(false);
  return p;
}

double unsplit_step(Module& model, const Workload& w) {
  for (auto& param : model.parameters()) param.zero_grad();
  const auto t0 = Clock::now();
  Variable out = model.forward(Variable(w.batch.input));
  w.loss(out, w.batch).loss.backward();
  return seconds_since(t0);
}

/// ZB-H1 against 1F1B of the same rounds. ideal_s: the event simulation (simulate_schedule) of the
/// ZB-H1 lists with free links and each stage's measured forward, I and W per micro-batch; the
/// textbook step for uniform stages is M (F + I + W) + (P - 1)(F + I - W).
void zero_bubble_row(const Workload& w, int stages, const Options& o, const std::vector<Sample>& z,
                     const std::vector<Sample>& f) {
  std::vector<double> tl, tl_1f1b, ideal, eff, bubble, bubble_1f1b, w_share;
  double held = 0;
  for (size_t k = 0; k < z.size(); ++k) {
    const Sample& s = z[k];
    SimCosts c;
    const double md = static_cast<double>(o.m);
    double wsum = 0;
    for (int i = 0; i < stages; ++i) {
      c.forward_s.push_back(s.stage_forward[i] / md);
      c.backward_s.push_back((s.stage_compute[i] - s.stage_forward[i]) / md);
      c.weight_s.push_back(s.stage_weight[i] / md);
      wsum += s.stage_weight[i];
    }
    const double sim = simulate_schedule(zbh1_schedule(stages, static_cast<int>(o.m)), c).step_s;
    tl.push_back(s.timeline), tl_1f1b.push_back(f[k].timeline), ideal.push_back(sim), eff.push_back(sim / s.timeline);
    bubble.push_back(1.0 - s.compute / (stages * s.timeline));
    bubble_1f1b.push_back(1.0 - f[k].compute / (stages * f[k].timeline));
    w_share.push_back(wsum / (s.compute - std::accumulate(s.stage_forward.begin(), s.stage_forward.end(), 0.0)));
    held = std::max(held, static_cast<double>(s.held_for_weights));
  }
  std::printf(
      "{\"bench\":\"pipeline\",\"model\":\"%s\",\"schedule\":\"zbh1\",\"stages\":%d,\"micro_batches\":%lld,"
      "\"threads\":%d,\"timeline_s\":%.5f,\"ideal_s\":%.5f,\"efficiency\":%.3f,\"timeline_1f1b_s\":%.5f,"
      "\"speedup_over_1f1b\":%.3f,\"bubble\":%.3f,\"bubble_1f1b\":%.3f,\"weight_share_of_backward\":%.3f,"
      "\"held_between_i_and_w_bytes\":%.0f}\n",
      w.name.c_str(), stages, static_cast<long long>(o.m), at::get_num_threads(), median(tl), median(ideal),
      median(eff), median(tl_1f1b), median(tl_1f1b) / median(tl), median(bubble), median(bubble_1f1b), median(w_share),
      held);
  std::fflush(stdout);
}

/// GPipe and 1F1B in process on `stages` stages; records the medians in `refs`.
void schedules(const Workload& w, int stages, const Options& o, std::map<std::string, double>& refs) {
  const bool with_unsplit = stages == 4;
  auto gpipe = build(w, stages, "identity", "identity"), one_f = build(w, stages, "identity", "identity");
  gpipe->set_schedule("gpipe");
  one_f->set_schedule("1f1b");
  ModulePtr unsplit = w.make();
  // Interleaved: 2 ranks x 2 virtual stages (4-stage splits, M a multiple of 2).
  const bool with_interleaved = stages == 4 && o.m % 2 == 0;
  auto inter = build(w, stages, "identity", "identity");
  inter->set_schedule("interleaved");
  if (with_interleaved) inter->set_virtual_stages(2);
  // ZB-H1 on the same stages (4-stage splits).
  const bool with_zb = stages == 4;
  auto zb = build(w, stages, "identity", "identity");
  zb->set_schedule("zbh1");
  std::vector<Sample> g, f, iv, z;
  std::vector<double> u;
  for (int r = -1; r < o.rounds; ++r) {  // round -1: warm-up
    Sample a = step(*gpipe, w, o.m), b = step(*one_f, w, o.m);
    Sample i = with_interleaved ? step(*inter, w, o.m) : Sample{};
    Sample zs = with_zb ? step(*zb, w, o.m) : Sample{};
    const double c = with_unsplit ? unsplit_step(*unsplit, w) : 0.0;
    if (r < 0) continue;
    g.push_back(a), f.push_back(b), iv.push_back(i), z.push_back(zs), u.push_back(c);
  }
  if (with_zb) zero_bubble_row(w, stages, o, z, f);
  if (with_interleaved) {
    const int P = 2, v = 2;
    std::vector<double> tl, ideal, eff, bubble, one_f_bubble;
    for (size_t k = 0; k < iv.size(); ++k) {
      const Sample& s = iv[k];
      const double busiest = s.bound, slot = busiest / static_cast<double>(o.m * v);
      const double textbook = busiest + (P - 1) * slot;
      tl.push_back(s.timeline), ideal.push_back(textbook), eff.push_back(textbook / s.timeline);
      bubble.push_back(1.0 - s.compute / (P * s.timeline));
      one_f_bubble.push_back(1.0 - f[k].compute / (stages * f[k].timeline));
    }
    std::printf(
        "{\"bench\":\"pipeline\",\"model\":\"%s\",\"schedule\":\"interleaved\",\"stages\":%d,\"ranks\":%d,"
        "\"virtual_stages\":%d,\"micro_batches\":%lld,\"threads\":%d,\"timeline_s\":%.5f,\"ideal_s\":%.5f,"
        "\"efficiency\":%.3f,\"bubble\":%.3f,\"bubble_1f1b_4_ranks\":%.3f}\n",
        w.name.c_str(), stages, P, v, static_cast<long long>(o.m), at::get_num_threads(), median(tl), median(ideal),
        median(eff), median(bubble), median(one_f_bubble));
    std::fflush(stdout);
  }
  for (const auto& [name, v] : {std::make_pair("gpipe", &g), std::make_pair("1f1b", &f)}) {
    std::vector<double> tl, ideal, bound, eff, wall, compute;
    std::vector<std::vector<double>> per_stage(static_cast<size_t>(stages));
    for (const Sample& s : *v) {
      tl.push_back(s.timeline), ideal.push_back(s.ideal), bound.push_back(s.bound), eff.push_back(s.ideal / s.timeline),
          wall.push_back(s.wall), compute.push_back(s.compute);
      for (size_t i = 0; i < per_stage.size() && i < s.stage_compute.size(); ++i) per_stage[i].push_back(s.stage_compute[i]);
    }
    std::vector<double> stage_med;
    for (const auto& c : per_stage) stage_med.push_back(median(c));
    char unsplit_field[64] = "";
    if (with_unsplit) std::snprintf(unsplit_field, sizeof(unsplit_field), ",\"unsplit_s\":%.5f", median(u));
    std::printf(
        "{\"bench\":\"pipeline\",\"model\":\"%s\",\"schedule\":\"%s\",\"stages\":%d,\"micro_batches\":%lld,"
        "\"threads\":%d,\"blas_threads\":%d,\"timeline_s\":%.5f,\"ideal_s\":%.5f,\"bound_s\":%.5f,\"efficiency\":%.3f,\"wall_s\":%.5f,"
        "\"compute_s\":%.5f,\"stage_compute_s\":%s,\"overhead\":%.3f%s}\n",
        w.name.c_str(), name, stages, static_cast<long long>(o.m), at::get_num_threads(), g_blas_threads, median(tl),
        median(ideal),
        median(bound), median(eff), median(wall), median(compute), json_array(stage_med).c_str(),
        median(wall) / median(compute) - 1.0, unsplit_field);
    std::fflush(stdout);
    refs[ref_key(w.name, stages, name, "timeline")] = median(tl);
    refs[ref_key(w.name, stages, name, "ideal")] = median(ideal);
    refs[ref_key(w.name, stages, name, "wall")] = median(wall);
    refs[ref_key(w.name, stages, name, "compute")] = median(compute);
  }
}

/// Calibration of the device model (Note [device model] in parallel/device_model.h): per stage of
/// the 4-stage 1F1B step, the measured compute against the compute modelled from the counted
/// FLOPs and bytes on the "cpu" preset (ratio = measured / modelled; 1 is a calibrated preset),
/// and what the h100 preset makes of the same step. First this machine's own roofs on 1 thread: a
/// float32 GEMM's FLOP/s and an elementwise add's bytes/s, the numbers the cpu preset should carry.
void calibration(const Workload& w, const Options& o) {
  static bool roofs_printed = false;
  if (!roofs_printed) {
    roofs_printed = true;
    const int64_t n = 512, e = 1 << 22;
    at::Tensor a = at::randn({n, n}), b = at::randn({n, n}), x = at::randn({e}), y = at::randn({e});
    std::vector<double> gemm, add;
    for (int r = 0; r < 7; ++r) {
      auto t0 = Clock::now();
      at::Tensor c = at::mm(a, b);
      gemm.push_back(2.0 * n * n * n / seconds_since(t0));
      t0 = Clock::now();
      at::Tensor z = x + y;
      add.push_back(3.0 * 4 * e / seconds_since(t0));
    }
    const DeviceModel cpu = device_model("cpu");
    std::printf("{\"bench\":\"device_roofs\",\"threads\":%d,\"gemm_flops_per_s\":%.4g,\"cpu_preset_flops_per_s\":%.4g,"
                "\"add_bytes_per_s\":%.4g,\"cpu_preset_bytes_per_s\":%.4g}\n",
                at::get_num_threads(), median(gemm), cpu.peak_flops * cpu.flop_efficiency, median(add),
                cpu.memory_bytes_per_s * cpu.memory_efficiency);
  }
  const DeviceModel cpu = device_model("cpu"), h100 = device_model("h100");
  auto p = build(w, 4, "identity", "identity");
  p->set_schedule("1f1b");
  std::vector<std::vector<double>> measured(4), modelled(4), on_h100(4), flops(4);
  for (int r = -1; r < o.rounds; ++r) {
    for (auto& param : p->parameters()) param.zero_grad();
    for (const DeviceModel* m : {&cpu, &h100}) {
      LocalExecutor ex(*p);
      ex.set_device_model(*m, /*drives_clock=*/false);
      StepTiming t;
      ex.train_step(w.batch, o.m, "1f1b", w.loss, 0, &t);
      if (r < 0) continue;
      for (size_t i = 0; i < 4; ++i) {
        if (m == &cpu) {
          measured[i].push_back(t.compute_s[i]), modelled[i].push_back(t.modelled_s[i]), flops[i].push_back(t.flops[i]);
        } else {
          on_h100[i].push_back(t.modelled_s[i]);
        }
      }
    }
  }
  std::vector<double> me, mo, ratio, h, f;
  for (size_t i = 0; i < 4; ++i) {
    me.push_back(median(measured[i])), mo.push_back(median(modelled[i])), h.push_back(median(on_h100[i]));
    f.push_back(median(flops[i]));
    ratio.push_back(me.back() / mo.back());
  }
  std::printf("{\"bench\":\"device_calibration\",\"model\":\"%s\",\"schedule\":\"1f1b\",\"stages\":4,"
              "\"micro_batches\":%lld,\"stage_flops\":%s,\"measured_s\":%s,\"cpu_modelled_s\":%s,\"ratio\":%s,"
              "\"h100_modelled_s\":%s}\n",
              w.name.c_str(), static_cast<long long>(o.m), json_array(f, "%.4g").c_str(), json_array(me).c_str(),
              json_array(mo).c_str(), json_array(ratio, "%.3f").c_str(), json_array(h, "%.3g").c_str());
  std::fflush(stdout);
}

/// 1F1B on 80 Mbit/s links in process (4 stages); records the timelines in `refs`.
void links(const Workload& w, const Options& o, std::map<std::string, double>& refs) {
  // The shared cases, then epilogue-only TopK backward by each rule (in process only).
  std::vector<LinkCase> cases = link_cases();
  cases.push_back({"topk(0.1) bwd epilogue-only, Optimus-CC", "identity", "topk(0.1)", 1});
  cases.push_back({"topk(0.1) bwd epilogue-only, critical path", "identity", "topk(0.1)", 2});
  const int stages = 4;
  // Per case, 1F1B and ZB-H1 (does the zero-bubble gain survive compression on a slow link?).
  const std::vector<std::string> schedules = {"1f1b", "zbh1"};
  std::vector<std::shared_ptr<Pipeline>> ps;
  for (const LinkCase& c : cases)
    for (const std::string& name : schedules) {
      ps.push_back(build(w, stages, c.fwd, c.bwd));
      ps.back()->set_schedule(name);
      for (const BoundaryPtr& b : ps.back()->boundaries()) {
        b->set_epilogue_only(c.epilogue > 0);
        b->set_epilogue_rule(c.epilogue == 2 ? EpilogueRule::CriticalPath : EpilogueRule::Optimus);
      }
      ps.back()->set_links(std::vector<LinkSpec>(w.cuts.at(stages).size(), bench_link()));
    }
  std::vector<std::vector<double>> t(ps.size()), bytes(ps.size()), compute(ps.size());
  for (int r = -1; r < o.rounds; ++r)
    for (size_t i = 0; i < ps.size(); ++i) {
      const Sample s = step(*ps[i], w, o.m);
      if (r >= 0) t[i].push_back(s.timeline), bytes[i].push_back(s.bytes), compute[i].push_back(s.compute);
    }
  for (size_t k = 0; k < schedules.size(); ++k) {
    const double ref = median(t[k]);  // this schedule, uncompressed
    for (size_t c = 0; c < cases.size(); ++c) {
      const size_t i = c * schedules.size() + k;
      std::printf(
          "{\"bench\":\"pipeline_link\",\"model\":\"%s\",\"schedule\":\"%s\",\"micro_batches\":%lld,\"link\":\"80 "
          "Mbit/s, 0 ms\",\"case\":\"%s\",\"timeline_s\":%.4f,\"bytes_per_step\":%.0f,\"reference_timeline_s\":%.4f,"
          "\"speedup\":%.2f,\"timeline_1f1b_s\":%.4f,\"speedup_over_1f1b\":%.3f}\n",
          w.name.c_str(), schedules[k].c_str(), static_cast<long long>(o.m), cases[c].name.c_str(), median(t[i]),
          median(bytes[i]), ref, ref / median(t[i]), median(t[c * schedules.size()]),
          median(t[c * schedules.size()]) / median(t[i]));
      std::fflush(stdout);
      if (schedules[k] != "1f1b" || c >= link_cases().size()) continue;
      refs[ref_key(w.name, stages, "link" + std::to_string(c), "timeline")] = median(t[i]);
      refs[ref_key(w.name, stages, "link" + std::to_string(c), "compute")] = median(compute[i]);
    }
  }
}

/// Schedules on the same two ranks (in process): 1F1B and ZB-H1 on the 2-stage split, interleaved
/// 1F1B and ZB-V on the 4-stage split with 2 stages per rank (round robin: every cut crosses the
/// link; V: the middle cut stays on rank 1). Free links, then 80 Mbit/s under each link case.
/// Records the free-link medians of interleaved and ZB-V in `refs` (the 2-process references).
void two_ranks(const Workload& w, const Options& o, std::map<std::string, double>& refs) {
  struct Sched {
    std::string name;
    int stages, v;
  };
  std::vector<Sched> scheds = {{"1f1b", 2, 1}, {"zbh1", 2, 1}, {"zbv", 4, 2}};
  if (o.m % 2 == 0) scheds.insert(scheds.begin() + 2, {"interleaved", 4, 2});
  std::vector<LinkCase> cases = {{"free links", "identity", "identity"}};
  if (o.links)
    for (const LinkCase& c : link_cases()) cases.push_back(c);
  std::vector<std::shared_ptr<Pipeline>> ps;
  for (size_t c = 0; c < cases.size(); ++c)
    for (const Sched& k : scheds) {
      ps.push_back(build(w, k.stages, cases[c].fwd, cases[c].bwd));
      ps.back()->set_schedule(k.name);
      ps.back()->set_virtual_stages(k.v);
      if (c > 0) ps.back()->set_links(std::vector<LinkSpec>(w.cuts.at(k.stages).size(), bench_link()));
    }
  std::vector<std::vector<Sample>> samples(ps.size());
  for (int r = -1; r < o.rounds; ++r)
    for (size_t i = 0; i < ps.size(); ++i) {
      Sample s = step(*ps[i], w, o.m);
      if (r >= 0) samples[i].push_back(std::move(s));
    }
  for (size_t c = 0; c < cases.size(); ++c) {
    const double ref = [&] {
      std::vector<double> t;
      for (const Sample& s : samples[c * scheds.size()]) t.push_back(s.timeline);
      return median(t);
    }();
    for (size_t k = 0; k < scheds.size(); ++k) {
      const size_t i = c * scheds.size() + k;
      std::vector<double> tl, bytes, link_bytes, bubble, compute, wall;
      for (const Sample& s : samples[i])
        tl.push_back(s.timeline), bytes.push_back(s.bytes), link_bytes.push_back(s.link_bytes), bubble.push_back(1.0 - s.compute / (2 * s.timeline)),
            compute.push_back(s.compute), wall.push_back(s.wall);
      std::printf(
          "{\"bench\":\"pipeline_2ranks\",\"model\":\"%s\",\"schedule\":\"%s\",\"ranks\":2,\"stages\":%d,"
          "\"virtual_stages\":%d,\"micro_batches\":%lld,\"link\":\"%s\",\"case\":\"%s\",\"timeline_s\":%.5f,"
          "\"compute_s\":%.5f,\"bubble\":%.3f,\"bytes_per_step\":%.0f,\"link_bytes_per_step\":%.0f,\"timeline_1f1b_s\":%.5f,"
          "\"speedup_over_1f1b\":%.3f}\n",
          w.name.c_str(), scheds[k].name.c_str(), scheds[k].stages, scheds[k].v, static_cast<long long>(o.m),
          c == 0 ? "free" : "80 Mbit/s, 0 ms", cases[c].name.c_str(), median(tl), median(compute), median(bubble),
          median(bytes), median(link_bytes), ref, ref / median(tl));
      std::fflush(stdout);
      if (c == 0 && scheds[k].v > 1) {
        refs[ref_key(w.name, 2, scheds[k].name, "timeline")] = median(tl);
        refs[ref_key(w.name, 2, scheds[k].name, "wall")] = median(wall);
        refs[ref_key(w.name, 2, scheds[k].name, "compute")] = median(compute);
      }
    }
  }
}

// ---- multi-process (one rank) -----------------------------------------------------------------------

/// What one rank measures in one step.
struct RankSample {
  double wall = 0, compute = 0, comm = 0, cpu = 0, thread_cpu = 0, bytes = 0, link = 0;
  static constexpr size_t kFields = 7;
};

/// One rank's step: barrier, then DistExecutor::train_step.
RankSample mp_step(ranks::DistExecutor& ex, Pipeline& p, ranks::Transport& t, const Workload& w, int64_t m,
                   const std::string& schedule, int64_t& step_no) {
  for (auto& param : p.parameters()) param.zero_grad();
  t.barrier("before step " + std::to_string(step_no));
  const ranks::TransportStats s0 = t.stats();
  const double cpu0 = cpu_s(CLOCK_PROCESS_CPUTIME_ID), thread0 = cpu_s(CLOCK_THREAD_CPUTIME_ID);
  const auto t0 = Clock::now();
  StepTiming timing;
  ex.train_step(w.batch, m, schedule, w.loss, StepPosition(0, step_no++), &timing);
  RankSample r;
  r.wall = seconds_since(t0);
  r.cpu = cpu_s(CLOCK_PROCESS_CPUTIME_ID) - cpu0;
  r.thread_cpu = cpu_s(CLOCK_THREAD_CPUTIME_ID) - thread0;
  r.compute = timing.compute_s.empty() ? 0.0 : timing.compute_s[0];
  r.comm = timing.comm_s.empty() ? 0.0 : timing.comm_s[0];
  const ranks::TransportStats s1 = t.stats();
  r.bytes = static_cast<double>(s1.bytes_sent - s0.bytes_sent);
  r.link = s1.link_s - s0.link_s;
  return r;
}

/// Runs every case for `rounds` (+1 warm-up) rounds, cases alternating; returns, on rank 0,
/// samples[case][round][rank] (empty elsewhere).
using AllSamples = std::vector<std::vector<std::vector<RankSample>>>;
AllSamples mp_rounds(ranks::Transport& t, const Workload& w, const Options& o, int rounds,
                     const std::vector<std::shared_ptr<Pipeline>>& ps, const std::vector<std::string>& schedules,
                     int64_t& step_no) {
  std::vector<std::unique_ptr<ranks::DistExecutor>> ex;
  for (const auto& p : ps) ex.push_back(std::make_unique<ranks::DistExecutor>(*p, t));
  std::vector<std::vector<RankSample>> mine(ps.size());
  for (int r = -1; r < rounds; ++r)
    for (size_t i = 0; i < ps.size(); ++i) {
      const RankSample s = mp_step(*ex[i], *ps[i], t, w, o.m, schedules[i], step_no);
      if (r >= 0) mine[i].push_back(s);
    }
  std::string bytes;
  for (const auto& c : mine)
    for (const RankSample& s : c)
      for (double v : {s.wall, s.compute, s.comm, s.cpu, s.thread_cpu, s.bytes, s.link})
        bytes.append(reinterpret_cast<const char*>(&v), sizeof(double));
  const std::vector<std::string> all = t.gather_bytes(bytes, 0, w.name + ": gathering the step timings");
  AllSamples out;
  if (t.rank() != 0) return out;
  out.assign(ps.size(), std::vector<std::vector<RankSample>>(static_cast<size_t>(rounds)));
  for (size_t rank = 0; rank < all.size(); ++rank) {
    TORCH_CHECK(all[rank].size() == bytes.size(), "rank ", rank, " sent ", all[rank].size(), " bytes of timings, rank 0 ",
                bytes.size());
    const double* d = reinterpret_cast<const double*>(all[rank].data());
    for (size_t i = 0; i < ps.size(); ++i)
      for (int r = 0; r < rounds; ++r, d += RankSample::kFields)
        out[i][static_cast<size_t>(r)].push_back({d[0], d[1], d[2], d[3], d[4], d[5], d[6]});
  }
  return out;
}

double ref_or_nan(const Options& o, const std::string& key) {
  auto it = o.refs.find(key);
  return it == o.refs.end() ? std::nan("") : it->second;
}

/// GPipe and 1F1B on this rank's stage (N ranks = N stages).
void mp_schedules(ranks::Transport& t, const Workload& w, const Options& o, int rounds, int64_t& step_no) {
  const int n = t.world_size();
  std::vector<std::string> names = {"gpipe", "1f1b", "zbh1"};
  std::vector<std::shared_ptr<Pipeline>> ps = {build(w, n, "identity", "identity"), build(w, n, "identity", "identity"),
                                               build(w, n, "identity", "identity")};
  // Two processes also run the 4-stage split with 2 stages each: interleaved and ZB-V.
  if (n == 2 && w.cuts.count(4))
    for (const std::string name : {"interleaved", "zbv"}) {
      if (name == "interleaved" && o.m % 2 != 0) continue;
      names.push_back(name);
      ps.push_back(build(w, 4, "identity", "identity"));
      ps.back()->set_schedule(name);
      ps.back()->set_virtual_stages(2);
    }
  const AllSamples all = mp_rounds(t, w, o, rounds, ps, names, step_no);
  if (t.rank() != 0) return;
  const double md = static_cast<double>(o.m);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (size_t i = 0; i < names.size(); ++i) {
    std::vector<double> wall, ideal, eff, cpu;
    std::vector<std::vector<double>> compute(n), comm(n), other(n), thread_cpu(n);
    for (const auto& round : all[i]) {
      double wmax = 0, sum = 0, slowest = 0, cpu_sum = 0;
      for (int r = 0; r < n; ++r) {
        const RankSample& s = round[static_cast<size_t>(r)];
        wmax = std::max(wmax, s.wall), sum += s.compute, slowest = std::max(slowest, s.compute), cpu_sum += s.cpu;
        compute[r].push_back(s.compute), comm[r].push_back(s.comm), other[r].push_back(s.wall - s.compute - s.comm),
            thread_cpu[r].push_back(s.thread_cpu);
      }
      // The 1F1B formula; not defined here for 2 stages per rank (null).
      const double id = ps[i]->num_stages() > n ? std::nan("") : sum / md + (md - 1) * slowest / md;
      wall.push_back(wmax), ideal.push_back(id), eff.push_back(id / wmax), cpu.push_back(cpu_sum);
    }
    std::vector<double> c_med, comm_med, other_med, thread_med;
    for (int r = 0; r < n; ++r)
      c_med.push_back(median(compute[r])), comm_med.push_back(median(comm[r])), other_med.push_back(median(other[r])),
          thread_med.push_back(median(thread_cpu[r]));
    const double in_tl = ref_or_nan(o, ref_key(w.name, n, names[i], "timeline"));
    const double in_ideal = ref_or_nan(o, ref_key(w.name, n, names[i], "ideal"));
    const double in_wall = ref_or_nan(o, ref_key(w.name, n, names[i], "wall"));
    const double in_compute = ref_or_nan(o, ref_key(w.name, n, names[i], "compute"));
    const double cores_bound = in_compute / std::min(cores, n);
    const double wm = median(wall);
    std::printf(
        "{\"bench\":\"pipeline_mp\",\"model\":\"%s\",\"schedule\":\"%s\",\"processes\":%d,\"stages\":%d,"
        "\"micro_batches\":%lld,\"threads_per_rank\":%d,\"blas_threads_per_rank\":%d,\"cores\":%d,\"rounds\":%d,\"wall_s\":%.5f,\"ideal_s\":%s,"
        "\"efficiency\":%s,\"rank_compute_s\":%s,\"rank_comm_s\":%s,\"rank_other_s\":%s,\"rank_thread_cpu_s\":%s,"
        "\"cpu_s\":%.5f,"
        "\"inproc_timeline_s\":%s,\"inproc_ideal_s\":%s,\"inproc_wall_s\":%s,\"inproc_compute_s\":%s,"
        "\"cores_bound_s\":%s,\"vs_inproc_timeline\":%s,\"speedup_vs_inproc_wall\":%s,\"loadavg_1m\":%.2f}\n",
        w.name.c_str(), names[i].c_str(), n, static_cast<int>(ps[i]->num_stages()), static_cast<long long>(o.m),
        at::get_num_threads(), g_blas_threads, cores, rounds, wm, json_number(median(ideal)).c_str(),
        json_number(median(eff), "%.3f").c_str(), json_array(c_med).c_str(), json_array(comm_med).c_str(),
        json_array(other_med).c_str(), json_array(thread_med).c_str(), median(cpu), json_number(in_tl).c_str(),
        json_number(in_ideal).c_str(), json_number(in_wall).c_str(), json_number(in_compute).c_str(),
        json_number(cores_bound).c_str(), json_number(in_tl / wm, "%.3f").c_str(),
        json_number(in_wall / wm, "%.3f").c_str(), loadavg_1m());
    std::fflush(stdout);
  }
}

/// 1F1B on 80 Mbit/s links emulated at the receivers (`t` was connected with them).
void mp_links(ranks::Transport& t, const Workload& w, const Options& o, int rounds, int64_t& step_no) {
  const int n = t.world_size();
  const auto& cases = link_cases();
  std::vector<std::shared_ptr<Pipeline>> ps;
  for (const LinkCase& c : cases) ps.push_back(build(w, n, c.fwd, c.bwd));
  const AllSamples all = mp_rounds(t, w, o, rounds, ps, std::vector<std::string>(cases.size(), "1f1b"), step_no);
  if (t.rank() != 0) return;
  std::vector<double> wall_med(cases.size()), bytes_med(cases.size());
  std::vector<std::vector<double>> link_med(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    std::vector<double> wall, bytes;
    std::vector<std::vector<double>> link(n);
    for (const auto& round : all[i]) {
      double wmax = 0, b = 0;
      for (int r = 0; r < n; ++r) {
        const RankSample& s = round[static_cast<size_t>(r)];
        wmax = std::max(wmax, s.wall), b += s.bytes, link[r].push_back(s.link);
      }
      wall.push_back(wmax), bytes.push_back(b);
    }
    wall_med[i] = median(wall), bytes_med[i] = median(bytes);
    for (int r = 0; r < n; ++r) link_med[i].push_back(median(link[r]));
  }
  const double pred_ref = ref_or_nan(o, ref_key(w.name, n, "link0", "timeline"));
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (size_t i = 0; i < cases.size(); ++i) {
    const double pred = ref_or_nan(o, ref_key(w.name, n, "link" + std::to_string(i), "timeline"));
    const double cores_bound = ref_or_nan(o, ref_key(w.name, n, "link" + std::to_string(i), "compute")) / std::min(cores, n);
    std::printf(
        "{\"bench\":\"pipeline_mp_link\",\"model\":\"%s\",\"schedule\":\"1f1b\",\"processes\":%d,\"micro_batches\":%lld,"
        "\"threads_per_rank\":%d,\"rounds\":%d,\"link\":\"80 Mbit/s, 0 ms\",\"case\":\"%s\",\"wall_s\":%.4f,"
        "\"bytes_per_step\":%.0f,\"rank_link_wait_s\":%s,\"reference_wall_s\":%.4f,\"speedup\":%.2f,"
        "\"predicted_s\":%.4f,\"predicted_speedup\":%.2f,\"vs_predicted\":%.3f,\"cores_bound_s\":%.4f,\"loadavg_1m\":%.2f}\n",
        w.name.c_str(), n, static_cast<long long>(o.m), at::get_num_threads(), rounds, cases[i].name.c_str(),
        wall_med[i], bytes_med[i], json_array(link_med[i], "%.4f").c_str(), wall_med[0], wall_med[0] / wall_med[i],
        pred, pred_ref / pred, pred / wall_med[i], cores_bound, loadavg_1m());
    std::fflush(stdout);
  }
}

// ---- workloads ------------------------------------------------------------------------------------

void classification_batch(Workload& w, int64_t b, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  w.batch.input = at::randn({b, 1, 28, 28}, gen);
  w.batch.target = at::randint(10, {b}, gen, at::kLong);
  w.batch.sample_ids = at::arange(b, at::kLong);
  w.batch.units = at::ones({b}, at::kLong);
  w.loss = classification_loss;
}

Workload resnet8() {
  Workload w;
  w.name = "resnet8";
  w.make = [] { return ModulePtr(make_resnet("resnet8", 1, 10, 1.0, at::detail::createCPUGenerator(1))); };
  w.cuts[4] = {"layer1", "layer2", "layer3"};
  w.cuts[2] = {"layer1"};
  classification_batch(w, 128, 11);
  return w;
}

Workload resnet18() {
  Workload w;
  w.name = "resnet18";
  w.make = [] { return ModulePtr(make_resnet("resnet18", 1, 10, 1.0, at::detail::createCPUGenerator(3))); };
  w.cuts[4] = {"layer1", "layer2", "layer3"};
  w.cuts[2] = {"layer2"};
  classification_batch(w, 32, 13);
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
  w.cuts[4] = {"h.0", "h.1", "h.2"};
  w.cuts[2] = {"h.1"};
  at::Generator gen = at::detail::createCPUGenerator(12);
  w.batch.input = at::randint(256, {b, t}, gen, at::kLong);
  w.batch.target = at::randint(256, {b, t}, gen, at::kLong);
  w.batch.side.token_ids = w.batch.input;
  w.batch.sample_ids = at::arange(b, at::kLong);
  w.batch.units = at::full({b}, t, at::kLong);
  w.loss = next_token_loss;
  return w;
}

Workload make_workload(const std::string& name) {
  if (name == "resnet8") return resnet8();
  if (name == "gpt2" || name == "gpt2_4x256") return gpt2();
  if (name == "resnet18") return resnet18();
  TORCH_CHECK(false, "unknown model '", name, "'; known: resnet8, gpt2, resnet18");
}

// ---- options --------------------------------------------------------------------------------------

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string part; std::getline(ss, part, sep);)
    if (!part.empty()) out.push_back(part);
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  int positional = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      TORCH_CHECK(i + 1 < argc, a, " needs a value");
      return argv[++i];
    };
    if (a == "--rank-worker") {
      o.worker = true;
    } else if (a == "--models") {
      o.models = split(value(), ',');
    } else if (a == "--mp") {
      const std::string v = value();
      o.mp.clear();
      if (v != "none" && v != "0")
        for (const std::string& n : split(v, ',')) {
          o.mp.push_back(std::atoi(n.c_str()));
          TORCH_CHECK(o.mp.back() == 2 || o.mp.back() == 4, "--mp ", v,
                      ": the models have 4-stage and 2-stage splits, so 4 or 2 processes (or none)");
        }
    } else if (a == "--mp-rounds") {
      o.mp_rounds = std::max(1, std::atoi(value().c_str()));
    } else if (a == "--no-links") {
      o.links = false;
    } else if (a == "--calibrate") {
      o.calibrate_only = true;
    } else if (a == "--refs") {
      for (const std::string& kv : split(value(), ';')) {
        const size_t eq = kv.find('=');
        if (eq != std::string::npos) o.refs[kv.substr(0, eq)] = std::atof(kv.substr(eq + 1).c_str());
      }
    } else if (a.rfind("--", 0) == 0) {
      TORCH_CHECK(false, "unknown option '", a,
                  "'; usage: bench_pipeline [rounds] [micro-batches] [--models resnet8,gpt2,resnet18] [--mp 4,2|none] "
                  "[--mp-rounds R] [--no-links] [--calibrate]");
    } else if (positional == 0) {
      o.rounds = std::max(1, std::atoi(a.c_str())), ++positional;
    } else if (positional == 1) {
      o.m = std::max(1, std::atoi(a.c_str())), ++positional;
    }
  }
  if (o.mp_rounds < 0) o.mp_rounds = o.rounds;
  return o;
}

std::string join(const std::vector<std::string>& v, char sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? std::string(1, sep) : "") + v[i];
  return s;
}

/// The arguments of the rank workers of an N-process launch.
std::vector<std::string> worker_args(const Options& o, int n, const std::map<std::string, double>& refs) {
  std::string r;
  char buf[64];
  for (const auto& [k, v] : refs) {
    std::snprintf(buf, sizeof(buf), "%.9g", v);
    r += (r.empty() ? "" : ";") + k + "=" + buf;
  }
  std::vector<std::string> args = {"--rank-worker", std::to_string(o.mp_rounds), std::to_string(o.m), "--models",
                                   join(o.models, ','), "--mp", std::to_string(n), "--refs", r};
  if (!o.links) args.push_back("--no-links");
  return args;
}

/// One rank of an N-process run (launched by main with --rank-worker).
int rank_worker(const Options& o) {
  const ranks::DistEnv env = ranks::DistEnv::from_env();
  ranks::TransportOptions opts;
  opts.timeout_s = 300;
  opts.comm_thread = true;  // as tasks/runner/trainer.cpp: sends overlap compute
  auto plain = ranks::Transport::connect(env, opts);
  std::unique_ptr<ranks::Transport> slow;
  const bool with_links = o.links && env.world_size == 4;
  if (with_links) {
    // A second transport (its own store prefix) whose receivers emulate 80 Mbit/s links.
    ranks::DistEnv env_link = env;
    env_link.restart_count = env.restart_count + 1000;
    env_link.agent_store = true;  // the launcher's store, or rank 0's first transport's
    ranks::TransportOptions lo = opts;
    const int r = env.rank;
    if (r > 0) lo.link_from[r - 1] = bench_link();                   // activations in
    if (r + 1 < env.world_size) lo.link_from[r + 1] = bench_link();  // gradients in
    slow = ranks::Transport::connect(env_link, lo);
  }
  int64_t step_plain = 0, step_slow = 0;
  for (const std::string& name : o.models) {
    const Workload w = make_workload(name);
    TORCH_CHECK(w.cuts.count(env.world_size), "no ", env.world_size, "-stage split of ", name);
    mp_schedules(*plain, w, o, o.rounds, step_plain);
    if (with_links) mp_links(*slow, w, o, o.rounds, step_slow);
  }
  if (slow) slow->barrier("end");
  plain->barrier("end");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    // As the tapeline CLI does: keep freed memory in the heap (no page faults per step).
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    at::manual_seed(0);
    // One thread for everything, in process and in every rank: the in-process compute is the
    // reference of the ranks' (see the header).
    at::set_num_threads(1);
    g_blas_threads = set_blas_threads(1);
    if (o.worker) return rank_worker(o);

    std::map<std::string, double> refs;
    std::vector<Workload> ws;
    for (const std::string& name : o.models) ws.push_back(make_workload(name));
    for (const Workload& w : ws) {
      calibration(w, o);
      if (o.calibrate_only) continue;
      schedules(w, 4, o, refs);
      if (o.links) links(w, o, refs);
      two_ranks(w, o, refs);
    }
    if (o.calibrate_only) return 0;
    for (int n : o.mp)
      if (n != 4)
        for (const Workload& w : ws)
          if (w.cuts.count(n)) schedules(w, n, o, refs);

    int status = 0;
    for (int n : o.mp) {
      if (!ranks::Transport::available("gloo")) {
        std::printf("{\"bench\":\"pipeline_mp\",\"skipped\":\"built without c10d Gloo (libgloo-dev)\"}\n");
        break;
      }
      ranks::LaunchOptions lo;
      lo.nproc = n;
      lo.args = worker_args(o, n, refs);
      // One thread per rank for BLAS too: at::set_num_threads does not reach OpenBLAS (Debian's
      // libtorch), whose pthread pool would otherwise add a worker per core to every rank, each
      // spinning between calls on the cores the other ranks need.
      lo.env = {{"OPENBLAS_NUM_THREADS", "1"}, {"OMP_NUM_THREADS", "1"}, {"MKL_NUM_THREADS", "1"}};
      lo.on_line = bench::print_rank_line;
      const ranks::LaunchResult r = ranks::launch_local(lo);
      if (!r.ok()) {
        std::fprintf(stderr, "bench_pipeline: %d processes: %s\n", n, r.message.c_str());
        status = r.exit_code;
      }
    }
    return status;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "bench_pipeline: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_pipeline: %s\n", e.what());
    return 1;
  }
}
