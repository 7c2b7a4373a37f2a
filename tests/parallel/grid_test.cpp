// The process grid (parallel/grid.h): Megatron's rank layout, the groups, and a world size that
// does not factor named in the error.
#include "parallel/grid.h"

#include <gtest/gtest.h>

#include "tests/tasks/task_testing.h"

namespace tl {
namespace {

TEST(Grid, RanksAreDataFastestThenPipeline) {
  const Grid g = Grid::of(8, 4, 2);  // 4 pipeline ranks x 2 replicas
  EXPECT_EQ(g.world(), 8);
  EXPECT_EQ(g.rank_of(2, 1), 5);
  EXPECT_EQ(g.pipeline_rank(5), 2);
  EXPECT_EQ(g.replica(5), 1);
  EXPECT_EQ(g.pipeline_group(1), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(g.data_group(2), (std::vector<int>{4, 5}));
  for (int r = 0; r < g.world(); ++r) EXPECT_EQ(g.rank_of(g.pipeline_rank(r), g.replica(r)), r);
  EXPECT_EQ(g.describe(), "4 pipeline ranks x 2 replicas");
  const Grid one = Grid::of(3, 3, 1);
  EXPECT_EQ(one.pipeline_group(0), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(one.data_group(1), (std::vector<int>{1}));
}

TEST(Grid, AWorldThatDoesNotFactorNamesBothNumbers) {
  testing::expect_error([] { Grid::of(3, 4, 2); },
                        {"3 ranks (WORLD_SIZE)", "2 replicas (parallel.dp)", "pipeline of 4 ranks", "start 8 ranks"});
  testing::expect_error([] { Grid::of(8, 4, 1); }, {"8 ranks", "start 4 ranks", "parallel.dp = 2"});
  testing::expect_error([] { Grid::of(4, 4, 0); }, {"must be >= 1"});
}

}  // namespace
}  // namespace tl
