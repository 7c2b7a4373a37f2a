// bench_pipeline's rank workers: each rank steps its stage; rank 0 gathers the timings and
// prints them against the in-process references.
#include "bench/pipeline/worker.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <memory>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "bench/pipeline/workloads.h"
#include "parallel/ranks/runtime.h"
#include "parallel/ranks/transport.h"

namespace tl::bench_pipeline {
namespace {

using Clock = std::chrono::steady_clock;
using bench::json_array;
using bench::json_number;
using bench::loadavg_1m;
using bench::median;
using bench::seconds_since;

double cpu_s(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// What one rank measures in one step.
struct RankSample {
  double wall = 0, compute = 0, comm = 0, cpu = 0, thread_cpu = 0, bytes = 0, link = 0;
  static constexpr size_t kFields = 7;
};

/// One rank's step: barrier, then DistExecutor::train_step.
RankSample mp_step(ranks::DistExecutor& ex, Pipeline& p, ranks::Transport& t, const Workload& w, int64_t m,
                   int64_t& step_no) {
  for (auto& param : p.parameters()) param.zero_grad();
  t.barrier("before step " + std::to_string(step_no));
  const ranks::TransportStats s0 = t.stats();
  const double cpu0 = cpu_s(CLOCK_PROCESS_CPUTIME_ID), thread0 = cpu_s(CLOCK_THREAD_CPUTIME_ID);
  const auto t0 = Clock::now();
  StepTiming timing;
  ex.train_step(w.batch, m, StepPosition(0, step_no++), &timing);
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

/// Runs every case (a pipeline and how it runs) for `rounds` (+1 warm-up) rounds, cases
/// alternating; returns, on rank 0, samples[case][round][rank] (empty elsewhere).
using AllSamples = std::vector<std::vector<std::vector<RankSample>>>;
AllSamples mp_rounds(ranks::Transport& t, const Workload& w, const Options& o, int rounds,
                     const std::vector<std::shared_ptr<Pipeline>>& ps, const std::vector<ScheduleSettings>& schedules,
                     int64_t& step_no) {
  std::vector<std::unique_ptr<ranks::DistExecutor>> ex;
  for (size_t i = 0; i < ps.size(); ++i)
    ex.push_back(std::make_unique<ranks::DistExecutor>(*ps[i], t, w.loss, schedules[i]));
  std::vector<std::vector<RankSample>> mine(ps.size());
  for (int r = -1; r < rounds; ++r)
    for (size_t i = 0; i < ps.size(); ++i) {
      const RankSample s = mp_step(*ex[i], *ps[i], t, w, o.m, step_no);
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
  std::vector<ScheduleSettings> settings = {{"gpipe"}, {"1f1b"}, {"zbh1"}};
  std::vector<std::shared_ptr<Pipeline>> ps = {build(w, n, "identity", "identity"), build(w, n, "identity", "identity"),
                                               build(w, n, "identity", "identity")};
  // Two processes also run the 4-stage split with 2 stages each: interleaved and ZB-V.
  if (n == 2 && w.cuts.count(4))
    for (const std::string name : {"interleaved", "zbv"}) {
      if (name == "interleaved" && o.m % 2 != 0) continue;
      names.push_back(name);
      ps.push_back(build(w, 4, "identity", "identity"));
      settings.push_back({name, 2});
    }
  const AllSamples all = mp_rounds(t, w, o, rounds, ps, settings, step_no);
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
        at::get_num_threads(), o.blas_threads, cores, rounds, wm, json_number(median(ideal)).c_str(),
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
  const AllSamples all = mp_rounds(t, w, o, rounds, ps, std::vector<ScheduleSettings>(cases.size(), ScheduleSettings{"1f1b"}), step_no);
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

}  // namespace

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

}  // namespace tl::bench_pipeline
