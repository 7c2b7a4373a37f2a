#pragma once
// Helpers for the tasks tests: temporary directories, error-message checks, the tapeline executable.

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "layers/models/pretrained.h"
#include "tests/common/testing.h"

namespace tl::testing {

/// The tapeline executable next to this test binary's build tree (build/tests/tasks/test_tasks ->
/// build/tapeline); empty if /proc/self/exe cannot be read.
inline std::filesystem::path tapeline_path() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path() : self.parent_path().parent_path().parent_path() / "tapeline";
}

/// A fresh directory under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("tapeline-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// Whether all-MiniLM-L6-v2 is installed where find_minilm("") looks (tests skip without it).
inline bool have_minilm() {
  try {
    find_minilm("");
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

/// Expects fn to throw (c10::Error or std::exception) with a message containing every fragment.
inline void expect_error(const std::function<void()>& fn, const std::vector<std::string>& fragments) {
  std::string msg;
  try {
    fn();
  } catch (const c10::Error& e) {
    msg = e.what_without_backtrace();
  } catch (const std::exception& e) {
    msg = e.what();
  }
  ASSERT_FALSE(msg.empty()) << "expected an error containing '" << (fragments.empty() ? "" : fragments[0])
                            << "' but nothing was thrown";
  for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
}

/// RUN_DIR/metrics.jsonl without what measures time (wall_s, train_time_s, compute_s, comm_s,
/// bubble, rank_times, throughputs *_per_s): every per-step and per-epoch record with its per-boundary
/// statistics, one line each. Two runs of the same seed must agree on it exactly.
inline std::string jsonl_without_times(const std::filesystem::path& run_dir) {
  std::ifstream f(run_dir / "metrics.jsonl");
  std::string line, out;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line);
    for (auto it = j.begin(); it != j.end();) {
      const std::string& k = it.key();
      const bool time = k == "wall_s" || k == "train_time_s" || k == "compute_s" || k == "comm_s" || k == "bubble" ||
                        k == "rank_times" || (k.size() > 6 && k.compare(k.size() - 6, 6, "_per_s") == 0);
      it = time ? j.erase(it) : std::next(it);
    }
    out += j.dump() + "\n";
  }
  return out;
}

}  // namespace tl::testing
