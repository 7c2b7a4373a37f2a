#pragma once
// `tapeline sweep`: every config x every seed, each run a `tapeline train` child process writing
// OUT/NAME.seedN (NAME: the config file's name without .ini), `jobs` of them at a time.
//
// Note [a sweep resumes]. Running the same sweep again continues it. A run directory whose
// summary.json says its last epoch is done is skipped; one with a checkpoint resumes from it
// (`train --resume`, Note [resume reproduces the run] in trainer.h); one without (stopped in its
// first epoch) starts over. Each directory holds sweep.json: the config, seed and overrides it was
// started with and the settings they resolve to. A directory whose settings differ from this
// sweep's, or that no sweep started, is an error before anything runs: results of different
// settings never mix under one name.

#include <cstdint>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

namespace tl {

/// One run of a sweep.
struct SweepRun {
  std::string config;  // the INI file
  int64_t seed = 0;
  std::string name;  // STEM.seedN
  std::string dir;   // OUT/name
};

/// "1,2,3", "1-3" or a mix ("0,5-7"): distinct integers >= 0, in the order given. Errors name the text.
std::vector<int64_t> parse_seeds(const std::string& text);

/// The runs of configs x seeds, config by config. Errors (std::invalid_argument) before anything
/// runs: no config or seed, a config that does not exist or does not load (with the overrides and
/// the seed), two configs of the same file name.
std::vector<SweepRun> plan_sweep(const std::vector<std::string>& configs, const std::vector<int64_t>& seeds,
                                 const std::string& out_dir,
                                 const std::vector<std::pair<std::string, std::string>>& overrides);

/// What the sweep does with a run directory (Note [a sweep resumes]).
enum class RunState { kNew, kFinished, kResume, kRestart };
RunState run_state(const std::string& dir);

/// The default number of runs at a time: half the cores (each run uses two threads), at least 1.
int default_jobs();

struct SweepOptions {
  std::vector<std::string> configs;
  std::vector<int64_t> seeds;
  std::string out_dir;
  std::vector<std::pair<std::string, std::string>> overrides;  // --section.key=value for every run
  int jobs = 0;                                                // 0: default_jobs()
  std::string executable;                                      // tapeline; empty: this process's own
  int64_t stop_after_epochs = 0;  // > 0: each run stops after this many epochs (a later sweep resumes it)
  bool plot = true;               // false: no curves.png per run (train --no-plot)
  int report_every_s = 60;        // seconds between lines showing each running run's latest log line
};

/// Runs every run that is not finished, `jobs` at a time, each child's output in DIR/train.log;
/// progress lines to `log`: one per start and end, and every report_every_s each running run's
/// latest log line. Returns the number of runs that failed (a run
/// stopped by stop_after_epochs has not failed).
int run_sweep(const SweepOptions& options, std::ostream& log);

}  // namespace tl
