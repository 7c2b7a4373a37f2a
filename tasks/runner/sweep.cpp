#include "tasks/runner/sweep.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "tasks/config.h"
#include "tasks/runner/report.h"

extern char** environ;

namespace tl {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;
using Overrides = std::vector<std::pair<std::string, std::string>>;

// Keys the sweep sets per child (presentation and threads), left out of a run's settings.
bool sweep_sets(const std::string& key) { return key == "run.progress" || key == "run.threads"; }

Overrides with_seed(const Overrides& overrides, int64_t seed) {
  Overrides o = overrides;
  o.emplace_back("run.seed", std::to_string(seed));
  return o;
}

// sweep.json of a run: what it was started with, and the settings that resolves to.
json sweep_record(const SweepRun& run, const Overrides& overrides) {
  json settings = json::object();
  const Config config = Config::load(run.config, with_seed(overrides, run.seed));
  for (const auto& [k, v] : config.resolved())
    if (!sweep_sets(k)) settings[k] = v;
  json o = json::array();
  for (const auto& [k, v] : overrides) o.push_back(k + "=" + v);
  return {{"config", run.config}, {"seed", run.seed}, {"overrides", o}, {"settings", settings}};
}

// The first setting in which two sweep.json records differ, as "key: a vs b" (empty: none).
std::string first_difference(const json& was, const json& now) {
  const json& a = was.at("settings");
  const json& b = now.at("settings");
  for (auto it = b.begin(); it != b.end(); ++it) {
    auto other = a.find(it.key());
    if (other == a.end()) return it.key() + ": unset there, " + it->dump() + " now";
    if (*other != *it) return it.key() + ": " + other->dump() + " there, " + it->dump() + " now";
  }
  for (auto it = a.begin(); it != a.end(); ++it)
    if (!b.contains(it.key())) return it.key() + ": " + it->dump() + " there, unset now";
  return {};
}

std::string seconds(double s) {
  std::ostringstream o;
  if (s < 120)
    o << std::fixed << std::setprecision(1) << s << " s";
  else
    o << std::fixed << std::setprecision(1) << s / 60 << " min";
  return o.str();
}

std::string last_line_of(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  // Progress bars redraw with \r: the last redraw is the line.
  auto cr = last.find_last_of('\r', last.size() >= 2 ? last.size() - 2 : 0);
  if (cr != std::string::npos && cr + 1 < last.size()) last = last.substr(cr + 1);
  return last;
}

// Starts `argv` with stdout and stderr appended to `log_path`, stdin from /dev/null.
pid_t spawn(const std::vector<std::string>& argv, const std::string& log_path) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
  return pid;
}

}  // namespace

std::vector<int64_t> parse_seeds(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return std::invalid_argument("--seeds '" + text + "': " + why +
                                 "; accepted: integers >= 0 separated by commas, and ranges A-B (e.g. 1,2,3 or 1-3)");
  };
  auto number = [&](const std::string& s) -> int64_t {
    if (s.empty() || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }) || s.size() > 18)
      throw bad("'" + s + "' is not an integer >= 0");
    return std::stoll(s);
  };
  std::vector<int64_t> seeds;
  std::set<int64_t> seen;
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    const auto dash = item.find('-');
    const int64_t a = number(item.substr(0, dash)), b = dash == std::string::npos ? a : number(item.substr(dash + 1));
    if (b < a) throw bad("the range '" + item + "' is empty");
    if (b - a > 10000) throw bad("the range '" + item + "' has more than 10,000 seeds");
    for (int64_t s = a; s <= b; ++s) {
      if (!seen.insert(s).second) throw bad("seed " + std::to_string(s) + " is given twice");
      seeds.push_back(s);
    }
  }
  if (seeds.empty() || text.back() == ',') throw bad("no seed");
  return seeds;
}

