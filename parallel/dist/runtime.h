#pragma once
// DistExecutor: this rank's stages of a multi-process pipeline (one process per pipeline rank,
// holding stage = rank, or with pipeline.virtual_stages = v the stages rank, rank + P, ...), running
// the one schedule interpreter (parallel/interpreter.h) that the in-process LocalExecutor runs,
// over a C10dChannel (c10d_channel.h) instead of in-memory queues.
//
// Every rank builds the same Pipeline from the same config and seed (so every rank holds every
// stage's parameters) and runs only its own stage: its optimizer sees gradients only for that
// stage's parameters (and its side of the adjacent boundaries' learned codecs), the others stay
// undefined and are skipped. What crosses between ranks:
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
// every rank gets every parameter's norm and forms the total as the in-process clip does.
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
#include "parallel/dist/transport.h"
#include "parallel/executor.h"

namespace tl::dist {

class DistExecutor {
 public:
  /// Pipeline rank = transport.rank(). Error when the world size is not the number of stages
  /// over the pipeline's virtual stages per rank.
  DistExecutor(Pipeline& pipeline, Transport& transport);

  int rank() const { return rank_; }
  /// Whether this rank holds the last stage.
  bool last() const { return rank_ + 1 == world_; }
  const StageLayout& layout() const { return layout_; }

  /// This rank's share of one training step under `schedule` (gpipe, 1f1b, interleaved): every rank passes
  /// the same batch. Returns the step's result (from the last stage, on every rank). `step` is
  /// the global step, used in message tags and error messages. Gradients (of the mean loss over
  /// the batch's units, tied parameters summed between their ranks) accumulate into this stage's
  /// parameters. timing: this rank's step (compute_s and comm_s have one entry).
  StepResult train_step(const Batch& batch, int64_t micro_batches, const std::string& schedule,
                        const Pipeline::LossFn& loss_fn, int64_t epoch, int64_t step, StepTiming* timing = nullptr);

  /// clip_grad_norm (layers/optim/grad_utils.h) over the gradients of every rank, each tied
  /// parameter counted once: returns the global norm and scales this rank's gradients. `params`:
  /// the optimizer's parameters, in the same order on every rank.
  double clip_grad_norm(const std::vector<Variable>& params, double max_norm, int64_t step);

  /// Forward-only pass of evaluation batch `index` with the boundaries' forward codecs on
  /// (`compression`) or bypassed (ScopedInference). Returns the task's tally (loss_fn's, of the
  /// last stage's output) on the last rank, undefined elsewhere.
  at::Tensor evaluate_batch(const Batch& batch, bool compression, const Pipeline::LossFn& loss_fn, int64_t index);
  /// The last rank's tally on every rank (`tally` ignored elsewhere; undefined: nothing tallied).
  Tally share_tally(const at::Tensor& tally, const std::string& context);

  /// Per-epoch gather to rank 0: each boundary's statistics (forward bytes are counted on the
  /// sending rank, gradient bytes on the next) and each rank's (train time, compute, comm)
  /// seconds. On other ranks the result is empty.
  struct EpochTotals {
    std::vector<BoundaryStats> boundaries;
    std::vector<double> train_time_s, compute_s, comm_s;  // per rank
  };
  EpochTotals gather_epoch(double train_time_s, double compute_s, double comm_s, int64_t epoch);

  /// Note [one checkpoint]: marks the current state as identical on every rank (after building or
  /// resuming).
  void synchronized(const Optimizer& optimizer);
  /// Collective: rank 0 assembles `mine` with the other ranks' parts and writes it to `path`
  /// atomically; other ranks send their part. Every rank returns once rank 0 has written.
  void save_checkpoint(const std::string& path, const CheckpointContents& mine);

  Transport& transport() { return transport_; }

 private:
  // Sums the gradients of parameters held by several stages between their ranks.
  void reduce_tied_grads(int64_t step);
  // Entries of this rank's contents that rank 0 takes from it (Note [one checkpoint]).
  TensorMap part_for_checkpoint(const TensorMap& all) const;
  // -1: not a model/optimizer entry owned by structure; else the owning rank.
  int structural_owner(const std::string& key) const;

  Pipeline& pipeline_;
  Transport& transport_;
  int rank_, world_;
  StageLayout layout_;
  std::vector<int> ranks_;                     // transport rank of each pipeline rank
  std::map<std::string, int> owner_;           // pipeline parameter/buffer name -> first rank holding it
  std::vector<std::string> tied_;              // parameters held by several ranks, by name
  std::map<std::string, std::set<int>> held_;  // tied parameter -> ranks holding it
  TensorMap reference_;                        // codec state when the ranks were last identical
};

}  // namespace tl::dist
