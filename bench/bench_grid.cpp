// bench_grid: the data-parallel gradient sum of a process grid (parallel/ranks/data_parallel.h)
// against raw c10d all-reduce of the same float32 bytes, between D local processes over Gloo.
// Run without arguments: it launches its own D ranks (parallel/ranks/launch.h).
//
// Per gradient size (a list of parameters of the shape a layer has, 256 KiB .. 16 MiB of float32 in
// all): each rank fills its gradients, then K times either (raw) ProcessGroupGloo::allreduce of one
// flat tensor of all the gradients, or (tapeline) DataParallelSync::reduce_gradients with identity
// codecs: encode, one packed message to every other replica, decode and ordered sum. Raw and
// tapeline alternate per repeat; ratio = raw time / tapeline time (>= 1: tapeline faster), the
// median of the paired ratios and the best of each. A compressed row (ef(powersgd(rank=4))) gives
// its time against the same raw all-reduce, and its bytes. JSON lines on stdout (rank 0):
//   {"bench":"grid_dp","ranks":D,"bytes":...,"raw_ms":...,"tapeline_ms":...,"ratio_median":...,
//    "target":0.9} and {"bench":"grid_dp_compressed",...,"speedup_median":...,"wire_bytes":...}
// A third side times the sum the runtime starts during the backward (dp.overlap: Note [sums
// started during the backward], on the replicas' own c10d process groups; more than two ranks:
// Note [group sums of more than two in rank order]): "during_ms" and "during_ratio_median" (raw
// time / its time).
//
// With --step-rounds R > 0, then: training steps of a P x D grid (the world's ranks: P pipeline
// ranks of D = --replicas replicas, default 2; P = ranks / D) through DistExecutor, one thread a rank, a GPT-2 of 4 blocks
// of width 512 (a vocabulary of 256, 4D x 16 tokens, 2D micro-batches), in 1F1B and in interleaved
// 1F1B with two stages a rank, with the data-parallel sums after the backward (dp.overlap = false)
// and during it, alternated step by step after a warm-up; medians:
//   {"bench":"grid_dp_step","schedule":..,"ranks":W,"pipeline":P,"virtual_stages":v,"replicas":D,
//    "dp_bytes":...,"after_ms":...,"during_ms":...,"speedup":...}  (dp_bytes: rank 0's gradients)
// Memory is allocated as in `tapeline` (Note [allocator]).
// Options: --ranks D (default 2), --repeats R (default 5), --max-mib M (default 16; 0: no sums),
// --step-rounds R (default 0), --replicas D (the step rows' grid, default 2), --bucket-kib K (the step rows' dp.bucket_mib in KiB, default 25600),
// --clone-grads 1 (the tapeline rounds as timed until issue 36's
// fused scale: each gradient copied in the timed rounds, the sum during the backward unscaled),
// --compressed 0 (no compressed rows: the uncompressed sums only, minutes shorter), --timeout S.
#include <ATen/CPUGeneratorImpl.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "autograd/threads.h"
#include "bench/bench_util.h"
#include "layers/models/gpt2.h"
#include "parallel/pipeline.h"
#include "parallel/ranks/c10d_compat.h"
#include "parallel/ranks/data_parallel.h"
#include "parallel/ranks/launch.h"
#include "parallel/ranks/rendezvous.h"
#include "parallel/ranks/runtime.h"
#include "parallel/ranks/transport.h"
#include "tasks/task.h"

using namespace tl;
using namespace tl::ranks;

