#include "tasks/runner/compare.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "tasks/config.h"
#include "tasks/runner/trainer.h"

extern char** environ;

namespace tl {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

// ---- reading a run directory ---------------------------------------------------------------------

// The first of `names` that `j` holds as a number.
std::optional<double> number_of(const json& j, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    auto it = j.find(n);
    if (it != j.end() && it->is_number()) return it->get<double>();
  }
  return std::nullopt;
}

std::string string_of(const json& j, const char* name, const std::string& fallback = "") {
  auto it = j.find(name);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> out;
  std::string cell;
  std::istringstream in(line);
  while (std::getline(in, cell, ',')) {
    if (!cell.empty() && cell.back() == '\r') cell.pop_back();
    out.push_back(cell);
  }
  if (!line.empty() && line.back() == ',') out.emplace_back();
  return out;
}

// The rows of metrics.csv as column name -> value (numbers only; empty cells left out); no rows
// without the file.
std::vector<std::map<std::string, double>> csv_rows(const fs::path& path) {
  std::vector<std::map<std::string, double>> rows;
  std::ifstream in(path);
  if (!in) return rows;
  std::string header_line, line;
  if (!std::getline(in, header_line)) return rows;
  const auto header = split_csv_line(header_line);
  for (int64_t n = 2; std::getline(in, line); ++n) {
    if (line.empty() || line == "\r") continue;
    const auto cells = split_csv_line(line);
    if (header.size() != cells.size())
      throw std::runtime_error(path.string() + ": row " + std::to_string(n) + " has " + std::to_string(cells.size()) +
                               " cells but the header names " + std::to_string(header.size()) + " columns");
    std::map<std::string, double> row;
    for (size_t i = 0; i < header.size(); ++i) {
      if (cells[i].empty()) continue;
      char* end = nullptr;
      double v = std::strtod(cells[i].c_str(), &end);
      if (end && *end == '\0') row[header[i]] = v;
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

std::optional<double> csv_value(const std::map<std::string, double>& row, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    auto it = row.find(n);
    if (it != row.end()) return it->second;
  }
  return std::nullopt;
}

// ---- formatting -----------------------------------------------------------------------------------
std::string fixed(double v, int digits) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << v;
  return s.str();
}

std::string seconds_text(double s) {
  if (s < 100) return fixed(s, 1) + " s";
  if (s < 3600) return fixed(s, 0) + " s";
  return fixed(s / 3600.0, 2) + " h";
}

std::string metric_text(const std::string& metric, std::optional<double> v, bool name_it) {
  if (!v) return "-";
  if (metric == "accuracy") return format_metric(metric, *v);
  // The training log's format, with one decimal from 100 on (perplexities early in training).
  const std::string text = std::fabs(*v) >= 100 ? fixed(*v, 1) : format_metric(metric, *v);
  return name_it ? metric + " " + text : text;
}

std::string table_text(const std::vector<std::vector<std::string>>& cells, size_t left_columns) {
  std::vector<size_t> width(cells[0].size(), 0);
  for (const auto& row : cells)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  std::ostringstream out;
  for (size_t r = 0; r < cells.size(); ++r) {
    for (size_t c = 0; c < cells[r].size(); ++c) {
      out << (c ? "  " : "");
      if (c < left_columns)
        out << std::left << std::setw(int(width[c])) << cells[r][c];
      else
        out << std::right << std::setw(int(width[c])) << cells[r][c];
    }
    out << "\n";
    if (r == 0) {
      size_t total = 0;
      for (size_t w : width) total += w + 2;
      out << std::string(total - 2, '-') << "\n";
    }
  }
  return out.str();
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
}

// ---- running the plot module ------------------------------------------------------------------------
struct ProcessResult {
  bool started = false;
  int status = -1;  // exit status; -1 when killed by a signal or not started
  std::string output;  // stdout and stderr together
};

// Runs argv[0] (searched on PATH) with stdout and stderr captured. posix_spawn rather than fork:
// the trainer has threads (ATen's pool, the loader), and only the spawned child runs after the split.
ProcessResult run_process(const std::vector<std::string>& argv) {
  ProcessResult r;
  int fds[2];
  if (::pipe(fds) != 0) return r;
  ::fcntl(fds[0], F_SETFD, FD_CLOEXEC);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[1]);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  int rc = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return r;
  }
  r.started = true;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n > 0) {
      r.output.append(buf, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) r.status = WEXITSTATUS(status);
  return r;
}

