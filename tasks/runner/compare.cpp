#include "tasks/runner/compare.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

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

// The last row of metrics.csv as column name -> value (numbers only; empty cells left out).
std::map<std::string, double> last_csv_row(const fs::path& path) {
  std::map<std::string, double> row;
  std::ifstream in(path);
  if (!in) return row;
  std::string header_line, line, last;
  if (!std::getline(in, header_line)) return row;
  while (std::getline(in, line))
    if (!line.empty() && line != "\r") last = line;
  if (last.empty()) return row;
  auto header = split_csv_line(header_line), cells = split_csv_line(last);
  if (header.size() != cells.size())
    throw std::runtime_error(path.string() + ": the last row has " + std::to_string(cells.size()) +
                             " cells but the header names " + std::to_string(header.size()) + " columns");
  for (size_t i = 0; i < header.size(); ++i) {
    if (cells[i].empty()) continue;
    char* end = nullptr;
    double v = std::strtod(cells[i].c_str(), &end);
    if (end && *end == '\0') row[header[i]] = v;
  }
  return row;
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
  const auto row = last_csv_row(d / "metrics.csv");

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
      if (r.task + " (" + r.metric + ")" == task && !r.fingerprint.empty()) by_fp[r.fingerprint].push_back(r.label);
    if (by_fp.size() > 1) {
      std::vector<std::string> groups;
      for (const auto& [fp, ls] : by_fp) groups.push_back("{" + join(ls, ", ") + "}");
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
