#pragma once
// Small helpers the benchmarks share.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace tl::bench {

/// Median of the values (the mean of the middle two for an even count); 0 for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
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

}  // namespace tl::bench