std::vector<std::string> python_candidates() {
  if (const char* p = std::getenv("TAPELINE_PYTHON"); p && *p) return {p};
  return {"python3", "/usr/bin/python3"};
}

std::string last_line(const std::string& text) {
  std::string t = text;
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
  auto pos = t.rfind('\n');
  return pos == std::string::npos ? t : t.substr(pos + 1);
}

// Runs the plot module with `args`; the module's exit 3 (no matplotlib) moves on to the next
// interpreter. Fills `result`.
void run_plot_module(const std::vector<std::string>& args, PlotResult& result) {
  const std::string module = plot_module_path();
  if (module.empty()) {
    result.missing_matplotlib = true;
    result.note = "plots skipped: the plot module python/tapeline_plots.py was not found (set TAPELINE_PLOTS to its path)";
    return;
  }
  std::vector<std::string> tried;
  for (const auto& py : python_candidates()) {
    std::vector<std::string> argv = {py, module};
    argv.insert(argv.end(), args.begin(), args.end());
    ProcessResult p = run_process(argv);
    if (!p.started || p.status == 127 || p.status == 3) {
      tried.push_back(py + (p.started && p.status == 3 ? " (no matplotlib)" : " (not found)"));
      continue;
    }
    if (p.status == 0) {
      result.written = true;
      std::istringstream lines(p.output);
      for (std::string l; std::getline(lines, l);)
        if (!l.empty()) result.files.push_back(l);
      return;
    }
    result.note = "plots failed (" + py + " " + module + ", exit status " + std::to_string(p.status) +
                  "): " + last_line(p.output);
    return;
  }
  result.missing_matplotlib = true;
  result.note = "plots skipped: no Python with matplotlib (tried " + join(tried, ", ") +
                "); on Debian: apt-get install python3-matplotlib, or set TAPELINE_PYTHON";
}

}  // namespace

// ---- RunRecord -------------------------------------------------------------------------------------
RunRecord run_record(const RunSummary& s, const std::string& label, const std::string& dir) {
  RunRecord r;
  r.dir = dir.empty() ? label : dir;
  r.label = label;
  r.task = s.task, r.metric = s.metric, r.higher_is_better = s.higher_is_better;
  r.config = s.config, r.forward = s.forward, r.backward = s.backward, r.fingerprint = s.fingerprint;
  r.epochs = s.epochs, r.last_epoch = s.last.epoch;
  r.metric_on = s.last.test_metric_compressed, r.metric_off = s.last.test_metric_uncompressed;
  r.bytes_per_step = s.bytes_per_step(), r.uncompressed_bytes_per_step = s.uncompressed_bytes_per_step();
  r.wall_s = s.last.wall_s;
  // The same conventions as summary.json's (read_run_record): target 0 is none, -1 not reached.
  if (s.target > 0) r.target = s.target;
  if (r.target && s.time_to_target_s >= 0) r.time_to_target_s = s.time_to_target_s;
  if (r.time_to_target_s && s.steps_to_target > 0) r.steps_to_target = s.steps_to_target;
  if (s.time_per_step_s() > 0) r.time_per_step_s = s.time_per_step_s();
  return r;
}

