#include "parallel/grid.h"

#include <c10/util/Exception.h>

namespace tl {

std::vector<int> Grid::pipeline_group(int replica) const {
  std::vector<int> ranks;
  for (int p = 0; p < pipeline; ++p) ranks.push_back(rank_of(p, replica));
  return ranks;
}

std::vector<int> Grid::data_group(int pipeline_rank) const {
  std::vector<int> ranks;
  for (int d = 0; d < data; ++d) ranks.push_back(rank_of(pipeline_rank, d));
  return ranks;
}

std::string Grid::describe() const {
  return std::to_string(pipeline) + " pipeline rank" + (pipeline == 1 ? "" : "s") + " x " + std::to_string(data) +
         " replica" + (data == 1 ? "" : "s");
}

Grid Grid::of(int world, int pipeline_ranks, int dp) {
  TORCH_CHECK(pipeline_ranks >= 1 && dp >= 1, "grid: ", pipeline_ranks, " pipeline ranks x ", dp,
              " replicas: both must be >= 1");
  TORCH_CHECK(world == pipeline_ranks * dp, world, " ranks (WORLD_SIZE) do not make ", dp, " replica",
              dp == 1 ? "" : "s", " (parallel.dp) of a pipeline of ", pipeline_ranks, " rank",
              pipeline_ranks == 1 ? "" : "s", " (the model's stages over pipeline.virtual_stages): start ",
              pipeline_ranks * dp, " ranks (", pipeline_ranks, " x ", dp, ")",
              world % pipeline_ranks == 0 ? ", or set parallel.dp = " + std::to_string(world / pipeline_ranks)
                                          : std::string());
  return Grid{pipeline_ranks, dp};
}

}  // namespace tl
