#pragma once
// bench_pipeline's rank workers: one process per stage (DistExecutor on a Gloo Transport), launched
// by bench_pipeline with --rank-worker (bench/bench_pipeline.cpp describes what they measure).
#include "bench/pipeline/options.h"

namespace tl::bench_pipeline {

/// One rank of an N-process run: every model's schedules, then (4 ranks) its slow-link cases;
/// rank 0 prints the JSON lines. Returns the exit status.
int rank_worker(const Options& o);

}  // namespace tl::bench_pipeline
