#pragma once
// Executor: the one seam of a training step. The runner (tasks/runner/) assembles a run, picks
// one executor for it, and from then on asks only this interface: train a step, clip, evaluate,
// close an epoch, gather the codecs' levels, save and restore checkpoints. Two implementations:
//
//   LocalExecutor (parallel/local_executor.h)   every stage in this process, on a virtual timeline
//   DistExecutor  (parallel/ranks/runtime.h)    this rank's stages of a P x D x T grid of processes
//
// Both run the one schedule interpreter (parallel/interpreter.h) over a Channel, with the step's
// lowered action lists made once per (schedule, layout, micro-batches) and kept (Note [plans are
// made once]: cached_schedule in parallel/schedule.h), and so are the interpreters and channels
// that run them (Note [interpreters are kept] in parallel/interpreter.h). The Pipeline
// (parallel/pipeline.h) is the model, its cuts and its boundaries, and nothing of running: what
// runs it, and how (schedule, placement, links, device model), lives here.
//
// Note [plans are made once]. Lowering a schedule (parallel/schedule.h: generate the compute
// actions, insert sends and receives, order them, compute slacks for the epilogue flags) costs
// more than a small model's step; a step changes none of its inputs except, for the last batch
// of an epoch, the number of micro-batches. The executors take their lists from
// cached_schedule, which lowers each (schedule, layout, micro-batches) once per process, and keep
// the interpreters they make for them.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "compression/boundary.h"
#include "layers/io/checkpoint.h"
#include "layers/optim/optimizer.h"
#include "parallel/batch.h"
#include "parallel/device_model.h"
#include "parallel/link.h"
#include "parallel/schedule.h"
#include "parallel/step.h"

namespace tl {

class Pipeline;

/// How the stages run: what an executor takes once, when a run is assembled.
struct ScheduleSettings {
  std::string schedule = "1f1b";  // a name of the registry (schedule_kinds() in parallel/schedule.h)
  int virtual_stages = 1;         // stages per pipeline rank (pipeline.virtual_stages)
  std::vector<LinkSpec> links;    // one per boundary (emulated links); empty: ideal links
  DeviceModel device;             // the compute the in-process timeline models; default "measured"
  LinkModel link_model = LinkModel::Pipelined;  // how in-process links charge messages (parallel/link.h)
  /// Where `stages` stages live under these settings (virtual stages per rank, placed as the
  /// schedule needs: a V for zbv, round robin otherwise). Errors name the key and what fits.
  StageLayout layout(int stages) const;
};

/// Bytes of a collective kind (data- or tensor-parallel) over an epoch.
struct ExchangeBytes {
  int64_t messages = 0;
  int64_t bytes = 0;      // payload bytes sent
  int64_t raw_bytes = 0;  // the same messages uncompressed
};

/// What one rank measured over an epoch, handed to Executor::finish_epoch.
struct RankEpoch {
  double train_time_s = 0, compute_s = 0, comm_s = 0;  // summed over the epoch's steps
  int64_t optimizer_bytes = 0;                         // this rank's optimizer state
};

/// An epoch's totals over every rank (rank 0; other ranks get empty vectors).
struct EpochTotals {
  std::vector<BoundaryStats> boundaries;                // per boundary, summed over the ranks that sent
  std::vector<double> train_time_s, compute_s, comm_s;  // per rank (one entry in process)
  ExchangeBytes data_parallel, tensor_parallel;         // summed over the ranks
  std::vector<int64_t> peak_rss_bytes;                  // per rank: peak resident memory so far
  std::vector<int64_t> parameter_bytes;                 // per rank: its parameters (stages, codecs)
  std::vector<int64_t> optimizer_bytes;                 // per rank: its optimizer state
};

class Executor {
 public:
  virtual ~Executor() = default;

  /// This process's rank in the world and the world's size (0 and 1 in process).
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  /// Where the stages live (pipeline ranks, virtual stages, placement).
  virtual const StageLayout& layout() const = 0;
  /// Whether this process built only some stages (checkpoints then load this rank's part).
  virtual bool holds_part() const = 0;
  /// Parameters of the whole model (every rank's stages, tied ones once).
  virtual int64_t model_parameters() const = 0;

  /// One training step of `batch` (the global batch; every rank passes the same) split into
  /// `micro_batches`. Gradients of the mean loss over the batch's units accumulate into the
  /// parameters this process holds (tied parameters and replicas summed); the caller zeroes them
  /// before and steps after. Returns the step's result over every rank; `timing`, when given,
  /// receives this process's timeline (one entry per pipeline rank it runs).
  virtual StepResult train_step(const Batch& batch, int64_t micro_batches, const StepPosition& at,
                                StepTiming* timing = nullptr) = 0;
  /// clip_grad_norm over the whole model's gradients (each parameter counted once, summed in the
  /// order one process sums Pipeline::parameters()); returns the global norm.
  virtual double clip_grad_norm(double max_norm, int64_t step) = 0;
  /// The summed tally of evaluation batches 0 .. count - 1 (`batch_at(i)`, on the run's device),
  /// forward only, with the boundaries' forward codecs on (`compression`) or bypassed; every rank
  /// gets the sum.
  virtual Tally evaluate(int64_t count, const std::function<Batch(int64_t)>& batch_at, bool compression) = 0;

  /// End of an epoch: every rank's measurements and statistics, collected on rank 0 (which also
  /// checks that replicas agree). Resets the collectives' statistics; the boundaries' are the
  /// caller's to reset.
  virtual EpochTotals finish_epoch(const RankEpoch& mine, int64_t epoch) = 0;
  /// levels.csv rows of an epoch: this process's rows (what its codecs sent), merged over the
  /// ranks on rank 0 as one process would report them; empty on other ranks.
  virtual std::vector<LevelRow> gather_levels(std::vector<LevelRow> mine, int64_t epoch) = 0;

  /// Marks the current state as the one every rank agrees on (after building or resuming: Note
  /// [one checkpoint] in parallel/ranks/runtime.h).
  virtual void synchronized(const Optimizer& optimizer) = 0;
  /// Writes `contents` (this process's view) as one checkpoint at `path`, atomically (collective
  /// across processes: rank 0 writes what every rank holds).
  virtual void save_checkpoint(const std::string& path, const CheckpointContents& contents) = 0;
  /// After the checkpoint's ordinary entries were loaded: restores what is this rank's own (Note
  /// [grid state in checkpoints]); returns "" or what the run could not restore exactly.
  virtual std::string restore_rank_state(const std::string& path) = 0;
};

/// This process's peak resident memory (getrusage's ru_maxrss), in bytes.
int64_t peak_resident_bytes();
/// Bytes of a module's parameters, and of an optimizer's state (every slot of every parameter).
int64_t parameter_bytes(const Module& module);
int64_t optimizer_state_bytes(const Optimizer& optimizer);

/// The emulated link of each directed pair of pipeline ranks that exchange messages, from the
/// boundaries' link specs (boundary b joins the ranks of stages b and b + 1; both directions use
/// its spec). Boundaries that share a pair of ranks (interleaved) must agree: an error names them.
std::map<std::pair<int, int>, LinkSpec> link_specs_by_rank_pair(const StageLayout& layout,
                                                                const std::vector<LinkSpec>& boundary_links);

}  // namespace tl
