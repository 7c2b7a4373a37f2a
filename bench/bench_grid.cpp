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
// Memory is allocated as in `tapeline` (Note [allocator]).
// Options: --ranks D (default 2), --repeats R (default 5), --max-mib M (default 16), --timeout S.
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "bench/bench_util.h"
#include "parallel/ranks/c10d_compat.h"
#include "parallel/ranks/data_parallel.h"
#include "parallel/ranks/launch.h"
#include "parallel/ranks/rendezvous.h"
#include "parallel/ranks/transport.h"

using namespace tl;
using namespace tl::ranks;

namespace {

using tl::bench::now_s;

struct Args : tl::bench::RankArgs {
  int max_mib = 16;
};

Args parse(int argc, char** argv) {
  Args a;
  static_cast<tl::bench::RankArgs&>(a) =
      tl::bench::parse_rank_options("bench_grid", argc, argv, {{"--max-mib", &a.max_mib}});
  return a;
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

  int64_t step = 0;
  for (int64_t bytes = 256 << 10; bytes <= (int64_t(args.max_mib) << 20); bytes *= 4) {
    const int k = static_cast<int>(std::max<int64_t>(3, std::min<int64_t>(20, (int64_t(64) << 20) / bytes)));
    for (const std::string spec : {"identity", "ef(powersgd(rank=4))"}) {
      auto params = make_params(bytes, me);
      std::vector<at::Tensor> grads;
      for (auto& [n, p] : params) grads.push_back(p.grad().clone());
      std::vector<bool> compressed(params.size(), true);
      DataParallelSync sync(*transport, group, me, params, compressed, {}, {}, CodecSpec(spec));
      int64_t numel = 0;
      for (const auto& g : grads) numel += g.numel();
      const int64_t actual_bytes = numel * 4;
      at::Tensor flat = at::empty({numel});
      const tl::bench::PairedTimes times = tl::bench::time_paired(
          *transport, args.repeats,
          [&] {  // raw: one flat all-reduce of every gradient (copied in, as a bucketing DDP does)
            for (int i = 0; i < k; ++i) {
              at::cat_out(flat, [&] {
                std::vector<at::Tensor> v;
                for (const auto& g : grads) v.push_back(g.reshape(-1));
                return v;
              }());
              std::vector<at::Tensor> v{flat};
              compat::wait(raw->allreduce(v), timeout);
            }
          },
          [&] { sync.reset_stats(); },
          [&] {  // tapeline: the runtime's path
            for (int i = 0; i < k; ++i) {
              for (size_t j = 0; j < params.size(); ++j) params[j].second.set_grad(grads[j].clone());
              sync.reduce_gradients(++step, "bench");
            }
          });
      const double best_raw = times.best_raw, best_tl = times.best_tapeline;
      const int64_t wire = sync.stats().bytes / k;  // of the last round
      if (me == 0) {
        if (spec == "identity")
          std::printf(
              "{\"bench\":\"grid_dp\",\"backend\":\"gloo\",\"ranks\":%d,\"bytes\":%lld,\"parameters\":%zu,"
              "\"reductions\":%d,\"raw_ms\":%.3f,\"tapeline_ms\":%.3f,\"ratio\":%.3f,\"ratio_median\":%.3f,"
              "\"target\":0.9}\n",
              D, (long long)actual_bytes, params.size(), k, 1e3 * best_raw / k, 1e3 * best_tl / k, best_raw / best_tl,
              tl::bench::median(times.ratios));
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
