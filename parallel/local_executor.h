#pragma once
// LocalExecutor: every stage of a Pipeline in this process (parallel/executor.h's in-process
// implementation). One RankInterpreter per pipeline rank over a LocalChannel, taking turns; a
// rank whose next action is a receive waits for the message. Messages are real payloads; with
// link specs set, each boundary is emulated as a Link on a virtual timeline: every rank has its
// own clock, advanced by the measured duration of its compute actions (or the modelled one, with
// a device model) and by waits for deliveries, so the step time is what a pipeline of processes on
// such links would take, while the run stays sequential and bit-reproducible.

#include <map>
#include <memory>
#include <vector>

#include "parallel/executor.h"
#include "parallel/pipeline.h"
#include "parallel/stage_runtime.h"

namespace tl {

class LocalExecutor : public Executor {
 public:
  /// Runs `pipeline` under `settings` (schedule, virtual stages, links, device model); `loss_fn`:
  /// the task's loss of the last stage's output. Errors name a schedule, placement or link setting
  /// that does not fit the pipeline's stages.
  LocalExecutor(Pipeline& pipeline, LossFn loss_fn, ScheduleSettings settings = {});
  ~LocalExecutor() override;

  /// With a device model: whether the timeline advances by the modelled seconds (default: step
  /// times do not depend on this machine) or by the measured ones (calibration: StepTiming has
  /// both).
  void set_model_drives_clock(bool on) { model_clock_ = on; }
  const ScheduleSettings& settings() const { return settings_; }
  /// Timing of the last train_step on the timeline (one entry per pipeline rank).
  const StepTiming& last_timing() const;
  /// What each emulated link carried in the last train_step: bytes, messages, and the seconds it
  /// spent transmitting them (busy; latency not included).
  struct LinkUse {
    int src = 0, dst = 0;  // pipeline ranks
    LinkSpec spec;
    int64_t bytes = 0, messages = 0;
    double busy_s = 0;
  };
  const std::vector<LinkUse>& last_links() const { return links_used_; }

  /// The task's tally (loss_fn's) of one evaluation batch run forward through every stage, the
  /// boundaries' forward codecs on (`compression`) or bypassed (the inference toggle).
  at::Tensor evaluate_batch(const Batch& batch, bool compression);

  // ---- Executor ----------------------------------------------------------------------------------
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  const StageLayout& layout() const override { return layout_; }
  bool holds_part() const override { return false; }
  int64_t model_parameters() const override;
  StepResult train_step(const Batch& batch, int64_t micro_batches, const StepPosition& at,
                        StepTiming* timing = nullptr) override;
  double clip_grad_norm(double max_norm, int64_t step) override;
  Tally evaluate(int64_t count, const std::function<Batch(int64_t)>& batch_at, bool compression) override;
  EpochTotals finish_epoch(const RankEpoch& mine, int64_t epoch) override;
  std::vector<LevelRow> gather_levels(std::vector<LevelRow> mine, int64_t epoch) override { return mine; }
  /// One process: nothing to agree on.
  void synchronized(const Optimizer& optimizer) override {}
  void save_checkpoint(const std::string& path, const CheckpointContents& contents) override;
  /// One process: the checkpoint's ordinary entries are all its state.
  std::string restore_rank_state(const std::string& path) override { return ""; }

 private:
  // The ranks of one action list set: a channel and an interpreter per pipeline rank over it, made
  // once and kept (Note [interpreters are kept] in parallel/interpreter.h).
  struct Ranks;
  Ranks& ranks_for(int micro_batches);
  Ranks& evaluation_ranks();

  Pipeline& pipeline_;
  LossFn loss_fn_;
  ScheduleSettings settings_;
  StageLayout layout_;
  std::map<std::pair<int, int>, LinkSpec> links_;  // by (sender, receiver) pipeline rank
  // The pipeline's parameters, listed once (a walk of the module tree that names each one costs
  // a small model's step a few microseconds: bench_pipeline --overhead); the set is fixed once
  // the pipeline is built (to() and checkpoints change their data, not the variables).
  std::vector<Variable> parameters_;
  bool model_clock_ = true;
  StepTiming timing_;
  std::vector<LinkUse> links_used_;
  bool stepped_ = false;
  std::map<int, std::unique_ptr<Ranks>> train_ranks_;  // by micro-batches of the step
  std::unique_ptr<Ranks> evaluation_ranks_;
};

}  // namespace tl
