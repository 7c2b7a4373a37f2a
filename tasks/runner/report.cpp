#include "tasks/runner/report.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace tl {
namespace {
using json = nlohmann::json;

// metrics.csv columns, in order; read back by name.
const std::vector<std::string> kCsvColumns = {
    "epoch",          "train_loss",    "train_metric",      "test_loss_compressed", "test_loss_uncompressed",
    "test_metric_compressed", "test_metric_uncompressed", "bytes_forward", "bytes_backward",
    "bytes_uncompressed",     "steps",         "lr",                "wall_s",   "train_time_s",
    "compute_s",              "comm_s",        "bubble",            "bytes_dp",             "bytes_dp_uncompressed",
    "bytes_tp",       "bytes_tp_uncompressed"};
// Columns added later: 0 when a file has none.
bool optional_column(const std::string& name) {
  return name == "bytes_dp" || name == "bytes_dp_uncompressed" || name == "bytes_tp" || name == "bytes_tp_uncompressed";
}

// The same fields in the same order, as (name, pointer-to-member) pairs for both readers.
template <class F>
void for_each_field(EpochMetrics& m, F&& f) {
  f("epoch", m.epoch);
  f("train_loss", m.train_loss);
  f("train_metric", m.train_metric);
  f("test_loss_compressed", m.test_loss_compressed);
  f("test_loss_uncompressed", m.test_loss_uncompressed);
  f("test_metric_compressed", m.test_metric_compressed);
  f("test_metric_uncompressed", m.test_metric_uncompressed);
  f("bytes_forward", m.bytes_forward);
  f("bytes_backward", m.bytes_backward);
  f("bytes_uncompressed", m.bytes_uncompressed);
  f("steps", m.steps);
  f("lr", m.lr);
  f("wall_s", m.wall_s);
  f("train_time_s", m.train_time_s);
  f("compute_s", m.compute_s);
  f("comm_s", m.comm_s);
  f("bubble", m.bubble);
  f("bytes_dp", m.bytes_dp);
  f("bytes_dp_uncompressed", m.bytes_dp_uncompressed);
  f("bytes_tp", m.bytes_tp);
  f("bytes_tp_uncompressed", m.bytes_tp_uncompressed);
}

json to_json(const EpochMetrics& metrics) {
  json j;
  EpochMetrics m = metrics;
  for_each_field(m, [&](const char* name, auto& v) { j[name] = v; });
  return j;
}

EpochMetrics from_json(const json& j) {
  EpochMetrics m;
  for_each_field(m, [&](const char* name, auto& v) {
    if (j.contains(name) || !optional_column(name)) v = j.at(name).get<std::decay_t<decltype(v)>>();
  });
  return m;
}

}  // namespace

std::string metrics_csv(const std::vector<EpochMetrics>& rows) {
  std::ostringstream out;
  for (size_t i = 0; i < kCsvColumns.size(); ++i) out << (i ? "," : "") << kCsvColumns[i];
  out << "\n" << std::setprecision(9);
  for (const auto& row : rows) {
    EpochMetrics m = row;
    bool first = true;
    for_each_field(m, [&](const char*, auto& v) {
      out << (first ? "" : ",") << v;
      first = false;
    });
    out << "\n";
  }
  return out.str();
}

std::vector<EpochMetrics> read_metrics_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot be read");
  auto split = [](const std::string& line) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) f.push_back(cell);
    return f;
  };
  std::string line;
  std::getline(in, line);
  const std::vector<std::string> header = split(line);
  std::map<std::string, size_t> column;
  for (size_t i = 0; i < header.size(); ++i) column[header[i]] = i;
  for (const auto& name : kCsvColumns)
    if (!column.count(name) && !optional_column(name))
      throw std::runtime_error(path + ": no column '" + name + "' in the header (not a metrics.csv of this version)");
  std::vector<EpochMetrics> rows;
  int64_t line_no = 1;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    const std::vector<std::string> f = split(line);
    if (f.size() != header.size())
      throw std::runtime_error(path + ":" + std::to_string(line_no) + ": expected " + std::to_string(header.size()) +
                               " columns, found " + std::to_string(f.size()));
    EpochMetrics m;
    try {
      for_each_field(m, [&](const char* name, auto& v) {
        if (!column.count(name)) return;  // an optional column the file predates
        const std::string& cell = f[column.at(name)];
        if constexpr (std::is_same_v<std::decay_t<decltype(v)>, int64_t>)
          v = std::stoll(cell);
        else
          v = std::stod(cell);
      });
    } catch (const std::logic_error&) {
      throw std::runtime_error(path + ":" + std::to_string(line_no) + ": not a number in '" + line + "'");
    }
    rows.push_back(m);
  }
  return rows;
}

double RunSummary::bytes_per_step() const {
  return last.steps > 0 ? double(last.bytes_forward + last.bytes_backward) / double(last.steps) : 0.0;
}
double RunSummary::uncompressed_bytes_per_step() const {
  return last.steps > 0 ? double(last.bytes_uncompressed) / double(last.steps) : 0.0;
}

