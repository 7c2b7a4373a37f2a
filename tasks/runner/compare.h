#pragma once
// Comparing finished runs: the table of `tapeline compare RUN_DIR...`, and the figures drawn by
// the Python module python/tapeline_plots.py (matplotlib) for `tapeline compare --plot DIR` and
// for the curves.png every `tapeline train` run writes.
//
// Run directories are read by name, not by position: summary.json's keys and metrics.csv's
// columns, in the task-generic schema (test_metric_compressed, "task", "metric",
// "higher_is_better", ...) and in the first vision schema (test_acc_compressed, no task: read as
// task "vision", metric "accuracy", higher is better).
//
// Note [plots from C++]. The C++ side never writes plot files itself. It runs the plot module as
// a script with the first interpreter that has matplotlib: $TAPELINE_PYTHON if set, else
// `python3` on PATH, then /usr/bin/python3 (Debian's python3-matplotlib installs for Debian's
// interpreter, which a pyenv or venv python3 first on PATH does not see). The module is found at
// $TAPELINE_PLOTS, else python/tapeline_plots.py of the source tree this was built from, else in a
// `python/` folder of an ancestor of the executable's directory. When none of that works the
// figure is skipped with a note; a training run never fails because of a plot.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tasks/runner/report.h"

namespace tl {

/// What `tapeline compare` shows of one run directory.
struct RunRecord {
  std::string dir;    // as given
  std::string label;  // the directory's name (summary "name" if the directory has none)
  std::string task = "vision";
  std::string metric = "accuracy";
  bool higher_is_better = true;
  std::string config;                 // path of the config the run was started from
  std::string forward, backward;      // boundary specs
  std::string fingerprint;            // settings other than the boundaries (empty: unknown)
  int64_t epochs = 0, last_epoch = 0;  // planned, finished
  std::optional<double> metric_on, metric_off;  // final test metric, compression on / off
  double bytes_per_step = 0.0, uncompressed_bytes_per_step = 0.0;  // of the last epoch, both directions
  double wall_s = 0.0;                                             // cumulative wall time
  std::optional<double> target;            // summary "target" when > 0 (0: none set)
  std::optional<double> time_to_target_s;  // training time until the metric (compression on) first reached
                                           // the target; unset when not reached (the summary's -1)
  std::optional<int64_t> steps_to_target;  // optimizer steps until then (summaries that record it)
  std::optional<double> time_per_step_s;   // the run's train_time_s / its steps (summaries that record them)
  std::string timeline_device = "measured";  // timeline.device of the run (what its train_time_s counts)

  // Read from RUN_DIR/config.ini when it loads (read_run_record); empty / unset otherwise.
  std::optional<int64_t> seed;      // run.seed
  std::string settings;             // hash of every setting but run.seed and presentation keys, boundaries
                                    // included: runs equal in it are seeds of one config
  std::string seedless_fingerprint;  // config_fingerprint with run.seed = 0 (settings besides the boundaries)

