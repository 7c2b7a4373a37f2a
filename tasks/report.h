#pragma once
// What a run writes and shows: per-epoch metrics (metrics.csv), per-step log lines
// (metrics.jsonl), the final summary (summary.json), the progress display, and the comparison
// table printed at the end of `tapeline train`. Files are replaced atomically (temp + rename).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tl {

struct EpochMetrics {
  int64_t epoch = 0;        // 1-based
  double train_loss = 0.0;  // mean over the epoch's samples
  double train_acc = 0.0;
  double test_acc_compressed = 0.0;    // boundaries active (compression on)
  double test_acc_uncompressed = 0.0;  // boundaries bypassed (compression off)
  int64_t bytes_forward = 0;           // sent forward by all boundaries during the epoch's training steps
  int64_t bytes_backward = 0;          // sent backward
  int64_t bytes_uncompressed = 0;      // what forward + backward would have sent uncompressed
  int64_t steps = 0;                   // optimizer steps in the epoch
  double lr = 0.0;                     // at the end of the epoch
  double wall_s = 0.0;                 // cumulative wall time of the run at the end of the epoch
  // Mean over the epoch's messages of ||x - x^|| / ||x|| and of the fraction of nonzero entries
  // of what was received, forward and backward (metrics.jsonl only; 0 and 1 where uncompressed).
  double forward_rel_error = 0.0, backward_rel_error = 0.0;
  double forward_density = 1.0, backward_density = 1.0;
};

/// The header and rows of metrics.csv (epoch,train_loss,test_acc_compressed,
/// test_acc_uncompressed,bytes_forward,bytes_backward,bytes_uncompressed,wall_s,train_acc,steps,lr).
std::string metrics_csv(const std::vector<EpochMetrics>& rows);
/// Reads metrics.csv back; a malformed file is an error naming it.
std::vector<EpochMetrics> read_metrics_csv(const std::string& path);

/// summary.json content: the last epoch's metrics plus run information.
struct RunSummary {
  std::string name;               // the run directory's name
  std::string config;             // path of the config it was started from
  std::string forward, backward;  // boundary specs (of [boundary]) for the table
  int64_t stages = 1;
  int64_t epochs = 0;
  int64_t train_samples = 0, test_samples = 0;
  std::string fingerprint;  // the settings a baseline must share to be comparable (see trainer)
  EpochMetrics last;
  double bytes_per_step() const;  // (forward + backward) / steps of the last epoch
  double uncompressed_bytes_per_step() const;
};
std::string summary_json(const RunSummary& s);
/// nullopt when the file does not exist; error when it exists but is malformed.
std::optional<RunSummary> read_summary_json(const std::string& path);

/// Writes `content` to `path` through a temporary file in the same directory and a rename.
void write_file_atomic(const std::string& path, const std::string& content);
/// Appends one line (a '\n' is added).
void append_line(const std::string& path, const std::string& line);

/// The end-of-run table: one row per run (label, summary).
std::string comparison_table(const std::vector<std::pair<std::string, RunSummary>>& runs);

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
  /// Redraws the bar (bar mode only): epoch e/E, step s/S, loss, images per second.
  void bar(int64_t epoch, int64_t epochs, int64_t step, int64_t steps, double loss, double images_per_s);
  /// A line of its own (after clearing a bar in progress); not shown in mode none.
  void line(const std::string& text);

 private:
  Mode mode_;
  bool bar_open_ = false;
};

}  // namespace tl