RunRecord read_run_record(const std::string& dir) {
  fs::path d(dir);
  if (!fs::is_directory(d))
    throw std::runtime_error(dir + ": not a directory (expected a run directory written by tapeline train)");
  fs::path summary_path = d / "summary.json";
  if (!fs::exists(summary_path))
    throw std::runtime_error(dir + ": no summary.json (not a run directory, or its first epoch has not finished)");
  json j;
  {
    std::ifstream in(summary_path);
    try {
      j = json::parse(in);
    } catch (const json::exception& e) {
      throw std::runtime_error(summary_path.string() + ": not a tapeline summary.json (" + e.what() + ")");
    }
  }
  if (!j.is_object()) throw std::runtime_error(summary_path.string() + ": not a tapeline summary.json (not an object)");
  const auto rows = csv_rows(d / "metrics.csv");
  const std::map<std::string, double> row = rows.empty() ? std::map<std::string, double>() : rows.back();

  RunRecord r;
  r.dir = dir;
  fs::path norm = d.lexically_normal();
  if (norm.filename().empty()) norm = norm.parent_path();
  r.label = norm.filename().string();
  if (r.label.empty() || r.label == "." || r.label == "..") r.label = string_of(j, "name", dir);
  r.task = string_of(j, "task", "vision");
  r.metric = string_of(j, "metric", "accuracy");
  if (auto it = j.find("higher_is_better"); it != j.end() && it->is_boolean()) r.higher_is_better = it->get<bool>();
  r.config = string_of(j, "config");
  r.forward = string_of(j, "forward", "?");
  r.backward = string_of(j, "backward", "?");
  r.fingerprint = string_of(j, "fingerprint");
  r.epochs = static_cast<int64_t>(number_of(j, {"epochs"}).value_or(0));
  r.last_epoch =
      static_cast<int64_t>(number_of(j, {"epoch"}).value_or(csv_value(row, {"epoch"}).value_or(0)));

  auto pick = [&](std::initializer_list<const char*> names) -> std::optional<double> {
    if (auto v = number_of(j, names)) return v;
    return csv_value(row, names);
  };
  r.metric_on = pick({"test_metric_compressed", "test_acc_compressed"});
  r.metric_off = pick({"test_metric_uncompressed", "test_acc_uncompressed"});
  r.wall_s = pick({"wall_s"}).value_or(0.0);
  const double steps = pick({"steps"}).value_or(0.0);
  if (auto b = number_of(j, {"bytes_per_step"})) {
    r.bytes_per_step = *b;
  } else if (steps > 0) {
    r.bytes_per_step = (pick({"bytes_forward"}).value_or(0) + pick({"bytes_backward"}).value_or(0)) / steps;
  }
  if (auto b = number_of(j, {"uncompressed_bytes_per_step"})) {
    r.uncompressed_bytes_per_step = *b;
  } else if (steps > 0) {
    r.uncompressed_bytes_per_step = pick({"bytes_uncompressed"}).value_or(0) / steps;
  }
  // target 0: none set; time_to_target_s < 0: not reached (the runner's conventions).
  if (auto t = number_of(j, {"target"}); t && *t > 0) r.target = t;
  if (auto t = number_of(j, {"time_to_target_s"}); t && *t >= 0 && r.target) r.time_to_target_s = t;
  if (auto n = number_of(j, {"steps_to_target"}); n && *n > 0 && r.time_to_target_s)
    r.steps_to_target = static_cast<int64_t>(*n);
  const auto total = number_of(j, {"total_steps"});
  const auto time = pick({"train_time_s"});
  if (total && *total > 0 && time && *time > 0) r.time_per_step_s = *time / *total;
  r.timeline_device = string_of(j, "timeline_device", "measured");

  int64_t steps_so_far = 0;
  for (const auto& e : rows) {
    RunRecord::Epoch h;
    h.epoch = static_cast<int64_t>(csv_value(e, {"epoch"}).value_or(0));
    steps_so_far += static_cast<int64_t>(csv_value(e, {"steps"}).value_or(0));
    h.steps = steps_so_far;
    h.metric_on = csv_value(e, {"test_metric_compressed", "test_acc_compressed"});
    h.train_time_s = csv_value(e, {"train_time_s"});
    h.train_loss = csv_value(e, {"train_loss"});
    r.history.push_back(h);
  }
  // The seed and the settings without it, from the run's resolved config (absent: runs stay apart).
  if (fs::exists(d / "config.ini")) {
    try {
      const Config config = Config::load((d / "config.ini").string());
      std::vector<std::pair<std::string, std::string>> seedless;
      std::string others;
      for (const auto& [k, v] : config.resolved()) {
        if (k == "run.seed") {
          r.seed = std::stoll(v);
          seedless.emplace_back(k, "0");
          continue;
        }
        seedless.emplace_back(k, v);
        if (k.rfind("boundary.", 0) == 0 || k.rfind("dp.", 0) == 0 || k == "parallel.dp") others += k + "=" + v + "\n";
      }
      r.seedless_fingerprint = config_fingerprint(Config::load("", seedless));
      r.settings = r.seedless_fingerprint + "\n" + others;
    } catch (const std::exception&) {
      r.seed.reset();  // an old config.ini (keys since renamed): shown alone
    }
  }
  return r;
}

