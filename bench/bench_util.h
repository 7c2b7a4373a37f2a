#pragma once
// Small helpers the benchmarks share.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "parallel/ranks/c10d_compat.h"
#include "parallel/step.h"
#include "parallel/ranks/launch.h"
#include "parallel/ranks/rendezvous.h"
#include "parallel/ranks/transport.h"

namespace tl::bench {

/// Seconds on the steady clock.
inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

using tl::seconds_since;  // parallel/step.h

/// Median of the values (the mean of the middle two for an even count); 0 for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// A number for a JSON line; null for NaN (not known, e.g. no reference to compare with).
inline std::string json_number(double x, const char* fmt = "%.5f") {
  if (std::isnan(x)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, x);
  return buf;
}

/// A JSON array of numbers, each printed with `fmt`.
inline std::string json_array(const std::vector<double>& v, const char* fmt = "%.5f") {
  std::string s = "[";
  char buf[64];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof(buf), fmt, v[i]);
    if (i) s += ',';
    s += buf;
  }
  return s + "]";
}

/// The 1-minute load average (other processes on the machine: the numbers are only as quiet as it).
inline double loadavg_1m() {
  double l = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = -1;
    std::fclose(f);
  }
  return l;
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

/// The options every benchmark that runs as ranks of itself takes: --ranks N (at least 2),
/// --repeats R (at least 1) and --timeout S.
struct RankArgs {
  int ranks = 2;
  int repeats = 5;
  double timeout_s = 60;
};

/// Parses --ranks, --repeats, the benchmark's `own` options, then --timeout; out-of-range ranks or
/// repeats exit with status 2, naming `bench`.
inline RankArgs parse_rank_options(const char* bench, int argc, char** argv, std::vector<Option> own = {}) {
  RankArgs a;
  own.insert(own.begin(), {{"--ranks", &a.ranks}, {"--repeats", &a.repeats}});
  own.push_back({"--timeout", nullptr, &a.timeout_s});
  parse_options(bench, argc, argv, own);
  if (a.ranks < 2 || a.repeats < 1) {
    std::fprintf(stderr, "%s: --ranks must be >= 2 and --repeats >= 1\n", bench);
    std::exit(2);
  }
  return a;
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

/// What a rank of such a benchmark times with: a Transport with the runtime's communication thread,
/// the raw Gloo group it is compared against (raw_gloo), and the group of all ranks.
struct RankLinks {
  std::unique_ptr<ranks::Transport> transport;
  ranks::compat::BackendPtr raw;
  std::vector<int> group;  // 0, 1, ..., world_size - 1
};

inline RankLinks connect_rank(const ranks::DistEnv& env, double timeout_s) {
  ranks::TransportOptions o;
  o.timeout_s = timeout_s;
  o.comm_thread = true;  // the runtime's setting: sends go out while the rank goes on
  RankLinks links;
  links.transport = ranks::Transport::connect(env, o);
  links.raw = raw_gloo(env, timeout_s);
  for (int r = 0; r < env.world_size; ++r) links.group.push_back(r);
  return links;
}

/// Raw against tapeline times of a benchmark that runs as ranks: `repeats` rounds, each a barrier
/// of all ranks and raw(), then prepare() untimed, a barrier and tapeline(); each callable runs the
/// side's calls of one round.
struct PairedTimes {
  double best_raw = 1e30, best_tapeline = 1e30;  // seconds, the fastest round of each side
  std::vector<double> ratios;                    // raw / tapeline per round (>= 1: tapeline faster)
};

template <class Raw, class Prepare, class Tapeline>
PairedTimes time_paired(ranks::Transport& transport, int repeats, Raw&& raw, Prepare&& prepare, Tapeline&& tapeline) {
  PairedTimes p;
  for (int rep = 0; rep < repeats; ++rep) {
    transport.barrier("raw start");
    double t0 = now_s();
    raw();
    const double raw_s = now_s() - t0;
    transport.barrier("tapeline start");
    prepare();
    t0 = now_s();
    tapeline();
    const double tl_s = now_s() - t0;
    p.best_raw = std::min(p.best_raw, raw_s), p.best_tapeline = std::min(p.best_tapeline, tl_s);
    p.ratios.push_back(raw_s / tl_s);
  }
  return p;
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
