// bench_tensor_parallel: tensor parallelism (layers/nn/tensor_parallel.h, parallel/ranks/
// tensor_parallel.h) between T local processes over Gloo. Run without arguments: it launches its
// own T ranks (parallel/ranks/launch.h).
//
// 1. Compute (rank 0): one GPT-2-small-sized transformer block (C = 768, 12 heads, MLP 3072) on
//    (8, 128, C), forward + backward, unsplit against rank 0's part at T with the all-reduces
//    replaced by a local copy, i.e. the compute a rank does on the timeline. Ideal ratio 1 / T.
//    {"bench":"tp_block","tensor":T,"whole_ms":...,"part_ms":...,"ratio":part/whole,"ideal":1/T}
// 2. All-reduce of one (8, 128, 768) float32 tensor (3 MiB, a block's activation): raw c10d
//    allreduce (ProcessGroupGloo, ring) against TensorParallelSync, uncompressed and compressed
//    (allgather with quant 8 and 4 bits and topk 10%, reduce_scatter with quant 8 and 4 bits).
//    ratio_median = raw time / tapeline time (>= 1: tapeline faster), paired per repeat; wire
//    bytes sent per rank and all-reduce, and the raw float32 bytes a ring sends per rank,
//    2 (T - 1) / T of the tensor.
//    {"bench":"tp_allreduce","codec":...,"algorithm":...,"raw_ms":...,"tapeline_ms":...,
//     "ratio_median":...,"wire_bytes_per_rank":...,"ring_bytes_per_rank":...}
// Options: --ranks T (default 2), --repeats R (default 5), --timeout S.
#include <malloc.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>

#include "autograd/autograd.h"
#include "bench/bench_util.h"
#include "layers/nn/tensor_parallel.h"
#include "layers/nn/transformer.h"
#include "parallel/ranks/c10d_compat.h"
#include "parallel/ranks/launch.h"
#include "parallel/ranks/rendezvous.h"
#include "parallel/ranks/tensor_parallel.h"
#include "parallel/ranks/transport.h"

using namespace tl;
using namespace tl::ranks;

namespace {

using tl::bench::now_s;

using Args = tl::bench::RankArgs;

Args parse(int argc, char** argv) { return tl::bench::parse_rank_options("bench_tensor_parallel", argc, argv); }

// A rank's compute alone: the all-reduces return the rank's own part.
class LocalComm : public TensorParallelComm {
 public:
  at::Tensor all_reduce(const at::Tensor& x, const std::string&, TpDirection) override { return x.clone(); }
};

void bench_block(int T, int repeats) {
  const auto o = TransformerBlockOptions(768, 12).norm(NormPlacement::Pre).fused_qkv(true).causal(true).activation(
      "gelu_tanh");
  auto whole = std::make_shared<TransformerBlock>(o, at::detail::createCPUGenerator(1));
  auto part = std::make_shared<TransformerBlock>(o, at::detail::createCPUGenerator(1));
  auto tp = std::make_shared<TensorParallel>(0, T);
  tp->bind(std::make_shared<LocalComm>());
  shard_tensor_parallel(*part, tp, "bench");
  const at::Tensor x0 = at::randn({8, 128, 768}), g = at::randn({8, 128, 768});
  auto time = [&](TransformerBlock& block) {
    Variable x(x0, true);
    const double t0 = now_s();
    block.forward(x).backward(g);
    return now_s() - t0;
  };
  time(*whole), time(*part);  // warm-up
  std::vector<double> w, p;
  for (int r = 0; r < repeats; ++r) w.push_back(time(*whole)), p.push_back(time(*part));
  const double wm = tl::bench::median(w), pm = tl::bench::median(p);
  std::printf("{\"bench\":\"tp_block\",\"tensor\":%d,\"shape\":[8,128,768],\"whole_ms\":%.2f,\"part_ms\":%.2f,"
              "\"ratio\":%.3f,\"ideal\":%.3f}\n",
              T, 1e3 * wm, 1e3 * pm, pm / wm, 1.0 / T);
  std::fflush(stdout);
}

int run_rank(const Args& args) {
  const DistEnv env = DistEnv::from_env();
  const int T = env.world_size, me = env.rank;
  if (me == 0) bench_block(T, args.repeats);
  tl::bench::RankLinks links = tl::bench::connect_rank(env, args.timeout_s);
  auto& transport = links.transport;
  auto& raw = links.raw;
  const std::vector<int>& group = links.group;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(args.timeout_s * 1000));

  const at::Tensor x = at::randn({8, 128, 768}, at::TensorOptions().dtype(at::kFloat)) * (me + 1);
  const int64_t bytes = x.numel() * 4;
  const int k = 10;
  struct Row {
    std::string codec, algorithm;
  };
  int64_t step = 0;
  for (const Row& row : {Row{"identity", "allgather"}, Row{"quant(bits=8)", "allgather"},
                         Row{"quant(bits=4)", "allgather"}, Row{"topk(0.1)", "allgather"},
                         Row{"quant(bits=8)", "reduce_scatter"}, Row{"quant(bits=4)", "reduce_scatter"}}) {
    TensorParallelOptions tpo;
    tpo.size = T;
    tpo.forward = CodecSpec(row.codec);
    tpo.algorithm = row.algorithm;
    TensorParallelSync sync(*transport, group, me, {"site"}, tpo);
    const tl::bench::PairedTimes times = tl::bench::time_paired(
        *transport, args.repeats,
        [&] {
          for (int i = 0; i < k; ++i) {
            std::vector<at::Tensor> v{x.clone()};  // allreduce works in place
            compat::wait(raw->allreduce(v), timeout);
          }
        },
        [&] {
          sync.reset_stats();
          sync.set_phase(++step, "bench", true, true);
        },
        [&] {
          for (int i = 0; i < k; ++i) sync.all_reduce(x, "site", TpDirection::Forward);
        });
    const double best_raw = times.best_raw, best_tl = times.best_tapeline;
    const int64_t wire = sync.stats().bytes / k;  // of the last round
    if (me == 0) {
      std::printf(
          "{\"bench\":\"tp_allreduce\",\"backend\":\"gloo\",\"ranks\":%d,\"codec\":\"%s\",\"algorithm\":\"%s\","
          "\"bytes\":%lld,\"raw_ms\":%.3f,\"tapeline_ms\":%.3f,\"ratio_median\":%.3f,\"wire_bytes_per_rank\":%lld,"
          "\"ring_bytes_per_rank\":%lld}\n",
          T, row.codec.c_str(), row.algorithm.c_str(), (long long)bytes, 1e3 * best_raw / k, 1e3 * best_tl / k,
          tl::bench::median(times.ratios), (long long)wire, (long long)(2 * (T - 1) * bytes / T));
      std::fflush(stdout);
    }
  }
  transport->barrier("end");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  mallopt(M_MMAP_THRESHOLD, 256 << 20);  // as `tapeline` (Note [allocator] in tasks/runner/cli/tapeline.cpp)
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  const Args args = parse(argc, argv);
  return tl::bench::run_as_ranks("tensor_parallel", args.ranks, argc, argv, [&] { return run_rank(args); });
}