// ---- the table ---------------------------------------------------------------------------------------
Comparison compare_runs(const std::vector<RunRecord>& runs) {
  Comparison c;
  std::set<std::string> metrics;
  bool any_target = false;
  for (const auto& r : runs) {
    metrics.insert(r.metric);
    any_target = any_target || r.target.has_value();
  }
  const bool all_accuracy = metrics.size() == 1 && *metrics.begin() == "accuracy";
  const bool name_metric = !all_accuracy;
  std::vector<std::string> header = {"run",
                                     "task / config",
                                     "compression (fwd / bwd)",
                                     all_accuracy ? "test acc, on" : "metric, on",
                                     all_accuracy ? "test acc, off" : "metric, off",
                                     "bytes/step",
                                     "ratio",
                                     "wall"};
  // Time to target and its two factors (docs/TIME.md): steps to it, and time per step.
  if (any_target)
    for (const char* h : {"steps to target", "time/step", "time to target"}) header.push_back(h);
  std::vector<std::vector<std::string>> cells = {header};
  for (const auto& r : runs) {
    std::string config = r.config.empty() ? "?" : fs::path(r.config).filename().string();
    if (config.empty()) config = r.config;
    std::string ratio = r.uncompressed_bytes_per_step > 0 ? fixed(r.bytes_per_step / r.uncompressed_bytes_per_step, 3) + "x"
                                                          : "-";  // no boundary (model.cuts = none)
    std::string label = r.label + (r.epochs > 0 && r.last_epoch < r.epochs ? " *" : "");
    std::vector<std::string> row = {label,
                                    r.task + " / " + config,
                                    r.forward + " / " + r.backward,
                                    metric_text(r.metric, r.metric_on, name_metric),
                                    metric_text(r.metric, r.metric_off, name_metric),
                                    human_bytes(r.bytes_per_step),
                                    ratio,
                                    seconds_text(r.wall_s)};
    if (any_target) {
      std::string t = "-";
      if (r.target) {
        std::string goal = metric_text(r.metric, r.target, false);
        t = r.time_to_target_s ? seconds_text(*r.time_to_target_s) + " to " + goal : "not reached (" + goal + ")";
      }
      row.push_back(r.steps_to_target ? std::to_string(*r.steps_to_target) : "-");
      row.push_back(r.time_per_step_s ? fixed(*r.time_per_step_s, 3) + " s" : "-");
      row.push_back(t);
    }
    cells.push_back(row);
  }
  c.table = table_text(cells, 3);

  // What does not compare: different tasks or metrics, then different settings within a task.
  std::map<std::string, std::vector<std::string>> by_task;
  for (const auto& r : runs) by_task[r.task + " (" + r.metric + ")"].push_back(r.label);
  if (by_task.size() > 1) {
    std::vector<std::string> groups;
    for (const auto& [task, labels] : by_task) groups.push_back(task + ": " + join(labels, ", "));
    c.notes.push_back("these runs are of different tasks or metrics and do not compare: " + join(groups, "; "));
  }
  for (const auto& [task, labels] : by_task) {
    std::map<std::string, std::vector<std::string>> by_fp;
    for (const auto& r : runs)
      if (r.task + " (" + r.metric + ")" == task && !r.fingerprint.empty())  // seeds apart
        by_fp[r.seedless_fingerprint.empty() ? r.fingerprint : r.seedless_fingerprint].push_back(r.label);
    if (by_fp.size() > 1) {
      std::vector<std::string> groups;
      for (const auto& [fp, ls] : by_fp) {
        std::string g = "{";  // appended, not "{" + ...: GCC 12 warns on that form (-Wstringop-overflow)
        g += join(ls, ", ");
        g += '}';
        groups.push_back(std::move(g));
      }
      c.notes.push_back("settings other than the boundaries differ (config fingerprints), so only runs within a group "
                        "compare directly: " + join(groups, " "));
    }
  }
  for (const auto& r : runs)
    if (r.fingerprint.empty())
      c.notes.push_back(r.label + ": no fingerprint in its summary.json; whether it compares is unknown");
  for (const auto& r : runs)
    if (r.epochs > 0 && r.last_epoch < r.epochs)
      c.notes.push_back(r.label + " *: unfinished (epoch " + std::to_string(r.last_epoch) + " of " +
                        std::to_string(r.epochs) + "); tapeline train --resume " + r.dir + " continues it");
  for (const auto& r : runs)
    if (!r.higher_is_better) {
      c.notes.push_back("lower is better for " + r.metric);
      break;
    }
  return c;
}