  /// One row of metrics.csv: what time to target is computed from.
  struct Epoch {
    int64_t epoch = 0, steps = 0;          // steps: cumulative optimizer steps at the end of the epoch
    std::optional<double> metric_on;       // test metric, compression on
    std::optional<double> train_time_s;    // cumulative, on the run's timeline
    std::optional<double> train_loss;
  };
  std::vector<Epoch> history;  // metrics.csv, in order (empty without one)
};

/// The record of a run this process has just trained (the table at the end of `tapeline train`).
RunRecord run_record(const RunSummary& s, const std::string& label, const std::string& dir = "");

/// Reads RUN_DIR/summary.json (required) and RUN_DIR/metrics.csv (optional: the last row fills
/// what the summary lacks). A missing or malformed file is an error naming it and what was expected.
RunRecord read_run_record(const std::string& dir);

/// The table and the notes under it (runs that do not compare, unfinished runs).
struct Comparison {
  std::string table;
  std::vector<std::string> notes;
};
/// Columns: run, task / config, compression fwd / bwd, final metric with compression on and off,
/// bytes per step, ratio to uncompressed, wall time, time to target. Runs of different tasks or
/// metrics, or with different fingerprints (settings besides the boundaries), are said not to compare.
Comparison compare_runs(const std::vector<RunRecord>& runs);

/// Outcome of a plot request.
struct PlotResult {
  bool written = false;            // the figures exist
  bool missing_matplotlib = false;  // skipped: no interpreter with matplotlib (or no plot module)
  std::vector<std::string> files;  // paths written
  std::string note;                // why nothing was written (empty when written)
};

/// Writes RUN_DIR/curves.png (metric per epoch on/off, training loss per step, relative error and
/// density over training). Never throws: returns false and sets *note (when given) to one line
/// saying why it was skipped or failed. Called at the end of every `tapeline train`.
bool write_run_plot(const std::string& run_dir, std::string* note);

/// Writes OUT_DIR/{metric_per_epoch,frontier,train_loss,boundary_stats}.{png,svg} for the runs.
/// Never throws.
PlotResult write_compare_plots(const std::vector<std::string>& run_dirs, const std::string& out_dir);

// ---- seeds of one config (`tapeline compare` over a `tapeline sweep`) --------------------------------

/// t_{0.975, df}: the two-sided 95% quantile of Student's t with `df` >= 1 degrees of freedom.
double student_t95(int64_t df);

/// Mean and the half-width of its 95% confidence interval (Student t, n - 1 degrees of freedom).
struct MeanCI {
  int64_t n = 0;
  double mean = 0.0;
  std::optional<double> half_width;  // unset when n < 2 ("n=1, no interval")
};
MeanCI mean_ci(const std::vector<double>& xs);

/// What `compare --plan` reads of a plan.json written by `tapeline plan`: `step_s`, the planned
/// seconds of one optimizer step (required, > 0); `device` and `config` are shown when present.
struct PlannedStep {
  std::string file;
  double step_s = 0.0;
  std::string device, config;
};
/// Errors name the file and the field.
PlannedStep read_plan(const std::string& path);

struct SeedOptions {
  std::optional<double> target;  // --target: overrides the runs' train.target
  std::string target_from;       // --target-from GROUP: its mean final metric (compression on) ...
  double target_delta = 0.0;     // ... plus this (--target-delta, e.g. -0.01: one point of accuracy)
  std::vector<std::pair<std::string, PlannedStep>> plans;  // group label ("" = every other group) -> plan
};

/// The seeds of one config: every statistic is a MeanCI over its runs.
struct SeedGroup {
  std::string label;  // the runs' common name without its seed suffix (sweep: NAME.seedN), else the config's
  std::string task, metric, config, forward, backward, timeline_device;
  bool higher_is_better = true;
  std::vector<std::string> dirs;
  std::vector<std::optional<int64_t>> seeds;  // per run (unset: unknown)
  MeanCI metric_on, metric_off, train_loss, bytes_per_step, time_per_step_s, wall_s;
  std::optional<double> target;
  std::vector<std::string> missed;   // runs that did not reach the target (label and their last step)
  std::vector<std::string> unfinished;
  MeanCI steps_to_target, time_to_target_s;  // over the runs that reached it (n = how many)
  std::optional<PlannedStep> plan;
  MeanCI planned_time_to_target_s;  // steps to target (measured) x plan.step_s (modelled)
};

struct SeedComparison {
  std::vector<SeedGroup> groups;
  std::string table;
  std::vector<std::string> notes;  // what is measured and what modelled, misses, n=1, duplicates
  std::string json;                // the groups as JSON (what the error-bar figures are drawn from)
};
/// Groups runs by their settings without run.seed (RunRecord::settings), in first-seen order, and
/// aggregates each group. Targets per run: --target, else --target-from, else the run's train.target;
/// steps and time to it are read from metrics.csv (the first epoch whose metric, compression on,
/// reaches it). Bad options (an unknown --target-from group, a plan for no group) are errors naming them.
SeedComparison compare_seeds(const std::vector<RunRecord>& runs, const SeedOptions& options);

/// Writes OUT_DIR/seeds.json and the error-bar figures OUT_DIR/seeds.{png,svg} (mean final metric,
/// steps to target and time to target per config, 95% intervals). Never throws.
PlotResult write_seed_plots(const SeedComparison& seeds, const std::string& out_dir);

/// The plot module's path (see Note [plots from C++]), or empty when it cannot be found.
std::string plot_module_path();

}  // namespace tl
