// bench_pipeline's command line, its rank workers' arguments and its link cases.
#include "bench/pipeline/options.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace tl::bench_pipeline {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string part; std::getline(ss, part, sep);)
    if (!part.empty()) out.push_back(part);
  return out;
}

std::string join(const std::vector<std::string>& v, char sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? std::string(1, sep) : "") + v[i];
  return s;
}

}  // namespace

Options parse(int argc, char** argv) {
  Options o;
  int positional = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      TORCH_CHECK(i + 1 < argc, a, " needs a value");
      return argv[++i];
    };
    if (a == "--rank-worker") {
      o.worker = true;
    } else if (a == "--models") {
      o.models = split(value(), ',');
    } else if (a == "--mp") {
      const std::string v = value();
      o.mp.clear();
      if (v != "none" && v != "0")
        for (const std::string& n : split(v, ',')) {
          o.mp.push_back(std::atoi(n.c_str()));
          TORCH_CHECK(o.mp.back() == 2 || o.mp.back() == 4, "--mp ", v,
                      ": the models have 4-stage and 2-stage splits, so 4 or 2 processes (or none)");
        }
    } else if (a == "--mp-rounds") {
      o.mp_rounds = std::max(1, std::atoi(value().c_str()));
    } else if (a == "--mp-only") {
      o.mp_only = true;
    } else if (a == "--no-links") {
      o.links = false;
    } else if (a == "--calibrate") {
      o.calibrate_only = true;
    } else if (a == "--overhead") {
      o.overhead_only = true;
    } else if (a == "--device") {
      o.device = value();
      TORCH_CHECK(o.device == "cpu" || o.device == "cuda" || o.device == "meta", "--device ", o.device,
                  ": accepted: cpu, cuda, meta (shapes only: the modelled seconds without a measurement)");
    } else if (a == "--batch-scale") {
      o.batch_scale = std::atoi(value().c_str());
      TORCH_CHECK(o.batch_scale >= 1, "--batch-scale ", o.batch_scale, ": a whole number >= 1");
    } else if (a == "--dtype") {
      o.dtype = value();
      TORCH_CHECK(o.dtype == "fp32" || o.dtype == "bf16", "--dtype ", o.dtype, ": accepted: fp32, bf16");
    } else if (a == "--refs") {
      for (const std::string& kv : split(value(), ';')) {
        const size_t eq = kv.find('=');
        if (eq != std::string::npos) o.refs[kv.substr(0, eq)] = std::atof(kv.substr(eq + 1).c_str());
      }
    } else if (a.rfind("--", 0) == 0) {
      TORCH_CHECK(false, "unknown option '", a,
                  "'; usage: bench_pipeline [rounds] [micro-batches] [--models resnet8,gpt2,resnet18] [--mp 4,2|none] "
                  "[--mp-rounds R] [--no-links] [--calibrate [--device cpu|cuda|meta] [--dtype fp32|bf16] [--batch-scale K]] [--mp-only] [--overhead]");
    } else if (positional == 0) {
      o.rounds = std::max(1, std::atoi(a.c_str())), ++positional;
    } else if (positional == 1) {
      o.m = std::max(1, std::atoi(a.c_str())), ++positional;
    }
  }
  if (o.mp_rounds < 0) o.mp_rounds = o.rounds;
  TORCH_CHECK(o.calibrate_only || (o.device == "cpu" && o.dtype == "fp32" && o.batch_scale == 1),
              "--device, --dtype and --batch-scale apply to --calibrate only (the pipeline cases run on the CPU "
              "in float32)");
  return o;
}

/// The arguments of the rank workers of an N-process launch.
std::vector<std::string> worker_args(const Options& o, int n, const std::map<std::string, double>& refs) {
  std::string r;
  char buf[64];
  for (const auto& [k, v] : refs) {
    std::snprintf(buf, sizeof(buf), "%.9g", v);
    r += (r.empty() ? "" : ";") + k + "=" + buf;
  }
  std::vector<std::string> args = {"--rank-worker", std::to_string(o.mp_rounds), std::to_string(o.m), "--models",
                                   join(o.models, ','), "--mp", std::to_string(n), "--refs", r};
  if (!o.links) args.push_back("--no-links");
  return args;
}

const std::vector<LinkCase>& link_cases() {
  static const std::vector<LinkCase> cases = {{"uncompressed", "identity", "identity"},
                                              {"topk(0.1) fwd+bwd", "topk(0.1)", "topk(0.1)"},
                                              {"quant(4) fwd, quant(8) bwd", "quant(bits=4, scale=channel)", "quant(8)"}};
  return cases;
}
LinkSpec bench_link() {
  LinkSpec l;
  l.bandwidth_mbps = 80;
  return l;
}

std::string ref_key(const std::string& model, int stages, const std::string& what, const std::string& field) {
  return model + "/" + std::to_string(stages) + "/" + what + "/" + field;
}

}  // namespace tl::bench_pipeline
