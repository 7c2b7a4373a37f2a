#include "tasks/report.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace tl {
namespace {
using json = nlohmann::json;

const char* kCsvHeader =
    "epoch,train_loss,test_acc_compressed,test_acc_uncompressed,bytes_forward,bytes_backward,bytes_uncompressed,"
    "wall_s,train_acc,steps,lr";

json to_json(const EpochMetrics& m) {
  return json{{"epoch", m.epoch},
              {"train_loss", m.train_loss},
              {"train_acc", m.train_acc},
              {"test_acc_compressed", m.test_acc_compressed},
              {"test_acc_uncompressed", m.test_acc_uncompressed},
              {"bytes_forward", m.bytes_forward},
              {"bytes_backward", m.bytes_backward},
              {"bytes_uncompressed", m.bytes_uncompressed},
              {"steps", m.steps},
              {"lr", m.lr},
              {"wall_s", m.wall_s}};
}

EpochMetrics from_json(const json& j) {
  EpochMetrics m;
  m.epoch = j.at("epoch").get<int64_t>();
  m.train_loss = j.at("train_loss").get<double>();
  m.train_acc = j.value("train_acc", 0.0);
  m.test_acc_compressed = j.at("test_acc_compressed").get<double>();
  m.test_acc_uncompressed = j.at("test_acc_uncompressed").get<double>();
  m.bytes_forward = j.at("bytes_forward").get<int64_t>();
  m.bytes_backward = j.at("bytes_backward").get<int64_t>();
  m.bytes_uncompressed = j.at("bytes_uncompressed").get<int64_t>();
  m.steps = j.at("steps").get<int64_t>();
  m.lr = j.value("lr", 0.0);
  m.wall_s = j.at("wall_s").get<double>();
  return m;
}

}  // namespace

std::string metrics_csv(const std::vector<EpochMetrics>& rows) {
  std::ostringstream out;
  out << kCsvHeader << "\n" << std::setprecision(9);
  for (const auto& m : rows)
    out << m.epoch << "," << m.train_loss << "," << m.test_acc_compressed << "," << m.test_acc_uncompressed << ","
        << m.bytes_forward << "," << m.bytes_backward << "," << m.bytes_uncompressed << "," << m.wall_s << ","
        << m.train_acc << "," << m.steps << "," << m.lr << "\n";
  return out.str();
}

std::vector<EpochMetrics> read_metrics_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot be read");
  std::string line;
  std::getline(in, line);
  if (line != kCsvHeader) throw std::runtime_error(path + ": unexpected header; expected '" + kCsvHeader + "'");
  std::vector<EpochMetrics> rows;
  int64_t line_no = 1;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    std::stringstream ss(line);
    std::vector<std::string> f;
    std::string cell;
    while (std::getline(ss, cell, ',')) f.push_back(cell);
    if (f.size() != 11) throw std::runtime_error(path + ":" + std::to_string(line_no) + ": expected 11 columns");
    try {
      EpochMetrics m;
      m.epoch = std::stoll(f[0]);
      m.train_loss = std::stod(f[1]);
      m.test_acc_compressed = std::stod(f[2]);
      m.test_acc_uncompressed = std::stod(f[3]);
      m.bytes_forward = std::stoll(f[4]);
      m.bytes_backward = std::stoll(f[5]);
      m.bytes_uncompressed = std::stoll(f[6]);
      m.wall_s = std::stod(f[7]);
      m.train_acc = std::stod(f[8]);
      m.steps = std::stoll(f[9]);
      m.lr = std::stod(f[10]);
      rows.push_back(m);
    } catch (const std::logic_error&) {
      throw std::runtime_error(path + ":" + std::to_string(line_no) + ": not a number in '" + line + "'");
    }
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
  j["forward"] = s.forward;
  j["backward"] = s.backward;
  j["stages"] = s.stages;
  j["epochs"] = s.epochs;
  j["train_samples"] = s.train_samples;
  j["test_samples"] = s.test_samples;
  j["fingerprint"] = s.fingerprint;
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
    s.forward = j.value("forward", "");
    s.backward = j.value("backward", "");
    s.stages = j.value("stages", int64_t(1));
    s.epochs = j.value("epochs", int64_t(0));
    s.train_samples = j.value("train_samples", int64_t(0));
    s.test_samples = j.value("test_samples", int64_t(0));
    s.fingerprint = j.value("fingerprint", "");
    return s;
  } catch (const json::exception& e) {
    throw std::runtime_error(path + ": not a tapeline summary.json (" + e.what() + ")");
  }
}

void write_file_atomic(const std::string& path, const std::string& content) {
  namespace fs = std::filesystem;
  fs::path target(path);
  fs::path tmp = target.parent_path() / ("." + target.filename().string() + ".tmp" + std::to_string(::getpid()));
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

std::string comparison_table(const std::vector<std::pair<std::string, RunSummary>>& runs) {
  std::vector<std::vector<std::string>> cells = {{"run", "compression (fwd / bwd)", "test acc, compression on",
                                                  "test acc, compression off", "bytes/step", "uncompressed bytes/step",
                                                  "ratio"}};
  auto pct = [](double a) {
    std::ostringstream s;
    s << std::fixed << std::setprecision(2) << 100.0 * a << "%";
    return s.str();
  };
  for (const auto& [label, s] : runs) {
    std::ostringstream r;
    if (s.uncompressed_bytes_per_step() > 0)
      r << std::fixed << std::setprecision(3) << s.bytes_per_step() / s.uncompressed_bytes_per_step() << "x";
    else
      r << "-";  // no boundary (model.cuts = none)
    cells.push_back({label, s.forward + " / " + s.backward, pct(s.last.test_acc_compressed),
                     pct(s.last.test_acc_uncompressed), human_bytes(s.bytes_per_step()),
                     human_bytes(s.uncompressed_bytes_per_step()), r.str()});
  }
  std::vector<size_t> width(cells[0].size(), 0);
  for (const auto& row : cells)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  std::ostringstream out;
  for (size_t r = 0; r < cells.size(); ++r) {
    for (size_t c = 0; c < cells[r].size(); ++c) {
      out << (c ? "  " : "");
      if (c < 2)
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

Progress::Mode Progress::resolve(const std::string& setting) {
  if (setting == "bar") return Mode::kBar;
  if (setting == "plain") return Mode::kPlain;
  if (setting == "none") return Mode::kNone;
  const char* ci = std::getenv("CI");
  bool in_ci = ci != nullptr && (std::string(ci) == "true" || std::string(ci) == "1");
  return (!in_ci && ::isatty(STDERR_FILENO)) ? Mode::kBar : Mode::kPlain;
}

void Progress::bar(int64_t epoch, int64_t epochs, int64_t step, int64_t steps, double loss, double images_per_s) {
  if (mode_ != Mode::kBar) return;
  const int cells = 30;
  int filled = steps > 0 ? int(cells * step / steps) : 0;
  std::ostringstream s;
  s << "\repoch " << epoch << "/" << epochs << " [" << std::string(filled, '#') << std::string(cells - filled, '.')
    << "] " << step << "/" << steps << "  loss " << std::fixed << std::setprecision(4) << loss << "  "
    << std::setprecision(0) << images_per_s << " img/s\033[K";
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
