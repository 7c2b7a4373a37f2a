#pragma once
// Grid: how the ranks of a multi-process run are arranged. World = P pipeline ranks x D
// data-parallel replicas of the whole pipeline x T tensor-parallel ranks per stage
// (pipeline.virtual_stages stages per pipeline rank; parallel.dp = D, parallel.tp = T).
//
// Note [rank layout]. As Megatron-LM orders its groups (tensor fastest, then data, then pipeline),
// rank = (p * D + d) * T + t for tensor rank t of pipeline rank p of replica d. So the T ranks that
// split one stage are neighbours (on a multi-GPU node the tensor-parallel all-reduces, the most
// frequent messages, stay on NVLink), then the D replicas of a pipeline rank, and replica d's
// pipeline through tensor rank t is the ranks (d T + t), ((D + d) T + t), ... Rank 0 (pipeline
// rank 0 of replica 0, tensor rank 0) writes the run directory. With T = 1, rank = p * D + d:
//
//   P = 2, D = 2:     replica 0   replica 1
//     pipeline rank 0   rank 0      rank 1     <- data-parallel group of pipeline rank 0
//     pipeline rank 1   rank 2      rank 3     <- data-parallel group of pipeline rank 1

#include <string>
#include <vector>

namespace tl {

struct Grid {
  int pipeline = 1;  // P: pipeline ranks per replica
  int data = 1;      // D: replicas (parallel.dp)
  int tensor = 1;    // T: tensor-parallel ranks per stage (parallel.tp)

  int world() const { return pipeline * data * tensor; }
  int rank_of(int pipeline_rank, int replica, int tensor_rank = 0) const {
    return (pipeline_rank * data + replica) * tensor + tensor_rank;
  }
  int pipeline_rank(int rank) const { return rank / (data * tensor); }
  int replica(int rank) const { return rank / tensor % data; }
  int tensor_rank(int rank) const { return rank % tensor; }
  /// Ranks of replica d's pipeline through tensor rank t, by pipeline rank.
  std::vector<int> pipeline_group(int replica, int tensor_rank = 0) const;
  /// Ranks holding tensor rank t of pipeline rank p, by replica (their data-parallel group).
  std::vector<int> data_group(int pipeline_rank, int tensor_rank = 0) const;
  /// Ranks splitting pipeline rank p of replica d, by tensor rank (their tensor-parallel group).
  std::vector<int> tensor_group(int pipeline_rank, int replica) const;
  /// "P pipeline ranks x D replicas [x T tensor ranks]" for messages.
  std::string describe() const;

  /// The grid of `world` ranks with `dp` replicas of a pipeline of `pipeline_ranks` ranks, each
  /// stage split over `tp` ranks; a world that is not pipeline_ranks x dp x tp is an error naming
  /// the numbers and what to start instead.
  static Grid of(int world, int pipeline_ranks, int dp, int tp = 1);
};

}  // namespace tl
