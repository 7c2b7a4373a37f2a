#pragma once
// Small helpers the benchmarks share.
#include <chrono>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "parallel/ranks/c10d_compat.h"
#include "parallel/ranks/launch.h"
#include "parallel/ranks/rendezvous.h"
#include "parallel/ranks/transport.h"

namespace tl::bench {

/// Median of the values (the mean of the middle two for an even count); 0 for none.
/// Seconds on the steady clock.
inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// A command-line option "--name value" of a benchmark, stored in an int or a double.
struct Option {
  std::string name;
  int* as_int = nullptr;
  double* as_double = nullptr;
};

/// Parses "--name value" pairs into `options`; an unknown option or a missing value exits with
/// status 2, naming `bench` and the known options.
inline void parse_options(const char* bench, int argc, char** argv, const std::vector<Option>& options) {
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    auto it = std::find_if(options.begin(), options.end(), [&](const Option& o) { return o.name == k; });
    if (it == options.end() || i + 1 >= argc) {
      std::string known;
      for (const auto& o : options) known += (known.empty() ? "" : ", ") + o.name;
      std::fprintf(stderr, "%s: %s '%s'; known: %s (each followed by a value)\n", bench,
                   it == options.end() ? "unknown option" : "no value for", k.c_str(), known.c_str());
      std::exit(2);
    }
    if (it->as_int) *it->as_int = std::atoi(argv[i + 1]);
    if (it->as_double) *it->as_double = std::atof(argv[i + 1]);
  }
}

/// LaunchOptions::on_line of a benchmark that launches ranks of itself: rank 0's stdout (its JSON
/// lines) as is, anything else prefixed with the rank, on stderr.
inline void print_rank_line(int rank, bool is_stderr, const std::string& line) {
  if (rank == 0 && !is_stderr)
    std::printf("%s\n", line.c_str());
  else
    std::fprintf(stderr, "[rank %d] %s\n", rank, line.c_str());
  std::fflush(stdout);
}

/// A raw ProcessGroupGloo over the world of `env`, on rank 0's store (which a Transport connected
/// first hosts) under a key prefix of its own: the reference the benchmarks time against.
inline ranks::compat::BackendPtr raw_gloo(const ranks::DistEnv& env, double timeout_s) {
  ranks::DistEnv raw = env;
  raw.restart_count = 1001;  // its own key prefix
  raw.agent_store = true;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  return ranks::compat::make_gloo(
      ranks::compat::make_prefix_store(raw.store_prefix(), ranks::compat::make_tcp_store(env.master_addr, env.master_port,
                                                                                       false, env.world_size, timeout)),
      env.rank, env.world_size, timeout, env.master_addr);
}

/// main() of a benchmark that runs as `nproc` ranks of itself over Gloo: under a launcher this
/// process is one rank (`rank_main`); otherwise it starts the ranks (parallel/ranks/launch.h), or
/// prints a skip line for `bench` where the build has no Gloo. Errors exit non-zero, naming `bench`.
template <class RankMain>
int run_as_ranks(const char* bench, int nproc, int argc, char** argv, RankMain&& rank_main) {
  try {
    if (ranks::DistEnv::launched()) return rank_main();
    if (!ranks::Transport::available("gloo")) {
      std::printf("{\"bench\":\"%s\",\"skipped\":\"built without c10d Gloo (libgloo-dev)\"}\n", bench);
      return 0;
    }
    ranks::LaunchOptions lo;
    lo.nproc = nproc;
    lo.args.assign(argv + 1, argv + argc);
    lo.on_line = print_rank_line;
    const ranks::LaunchResult r = ranks::launch_local(lo);
    if (!r.ok()) std::fprintf(stderr, "%s: %s\n", bench, r.message.c_str());
    return r.exit_code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", bench, e.what());
    return 1;
  }
}

}  // namespace tl::bench