// ---- seeds of one config ----------------------------------------------------------------------------
namespace {

// Student t density with df degrees of freedom.
double t_density(double x, double df) {
  const double c = std::lgamma((df + 1) / 2) - std::lgamma(df / 2) - 0.5 * std::log(df * M_PI);
  return std::exp(c - (df + 1) / 2 * std::log1p(x * x / df));
}

// P(0 <= T <= x), Simpson's rule on 2,000 intervals (the density is smooth; error < 1e-9 here).
double t_mass_to(double x, double df) {
  const int n = 2000;
  const double h = x / n;
  double sum = t_density(0, df) + t_density(x, df);
  for (int i = 1; i < n; ++i) sum += (i % 2 ? 4 : 2) * t_density(i * h, df);
  return sum * h / 3;
}

// "12.3 ± 0.4", "12.3 (n=1, no interval)", "-" (no values), through `text` for the unit.
std::string ci_text(const MeanCI& m, const std::function<std::string(double)>& text) {
  if (m.n == 0) return "-";
  if (!m.half_width) return text(m.mean) + " (n=1, no interval)";
  return text(m.mean) + " ± " + text(*m.half_width);
}

// The run's name without a seed suffix: NAME.seed3, NAME-seed3, NAME_seed3, NAME.s3 -> NAME.
std::string without_seed_suffix(const std::string& label) {
  for (const char* sep : {".seed", "-seed", "_seed", ".s"}) {
    const auto pos = label.rfind(sep);
    if (pos == std::string::npos || pos == 0) continue;
    const std::string digits = label.substr(pos + std::strlen(sep));
    if (!digits.empty() && std::all_of(digits.begin(), digits.end(), [](char c) { return std::isdigit(c); }))
      return label.substr(0, pos);
  }
  return label;
}

json ci_json(const MeanCI& m) {
  json j = {{"n", m.n}, {"mean", m.mean}};
  j["half_width"] = m.half_width ? json(*m.half_width) : json(nullptr);
  return j;
}

bool reaches(double value, double target, bool higher_is_better) {
  return higher_is_better ? value >= target : value <= target;
}

}  // namespace

