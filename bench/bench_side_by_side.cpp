// bench_side_by_side: two `tapeline train` runs at once on one machine, each against one run alone
// (Note [waiting threads], autograd/passive_wait.cpp). The job is a short run of a config (by
// default configs/default.ini, 1 epoch of 5,120 Fashion-MNIST images, default threads); its time is
// the process's wall time, start to exit. Per waiting policy:
//   - "passive": the program as it ships (its OpenMP workers sleep while they wait);
//   - "spinning": libgomp's own default (GOMP_SPINCOUNT=300000, what tapeline did before).
// Rounds alternate the policies and, within a policy, the run alone and the pair, so load from
// other processes hits all of them alike; each number is the median over the rounds.
// One JSON line per policy:
//   {"bench":"side_by_side","policy":..,"alone_s":..,"pair_s":[a,b],"ratio":..,"ratio_worst":..,
//    "loadavg":..}   ratio = alone_s / mean(pair_s): the share of a lone run's throughput each of
//                    two runs gets (0.5 is a fair split of the cores); ratio_worst uses the slower
// and a last line {"bench":"side_by_side_alone","passive_vs_spinning":..}: a lone run's throughput
// with passive waiting over the one with spinning (what passive waiting costs a run alone).
// Usage: bench_side_by_side [--rounds N] [--config INI] [--tapeline PATH] [--keep DIR]
//                           [-- --section.key=value ...]   (overrides for both runs)
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/bench_util.h"

extern char** environ;

namespace {
namespace fs = std::filesystem;
using tl::bench::json_array;
using tl::bench::json_number;
using tl::bench::median;
using tl::bench::now_s;

struct Options {
  int rounds = 3;
  std::string config = TL_SOURCE_DIR "/configs/default.ini";
  std::string tapeline = TL_TAPELINE;
  std::string keep;  // run directories go here (default: a temporary folder, removed)
  std::vector<std::string> overrides = {"--data.train_limit=5120", "--data.test_limit=1000", "--train.epochs=1"};
};

// The environment of a child: ours without OpenMP waiting settings, plus `extra` ("" for none).
std::vector<std::string> child_environment(const std::string& extra) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string v(*e);
    if (v.rfind("OMP_WAIT_POLICY=", 0) == 0 || v.rfind("GOMP_SPINCOUNT=", 0) == 0) continue;
    env.push_back(v);
  }
  if (!extra.empty()) env.push_back(extra);
  return env;
}

// Starts `tapeline train` into `out`; returns its pid.
pid_t start_run(const Options& o, const std::string& out, const std::vector<std::string>& env) {
  std::vector<std::string> args = {o.tapeline, "train", "--config", o.config, "--out", out, "--quiet", "--no-plot"};
  args.insert(args.end(), o.overrides.begin(), o.overrides.end());
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, o.tapeline.c_str(), &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("cannot start " + o.tapeline + ": " + std::strerror(rc));
  return pid;
}

// Wall seconds of each of `n` runs started together.
std::vector<double> run_together(const Options& o, int n, const std::vector<std::string>& env, const fs::path& dir,
                                 const std::string& tag) {
  std::vector<pid_t> pids;
  std::vector<double> t(n, 0.0);
  const double t0 = now_s();
  for (int i = 0; i < n; ++i) pids.push_back(start_run(o, (dir / (tag + "_" + std::to_string(i))).string(), env));
  std::vector<bool> done(n, false);
  for (int left = n; left > 0;) {  // times each run to its own exit
    int status = 0;
    const pid_t p = waitpid(-1, &status, 0);
    if (p < 0) throw std::runtime_error("waitpid failed: " + std::string(std::strerror(errno)));
    for (int i = 0; i < n; ++i)
      if (pids[i] == p && !done[i]) {
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
          throw std::runtime_error(tag + " run " + std::to_string(i) + " failed (status " + std::to_string(status) +
                                   "); its errors are above");
        t[i] = now_s() - t0, done[i] = true, --left;
      }
  }
  return t;
}

Options parse(int argc, char** argv) {
  Options o;
  bool defaults = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--rounds") {
      o.rounds = std::stoi(value());
      if (o.rounds < 1) throw std::invalid_argument("--rounds must be >= 1");
    } else if (a == "--config") {
      o.config = value();
    } else if (a == "--tapeline") {
      o.tapeline = value();
    } else if (a == "--keep") {
      o.keep = value();
    } else if (a == "--") {
      if (defaults) o.overrides.clear(), defaults = false;
      for (++i; i < argc; ++i) o.overrides.push_back(argv[i]);
    } else {
      throw std::invalid_argument("unknown argument '" + a +
                                  "'; accepted: --rounds N, --config INI, --tapeline PATH, --keep DIR, -- OVERRIDES");
    }
  }
  if (!fs::exists(o.tapeline)) throw std::invalid_argument("--tapeline: " + o.tapeline + " does not exist (build it)");
  if (!fs::exists(o.config)) throw std::invalid_argument("--config: " + o.config + " does not exist");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    const fs::path dir = o.keep.empty() ? fs::temp_directory_path() / ("tl_side_by_side_" + std::to_string(getpid()))
                                        : fs::path(o.keep);
    fs::create_directories(dir);
    struct Policy {
      std::string name, env;
      std::vector<double> alone, pair_a, pair_b;
    };
    std::vector<Policy> policies = {{"passive", "", {}, {}, {}}, {"spinning", "GOMP_SPINCOUNT=300000", {}, {}, {}}};
    for (int r = 0; r < o.rounds; ++r) {
      for (size_t k = 0; k < policies.size(); ++k) {
        Policy& p = policies[(k + r) % policies.size()];  // alternate which policy goes first
        const auto env = child_environment(p.env);
        const std::string tag = p.name + "_r" + std::to_string(r);
        p.alone.push_back(run_together(o, 1, env, dir, tag + "_alone")[0]);
        const auto two = run_together(o, 2, env, dir, tag + "_pair");
        p.pair_a.push_back(two[0]), p.pair_b.push_back(two[1]);
        std::fprintf(stderr, "round %d/%d %s: alone %.1f s, pair %.1f s and %.1f s\n", r + 1, o.rounds,
                     p.name.c_str(), p.alone.back(), two[0], two[1]);
      }
    }
    double alone_passive = 0, alone_spinning = 0;
    for (const Policy& p : policies) {
      const double alone = median(p.alone), a = median(p.pair_a), b = median(p.pair_b);
      std::printf("{\"bench\":\"side_by_side\",\"policy\":\"%s\",\"alone_s\":%s,\"pair_s\":%s,\"ratio\":%s,"
                  "\"ratio_worst\":%s,\"rounds\":%d,\"loadavg\":%s}\n",
                  p.name.c_str(), json_number(alone, "%.2f").c_str(), json_array({a, b}, "%.2f").c_str(),
                  json_number(alone / (0.5 * (a + b)), "%.3f").c_str(),
                  json_number(alone / std::max(a, b), "%.3f").c_str(), o.rounds,
                  json_number(tl::bench::loadavg_1m(), "%.2f").c_str());
      (p.name == "passive" ? alone_passive : alone_spinning) = alone;
    }
    std::printf("{\"bench\":\"side_by_side_alone\",\"passive_vs_spinning\":%s}\n",
                json_number(alone_spinning / alone_passive, "%.3f").c_str());
    if (o.keep.empty()) fs::remove_all(dir);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_side_by_side: %s\n", e.what());
    return 1;
  }
}