namespace {

using tl::bench::now_s;

struct Args : tl::bench::RankArgs {
  int max_mib = 16;
  int step_rounds = 0;
  int clone_grads = 0;
  int compressed = 1;
  int bucket_kib = 25 << 10;
  int replicas = 2;
};

Args parse(int argc, char** argv) {
  Args a;
  static_cast<tl::bench::RankArgs&>(a) = tl::bench::parse_rank_options("bench_grid", argc, argv,
                                                                       {{"--max-mib", &a.max_mib},
                                                                        {"--step-rounds", &a.step_rounds},
                                                                        {"--clone-grads", &a.clone_grads},
                                                                        {"--compressed", &a.compressed},
                                                                        {"--bucket-kib", &a.bucket_kib},
                                                                        {"--replicas", &a.replicas}});
  return a;
}

// The grid_dp_step rows (see the header).
void step_rows(const Args& args, Transport& transport) {
  const int W = transport.world_size();
  const int D = args.replicas;
  if (D < 1 || W % D) {
    if (transport.rank() == 0)
      std::printf("{\"bench\":\"grid_dp_step\",\"skipped\":\"%d ranks are not a multiple of --replicas %d\"}\n", W, D);
    return;
  }
  set_compute_threads(1);  // one thread a rank, as the multi-process runs of bench_pipeline
  const int P = W / D, micro_batches = 2 * D, rows = 4 * D;  // two micro-batches of 2 rows a replica
  GPT2Config c;
  c.vocab_size = 256, c.n_positions = 16, c.n_embd = 512, c.n_layer = 4, c.n_head = 8, c.dropout = 0.0;
  at::Generator gen = at::detail::createCPUGenerator(12);
  Batch batch;
  batch.input = at::randint(c.vocab_size, {rows, c.n_positions}, gen, at::kLong);  // (B, T)
  batch.target = at::randint(c.vocab_size, {rows, c.n_positions}, gen, at::kLong);
  batch.side.token_ids = batch.input;
  batch.sample_ids = at::arange(rows, at::kLong);
  batch.units = at::full({rows}, c.n_positions, at::kLong);
  const Grid grid = Grid::of(W, P, D);
  for (const int v : {1, 2}) {  // 1F1B; interleaved 1F1B with two stages a rank
    ScheduleSettings settings;
    settings.schedule = v == 1 ? "1f1b" : "interleaved";
    settings.virtual_stages = v;
    const int stages = P * v;
    if (stages > c.n_layer) continue;
    std::vector<std::string> cuts;
    for (int s = 1; s < stages; ++s) cuts.push_back("h." + std::to_string(c.n_layer * s / stages - 1));
    const std::vector<int> own = settings.layout(stages).stages_of(grid.pipeline_rank(transport.rank()));
    auto model = std::make_shared<GPT2>(c, at::detail::createCPUGenerator(2),
                                        StageSelection::of(cuts, std::set<int64_t>(own.begin(), own.end())));
    auto pipeline = Pipeline::build(model, cuts, std::vector<BoundarySpec>(cuts.size()));
    pipeline->set_measure_error(false);
    DataParallelOptions dp;
    dp.replicas = D;
    dp.bucket_bytes = int64_t(args.bucket_kib) << 10;
    std::vector<std::unique_ptr<DistExecutor>> executors;  // after, during
    for (const bool during : {false, true}) {
      dp.overlap = during;
      executors.push_back(std::make_unique<DistExecutor>(*pipeline, transport, next_token_loss, settings, dp));
    }
    int64_t dp_bytes = 0;
    for (const auto& p : pipeline->parameters()) dp_bytes += p.numel() * p.data().element_size();
    std::vector<double> times[2];
    int64_t step = 0;
    for (int round = -2; round < args.step_rounds; ++round)
      for (int side = 0; side < 2; ++side) {
        for (auto& p : pipeline->parameters()) p.zero_grad();
        transport.barrier("step start");
        const double t0 = now_s();
        executors[static_cast<size_t>(side)]->train_step(batch, micro_batches, StepPosition(0, ++step, -1));
        if (round >= 0) times[side].push_back(now_s() - t0);
      }
    if (transport.rank() == 0) {
      const double after = tl::bench::median(times[0]), during = tl::bench::median(times[1]);
      std::printf(
          "{\"bench\":\"grid_dp_step\",\"model\":\"gpt2 4 x 512, 4D x 16 tokens\",\"schedule\":\"%s\","
          "\"ranks\":%d,\"pipeline\":%d,\"virtual_stages\":%d,\"replicas\":%d,\"micro_batches\":%d,"
          "\"dp_bytes\":%lld,\"bucket_kib\":%d,\"after_ms\":%.2f,\"during_ms\":%.2f,\"speedup\":%.3f}\n",
          settings.schedule.c_str(), W, P, v, D, micro_batches, (long long)dp_bytes, args.bucket_kib, 1e3 * after,
          1e3 * during, after / during);
      std::fflush(stdout);
    }
  }
}

// Weight matrices (up to 256 x 1024) plus a bias each, about `bytes` of float32 in all.
std::vector<std::pair<std::string, Variable>> make_params(int64_t bytes, int rank) {
  std::vector<std::pair<std::string, Variable>> params;
  const int64_t floats = bytes / 4, cols = 1024, rows_per = 256;
  int64_t left = floats;
  for (int i = 0; left > 0; ++i) {
    const int64_t rows = std::max<int64_t>(1, std::min<int64_t>(rows_per, left / (cols + 1)));
    Variable w(at::zeros({rows, cols}), true), b(at::zeros({rows}), true);
    w.set_grad(at::full({rows, cols}, 0.001 * (rank + 1)) + at::arange(rows * cols).reshape({rows, cols}) * 1e-7);
    b.set_grad(at::full({rows}, 0.5 * (rank + 1)));
    params.emplace_back("w" + std::to_string(i), w);
    params.emplace_back("b" + std::to_string(i), b);
    left -= rows * cols + rows;
  }
  return params;
}

int run_rank(const Args& args) {
  const DistEnv env = DistEnv::from_env();
  const int D = env.world_size, me = env.rank;
  tl::bench::RankLinks links = tl::bench::connect_rank(env, args.timeout_s);
  auto& transport = links.transport;
  auto& raw = links.raw;
  const std::vector<int>& group = links.group;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(args.timeout_s * 1000));

