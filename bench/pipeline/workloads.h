#pragma once
// bench_pipeline's workloads: the models it steps, their cuts, batches and losses, and a
// workload's Pipeline (bench/bench_pipeline.cpp describes the benchmark).
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "parallel/pipeline.h"
#include "tasks/task.h"

namespace tl::bench_pipeline {

/// A model, its batch and its loss.
struct Workload {
  std::string name;
  std::function<ModulePtr()> make;                  // same weights every call
  std::map<int, std::vector<std::string>> cuts;     // by number of stages
  Batch batch;
  LossFn loss;
};

/// "resnet8", "gpt2" (or "gpt2_4x256"), "resnet18", "gpt2_12x768" (GPT-2 small, for the GPU
/// calibration) or "gpt2_12x768_v50304" (its vocabulary padded); same weights and batch every call.
Workload make_workload(const std::string& name);

/// The workload's model split into `stages` at its cuts, every boundary (fwd, bwd), no error
/// statistics.
std::shared_ptr<Pipeline> build(const Workload& w, int stages, const std::string& fwd, const std::string& bwd);

}  // namespace tl::bench_pipeline
