#pragma once
// What a run writes and shows: per-epoch metrics (metrics.csv), per-step log lines
// (metrics.jsonl), the final summary (summary.json), the progress display, and the comparison
// table printed at the end of `tapeline train`. Files are replaced atomically (temp + rename).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "parallel/step.h"

namespace tl {

/// One boundary's share of an epoch (metrics.jsonl's "boundaries" list).
struct BoundaryMetrics {
  int64_t index = 0;  // 1-based, as boundary.N
  int64_t bytes_forward = 0, bytes_backward = 0;
  double forward_rel_error = 0.0, backward_rel_error = 0.0;
  double forward_density = 1.0, backward_density = 1.0;
};

struct EpochMetrics {
  int64_t epoch = 0;           // 1-based
  double train_loss = 0.0;     // mean over the epoch's loss units (samples or tokens)
  double train_metric = 0.0;   // the task's metric on the training steps (accuracy, perplexity)
  double test_loss_compressed = 0.0, test_loss_uncompressed = 0.0;
  double test_metric_compressed = 0.0;    // boundaries active (compression on)
  double test_metric_uncompressed = 0.0;  // boundaries bypassed (compression off)
  int64_t bytes_forward = 0;              // sent forward by all boundaries during the epoch's training steps
  int64_t bytes_backward = 0;             // sent backward
  int64_t bytes_uncompressed = 0;         // what forward + backward would have sent uncompressed
  int64_t bytes_dp = 0;                   // data-parallel gradient messages, all ranks (parallel.dp > 1)
  int64_t bytes_dp_uncompressed = 0;      // what they would have been uncompressed
  int64_t bytes_tp = 0;                   // tensor-parallel all-reduce messages, all ranks (parallel.tp > 1)
  int64_t bytes_tp_uncompressed = 0;      // what they would have been uncompressed (float32)
  int64_t steps = 0;                      // optimizer steps in the epoch
  double lr = 0.0;                        // at the end of the epoch
  double wall_s = 0.0;                    // cumulative wall time of the run at the end of the epoch
  // The pipeline's timeline (parallel/executor.h): in-process, each stage's clock advanced by its
  // compute (measured, or modelled on timeline.device) and by emulated link delivery;
  // multi-process, real time. Evaluation excluded.
  double train_time_s = 0.0;  // cumulative training time of the run at the end of the epoch
  double compute_s = 0.0;     // this epoch: time a stage spent computing (mean over stages)
  double comm_s = 0.0;        // this epoch: time a stage waited for messages (mean over stages)
  double bubble = 0.0;        // this epoch: idle fraction of the stages, 1 - compute / (stages x time)
  // This epoch, per rank (per process of a multi-process run, per pipeline rank in process):
  // compute_s and comm_s before the mean (metrics.jsonl's "rank_times" only).
  std::vector<double> rank_compute_s, rank_comm_s;
  // Mean over the epoch's messages of ||x - x^|| / ||x|| and of the fraction of nonzero entries
  // of what was received, forward and backward (metrics.jsonl only; 0 and 1 where uncompressed).
  double forward_rel_error = 0.0, backward_rel_error = 0.0;
  double forward_density = 1.0, backward_density = 1.0;
  std::vector<BoundaryMetrics> boundaries;  // metrics.jsonl only
};

/// The header and rows of metrics.csv: epoch, train_loss, train_metric, test_loss_compressed,
/// test_loss_uncompressed, test_metric_compressed, test_metric_uncompressed, bytes_forward,
/// bytes_backward, bytes_uncompressed, steps, lr, wall_s, train_time_s, compute_s, comm_s, bubble,
/// bytes_dp, bytes_dp_uncompressed (the last two optional when read: files written before them).
std::string metrics_csv(const std::vector<EpochMetrics>& rows);
/// Reads metrics.csv back by column name (other columns are ignored); a malformed file or a
/// missing column is an error naming the file.
std::vector<EpochMetrics> read_metrics_csv(const std::string& path);

/// levels.csv (runs with adaptive codecs; LevelRow in parallel/step.h):
/// "step,epoch,boundary,direction,level,label,bytes" and one row (no newline).
std::string levels_csv_header();
std::string levels_csv_row(const LevelRow& row);

/// summary.json content: the last epoch's metrics plus run information.
struct RunSummary {
  std::string name;               // the run directory's name
  std::string config;             // path of the config it was started from
  std::string task = "vision";    // task.name
  std::string metric = "accuracy";
  bool higher_is_better = true;
  std::string forward, backward;  // boundary specs (of [boundary]) for the table
  int64_t stages = 1;
  int64_t epochs = 0;
  int64_t train_samples = 0, test_samples = 0;
  std::string fingerprint;  // the settings a baseline must share to be comparable (see trainer)
  double target = 0;               // train.target (0: none)
  std::string timeline_device = "measured";  // timeline.device: what train_time_s counts compute as
  double time_to_target_s = -1;    // train_time_s when the test metric (compression on) first reached it; -1: not
  double wall_to_target_s = -1;    // the same in wall time
  int64_t steps_to_target = -1;    // optimizer steps up to the end of that epoch; -1: not reached
  int64_t steps = 0;               // optimizer steps of the whole run
  /// train_time_s / steps over the whole run (0 when unknown).
  double time_per_step_s() const { return steps > 0 ? last.train_time_s / double(steps) : 0.0; }
  EpochMetrics last;
  std::vector<int64_t> peak_rss_bytes;  // peak resident memory of each rank (one entry in process)
  std::vector<int64_t> parameter_bytes;  // each rank's parameters (its stages and codec weights)
  std::vector<int64_t> optimizer_bytes;  // each rank's optimizer state
  double bytes_per_step() const;  // (forward + backward) / steps of the last epoch
  double uncompressed_bytes_per_step() const;
};
std::string summary_json(const RunSummary& s);
/// nullopt when the file does not exist; error when it exists but is malformed.
std::optional<RunSummary> read_summary_json(const std::string& path);

/// A metric value as shown in tables: accuracy in percent, perplexity as a number.
std::string format_metric(const std::string& metric, double value);

/// Writes `content` to `path` through a temporary file in the same directory and a rename.
void write_file_atomic(const std::string& path, const std::string& content);
/// Appends one line (a '\n' is added).
void append_line(const std::string& path, const std::string& line);

/// "1.23 MB", "512 B", ...
std::string human_bytes(double bytes);

/// Progress display. Mode bar: one line redrawn with \r (a terminal); plain: a line every call of
/// line(); none: silent. Resolved from run.progress ("auto": bar on a terminal unless CI=true).
class Progress {
 public:
  enum class Mode { kBar, kPlain, kNone };
  static Mode resolve(const std::string& setting);

  explicit Progress(Mode mode) : mode_(mode) {}
  Mode mode() const { return mode_; }
  /// Redraws the bar (bar mode only): epoch e/E, step s/S, loss, throughput in `unit` per second
  /// (e.g. "img", "tok").
  void bar(int64_t epoch, int64_t epochs, int64_t step, int64_t steps, double loss, double rate, const std::string& unit);
  /// A line of its own (after clearing a bar in progress); not shown in mode none.
  void line(const std::string& text);

 private:
  Mode mode_;
  bool bar_open_ = false;
};

}  // namespace tl
