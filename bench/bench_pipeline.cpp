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
// [ZB-H1] in parallel/schedule.cpp): timeline_s against 1F1B's of the same rounds (speedup), the
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
// Per schedule on the 4 stages ("plans"): lowering_s, the time make_schedule takes to lower the
// step's lists (what every step paid before the executors took them from cached_schedule: Note
// [plans are made once] in parallel/executor.h), cached_s, the cached lookup each step pays now,
// and both as a share of the step's wall time.
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
//
// The parts: bench/pipeline/options.h (the command line, the link cases), workloads.h (the
// models), in_process.h (part 1 and the calibration), worker.h (the ranks of part 2).
#include <dlfcn.h>
#include <malloc.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/pipeline/in_process.h"
#include "bench/pipeline/options.h"
#include "bench/pipeline/worker.h"
#include "bench/pipeline/workloads.h"
#include "autograd/threads.h"
#include "parallel/ranks/launch.h"
#include "parallel/ranks/transport.h"

using namespace tl;
using namespace tl::bench_pipeline;

int main(int argc, char** argv) {
  try {
    Options o = parse(argc, argv);
    // As the tapeline CLI does: keep freed memory in the heap (no page faults per step).
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    at::manual_seed(0);
    // One thread for everything, in process and in every rank: the in-process compute is the
    // reference of the ranks' (see the header).
    o.blas_threads = set_compute_threads(1);  // ATen's and OpenBLAS's (Note [OpenBLAS threads])
    if (o.worker) return rank_worker(o);
    if (o.overhead_only) {
      step_overhead();
      return 0;
    }

    std::map<std::string, double> refs;
    std::vector<Workload> ws;
    for (const std::string& name : o.models) ws.push_back(make_workload(name));
    for (const Workload& w : ws) {
      if (o.mp_only) break;  // the in-process references are left out (NaN in the rows)
      calibration(w, o);
      if (o.calibrate_only) continue;
      schedules(w, 4, o, refs);
      plans(w, o);
      if (o.links) links(w, o, refs);
      two_ranks(w, o, refs);
    }
    if (o.calibrate_only) return 0;
    for (int n : o.mp)
      if (n != 4 && !o.mp_only)
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