  // One compute thread a rank, as `tapeline train` gives D ranks on D cores and step_rows runs:
  // with ATen's default pool, the raw side's cat and the scaled copies woke one thread a core in
  // each rank, and on 2 shared cores those threads' spinning, not the all-reduce, set the times.
  set_compute_threads(1);
  int64_t step = 0;
  for (int64_t bytes = 256 << 10; bytes <= (int64_t(args.max_mib) << 20); bytes *= 4) {
    const int k = static_cast<int>(std::max<int64_t>(3, std::min<int64_t>(20, (int64_t(64) << 20) / bytes)));
    for (const std::string spec : {"identity", "ef(powersgd(rank=4))"}) {
      if (spec != "identity" && !args.compressed) continue;
      auto params = make_params(bytes, me);
      std::vector<at::Tensor> grads;
      for (auto& [n, p] : params) grads.push_back(p.grad().clone());
      std::vector<bool> compressed(params.size(), true);
      DataParallelSync sync(*transport, group, me, params, compressed, {}, {}, CodecSpec(spec));
      // The runtime's sum during the backward: its buckets started and waited for.
      std::unique_ptr<DataParallelSync> during;
      if (spec == "identity") {
        during = std::make_unique<DataParallelSync>(*transport, group, me, params, compressed,
                                                    std::vector<std::pair<std::string, Variable>>{},
                                                    std::vector<double>{}, CodecSpec(spec));
        during->sum_during_backward(std::vector<std::vector<int>>(params.size(), std::vector<int>{0}));
      }
      int64_t numel = 0;
      for (const auto& g : grads) numel += g.numel();
      const int64_t actual_bytes = numel * 4;
      at::Tensor flat = at::empty({numel});
      auto raw_rounds = [&] {  // raw: one flat all-reduce of every gradient (copied in, as a bucketing DDP does)
        for (int i = 0; i < k; ++i) {
          at::cat_out(flat, [&] {
            std::vector<at::Tensor> v;
            for (const auto& g : grads) v.push_back(g.reshape(-1));
            return v;
          }());
          std::vector<at::Tensor> v{flat};
          compat::wait(raw->allreduce(v), timeout);
        }
      };
      // The runtime's path, from gradients as the backward leaves them (set, not copied: the sums
      // never write into the gradients they are given, the buckets are copies); the side summed
      // during the backward is scaled as a step of two replicas scales (by 1 / its loss units),
      // into its buckets. --clone-grads 1: as this benchmark timed before, a copy of every
      // gradient inside the timed rounds and no scale (the raw side copies once, with cat).
      auto tapeline_rounds = [&](DataParallelSync& s) {
        for (int i = 0; i < k; ++i) {
          for (size_t j = 0; j < params.size(); ++j)
            params[j].second.set_grad(args.clone_grads ? grads[j].clone() : grads[j]);
          if (s.sums_during_backward() && !args.clone_grads) {
            s.begin_step(++step, "bench", 0.5);
            s.stage_done(0);
          }
          s.reduce_gradients(++step, "bench");
        }
      };
      const tl::bench::PairedTimes times = tl::bench::time_paired(
          *transport, args.repeats, raw_rounds, [&] { sync.reset_stats(); }, [&] { tapeline_rounds(sync); });
      const double best_raw = times.best_raw, best_tl = times.best_tapeline;
      const int64_t wire = sync.stats().bytes / k;  // of the last round
      tl::bench::PairedTimes during_times;
      if (during)
        during_times = tl::bench::time_paired(
            *transport, args.repeats, raw_rounds, [] {}, [&] { tapeline_rounds(*during); });
      if (me == 0) {
        if (spec == "identity")
          std::printf(
              "{\"bench\":\"grid_dp\",\"backend\":\"gloo\",\"ranks\":%d,\"bytes\":%lld,\"parameters\":%zu,"
              "\"reductions\":%d,\"raw_ms\":%.3f,\"tapeline_ms\":%.3f,\"ratio\":%.3f,\"ratio_median\":%.3f,"
              "\"during_ms\":%.3f,\"during_ratio_median\":%.3f,\"target\":0.95}\n",
              D, (long long)actual_bytes, params.size(), k, 1e3 * best_raw / k, 1e3 * best_tl / k, best_raw / best_tl,
              tl::bench::median(times.ratios), during ? 1e3 * during_times.best_tapeline / k : 0.0,
              during ? tl::bench::median(during_times.ratios) : 0.0);
        else
          std::printf(
              "{\"bench\":\"grid_dp_compressed\",\"codec\":\"%s\",\"ranks\":%d,\"bytes\":%lld,\"wire_bytes\":%lld,"
              "\"raw_ms\":%.3f,\"tapeline_ms\":%.3f,\"speedup_median\":%.3f}\n",
              spec.c_str(), D, (long long)actual_bytes, (long long)wire, 1e3 * best_raw / k, 1e3 * best_tl / k,
              tl::bench::median(times.ratios));
        std::fflush(stdout);
      }
    }
  }
  if (args.step_rounds > 0) step_rows(args, *transport);
  transport->barrier("end");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // As `tapeline` runs (Note [allocator] in tasks/runner/cli/tapeline.cpp): freed blocks stay in
  // the heap, so a step's messages do not start with page faults.
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  const Args args = parse(argc, argv);
  return tl::bench::run_as_ranks("grid_dp", args.ranks, argc, argv, [&] { return run_rank(args); });
}
