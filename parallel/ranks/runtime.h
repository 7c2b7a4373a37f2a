#pragma once
// DistExecutor: the multi-process implementation of the step's seam (parallel/executor.h): this
// rank's stages of a multi-process pipeline (one process per pipeline rank, holding stage = rank,
// or with pipeline.virtual_stages = v the stages rank, rank + P, ...), running the one schedule
// interpreter (parallel/interpreter.h) that the in-process LocalExecutor runs,
// over a C10dChannel (c10d_channel.h) instead of in-memory queues. With parallel.dp = D the world
// is a grid of D replicas of the P-rank pipeline (parallel/grid.h, Note [rank layout]).
//
// Note [data parallelism]. Replica d runs micro-batches [d M / D, (d + 1) M / D) of every step's M
// (the global batch and the learning dynamics do not change with D). The step's tally and loss
// units are summed over the replicas, so every replica scales its gradients by the same 1 / units;
// tied parameters are then summed over every rank holding them (all replicas), and each stage's
// other gradients over its data-parallel group (DataParallelSync, data_parallel.h: uncompressed or
// through dp.compression), so all replicas step identically. BatchNorm's running statistics
// become the replicas' mean (one process would have updated them micro-batch after micro-batch:
// the evaluation of a D-replica run with BatchNorm is close to, not equal to, one process's; the
// training numbers are unaffected, as training normalises by the micro-batch's own statistics).
// Evaluation batches are shared out among the replicas (batch i to replica i % D) and the tallies
// summed. The metrics and the checkpoint are replica 0's, after every epoch checks that the
// replicas' stages are bitwise equal (an error naming the pipeline rank and the replica if not).
// Each replica keeps its own boundary codec state (EF residuals, ...) and its own data-parallel
// codec state; the checkpoint holds them all (Note [grid state in checkpoints]).
//
// Note [grid state in checkpoints]. The checkpoint's ordinary entries are replica 0's state, so
// one process, `tapeline eval` and any grid read it. What differs between the ranks of a grid is
// kept beside it under grid.* (only with D > 1: a one-replica checkpoint is byte for byte the
// in-process one): grid.shape = (P, D, virtual stages, placement); grid.replica<d>.<entry>, the
// boundary codec state of replica d > 0 that it changed (or restored); grid.dp.<p>.<d>.<entry>,
// every rank's data-parallel codec state. Resuming with the same grid restores each rank's own, so
// stateful codecs resume exactly; another grid shape continues every replica from replica 0's
// boundary codec state and dp.compression's from zero, and says so.
//
// Every rank builds the same Pipeline from the same config and seed, but only its own stages'
// modules (Note [building only some stages] in layers/models/splittable.h; the other stages are
// empty), and runs only its own stages. Its optimizer holds those stages' parameters and the
// boundaries' learned codec weights it uses. At construction every rank learns, from every other,
// which rank holds which parameter and buffer (Note [the grid's parameters]). What crosses
// between ranks:
//   - per micro-batch, the Boundary's real payloads: activations forward, gradients backward
//     (none in backward mode none: both ends know it from the config and skip the message);
//   - per step: the last stage's tally (loss sum, units, correct) broadcast to every rank, the
//     gradients of tied parameters summed between the ranks that hold them (GPT-2's wte on the
//     first and last stage, as Megatron does), and, with gradient clipping, the squared norm;
//   - per evaluation batch, the forward activations; per evaluation, the tally;
//   - per epoch, each rank's timings and boundary statistics, gathered to rank 0;
//   - per checkpoint, each rank's part of the state, gathered to rank 0 (Note [one checkpoint]).
//
// Note [same numbers as in process]. A rank runs exactly the ops its stage runs in process, in the
// order of its action list, and the codecs see their messages in the order of Note [codec state
// order]; payloads are lossless byte copies. So on CPU, with the same thread count, a run of N
// processes is bit-identical to the in-process run of the same schedule, with one documented
// exception, where a sum is formed in another order and results agree to rounding only: tied
// parameters (in process both stages accumulate into one gradient micro-batch by micro-batch;
// here each rank sums its own part, then the two parts are added). Gradient clipping is exact:
// every rank gets every parameter's norm and forms the total as the in-process clip does over
// Pipeline::parameters().
//
// Note [one checkpoint]. Rank 0 writes one checkpoint in the same format as an in-process run's
// (so `tapeline eval`, `compare` and resuming with any number of processes read it), assembled
// from every rank's contents: model parameters and buffers from the rank of the (first) stage
// that holds them, optimizer state likewise by parameter, and everything else (the boundaries'
// codec state and learned weights, their optimizer state) from the rank that changed it since
// the ranks were last identical (the start of the run or the resume: synchronized()). Every rank
// keeps that reference copy of the codec state. A codec entry changed on two ranks must be equal
// on both (mirrored state); if not, saving fails with the entry's name, rather than writing one
// side's view. Schedule counters are identical on every rank; the default RNG state is rank 0's
// (nothing in training draws from it: models and codecs own their generators).

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "layers/io/checkpoint.h"
#include "parallel/ranks/data_parallel.h"
#include "parallel/ranks/grid_checkpoint.h"
#include "parallel/ranks/tensor_parallel.h"
#include "parallel/ranks/transport.h"
#include "parallel/executor.h"
#include "parallel/stage_runtime.h"
#include "parallel/grid.h"

