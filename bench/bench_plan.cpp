// Planning time (tasks/runner/plan.h, `tapeline plan`). Rows, as JSON lines:
//   - "small": gpt2-mini (4 x 256), 6 stages, 8 micro-batches of 4 x 128 tokens, h100 model: the plan
//     (meta tensors) against one real training step of the same config on this CPU through the
//     same executor and device model (the reference: what the plan replaces), and both steps'
//     modelled times (equal: the plan is that timeline);
//   - "protocol_nanogpt": configs/plan/protocol_nanogpt_dense.ini (8 x 1024, vocab 50304, 8 stages,
//     64 micro-batches of 8 x 1024 tokens): planning time and the planned step. No real step is
//     timed for it (one would take minutes of this CPU and gigabytes); its reference is the
//     resident-memory growth of the process, which stays flat where a real step would hold the
//     weights (600 MB) and the activations (tens of GB);
//   - "protocol_nanogpt_tp4": the same config with each stage split over 4 tensor ranks
//     (parallel.tp = 4, tp.forward and tp.backward quant(bits=8); Note [tensor parallelism in a
//     plan]), its 2,048 all-reduces a step (8 blocks x 2 sublayers x 2 directions x 64
//     micro-batches) counted and charged: planning time against the
//     previous row's (the reference), and the planned step.
// Usage: bench_plan [--rounds N] [--config INI]   (default 3 rounds, medians; the INI of the second
// row, default configs/plan/protocol_nanogpt_dense.ini from the repository root)
#include <ATen/Parallel.h>

#include <cstring>
#include <iostream>

#include "bench/bench_util.h"
#include "parallel/executor.h"
#include "tasks/runner/plan.h"

using namespace tl;

namespace {

Config small() {
  return Config::load("", {{"task.name", "lm"},
                           {"model.arch", "gpt2-mini"},
                           {"data.seq_len", "128"},
                           {"train.batch_size", "32"},
                           {"train.micro_batches", "8"},
                           {"timeline.device", "h100"},
                           {"boundary.forward", "bf16"},
                           {"boundary.backward", "bf16"},
                           {"boundary.bandwidth_mbps", "200"},
                           {"boundary.latency_ms", "50"}});
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 3;
  std::string ini = "configs/plan/protocol_nanogpt_dense.ini";
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--config") && i + 1 < argc) {
      ini = argv[++i];
    } else {
      std::cerr << "bench_plan: unknown argument '" << argv[i] << "'; accepted: --rounds N, --config INI\n";
      return 2;
    }
  }
  at::set_num_threads(1);
  {
    const Config c = small();
    std::vector<double> plan_s, real_s;
    double planned = 0, modelled = 0;
    for (int r = 0; r < rounds; ++r) {
      const Plan p = plan_step(c);
      plan_s.push_back(p.planning_s);
      planned = p.step_s;
      const double t0 = bench::now_s();
      modelled = real_step(c).step_s;
      real_s.push_back(bench::now_s() - t0);
    }
    const double ps = bench::median(plan_s), rs = bench::median(real_s);
    std::cout << "{\"bench\": \"plan\", \"row\": \"small\", \"plan_s\": " << bench::json_number(ps)
              << ", \"real_step_s\": " << bench::json_number(rs)
              << ", \"real_over_plan\": " << bench::json_number(rs / ps, "%.2f")
              << ", \"planned_step_s\": " << bench::json_number(planned, "%.6f")
              << ", \"real_modelled_step_s\": " << bench::json_number(modelled, "%.6f")
              << ", \"loadavg\": " << bench::json_number(bench::loadavg_1m(), "%.2f") << "}" << std::endl;
  }
  {
    Config c;
    try {
      c = Config::load(ini);
    } catch (const std::exception& e) {  // run from the repository root, or give --config
      std::cerr << "bench_plan: " << e.what() << " (run from the repository root, or give --config INI)\n";
      return 2;
    }
    std::vector<double> plan_s;
    double planned = 0;
    const int64_t rss0 = peak_resident_bytes();
    for (int r = 0; r < rounds; ++r) {
      const Plan p = plan_step(c);
      plan_s.push_back(p.planning_s);
      planned = p.step_s;
    }
    const double dense_plan_s = bench::median(plan_s);
    std::cout << "{\"bench\": \"plan\", \"row\": \"protocol_nanogpt\", \"plan_s\": "
              << bench::json_number(bench::median(plan_s))
              << ", \"planned_step_s\": " << bench::json_number(planned, "%.3f")
              << ", \"measured_step_s\": 100.475, \"peak_rss_growth_mb\": "
              << bench::json_number((peak_resident_bytes() - rss0) / 1e6, "%.1f")
              << ", \"loadavg\": " << bench::json_number(bench::loadavg_1m(), "%.2f") << "}" << std::endl;
    const Config tp =
        Config::load(ini, {{"parallel.tp", "4"}, {"tp.forward", "quant(bits=8)"}, {"tp.backward", "quant(bits=8)"}});
    std::vector<double> tp_s;
    Plan last;
    for (int r = 0; r < rounds; ++r) {
      last = plan_step(tp);
      tp_s.push_back(last.planning_s);
    }
    int64_t all_reduces = 0;
    for (const PlanRank& pr : last.rank_plans) all_reduces += pr.tp_all_reduces;
    std::cout << "{\"bench\": \"plan\", \"row\": \"protocol_nanogpt_tp4\", \"plan_s\": "
              << bench::json_number(bench::median(tp_s))
              << ", \"over_tp1_plan\": " << bench::json_number(bench::median(tp_s) / dense_plan_s, "%.2f")
              << ", \"all_reduces\": " << all_reduces
              << ", \"planned_step_s\": " << bench::json_number(last.step_s, "%.3f")
              << ", \"loadavg\": " << bench::json_number(bench::loadavg_1m(), "%.2f") << "}" << std::endl;
  }
  return 0;
}