std::vector<SweepRun> plan_sweep(const std::vector<std::string>& configs, const std::vector<int64_t>& seeds,
                                 const std::string& out_dir, const Overrides& overrides) {
  if (configs.empty()) throw std::invalid_argument("no config given (--configs A.ini B.ini ...)");
  if (seeds.empty()) throw std::invalid_argument("no seed given (--seeds 1,2,3)");
  if (out_dir.empty()) throw std::invalid_argument("--out DIR is required");
  std::map<std::string, std::string> by_name;
  std::vector<SweepRun> runs;
  for (const auto& c : configs) {
    if (!fs::is_regular_file(c))
      throw std::invalid_argument("--configs: " + c + " is not a file (expected an INI file)");
    const std::string stem = fs::path(c).stem().string();
    auto [it, fresh] = by_name.emplace(stem, c);
    if (!fresh)
      throw std::invalid_argument("--configs: " + it->second + " and " + c + " would share the run directories " +
                                  stem + ".seedN; give the files different names");
    for (int64_t seed : seeds) {
      Config::load(c, with_seed(overrides, seed));  // every error before anything runs
      SweepRun r;
      r.config = c, r.seed = seed, r.name = stem + ".seed" + std::to_string(seed);
      r.dir = (fs::path(out_dir) / r.name).string();
      runs.push_back(r);
    }
  }
  return runs;
}

RunState run_state(const std::string& dir) {
  if (!fs::exists(dir)) return RunState::kNew;
  std::optional<RunSummary> s;
  try {
    s = read_summary_json((fs::path(dir) / "summary.json").string());
  } catch (const std::exception&) {
    // A torn summary cannot be: it is written by rename. Treated as unfinished.
  }
  if (s && s->epochs > 0 && s->last.epoch >= s->epochs) return RunState::kFinished;
  return fs::exists(fs::path(dir) / "checkpoint.safetensors") ? RunState::kResume : RunState::kRestart;
}

int default_jobs() { return std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / 2); }

