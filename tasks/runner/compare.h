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

/// The plot module's path (see Note [plots from C++]), or empty when it cannot be found.
std::string plot_module_path();

}  // namespace tl
