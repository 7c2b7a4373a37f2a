#include "parallel/grid.h"

#include <c10/util/Exception.h>

namespace tl {

std::vector<int> Grid::pipeline_group(int replica, int tensor_rank) const {
  std::vector<int> ranks;
  for (int p = 0; p < pipeline; ++p) ranks.push_back(rank_of(p, replica, tensor_rank));
  return ranks;
}

std::vector<int> Grid::data_group(int pipeline_rank, int tensor_rank) const {
  std::vector<int> ranks;
  for (int d = 0; d < data; ++d) ranks.push_back(rank_of(pipeline_rank, d, tensor_rank));
  return ranks;
}

std::vector<int> Grid::tensor_group(int pipeline_rank, int replica) const {
  std::vector<int> ranks;
  for (int t = 0; t < tensor; ++t) ranks.push_back(rank_of(pipeline_rank, replica, t));
  return ranks;
}

std::string Grid::describe() const {
  std::string s = std::to_string(pipeline) + " pipeline rank" + (pipeline == 1 ? "" : "s") + " x " +
                  std::to_string(data) + " replica" + (data == 1 ? "" : "s");
  if (tensor > 1) s += " x " + std::to_string(tensor) + " tensor ranks";
  return s;
}

Grid Grid::of(int world, int pipeline_ranks, int dp, int tp) {
  TORCH_CHECK(pipeline_ranks >= 1 && dp >= 1 && tp >= 1, "grid: ", pipeline_ranks, " pipeline ranks x ", dp,
              " replicas x ", tp, " tensor ranks: each must be >= 1");
  const int want = pipeline_ranks * dp * tp;
  if (tp == 1) {
    TORCH_CHECK(world == want, world, " ranks (WORLD_SIZE) do not make ", dp, " replica", dp == 1 ? "" : "s",
                " (parallel.dp) of a pipeline of ", pipeline_ranks, " rank", pipeline_ranks == 1 ? "" : "s",
                " (the model's stages over pipeline.virtual_stages): start ", want, " ranks (", pipeline_ranks, " x ",
                dp, ")",
                world % pipeline_ranks == 0 ? ", or set parallel.dp = " + std::to_string(world / pipeline_ranks)
                                            : std::string());
  } else {
    TORCH_CHECK(world == want, world, " ranks (WORLD_SIZE) do not make ", dp, " replica", dp == 1 ? "" : "s",
                " (parallel.dp) of a pipeline of ", pipeline_ranks, " rank", pipeline_ranks == 1 ? "" : "s",
                " (the model's stages over pipeline.virtual_stages) with each stage split over ", tp,
                " tensor-parallel ranks (parallel.tp): start ", want, " ranks (", pipeline_ranks, " x ", dp, " x ", tp,
                ")");
  }
  return Grid{pipeline_ranks, dp, tp};
}

}  // namespace tl