namespace tl::ranks {

/// Before training, with every rank's model built in part (Note [building only some stages]): one
/// forward-only pass of `batch` (a couple of training samples) through each replica's pipeline in
/// eval mode, codecs on. It checks that the model accepts the task's batches and lets codecs that
/// size their weights at their first input (ae with d = 0) create them on the ranks that use them,
/// before the optimizer collects the parameters. Collective over the world.
void run_probe(Pipeline& pipeline, const StageLayout& layout, Transport& transport, int replicas, const Batch& batch,
               const LossFn& loss_fn, int tensor = 1);

class DistExecutor : public Executor {
 public:
  /// Pipeline rank, replica and tensor rank from transport.rank() (Note [rank layout]), the stages'
  /// placement from `settings` (its links are emulated by the transport, at the receiver). `tp`:
  /// the tensor-parallel group's communicator when parallel.tp > 1 (its blocks already split),
  /// else null. Error when the world size is not (stages / virtual stages) x dp.replicas x T, or
  /// dp.compression cannot compress gradients.
  DistExecutor(Pipeline& pipeline, Transport& transport, LossFn loss_fn, const ScheduleSettings& settings,
               const DataParallelOptions& dp = {}, TensorParallelSync* tp = nullptr);
  ~DistExecutor() override;

  /// Pipeline rank (0 .. P - 1), replica (0 .. D - 1) and tensor rank (0 .. T - 1) of this process.
  int pipeline_rank() const { return rank_; }
  int replica() const { return replica_; }
  int tensor_rank() const { return tensor_rank_; }
  const Grid& grid() const { return grid_; }
  /// Whether this rank holds the last stage.
  bool last() const { return layout_.rank_of(layout_.stages() - 1) == rank_; }
  /// Whether this replica evaluates evaluation batch `index` (Note [data parallelism]).
  bool evaluates(int64_t index) const { return index % grid_.data == replica_; }

  // ---- Executor ----------------------------------------------------------------------------------
  int rank() const override { return transport_.rank(); }
  int world_size() const override { return transport_.world_size(); }
  const StageLayout& layout() const override { return layout_; }
  bool holds_part() const override { return true; }
  /// Parameters of the whole model (every rank's stages, tied ones once; Note [the grid's
  /// parameters]).
  int64_t model_parameters() const override { return model_parameters_; }

  /// This rank's share of one training step: every rank passes the same (global) batch; this
  /// replica runs its share of the micro-batches. Returns the step's result (over every replica,
  /// on every rank). `at.step` is the global step, used in message tags and error messages.
  /// Gradients (of the mean loss over the batch's units, tied parameters summed between their
  /// ranks, the rest over the replicas) accumulate into this stage's parameters. timing: this
  /// rank's step (compute_s and comm_s have one entry; the data-parallel exchange counts as comm).
  StepResult train_step(const Batch& batch, int64_t micro_batches, const StepPosition& at,
                        StepTiming* timing = nullptr) override;
  /// clip_grad_norm (layers/optim/grad_utils.h) over the gradients of every rank, each tied
  /// parameter counted once, summed as one process sums Pipeline::parameters(): returns the
  /// global norm and scales this rank's gradients.
  double clip_grad_norm(double max_norm, int64_t step) override;
  /// This replica's share of the evaluation batches (batch i on replica i % D), the tallies summed
  /// over the replicas on every rank.
  Tally evaluate(int64_t count, const std::function<Batch(int64_t)>& batch_at, bool compression) override;