int run_sweep(const SweepOptions& options, std::ostream& log) {
  using clock = std::chrono::steady_clock;
  const int jobs = options.jobs > 0 ? options.jobs : default_jobs();
  const auto runs = plan_sweep(options.configs, options.seeds, options.out_dir, options.overrides);
  std::string exe = options.executable;
  if (exe.empty()) {
    std::error_code ec;
    exe = fs::read_symlink("/proc/self/exe", ec).string();
    if (ec) throw std::runtime_error("cannot find the tapeline executable (/proc/self/exe: " + ec.message() + ")");
  }

  // Every directory is checked before anything runs (Note [a sweep resumes]).
  std::vector<const SweepRun*> todo;
  std::vector<RunState> states;
  int finished = 0;
  for (const auto& r : runs) {
    const json now = sweep_record(r, options.overrides);
    const RunState state = run_state(r.dir);
    if (state != RunState::kNew) {
      const fs::path record = fs::path(r.dir) / "sweep.json";
      if (!fs::exists(record))
        throw std::invalid_argument(r.dir +
                                    " exists but no tapeline sweep started it (no sweep.json); move it away "
                                    "or choose another --out");
      json was;
      try {
        std::ifstream in(record);
        was = json::parse(in);
        const std::string diff = first_difference(was, now);
        if (!diff.empty())
          throw std::invalid_argument(r.dir + " holds a run of other settings (" + diff +
                                      "); move it away or choose another --out");
      } catch (const json::exception& e) {
        throw std::invalid_argument(record.string() + ": not a sweep record (" + e.what() + ")");
      }
    }
    if (state == RunState::kFinished) {
      ++finished;
      continue;
    }
    todo.push_back(&r);
    states.push_back(state);
  }
  const bool user_threads = std::any_of(options.overrides.begin(), options.overrides.end(),
                                        [](const auto& kv) { return kv.first == "run.threads"; });
  const int threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / jobs);
  auto count = [](size_t n, const char* what) { return std::to_string(n) + " " + what + (n == 1 ? "" : "s"); };
  log << "sweep: " << count(runs.size(), "run") << " (" << count(options.configs.size(), "config") << " x "
      << count(options.seeds.size(), "seed") << ") in " << options.out_dir << ": " << finished << " finished, "
      << todo.size() << " to run, " << jobs << " at a time"
      << (user_threads ? "" : ", " + std::to_string(threads) + (threads == 1 ? " thread" : " threads") + " each")
      << "\n"
      << std::flush;

  struct Active {
    size_t index;
    clock::time_point start;
    std::string shown;  // the log line last printed for it
  };
  std::map<pid_t, Active> active;
  size_t next = 0;
  int failed = 0, done = 0, stopped = 0;
  const auto sweep_start = clock::now();
  auto last_report = sweep_start;
  auto start = [&](size_t i) {
    const SweepRun& r = *todo[i];
    fs::create_directories(r.dir);
    write_file_atomic((fs::path(r.dir) / "sweep.json").string(), sweep_record(r, options.overrides).dump(1) + "\n");
    std::vector<std::string> argv = {exe, "train", "--config", r.config, "--out", r.dir};
    if (states[i] == RunState::kResume) argv.insert(argv.end(), {"--resume", r.dir});
    for (const auto& [k, v] : with_seed(options.overrides, r.seed)) argv.push_back("--" + k + "=" + v);
    argv.push_back("--run.progress=plain");
    if (options.stop_after_epochs > 0)
      argv.insert(argv.end(), {"--stop-after", std::to_string(options.stop_after_epochs)});
    if (!options.plot) argv.push_back("--no-plot");
    if (!user_threads) argv.push_back("--run.threads=" + std::to_string(threads));
    const std::string log_path = (fs::path(r.dir) / "train.log").string();
    const pid_t pid = spawn(argv, log_path);
    active[pid] = {i, clock::now(), ""};
    log << "[" << i + 1 << "/" << todo.size() << "] start " << r.name
        << (states[i] == RunState::kResume    ? " (resuming from its checkpoint)"
            : states[i] == RunState::kRestart ? " (again from the start: no checkpoint)"
                                              : "")
        << "; log " << log_path << "\n"
        << std::flush;
  };
  while (next < todo.size() || !active.empty()) {
    while (next < todo.size() && static_cast<int>(active.size()) < jobs) start(next++);
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid == 0) {  // all still running: every minute, each run's latest log line (when it changed)
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (clock::now() - last_report < std::chrono::seconds(options.report_every_s)) continue;
      last_report = clock::now();
      for (auto& [p, a] : active) {
        const std::string line = last_line_of((fs::path(todo[a.index]->dir) / "train.log").string());
        if (line.empty() || line == a.shown) continue;
        a.shown = line;
        log << "[" << a.index + 1 << "/" << todo.size() << "] " << todo[a.index]->name << ": " << line << "\n"
            << std::flush;
      }
      continue;
    }
    if (pid < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("sweep: waitpid: ") + std::strerror(errno));
    }
    auto it = active.find(pid);
    if (it == active.end()) continue;  // not one of ours
    const SweepRun& r = *todo[it->second.index];
    const double took = std::chrono::duration<double>(clock::now() - it->second.start).count();
    const size_t index = it->second.index;
    active.erase(it);
    ++done;
    const bool exited = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    const RunState after = run_state(r.dir);
    std::ostringstream line;
    line << "[" << index + 1 << "/" << todo.size() << "] ";
    if (exited && after == RunState::kResume && options.stop_after_epochs > 0) {
      auto s = read_summary_json((fs::path(r.dir) / "summary.json").string());
      ++stopped;
      line << "stopped " << r.name << " after epoch " << (s ? s->last.epoch : 0) << " of " << (s ? s->epochs : 0)
           << " in " << seconds(took) << " (--stop-after; the same command again continues it)";
    } else if (exited && after == RunState::kFinished) {
      auto s = read_summary_json((fs::path(r.dir) / "summary.json").string());
      line << "done " << r.name << " in " << seconds(took) << ": test " << s->metric << " "
           << format_metric(s->metric, s->last.test_metric_compressed) << " (compression on), "
           << format_metric(s->metric, s->last.test_metric_uncompressed) << " (off)";
    } else {
      ++failed;
      line << "FAILED " << r.name << " after " << seconds(took) << " ("
           << (WIFEXITED(status)     ? "exit status " + std::to_string(WEXITSTATUS(status))
               : WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                     : "?")
           << "): " << last_line_of((fs::path(r.dir) / "train.log").string());
    }
    const double elapsed = std::chrono::duration<double>(clock::now() - sweep_start).count();
    line << "; " << done << " of " << todo.size() << " ended, " << seconds(elapsed) << " so far";
    log << line.str() << "\n" << std::flush;
  }
  log << "sweep: " << runs.size() - failed - stopped << " of " << runs.size() << " runs finished"
      << (stopped ? ", " + std::to_string(stopped) + " stopped" : "")
      << (failed ? ", " + std::to_string(failed) + " failed (run the same command again to resume them)" : "")
      << "; tapeline compare " << (fs::path(options.out_dir) / "*").string() << " aggregates the seeds\n"
      << std::flush;
  return failed;
}

}  // namespace tl
