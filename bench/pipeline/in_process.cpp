// bench_pipeline's in-process part: timed steps of Pipelines in this process.
#include "bench/pipeline/in_process.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <vector>

#include "bench/bench_util.h"
#include "layers/models/gpt2.h"
#include "layers/optim/grad_utils.h"
#include "parallel/interpreter.h"
#include "parallel/local_executor.h"
#include "parallel/simulate.h"

namespace tl::bench_pipeline {
namespace {

using Clock = std::chrono::steady_clock;
using bench::json_array;
using bench::median;
using bench::seconds_since;

/// What one timed step of a pipeline gives.
struct Sample {
  double timeline = 0, ideal = 0, bound = 0, wall = 0, compute = 0, bytes = 0;
  double link_bytes = 0;  // of the cuts between two ranks (a cut inside a rank sends nothing)
  std::vector<double> stage_compute, stage_forward, stage_weight;
  size_t held_for_weights = 0;  // the most any rank held between I and W
};

/// A pipeline of a workload and the executor that runs it in this process.
struct Run {
  std::shared_ptr<Pipeline> p;
  std::unique_ptr<LocalExecutor> ex;
};
Run run_of(const Workload& w, int stages, const std::string& fwd, const std::string& bwd, ScheduleSettings settings,
           bool with_links = false) {
  Run r{build(w, stages, fwd, bwd), nullptr};
  if (with_links) settings.links.assign(w.cuts.at(stages).size(), bench_link());
  r.ex = std::make_unique<LocalExecutor>(*r.p, w.loss, std::move(settings));
  return r;
}

Sample step(Run& run, const Workload& w, int64_t m) {
  Pipeline& p = *run.p;
  for (auto& param : p.parameters()) param.zero_grad();
  p.reset_stats();
  const auto t0 = Clock::now();
  run.ex->train_step(w.batch, m, {});
  Sample s;
  s.wall = seconds_since(t0);
  const StepTiming& t = run.ex->last_timing();
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
  const StageLayout& layout = run.ex->layout();
  for (size_t b = 0; b < p.boundaries().size(); ++b)
    if (layout.rank_of(static_cast<int>(b)) != layout.rank_of(static_cast<int>(b) + 1)) {
      const BoundaryStats& bs = p.boundaries()[b]->stats();
      s.link_bytes += static_cast<double>(bs.forward.bytes + bs.backward.bytes);
    }
  return s;
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

}  // namespace

/// GPipe and 1F1B in process on `stages` stages; records the medians in `refs`.
void schedules(const Workload& w, int stages, const Options& o, std::map<std::string, double>& refs) {
  const bool with_unsplit = stages == 4;
  Run gpipe = run_of(w, stages, "identity", "identity", {"gpipe"});
  Run one_f = run_of(w, stages, "identity", "identity", {"1f1b"});
  ModulePtr unsplit = w.make();
  // Interleaved: 2 ranks x 2 virtual stages (4-stage splits, M a multiple of 2).
  const bool with_interleaved = stages == 4 && o.m % 2 == 0;
  Run inter = run_of(w, stages, "identity", "identity", {"interleaved", with_interleaved ? 2 : 1});
  // ZB-H1 on the same stages (4-stage splits).
  const bool with_zb = stages == 4;
  Run zb = run_of(w, stages, "identity", "identity", {"zbh1"});
  std::vector<Sample> g, f, iv, z;
  std::vector<double> u;
  for (int r = -1; r < o.rounds; ++r) {  // round -1: warm-up
    Sample a = step(gpipe, w, o.m), b = step(one_f, w, o.m);
    Sample i = with_interleaved ? step(inter, w, o.m) : Sample{};
    Sample zs = with_zb ? step(zb, w, o.m) : Sample{};
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
        w.name.c_str(), name, stages, static_cast<long long>(o.m), at::get_num_threads(), o.blas_threads, median(tl),
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

/// The roofs the device model's constants stand for, measured on `device` in `dtype`: a square
/// GEMM's FLOP/s (512 on the CPU, 8192 on a GPU), an elementwise add's bytes/s (16 MiB, 256 MiB
/// on a GPU: past its cache) and the seconds of one tiny kernel in a row of 2,000 (launch and
/// gap, the launch_s a preset charges). Medians of 7.
void roofs(at::Device device, at::ScalarType dtype, const DeviceModel& preset) {
  const bool gpu = !device.is_cpu();
  const auto opt = at::TensorOptions().device(device).dtype(dtype);
  const int64_t n = gpu ? 8192 : 512, e = gpu ? (int64_t{1} << 26) : (int64_t{1} << 22);
  at::Tensor a = at::randn({n, n}, opt), b = at::randn({n, n}, opt), x = at::randn({e}, opt), y = at::randn({e}, opt);
  at::Tensor one = at::zeros({1}, opt);
  std::vector<double> gemm, add, launch;
  for (int r = -1; r < 7; ++r) {  // r = -1: warm-up (cuBLAS handles, the allocator's first blocks)
    wait_for_device(device);
    auto t0 = Clock::now();
    at::Tensor c = at::mm(a, b);
    wait_for_device(device);
    const double g = 2.0 * n * n * n / seconds_since(t0);
    t0 = Clock::now();
    at::Tensor z = x + y;
    wait_for_device(device);
    const double m = 3.0 * static_cast<double>(x.element_size() * e) / seconds_since(t0);
    t0 = Clock::now();
    for (int i = 0; i < 2000; ++i) one.add_(1.0);
    wait_for_device(device);
    const double l = seconds_since(t0) / 2000;
    if (r >= 0) gemm.push_back(g), add.push_back(m), launch.push_back(l);
  }
  std::printf("{\"bench\":\"device_roofs\",\"device\":\"%s\",\"dtype\":\"%s\",\"threads\":%d,\"gemm_n\":%lld,"
              "\"gemm_flops_per_s\":%.4g,\"preset\":\"%s\",\"preset_flops_per_s\":%.4g,\"add_bytes_per_s\":%.4g,"
              "\"preset_bytes_per_s\":%.4g,\"tiny_kernel_s\":%.3g,\"preset_launch_s\":%.3g}\n",
              device.str().c_str(), c10::toString(dtype), at::get_num_threads(), static_cast<long long>(n), median(gemm),
              preset.name.c_str(), preset.peak_flops * preset.flop_efficiency, median(add),
              preset.memory_bytes_per_s * preset.memory_efficiency, median(launch), preset.launch_s);
  std::fflush(stdout);
}

/// Calibration of the device model (Note [device model] in parallel/device_model.h): per stage of
/// the 4-stage 1F1B step, the measured compute against the compute modelled from the counted
/// FLOPs and bytes on the preset of the device it runs on (ratio = measured / modelled; 1 is a
/// calibrated preset): "cpu" on the CPU, "h100" on a GPU (Note [timing actions on a GPU]: each
/// action waits for its kernels). The counted FLOPs, bytes and kernels are printed too, so that a
/// preset's efficiencies and launch cost can be fitted to the stages, and the measured compute of
/// the same step with no meter installed (unmetered_s: what the op accounting costs). On the CPU
/// the line also says what the h100 preset makes of the same step. First the device's own roofs.
void calibration(const Workload& w, const Options& o) {
  const at::Device device(o.device == "cuda" ? at::kCUDA : o.device == "meta" ? at::kMeta : at::kCPU);
  const bool meta = device.is_meta();  // shapes only: the measured seconds mean nothing
  const at::ScalarType dtype = o.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  TORCH_CHECK(!device.is_cuda() || at::hasCUDA(), "bench_pipeline --device cuda: this machine has no CUDA device");
  DeviceModel preset = device_model(device.is_cpu() ? "cpu" : "h100");  // meta: the GPU's preset
  // The engine counts the bytes of the tensors it runs; the preset's bytes_scale converts float32
  // counts to its training dtype, so a run already in that dtype is counted at scale 1.
  if (dtype != at::kFloat) preset.bytes_scale = 1.0;
  static bool roofs_printed = false;
  if (!roofs_printed && !meta) {
    roofs_printed = true;
    roofs(device, dtype, preset);
  }
  const DeviceModel h100 = device_model("h100");
  auto p = build(w, 4, "identity", "identity");
  p->to(device, dtype);
  Batch batch = w.batch;
  if (o.batch_scale > 1) {  // the workload's rows repeated: the same shapes, K times the tokens
    auto repeat = [&](const at::Tensor& t) {
      std::vector<int64_t> times(static_cast<size_t>(t.dim()), 1);
      times[0] = o.batch_scale;
      return t.defined() ? t.repeat(times) : t;
    };
    batch.input = repeat(batch.input), batch.target = repeat(batch.target), batch.units = repeat(batch.units);
    batch.side.token_ids = repeat(batch.side.token_ids);
    batch.sample_ids = at::arange(batch.input.size(0), at::kLong);
  }
  batch = batch.to(device);
  if (at::isFloatingType(batch.input.scalar_type())) batch.input = batch.input.to(dtype);
  // The presets' meters, then (last) no meter: the measured compute without the op accounting.
  const DeviceModel unmetered = device_model("measured");
  std::vector<const DeviceModel*> models = {&preset};
  if (device.is_cpu()) models.push_back(&h100);
  if (!meta) models.push_back(&unmetered);
  std::vector<std::unique_ptr<LocalExecutor>> on;  // one executor per device model, measured clocks
  for (const DeviceModel* m : models) {
    on.push_back(std::make_unique<LocalExecutor>(*p, w.loss, ScheduleSettings{"1f1b", 1, {}, *m}));
    on.back()->set_model_drives_clock(false);
  }
  std::vector<std::vector<double>> measured(4), modelled(4), on_h100(4), flops(4), bytes(4), kernels(4), bare(4);
  for (int r = -1; r < o.rounds; ++r) {
    for (size_t k = 0; k < models.size(); ++k) {
      for (auto& param : p->parameters()) param.zero_grad();
      StepTiming t;
      on[k]->train_step(batch, o.m, 0, &t);
      if (r < 0) continue;
      for (size_t i = 0; i < 4; ++i) {
        if (k == 0) {
          measured[i].push_back(t.compute_s[i]), modelled[i].push_back(t.modelled_s[i]);
          flops[i].push_back(t.flops[i]), bytes[i].push_back(t.op_bytes[i]), kernels[i].push_back(t.kernels[i]);
        } else if (models[k] == &unmetered) {
          bare[i].push_back(t.compute_s[i]);
        } else {
          on_h100[i].push_back(t.modelled_s[i]);
        }
      }
    }
  }
  std::vector<double> me, mo, ratio, h, f, by, ke, un;
  for (size_t i = 0; i < 4; ++i) {
    me.push_back(median(measured[i])), mo.push_back(median(modelled[i]));
    un.push_back(bare[i].empty() ? 0.0 : median(bare[i]));
    f.push_back(median(flops[i])), by.push_back(median(bytes[i])), ke.push_back(median(kernels[i]));
    if (!on_h100[i].empty()) h.push_back(median(on_h100[i]));
    ratio.push_back(me.back() / mo.back());
  }
  std::printf("{\"bench\":\"device_calibration\",\"model\":\"%s\",\"device\":\"%s\",\"dtype\":\"%s\","
              "\"schedule\":\"1f1b\",\"stages\":4,\"micro_batches\":%lld,\"preset\":\"%s\",\"stage_flops\":%s,"
              "\"batch_rows\":%lld,\"stage_bytes\":%s,\"stage_kernels\":%s,\"measured_s\":%s,\"unmetered_s\":%s,"
              "\"modelled_s\":%s,\"ratio\":%s",
              w.name.c_str(), device.str().c_str(), c10::toString(dtype), static_cast<long long>(o.m),
              preset.name.c_str(), json_array(f, "%.4g").c_str(), static_cast<long long>(batch.rows()),
              json_array(by, "%.4g").c_str(), json_array(ke, "%.0f").c_str(), json_array(me).c_str(),
              json_array(un).c_str(), json_array(mo).c_str(),
              json_array(ratio, "%.3f").c_str());
  if (!h.empty()) std::printf(",\"h100_modelled_s\":%s", json_array(h, "%.3g").c_str());
  std::printf("}\n");
  std::fflush(stdout);
}

void plans(const Workload& w, const Options& o) {
  const int stages = 4, m = static_cast<int>(o.m);
  struct Kind {
    std::string name;
    int v;
  };
  std::vector<Kind> kinds = {{"1f1b", 1}, {"zbh1", 1}};
  if (m % 2 == 0) kinds.push_back({"interleaved", 2});
  for (const Kind& k : kinds) {
    Run run = run_of(w, stages, "identity", "identity", {k.name, k.v});
    const StageLayout& layout = run.ex->layout();
    std::vector<double> lower, lookup, wall;
    for (int r = -1; r < o.rounds; ++r) {
      auto t0 = Clock::now();
      const std::vector<RankSchedule> fresh = make_schedule(k.name, layout, m);  // what each step did
      const double l = seconds_since(t0);
      t0 = Clock::now();
      const std::vector<RankSchedule>& kept = cached_schedule(k.name, layout, m);  // what each step does
      const double c = seconds_since(t0);
      TORCH_CHECK(kept.size() == fresh.size(), "plans: the cached plan has ", kept.size(), " ranks, a fresh one ",
                  fresh.size());
      const Sample s = step(run, w, o.m);
      if (r < 0) continue;
      lower.push_back(l), lookup.push_back(c), wall.push_back(s.wall);
    }
    std::printf("{\"bench\":\"plans\",\"model\":\"%s\",\"schedule\":\"%s\",\"ranks\":%d,\"virtual_stages\":%d,"
                "\"micro_batches\":%d,\"lowering_s\":%.3g,\"cached_s\":%.3g,\"step_wall_s\":%.5f,"
                "\"lowering_share_of_step\":%.4f,\"cached_share_of_step\":%.6f}\n",
                w.name.c_str(), k.name.c_str(), layout.ranks, k.v, m, median(lower), median(lookup), median(wall),
                median(lower) / median(wall), median(lookup) / median(wall));
    std::fflush(stdout);
  }
}

/// What the executor adds to a step (issue 36, "per step, nothing is rebuilt that the step does not
/// change"): a 1-layer GPT-2 (width 64, 2 heads, 64 tokens of vocabulary, 4 x 16 tokens) as one
/// stage and one micro-batch through LocalExecutor, against the same model's forward, loss and
/// backward called directly; the difference is the executor's per-step cost (the micro-batch split,
/// the schedule lookup, one RankInterpreter and its stage runtime, the channel, the gradient
/// accumulator, the timing). Medians of 300 steps each, alternated. Then what keeping the
/// interpreters saves: a channel and an interpreter made afresh per step (as before) against
/// begin() on kept ones.
void step_overhead() {
  auto make = [] {
    GPT2Config c;
    c.vocab_size = 64, c.n_positions = 16, c.n_embd = 64, c.n_layer = 1, c.n_head = 2, c.dropout = 0.0;
    return std::make_shared<GPT2>(c, at::detail::createCPUGenerator(5));
  };
  const auto direct_model = make();
  auto p = Pipeline::build(make(), {}, {});
  LocalExecutor ex(*p, next_token_loss, ScheduleSettings{"1f1b", 1, {}, device_model("measured")});
  at::Generator gen = at::detail::createCPUGenerator(6);
  Batch b;
  b.input = at::randint(64, {4, 16}, gen, at::kLong);  // (B, T)
  b.target = at::randint(64, {4, 16}, gen, at::kLong);
  b.side.token_ids = b.input;
  b.sample_ids = at::arange(4, at::kLong);
  b.units = at::full({4}, 16, at::kLong);
  std::vector<double> through, direct;
  for (int i = -20; i < 300; ++i) {
    for (auto& param : p->parameters()) param.zero_grad();
    auto t0 = Clock::now();
    ex.train_step(b, 1, 0);
    const double a = seconds_since(t0);
    for (auto& param : direct_model->parameters()) param.zero_grad();
    t0 = Clock::now();
    Variable out = direct_model->forward(b.input);
    next_token_loss(out, b).loss.backward();
    const double d = seconds_since(t0);
    if (i >= 0) through.push_back(a), direct.push_back(d);
  }
  const double a = median(through), d = median(direct);
  // What keeping the interpreters saves (Note [interpreters are kept]): a step's channel and
  // interpreter made afresh, as every step did, against begin() on the kept ones.
  const MicroBatches split = split_micro_batches(b, 1, 0);
  const RankSchedule& list = cached_schedule("1f1b", StageLayout{}, 1).at(0);
  LocalChannel kept_channel;
  RankInterpreter kept(*p, StageLayout{}, 0, list, next_token_loss, kept_channel, RankInterpreter::Mode::Train);
  std::vector<double> fresh_s, begin_s;
  for (int i = -20; i < 300; ++i) {
    auto t0 = Clock::now();
    {
      LocalChannel channel;
      RankInterpreter fresh(*p, StageLayout{}, 0, list, next_token_loss, channel, RankInterpreter::Mode::Train);
      fresh.begin(split);
    }
    const double f = seconds_since(t0);
    t0 = Clock::now();
    kept_channel.reset();
    kept.begin(split);
    const double k = seconds_since(t0);
    if (i >= 0) fresh_s.push_back(f), begin_s.push_back(k);
  }
  // The parts of the executor's step that are not the model's forward, loss and backward, each
  // timed alone, as LocalExecutor::train_step calls them (medians of 300): the micro-batch split,
  // the parameter list (walked per step before issue 36; kept by the executor since), the
  // division of the gradients by the step's units (one mul_ a parameter), the step's result
  // (the tally read), the sum of a micro-batch's loss units (Batch::weight), the interpreter's
  // begin. "rest" is the overhead none of these explains:
  // the interpreter's run around the stage (a tape per micro-batch, the seed of the backward,
  // the tally's sum, the action timers).
  const std::vector<Variable> params = p->parameters();
  Variable out = direct_model->forward(b.input);
  const at::Tensor tally = next_token_loss(out, b).tally;
  std::vector<double> split_s, params_s, scale_s, result_s, weight_s, weight_kernel_s;
  for (int i = -20; i < 300; ++i) {
    auto t0 = Clock::now();
    { const MicroBatches m = split_micro_batches(b, 1, 0); }
    const double sp = seconds_since(t0);
    t0 = Clock::now();
    { const std::vector<Variable> v = p->parameters(); }
    const double pa = seconds_since(t0);
    t0 = Clock::now();
    scale_grads(params, i % 2 ? 2.0 : 0.5);  // the mul_s of a step (powers of 2: the values neither drift nor go subnormal)
    const double sc = seconds_since(t0);
    t0 = Clock::now();
    { [[maybe_unused]] const StepResult r = step_result(tally, 64, 4, 1); }
    const double re = seconds_since(t0);
    t0 = Clock::now();
    { [[maybe_unused]] volatile double w = b.weight(); }
    const double we = seconds_since(t0);
    t0 = Clock::now();  // the same sum as Batch::weight() took it before issue 36: a kernel and a read-back
    { [[maybe_unused]] volatile int64_t w = b.units.sum().item<int64_t>(); }
    const double wk = seconds_since(t0);
    if (i >= 0)
      split_s.push_back(sp), params_s.push_back(pa), scale_s.push_back(sc), result_s.push_back(re),
          weight_s.push_back(we), weight_kernel_s.push_back(wk);
  }
  const double parts_us[] = {median(split_s) * 1e6,  median(params_s) * 1e6, median(scale_s) * 1e6,
                             median(result_s) * 1e6, median(weight_s) * 1e6, median(begin_s) * 1e6};
  const double rest_us = (a - d) * 1e6 - std::accumulate(std::begin(parts_us), std::end(parts_us), 0.0);
  std::printf(
      "{\"bench\":\"step_overhead\",\"model\":\"gpt2 1 x 64, 4 x 16 tokens\",\"stages\":1,"
      "\"micro_batches\":1,\"executor_step_s\":%.3g,\"direct_step_s\":%.3g,\"overhead_us\":%.1f,"
      "\"ratio\":%.3f,\"fresh_interpreter_us\":%.2f,\"kept_interpreter_us\":%.2f,\"split_us\":%.2f,"
      "\"parameter_list_us\":%.2f,\"grad_scale_us\":%.2f,\"step_result_us\":%.2f,\"units_sum_us\":%.2f,"
      "\"units_sum_by_kernel_us\":%.2f,\"rest_us\":%.1f}\n",
      a, d, (a - d) * 1e6, a / d, median(fresh_s) * 1e6, median(begin_s) * 1e6, parts_us[0], parts_us[1], parts_us[2],
      parts_us[3], parts_us[4], median(weight_kernel_s) * 1e6, rest_us);
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
  std::vector<Run> ps;
  for (const LinkCase& c : cases)
    for (const std::string& name : schedules) {
      ps.push_back(run_of(w, stages, c.fwd, c.bwd, {name}, /*with_links=*/true));
      for (const BoundaryPtr& b : ps.back().p->boundaries()) {
        b->set_epilogue_only(c.epilogue > 0);
        b->set_epilogue_rule(c.epilogue == 2 ? EpilogueRule::CriticalPath : EpilogueRule::Optimus);
      }
    }
  std::vector<std::vector<double>> t(ps.size()), bytes(ps.size()), compute(ps.size());
  for (int r = -1; r < o.rounds; ++r)
    for (size_t i = 0; i < ps.size(); ++i) {
      const Sample s = step(ps[i], w, o.m);
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
  std::vector<Run> ps;
  for (size_t c = 0; c < cases.size(); ++c)
    for (const Sched& k : scheds)
      ps.push_back(run_of(w, k.stages, cases[c].fwd, cases[c].bwd, {k.name, k.v}, /*with_links=*/c > 0));
  std::vector<std::vector<Sample>> samples(ps.size());
  for (int r = -1; r < o.rounds; ++r)
    for (size_t i = 0; i < ps.size(); ++i) {
      Sample s = step(ps[i], w, o.m);
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

}  // namespace tl::bench_pipeline
