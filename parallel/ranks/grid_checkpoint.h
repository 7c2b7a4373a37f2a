#pragma once
// GridCheckpoint: one checkpoint from the ranks of a grid (Note [one checkpoint] and Note [grid
// state in checkpoints] in parallel/ranks/runtime.h): which entries each rank contributes, rank
// 0's assembly and atomic write, and each rank's restore of its own state on resume. The
// DistExecutor owns one, built once it knows which rank holds which parameter.

#include <map>
#include <set>
#include <string>
#include <vector>

#include "layers/io/checkpoint.h"
#include "layers/optim/optimizer.h"
#include "parallel/grid.h"
#include "parallel/pipeline.h"
#include "parallel/ranks/data_parallel.h"
#include "parallel/ranks/tensor_parallel.h"
#include "parallel/ranks/transport.h"
#include "parallel/schedule.h"

namespace tl::ranks {

class GridCheckpoint {
 public:
  /// `owner`: pipeline parameter/buffer name -> the first pipeline rank holding it; `shards`: every
  /// rank's parameters split over the tensor ranks; `split_shape`: their shapes on this rank (Note
  /// [the grid's parameters]). `dp`, `tp`: this rank's collectives whose codec state is kept
  /// (null: none). The maps must outlive this object.
  GridCheckpoint(Pipeline& pipeline, Transport& transport, const Grid& grid, const StageLayout& layout,
                 const std::map<std::string, int>& owner, const std::map<std::string, TensorShard>& shards,
                 std::map<std::string, std::vector<int64_t>> split_shape, DataParallelSync* dp, TensorParallelSync* tp);

  /// Marks the current codec state as identical on every rank (after building or resuming).
  void synchronized(const Optimizer& optimizer);
  /// Collective: rank 0 assembles `mine` with the other ranks' parts and writes it to `path`
  /// atomically; other ranks send their part. Every rank returns once rank 0 has written.
  /// `last_step`: for the errors.
  void save(const std::string& path, const CheckpointContents& mine, int64_t last_step);
  /// This rank's own state from `path` (replica d's boundary codec state, its data- and
  /// tensor-parallel codec state); "" when restored or nothing is per rank, else why not.
  std::string restore(const std::string& path);

 private:
  // Entries of this rank's contents that rank 0 takes from it.
  TensorMap part_for_checkpoint(const TensorMap& all) const;
  // -1: not a model/optimizer entry owned by structure; else the owning rank.
  int structural_owner(const std::string& key) const;
  // The parameter whose part (split over the tensor ranks) checkpoint entry `key` holds ("" if
  // none): the parameter itself, or optimizer state of its shape.
  std::string split_parameter(const std::string& key, const at::Tensor& value) const;
  // (P, D, virtual stages, placement[, T]): checkpoints' grid.shape.
  at::Tensor grid_shape() const;

  Pipeline& pipeline_;
  Transport& transport_;
  Grid grid_;
  StageLayout layout_;
  int rank_ = 0, replica_ = 0, tensor_rank_ = 0;  // pipeline rank, replica, tensor rank
  const std::map<std::string, int>& owner_;
  const std::map<std::string, TensorShard>& shards_;
  std::map<std::string, std::vector<int64_t>> split_shape_;
  DataParallelSync* dp_;
  TensorParallelSync* tp_;
  TensorMap reference_;             // codec state when the ranks were last identical
  std::set<std::string> restored_;  // entries restored for this replica (always saved)
};

}  // namespace tl::ranks
