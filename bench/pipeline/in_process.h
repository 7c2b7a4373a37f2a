#pragma once
// bench_pipeline's in-process part (LocalExecutor: the stages run one after another in this
// process): calibration, the schedules against pipeline theory, slow links, two ranks' schedules.
// Each prints its JSON lines (bench/bench_pipeline.cpp) and records the medians the rank workers
// compare with in `refs` (keys: ref_key).
#include <map>
#include <string>

#include "bench/pipeline/options.h"
#include "bench/pipeline/workloads.h"

namespace tl::bench_pipeline {

/// The device model's calibration on the 4-stage 1F1B step (one "device_calibration" line; the
/// machine's roofs first, once).
void calibration(const Workload& w, const Options& o);
/// The executor's per-step cost on a 1-layer model (one "step_overhead" line).
void step_overhead();
/// GPipe and 1F1B on `stages` stages, and with 4 stages interleaved 1F1B and ZB-H1.
void schedules(const Workload& w, int stages, const Options& o, std::map<std::string, double>& refs);
/// What a step's plan costs (one "plans" line per schedule, 4 stages): lowering the schedule, as
/// every step did before the executors took their lists from cached_schedule, against the cached
/// lookup and the step itself.
void plans(const Workload& w, const Options& o);
/// 1F1B and ZB-H1 on 80 Mbit/s links, 4 stages, under each link case.
void links(const Workload& w, const Options& o, std::map<std::string, double>& refs);
/// 1F1B, ZB-H1, interleaved 1F1B and ZB-V on the same two ranks.
void two_ranks(const Workload& w, const Options& o, std::map<std::string, double>& refs);

}  // namespace tl::bench_pipeline
