#pragma once
// bench_pipeline's command line (bench/bench_pipeline.cpp), the arguments it passes to its rank
// workers, and the link cases that the in-process and the multi-process parts both run.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "parallel/link.h"
#include "parallel/pipeline.h"

namespace tl::bench_pipeline {

/// The benchmark's options (also passed to the rank workers).
struct Options {
  int rounds = 7;
  int64_t m = 8;
  std::vector<std::string> models = {"resnet8", "gpt2"};
  std::vector<int> mp = {4, 2};  // process counts of the multi-process part
  int mp_rounds = -1;            // -1: rounds
  bool links = true;
  bool calibrate_only = false;  // --calibrate: the device model's calibration lines only
  bool overhead_only = false;   // --overhead: the executor's per-step cost on a 1-layer model only
  std::string device = "cpu";   // --device: where the calibration runs (cpu, cuda, meta: modelled only)
  std::string dtype = "fp32";   // --dtype: the calibration's training dtype (fp32, bf16)
  int batch_scale = 1;          // --batch-scale K: the calibration's batches K times the workload's rows
  bool mp_only = false;         // --mp-only: the processes' rows only (bench/peer_pipeline.sh)
  int blas_threads = 0;         // OpenBLAS's threads as main set them (for the JSON lines; not an option)
  // Rank workers only.
  bool worker = false;
  std::map<std::string, double> refs;  // in-process results, "model/stages/schedule/field"
};

/// Parses bench_pipeline's command line; an unknown option is an error naming the usage.
Options parse(int argc, char** argv);

/// The arguments of the rank workers of an N-process launch (`refs`: the in-process results).
std::vector<std::string> worker_args(const Options& o, int n, const std::map<std::string, double>& refs);

/// The 80 Mbit/s cases (forward, backward codec).
struct LinkCase {
  std::string name, fwd, bwd;
  int epilogue = 0;  // epilogue-only backward: 0 off, 1 Optimus-CC's rule, 2 the critical path
};
const std::vector<LinkCase>& link_cases();
/// The emulated link: 80 Mbit/s, no latency.
LinkSpec bench_link();

/// The key of an in-process result in Options::refs: "model/stages/what/field".
std::string ref_key(const std::string& model, int stages, const std::string& what, const std::string& field);

}  // namespace tl::bench_pipeline