  /// Forward-only pass of evaluation batch `index` with the boundaries' forward codecs on
  /// (`compression`) or bypassed (ScopedInference). Returns the task's tally (loss_fn's, of the
  /// last stage's output) on the last rank, undefined elsewhere.
  at::Tensor evaluate_batch(const Batch& batch, bool compression, int64_t index);
  /// The sum of the last pipeline rank's tallies over the replicas, on every rank (`tally` ignored
  /// elsewhere; undefined: nothing tallied).
  Tally share_tally(const at::Tensor& tally, const std::string& context);

  /// Per-epoch gather to rank 0: each boundary's statistics (forward bytes are counted on the
  /// sending rank, gradient bytes on the next) and each rank's (train time, compute, comm)
  /// seconds. On other ranks the result is empty. Also checks that the replicas of every pipeline
  /// rank hold bitwise equal stages (every rank throws if not, naming the pipeline rank and the
  /// replicas).
  EpochTotals finish_epoch(const RankEpoch& mine, int64_t epoch) override;
  /// Note [levels of a multi-process run].
  std::vector<LevelRow> gather_levels(std::vector<LevelRow> mine, int64_t epoch) override;

  /// Note [one checkpoint]: marks the current state as identical on every rank (after building or
  /// resuming).
  void synchronized(const Optimizer& optimizer) override;
  /// Collective: rank 0 assembles `mine` with the other ranks' parts and writes it to `path`
  /// atomically; other ranks send their part. Every rank returns once rank 0 has written.
  void save_checkpoint(const std::string& path, const CheckpointContents& mine) override;
  /// After loading the checkpoint's ordinary entries (replica 0's state) on resume: this rank's
  /// own state of Note [grid state in checkpoints] (replica d's boundary codec state, this rank's
  /// data-parallel codec state). Returns "" when restored (or when there is nothing per replica),
  /// else why not (a checkpoint of another grid shape): what the run continues from.
  std::string restore_rank_state(const std::string& path) override;

  Transport& transport() { return transport_; }

 private:
  // This rank's training channel and interpreter for a step of some micro-batches, made once and
  // kept (Note [interpreters are kept] in parallel/interpreter.h).
  struct TrainRank;
  TrainRank& train_rank(int micro_batches, at::Device device);

  // Note [the grid's parameters]: what every rank holds, from every rank (collective).
  void learn_structure();
  // Sums the gradients of parameters held by several stages between their ranks.
  void reduce_tied_grads(int64_t step);

  // share_tally, plus the sum of pipeline rank 0's `first_units` over the replicas.
  std::pair<Tally, double> sum_tallies(const at::Tensor& tally, double first_units, const std::string& context);
  // FNV-1a of this rank's stages' parameters and buffers (replica agreement).
  uint64_t stages_hash() const;

  Pipeline& pipeline_;
  Transport& transport_;
  LossFn loss_fn_;
  std::string schedule_;
  Grid grid_;
  int rank_ = 0, replica_ = 0, tensor_rank_ = 0;  // pipeline rank, replica, tensor rank
  TensorParallelSync* tp_ = nullptr;              // T > 1
  std::map<std::string, TensorShard> shards_;     // parameters split over the tensor ranks, by name
  int64_t last_step_ = 0;       // the training step run last, for the errors of evaluation and checkpoints
  at::Device device_ = at::kCPU;  // of the parameters (NCCL reduces device tensors)
  StageLayout layout_;
  std::unique_ptr<DataParallelSync> dp_;       // D > 1
  std::vector<int> ranks_;                     // transport rank of each pipeline rank of this replica
  std::map<std::string, int> owner_;           // pipeline parameter/buffer name -> first rank holding it
  std::vector<std::string> tied_;              // parameters held by several ranks, by name
  std::map<std::string, std::set<int>> held_;  // tied parameter -> ranks holding it
  std::vector<std::string> order_;             // every parameter of the pipeline, in the in-process order
  std::map<std::string, int64_t> slot_;        // name -> index in order_
  std::map<std::string, int64_t> numel_;       // of every parameter (tied ones this rank may not hold)
  int64_t model_parameters_ = 0;
  std::unique_ptr<GridCheckpoint> checkpoint_;  // Note [one checkpoint]
  std::map<int, std::unique_ptr<TrainRank>> train_ranks_;  // by this replica's micro-batches of a step
};

}  // namespace tl::ranks
