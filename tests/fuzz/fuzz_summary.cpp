// Run directories for `tapeline compare`: summary.json (and metrics.jsonl) as another run or
// another version wrote them.
#include "tasks/runner/compare.h"
#include "tests/fuzz/fuzz.h"

TL_FUZZ_TARGET(summary) {
  tl::fuzz::Reader in(data, size);
  const std::string summary = in.chunk();
  const std::string metrics = in.rest();
  tl::fuzz::write_file("run/summary.json", summary);
  tl::fuzz::write_file("run/metrics.jsonl", metrics);
  const tl::RunRecord r = tl::read_run_record(tl::fuzz::scratch_dir() + "/run");
  tl::compare_runs({r, r});
}
