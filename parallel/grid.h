#pragma once
// Grid: how the ranks of a multi-process run are arranged. World = P pipeline ranks x D
// data-parallel replicas of the whole pipeline (pipeline.virtual_stages stages per pipeline rank;
// tensor parallelism will be the third, fastest-varying axis).
//
// Note [rank layout]. As Megatron-LM orders its groups (tensor fastest, then data, then pipeline),
// rank = p * D + d for pipeline rank p of replica d. So the D replicas of one pipeline rank are
// neighbours (rank 4 and 5 of a 4 x 2 grid hold stage 2 of replicas 0 and 1; on a multi-GPU node
// the data-parallel all-reduce stays inside the node), and replica d's pipeline is the ranks
// d, D + d, 2D + d, ... Rank 0 (pipeline rank 0 of replica 0) writes the run directory.
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

  int world() const { return pipeline * data; }
  int rank_of(int pipeline_rank, int replica) const { return pipeline_rank * data + replica; }
  int pipeline_rank(int rank) const { return rank / data; }
  int replica(int rank) const { return rank % data; }
  /// Ranks of replica d's pipeline, by pipeline rank.
  std::vector<int> pipeline_group(int replica) const;
  /// Ranks holding pipeline rank p, by replica (its data-parallel group).
  std::vector<int> data_group(int pipeline_rank) const;
  /// "P x D" for messages.
  std::string describe() const;

  /// The grid of `world` ranks with `dp` replicas of a pipeline of `pipeline_ranks` ranks; a world
  /// that is not pipeline_ranks x dp is an error naming the numbers and what to start instead.
  static Grid of(int world, int pipeline_ranks, int dp);
};

}  // namespace tl
