#pragma once
// Training checkpoints: one safetensors file holding everything needed to resume bit-for-bit.
//
// Tensor names (prefix + the component's own state-dict key):
//   model.<name>     Module::state_dict(): parameters and every registered buffer (BatchNorm
//                    statistics, compression state, ...)
//   optim.<key>      Optimizer::state_dict() (state.<param>.<slot>, groups.<g>.<option>)
//   sched.<key>      LRScheduler::state_dict() (step, base_lrs)
//   rng.cpu          the default CPU generator's state (uint8), rng.cuda.<i> for each CUDA device
//   grid.<key>       multi-process runs only: state that differs between the ranks of a grid
//                    (parallel/ranks/runtime.h, Note [grid state in checkpoints]); load_checkpoint
//                    leaves it to the multi-process runtime
// JSON metadata ("__metadata__"): format = tapeline.checkpoint, version = 1, step, epoch,
// optimizer (its name), schedule (its description), and the caller's entries as user.<key>.
//
// save_checkpoint writes atomically (temp file + rename): a failed save leaves an existing file
// untouched. load_checkpoint validates every part against the targets before changing any of
// them, so it either restores everything or throws with nothing changed.

#include <cstdint>
#include <map>
#include <string>

#include "layers/module.h"
#include "layers/optim/optimizer.h"
#include "layers/optim/schedule.h"

namespace tl {

/// Counters and free-form metadata stored with a checkpoint.
struct CheckpointInfo {
  int64_t step = 0;
  int64_t epoch = 0;
  std::map<std::string, std::string> metadata;  // caller's own entries (config, data order, ...)
};

struct CheckpointLoadOptions {
  /// Model: missing or unexpected names are an error (shape mismatches always are).
  bool strict = true;
  /// Restore the CPU (and, where the devices exist, CUDA) generator states.
  bool restore_rng = true;
  /// The targets are part of the checkpointed ones (a rank's stages of a multi-process run): the
  /// checkpoint's model and optimizer entries for modules and parameters they do not have are
  /// skipped; every entry they have must still be there.
  bool part = false;
  /// Tensor parallelism (Note [tensor-parallel blocks]): the target's parameters split over
  /// `tensor_size` ranks (Module::named_shards(), keyed as the model's state_dict). Checkpoints
  /// hold whole tensors; each is cut to rank `tensor_rank`'s part, with its optimizer state of the
  /// same shape.
  std::map<std::string, TensorShard> shards;
  int64_t tensor_rank = 0, tensor_size = 1;
};

/// Saves model (parameters + buffers), optional optimizer and scheduler state, RNG states and
/// `info`. Pass nullptr for parts that do not exist (e.g. evaluation-only snapshots).
void save_checkpoint(const std::string& path, const Module& model, const Optimizer* optimizer,
                     const LRScheduler* scheduler, const CheckpointInfo& info, bool save_rng = true);

/// What save_checkpoint writes, in memory: the named tensors (model.*, optim.*, sched.*, rng.*)
/// and the metadata. Multi-process runs assemble one checkpoint from every rank's contents
/// (parallel/ranks/runtime.h) and write it with write_checkpoint.
struct CheckpointContents {
  TensorMap tensors;
  std::map<std::string, std::string> metadata;
};
CheckpointContents checkpoint_contents(const Module& model, const Optimizer* optimizer, const LRScheduler* scheduler,
                                       const CheckpointInfo& info, bool save_rng = true);
/// Writes `contents` atomically (temp file + rename).
void write_checkpoint(const std::string& path, const CheckpointContents& contents);

/// Restores into the given targets (all validated first; nothing changes on error) and returns the
/// stored counters and metadata. A target passed as nullptr is skipped (e.g. loading weights only);
/// a target the checkpoint has no state for is an error.
CheckpointInfo load_checkpoint(const std::string& path, Module& model, Optimizer* optimizer, LRScheduler* scheduler,
                               const CheckpointLoadOptions& options = {});

/// The counters and metadata only (reads the header, not the tensors).
CheckpointInfo read_checkpoint_info(const std::string& path);

/// The default generators' states: "cpu" and "cuda.<i>" for every visible CUDA device.
TensorMap rng_state();
/// Restores states produced by rng_state(); CUDA entries for devices absent here are skipped.
/// Validates every entry before setting any.
void set_rng_state(const TensorMap& state);

}  // namespace tl