std::string summary_json(const RunSummary& s) {
  json j = to_json(s.last);
  j["name"] = s.name;
  j["config"] = s.config;
  j["task"] = s.task;
  j["metric"] = s.metric;
  j["higher_is_better"] = s.higher_is_better;
  j["target"] = s.target;
  j["time_to_target_s"] = s.time_to_target_s;
  j["timeline_device"] = s.timeline_device;
  j["wall_to_target_s"] = s.wall_to_target_s;
  j["steps_to_target"] = s.steps_to_target;
  j["total_steps"] = s.steps;
  j["forward"] = s.forward;
  j["backward"] = s.backward;
  j["stages"] = s.stages;
  j["epochs"] = s.epochs;
  j["train_samples"] = s.train_samples;
  j["test_samples"] = s.test_samples;
  j["fingerprint"] = s.fingerprint;
  j["peak_rss_bytes"] = s.peak_rss_bytes;
  j["parameter_bytes"] = s.parameter_bytes;
  j["optimizer_bytes"] = s.optimizer_bytes;
  j["bytes_per_step"] = s.bytes_per_step();
  j["uncompressed_bytes_per_step"] = s.uncompressed_bytes_per_step();
  return j.dump(2) + "\n";
}

std::optional<RunSummary> read_summary_json(const std::string& path) {
  if (!std::filesystem::exists(path)) return std::nullopt;
  std::ifstream in(path);
  try {
    json j = json::parse(in);
    RunSummary s;
    s.last = from_json(j);
    s.name = j.value("name", "");
    s.config = j.value("config", "");
    s.task = j.value("task", "vision");
    s.metric = j.value("metric", "accuracy");
    s.higher_is_better = j.value("higher_is_better", true);
    s.target = j.value("target", 0.0);
    s.time_to_target_s = j.value("time_to_target_s", -1.0);
    s.timeline_device = j.value("timeline_device", std::string("measured"));
    s.wall_to_target_s = j.value("wall_to_target_s", -1.0);
    s.steps_to_target = j.value("steps_to_target", int64_t(-1));
    s.steps = j.value("total_steps", int64_t(0));
    s.forward = j.value("forward", "");
    s.backward = j.value("backward", "");
    s.stages = j.value("stages", int64_t(1));
    s.epochs = j.value("epochs", int64_t(0));
    s.train_samples = j.value("train_samples", int64_t(0));
    s.test_samples = j.value("test_samples", int64_t(0));
    s.fingerprint = j.value("fingerprint", "");
    s.peak_rss_bytes = j.value("peak_rss_bytes", std::vector<int64_t>{});
    s.parameter_bytes = j.value("parameter_bytes", std::vector<int64_t>{});
    s.optimizer_bytes = j.value("optimizer_bytes", std::vector<int64_t>{});
    return s;
  } catch (const json::exception& e) {
    throw std::runtime_error(path + ": not a tapeline summary.json (" + e.what() + ")");
  }
}

std::string levels_csv_header() { return "step,epoch,boundary,direction,level,label,bytes"; }

std::string levels_csv_row(const LevelRow& r) {
  std::string quoted = "\"";
  for (char c : r.label) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  std::ostringstream s;
  s << r.step << "," << r.epoch << "," << r.boundary << "," << r.direction << "," << std::setprecision(12) << r.level
    << "," << quoted << "\"," << r.bytes;
  return s.str();
}

void write_file_atomic(const std::string& path, const std::string& content) {
  namespace fs = std::filesystem;
  fs::path target(path);
  std::string name = ".";  // appended, not "." + ...: GCC 12 warns on that form (-Wstringop-overflow)
  name += target.filename().string();
  name += ".tmp";
  name += std::to_string(::getpid());
  fs::path tmp = target.parent_path() / name;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error(tmp.string() + ": cannot be written");
    out << content;
    out.flush();
    if (!out) {
      out.close();
      fs::remove(tmp);
      throw std::runtime_error(tmp.string() + ": write failed");
    }
  }
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec) {
    fs::remove(tmp);
    throw std::runtime_error(path + ": cannot replace (" + ec.message() + ")");
  }
}

void append_line(const std::string& path, const std::string& line) {
  std::ofstream out(path, std::ios::app);
  if (!out) throw std::runtime_error(path + ": cannot be appended to");
  out << line << "\n";
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  while (std::fabs(bytes) >= 1000.0 && u < 4) bytes /= 1000.0, ++u;
  std::ostringstream s;
  s << std::fixed << std::setprecision(u == 0 ? 0 : 2) << bytes << " " << units[u];
  return s.str();
}

std::string format_metric(const std::string& metric, double value) {
  std::ostringstream s;
  if (metric == "accuracy")
    s << std::fixed << std::setprecision(2) << 100.0 * value << "%";
  else
    s << std::fixed << std::setprecision(3) << value;
  return s.str();
}

Progress::Mode Progress::resolve(const std::string& setting) {
  if (setting == "bar") return Mode::kBar;
  if (setting == "plain") return Mode::kPlain;
  if (setting == "none") return Mode::kNone;
  const char* ci = std::getenv("CI");
  bool in_ci = ci != nullptr && (std::string(ci) == "true" || std::string(ci) == "1");
  return (!in_ci && ::isatty(STDERR_FILENO)) ? Mode::kBar : Mode::kPlain;
}

void Progress::bar(int64_t epoch, int64_t epochs, int64_t step, int64_t steps, double loss, double rate,
                   const std::string& unit) {
  if (mode_ != Mode::kBar) return;
  const int cells = 30;
  int filled = steps > 0 ? int(cells * step / steps) : 0;
  std::ostringstream s;
  s << "\repoch " << epoch << "/" << epochs << " [" << std::string(filled, '#') << std::string(cells - filled, '.')
    << "] " << step << "/" << steps << "  loss " << std::fixed << std::setprecision(4) << loss << "  "
    << std::setprecision(0) << rate << " " << unit << "/s\033[K";
  std::cerr << s.str() << std::flush;
  bar_open_ = true;
}

void Progress::line(const std::string& text) {
  if (mode_ == Mode::kNone) return;
  if (bar_open_) std::cerr << "\r\033[K";
  bar_open_ = false;
  std::cerr << text << std::endl;
}

}  // namespace tl