double student_t95(int64_t df) {
  if (df < 1) throw std::invalid_argument("student_t95: degrees of freedom must be >= 1, got " + std::to_string(df));
  // Bisection on P(0 <= T <= x) = 0.475; t_{0.975} is 12.71 at df = 1 and falls towards 1.96.
  double lo = 1.9, hi = 13.0;
  for (int i = 0; i < 60; ++i) {
    const double mid = (lo + hi) / 2;
    (t_mass_to(mid, double(df)) < 0.475 ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

MeanCI mean_ci(const std::vector<double>& xs) {
  MeanCI m;
  m.n = static_cast<int64_t>(xs.size());
  if (xs.empty()) return m;
  for (double x : xs) m.mean += x;
  m.mean /= double(xs.size());
  if (xs.size() < 2) return m;
  double ss = 0;
  for (double x : xs) ss += (x - m.mean) * (x - m.mean);
  const double sd = std::sqrt(ss / double(xs.size() - 1));
  m.half_width = student_t95(m.n - 1) * sd / std::sqrt(double(xs.size()));
  return m;
}

PlannedStep read_plan(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot be read (expected a plan.json written by tapeline plan)");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw std::runtime_error(path + ": not JSON (" + std::string(e.what()) +
                             "); expected a plan.json written by tapeline plan");
  }
  PlannedStep p;
  p.file = path;
  auto it = j.is_object() ? j.find("step_s") : j.end();
  if (!j.is_object() || it == j.end())
    throw std::runtime_error(path +
                             ": no \"step_s\" (the planned seconds of one optimizer step, written by tapeline plan)");
  if (!it->is_number() || !(it->get<double>() > 0))
    throw std::runtime_error(path + ": \"step_s\" must be a number > 0 (seconds per planned step), got " + it->dump());
  p.step_s = it->get<double>();
  p.device = string_of(j, "device");
  p.config = string_of(j, "config");
  return p;
}

SeedComparison compare_seeds(const std::vector<RunRecord>& runs, const SeedOptions& options) {
  SeedComparison out;
  // Groups, in first-seen order: same settings but the seed (runs without a config.ini stay alone).
  std::vector<std::vector<const RunRecord*>> members;
  std::map<std::string, size_t> index;
  for (const auto& r : runs) {
    const std::string key = r.settings.empty() ? "dir:" + r.dir : r.settings;
    auto [it, fresh] = index.emplace(key, members.size());
    if (fresh) members.emplace_back();
    members[it->second].push_back(&r);
  }
  for (const auto& m : members) {
    SeedGroup g;
    const RunRecord& first = *m.front();
    g.label = without_seed_suffix(first.label);
    for (const RunRecord* r : m)
      if (without_seed_suffix(r->label) != g.label) {
        std::string stem = fs::path(first.config).stem().string();
        g.label = stem.empty() ? first.label : stem;
        break;
      }
    g.task = first.task, g.metric = first.metric, g.higher_is_better = first.higher_is_better;
    g.config = first.config, g.forward = first.forward, g.backward = first.backward;
    g.timeline_device = first.timeline_device;
    out.groups.push_back(g);
  }
  // Labels must name one group each (--target-from and --plan refer to them).
  {
    std::map<std::string, int> seen;
    for (auto& g : out.groups)
      if (++seen[g.label] > 1) g.label += " (" + std::to_string(seen[g.label]) + ")";
  }
  auto find_group = [&](const std::string& label) -> size_t {
    for (size_t i = 0; i < out.groups.size(); ++i)
      if (out.groups[i].label == label) return i;
    std::vector<std::string> names;
    for (const auto& g : out.groups) names.push_back(g.label);
    throw std::invalid_argument("no config named '" + label + "' among the runs; their configs: " + join(names, ", "));
  };

  // The final metrics first: --target-from needs its group's mean.
  for (size_t gi = 0; gi < members.size(); ++gi) {
    SeedGroup& g = out.groups[gi];
    std::vector<double> on, off, loss, bytes, step, wall;
    std::set<int64_t> seeds;
    for (const RunRecord* r : members[gi]) {
      g.dirs.push_back(r->dir);
      g.seeds.push_back(r->seed);
      if (r->seed && !seeds.insert(*r->seed).second)
        out.notes.push_back(g.label + ": two runs of seed " + std::to_string(*r->seed) +
                            " (the same run twice?); both are counted");
      if (r->epochs > 0 && r->last_epoch < r->epochs)
        g.unfinished.push_back(r->label + " (epoch " + std::to_string(r->last_epoch) + " of " +
                               std::to_string(r->epochs) + ")");
      if (r->metric_on) on.push_back(*r->metric_on);
      if (r->metric_off) off.push_back(*r->metric_off);
      if (!r->history.empty() && r->history.back().train_loss) loss.push_back(*r->history.back().train_loss);
      bytes.push_back(r->bytes_per_step);
      if (r->time_per_step_s) step.push_back(*r->time_per_step_s);
      wall.push_back(r->wall_s);
    }
    g.metric_on = mean_ci(on), g.metric_off = mean_ci(off), g.train_loss = mean_ci(loss);
    g.bytes_per_step = mean_ci(bytes), g.time_per_step_s = mean_ci(step), g.wall_s = mean_ci(wall);
  }
  std::optional<double> shared_target = options.target;
  if (!shared_target && !options.target_from.empty()) {
    const SeedGroup& ref = out.groups[find_group(options.target_from)];
    if (ref.metric_on.n == 0)
      throw std::invalid_argument("--target-from " + options.target_from + ": its runs have no final test metric");
    shared_target = ref.metric_on.mean + options.target_delta;
  }
  // A plan without a name is every group's; named plans win over it.
  for (const auto& [label, plan] : options.plans)
    if (label.empty())
      for (auto& g : out.groups) g.plan = plan;
  for (const auto& [label, plan] : options.plans)
    if (!label.empty()) out.groups[find_group(label)].plan = plan;

  // Steps and time to target, per run, from metrics.csv.
  bool any_target = false;
  for (size_t gi = 0; gi < members.size(); ++gi) {
    SeedGroup& g = out.groups[gi];
    std::vector<double> steps, times, planned;
    for (const RunRecord* r : members[gi]) {
      const std::optional<double> target = shared_target ? shared_target : r->target;
      if (!target) continue;
      if (g.target && std::fabs(*g.target - *target) > 1e-12)
        out.notes.push_back(g.label + ": its runs have different train.target values; " + r->label +
                            "'s is used for it");
      g.target = target;
      const RunRecord::Epoch* hit = nullptr;
      for (const auto& e : r->history)
        if (e.metric_on && reaches(*e.metric_on, *target, r->higher_is_better)) {
          hit = &e;
          break;
        }
      if (!hit) {
        const int64_t last = r->history.empty() ? 0 : r->history.back().steps;
        g.missed.push_back(r->label + " (" + std::to_string(last) + " steps)");
        continue;
      }
      steps.push_back(double(hit->steps));
      if (hit->train_time_s) times.push_back(*hit->train_time_s);
      if (g.plan) planned.push_back(double(hit->steps) * g.plan->step_s);
    }
    any_target = any_target || g.target.has_value();
    g.steps_to_target = mean_ci(steps), g.time_to_target_s = mean_ci(times);
    g.planned_time_to_target_s = mean_ci(planned);
  }

  // The table.
  const bool any_plan = std::any_of(out.groups.begin(), out.groups.end(), [](const SeedGroup& g) { return g.plan; });
  std::vector<std::string> header = {"config",     "n",           "seeds",      "compression (fwd / bwd)",
                                     "metric, on", "metric, off", "bytes/step", "time/step"};
  if (any_target)
    for (const char* h : {"target", "reached", "steps to target", "time to target"}) header.push_back(h);
  if (any_plan)
    for (const char* h : {"planned step", "planned time to target"}) header.push_back(h);
  std::vector<std::vector<std::string>> cells = {header};
  for (const auto& g : out.groups) {
    std::vector<std::string> seeds;
    for (const auto& s : g.seeds) seeds.push_back(s ? std::to_string(*s) : "?");
    auto metric = [&](double v) { return metric_text(g.metric, v, false); };
    auto secs = [](double v) { return fixed(v, 3) + " s"; };
    std::vector<std::string> row = {g.label,
                                    std::to_string(g.dirs.size()),
                                    join(seeds, ","),
                                    g.forward + " / " + g.backward,
                                    ci_text(g.metric_on, metric),
                                    ci_text(g.metric_off, metric),
                                    ci_text(g.bytes_per_step, [](double v) { return human_bytes(v); }),
                                    ci_text(g.time_per_step_s, secs)};
    if (any_target) {
      row.push_back(g.target ? metric(*g.target) : "-");
      row.push_back(g.target ? std::to_string(g.steps_to_target.n) + " of " + std::to_string(g.dirs.size()) : "-");
      row.push_back(ci_text(g.steps_to_target, [](double v) { return fixed(v, v == std::floor(v) ? 0 : 1); }));
      row.push_back(ci_text(g.time_to_target_s, [](double v) { return seconds_text(v); }));
    }
    if (any_plan) {
      row.push_back(g.plan ? fixed(g.plan->step_s, 3) + " s" : "-");
      row.push_back(ci_text(g.planned_time_to_target_s, [](double v) { return seconds_text(v); }));
    }
    cells.push_back(row);
  }
  out.table = table_text(cells, 4);

  // What each number is, and what the means leave out.
  out.notes.push_back(
      "mean ± half-width of the 95% confidence interval over seeds (Student t, n - 1 degrees of "
      "freedom); metrics are the last epoch's test metric with compression on and off");
  if (any_target) {
    std::set<std::string> devices;
    for (const auto& g : out.groups)
      if (g.target) devices.insert(g.timeline_device);
    out.notes.push_back(
        "steps to target: measured by training (optimizer steps to the end of the first epoch whose test metric, "
        "compression on, reaches the target; resolution one epoch), over the runs that reached it");
    out.notes.push_back("time to target: the runs' own timeline at that epoch (timeline.device = " +
                        join({devices.begin(), devices.end()}, ", ") +
                        (devices.count("measured") && devices.size() == 1
                             ? ": compute measured on this machine, links emulated)"
                             : ": compute modelled on that device, links emulated)"));
    if (shared_target)
      out.notes.push_back(
          "target " + metric_text(out.groups.front().metric, *shared_target, true) +
          (options.target ? " (--target)"
                          : " (--target-from " + options.target_from + ": its mean final metric " +
                                (options.target_delta >= 0 ? "+ " : "- ") +
                                metric_text(out.groups.front().metric, std::fabs(options.target_delta), false) + ")"));
  }
  if (any_plan) {
    for (const auto& g : out.groups)
      if (g.plan)
        out.notes.push_back(g.label + ": planned time to target = steps to target (measured) x " +
                            fixed(g.plan->step_s, 3) + " s per step (modelled: " + g.plan->file +
                            (g.plan->device.empty() ? "" : ", device " + g.plan->device) +
                            (g.plan->config.empty() ? "" : ", config " + g.plan->config) + ")");
  }
  for (const auto& g : out.groups) {
    if (!g.missed.empty())
      out.notes.push_back(
          g.label + ": " + std::to_string(g.missed.size()) + " of " + std::to_string(g.dirs.size()) +
          " runs did not reach the target and are left out of steps and time to target: " + join(g.missed, ", "));
    if (!g.unfinished.empty())
      out.notes.push_back(
          g.label + ": unfinished runs (tapeline sweep or train --resume continues them): " + join(g.unfinished, ", "));
    if (g.dirs.size() == 1) out.notes.push_back(g.label + ": n=1, no interval");
  }
  {
    std::set<std::string> tasks;
    for (const auto& g : out.groups) tasks.insert(g.task + " (" + g.metric + ")");
    if (tasks.size() > 1)
      out.notes.push_back("these configs are of different tasks or metrics and do not compare: " +
                          join({tasks.begin(), tasks.end()}, ", "));
  }

  json j = json::array();
  for (const auto& g : out.groups) {
    json seeds = json::array();
    for (const auto& s : g.seeds) seeds.push_back(s ? json(*s) : json(nullptr));
    json e = {{"label", g.label},
              {"task", g.task},
              {"metric", g.metric},
              {"higher_is_better", g.higher_is_better},
              {"forward", g.forward},
              {"backward", g.backward},
              {"runs", g.dirs},
              {"seeds", seeds},
              {"metric_on", ci_json(g.metric_on)},
              {"metric_off", ci_json(g.metric_off)},
              {"bytes_per_step", ci_json(g.bytes_per_step)},
              {"time_per_step_s", ci_json(g.time_per_step_s)},
              {"missed", g.missed.size()},
              {"steps_to_target", ci_json(g.steps_to_target)},
              {"time_to_target_s", ci_json(g.time_to_target_s)},
              {"timeline_device", g.timeline_device}};
    e["target"] = g.target ? json(*g.target) : json(nullptr);
    if (g.plan) {
      e["plan"] = {{"file", g.plan->file}, {"step_s", g.plan->step_s}, {"device", g.plan->device}};
      e["planned_time_to_target_s"] = ci_json(g.planned_time_to_target_s);
    }
    j.push_back(e);
  }
  out.json = json({{"groups", j}}).dump(1);
  return out;
}

// ---- plots -------------------------------------------------------------------------------------------
std::string plot_module_path() {
  if (const char* p = std::getenv("TAPELINE_PLOTS"); p && *p) return fs::exists(p) ? std::string(p) : std::string();
  std::error_code ec;
  // The source tree this was built from (CMake defines TAPELINE_SOURCE_DIR on this file alone):
  // a build directory outside the tree (cmake -B /elsewhere) finds the module only this way.
  {
    fs::path m = fs::path(TAPELINE_SOURCE_DIR) / "python" / "tapeline_plots.py";
    if (fs::exists(m, ec)) return m.string();
  }
  // An ancestor of the executable's directory (build/tapeline -> python/ next to build/).
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (fs::path d = exe.parent_path(); !d.empty(); d = d.parent_path()) {
      for (const char* rel : {"python/tapeline_plots.py", "share/tapeline/python/tapeline_plots.py"}) {
        fs::path m = d / rel;
        if (fs::exists(m, ec)) return m.string();
      }
      if (d == d.parent_path()) break;
    }
  }
  return {};
}

bool write_run_plot(const std::string& run_dir, std::string* note) {
  PlotResult r;
  try {
    run_plot_module({"run", run_dir}, r);
  } catch (const std::exception& e) {
    r.written = false;
    r.note = std::string("curves.png skipped: ") + e.what();
  }
  if (!r.written && note) *note = r.note.empty() ? "curves.png was not written" : r.note;
  return r.written;
}

PlotResult write_seed_plots(const SeedComparison& seeds, const std::string& out_dir) {
  PlotResult r;
  try {
    fs::create_directories(out_dir);
    const std::string path = (fs::path(out_dir) / "seeds.json").string();
    write_file_atomic(path, seeds.json + "\n");
    run_plot_module({"seeds", "--out", out_dir, path}, r);
  } catch (const std::exception& e) {
    r.written = false;
    r.note = std::string("plots failed: ") + e.what();
  }
  return r;
}

PlotResult write_compare_plots(const std::vector<std::string>& run_dirs, const std::string& out_dir) {
  PlotResult r;
  try {
    std::vector<std::string> args = {"compare", "--out", out_dir};
    args.insert(args.end(), run_dirs.begin(), run_dirs.end());
    run_plot_module(args, r);
  } catch (const std::exception& e) {
    r.written = false;
    r.note = std::string("plots failed: ") + e.what();
  }
  return r;
}

}  // namespace tl
