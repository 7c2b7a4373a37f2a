// The tapeline executable (build/tapeline): help, exit codes and error messages of bad command
// lines. Skipped when the executable has not been built next to this test binary's build tree.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "tasks/data/dataset.h"
#include "tests/tasks/task_testing.h"

namespace tl {
namespace {
namespace fs = std::filesystem;

using testing::tapeline_path;

struct Result {
  int status = -1;
  std::string output;  // stdout and stderr
};

Result run(const std::string& args, const fs::path& exe = tapeline_path()) {
  Result r;
  std::string cmd = exe.string() + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

using testing::configs_dir;

#define REQUIRE_TAPELINE() \
  if (!fs::exists(tapeline_path())) GTEST_SKIP() << tapeline_path() << " not built (make tapeline)"

// `tapeline schedule` prints the lists the runner executes (parallel/schedule.h).
TEST(Cli, SchedulePrintsEveryRanksActions) {
  REQUIRE_TAPELINE();
  Result r = run("schedule --stages 4 --micro-batches 8");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("rank 3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7\n"), std::string::npos) << r.output;
  Result comm = run("schedule --schedule gpipe --stages 2 --micro-batches 2 --comm");
  EXPECT_EQ(comm.output, "rank 0: F0 SA0 F1 SA1 RG0 B0 RG1 B1\nrank 1: RA0 F0 RA1 F1 B0 SG0 B1 SG1\n");
  Result bad = run("schedule --schedule zigzag");
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.output.find("unknown pipeline schedule 'zigzag'"), std::string::npos) << bad.output;
}

TEST(Cli, HelpListsCommandsAndEveryKey) {
  REQUIRE_TAPELINE();
  Result top = run("--help");
  EXPECT_EQ(top.status, 0);
  EXPECT_NE(top.output.find("tapeline train --config FILE --out DIR"), std::string::npos) << top.output;
  Result train = run("train --help");
  EXPECT_EQ(train.status, 0);
  for (const char* k : {"--resume", "--with-baseline", "train.epochs", "boundary.N.forward", "data.train_limit"})
    EXPECT_NE(train.output.find(k), std::string::npos) << k;
  EXPECT_EQ(run("eval --help").status, 0);
  EXPECT_EQ(run("").status, 2);
}

TEST(Cli, ConfigurationErrorsExitWithStatus2BeforeRunning) {
  REQUIRE_TAPELINE();
  testing::TempDir dir;
  const std::string out = (dir.path() / "run").string();
  const std::string cfg = (configs_dir() / "default.ini").string();
  Result r = run("train --config " + cfg + " --out " + out + " --train.epoch=3");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("unknown key 'train.epoch' (did you mean 'train.epochs'?)"), std::string::npos) << r.output;
  r = run("train --config " + cfg + " --out " + out + " --boundary.forward='topk(2.5.1)'");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("boundary.forward"), std::string::npos) << r.output;
  r = run("train --out " + out);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--config FILE is required"), std::string::npos) << r.output;
  r = run("frobnicate");
  EXPECT_EQ(r.status, 2);
  EXPECT_FALSE(fs::exists(out)) << "nothing may be written when the command line is wrong";
  r = run("eval --run " + out);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("not a tapeline run directory"), std::string::npos) << r.output;
}

// `tapeline sweep` and `tapeline compare --plan`: bad input is exit status 2, naming what is wrong,
// and nothing is written.
TEST(Cli, SweepAndPlanErrorsExitWithStatus2) {
  REQUIRE_TAPELINE();
  testing::TempDir dir;
  const std::string out = (dir.path() / "sweep").string();
  const std::string cfg = (configs_dir() / "baseline.ini").string();
  Result r = run("sweep --configs " + cfg + " --seeds 1,x --out " + out);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--seeds '1,x': 'x' is not an integer >= 0"), std::string::npos) << r.output;
  r = run("sweep --configs " + cfg + " nope.ini --seeds 1 --out " + out);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("nope.ini is not a file"), std::string::npos) << r.output;
  r = run("sweep --configs " + cfg + " --seeds 1 --out " + out + " --train.epoch=3");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("train.epoch"), std::string::npos) << r.output;
  r = run("sweep --configs " + cfg + " --seeds 1 --out " + out + " --jobs 0");
  EXPECT_EQ(r.status, 2);
  EXPECT_FALSE(fs::exists(out)) << "nothing may be written when the command line is wrong";

  // A run directory for compare, and a plan.json without step_s.
  const fs::path run_dir = dir.path() / "dense.seed1";
  fs::create_directories(run_dir);
  std::ofstream(run_dir / "summary.json") << R"({"name": "dense.seed1", "epochs": 1, "epoch": 1, "forward": "bf16",
      "backward": "bf16", "test_metric_compressed": 0.5, "test_metric_uncompressed": 0.5})";
  const fs::path plan = dir.path() / "plan.json";
  std::ofstream(plan) << R"({"bytes_per_token": 4096})";
  r = run("compare " + run_dir.string() + " --plan " + plan.string());
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find(plan.string() + ": no \"step_s\""), std::string::npos) << r.output;
  std::ofstream(plan) << R"({"step_s": 2.0, "device": "h100"})";
  r = run("compare " + run_dir.string() + " --plan other=" + plan.string());
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("no config named 'other'"), std::string::npos) << r.output;
  r = run("compare " + run_dir.string() + " --plan " + plan.string());
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("by config, over seeds"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("n=1, no interval"), std::string::npos) << r.output;
}

// A finished `tapeline train` draws DIR/curves.png when python3 has matplotlib, and otherwise ends
// with a note and status 0 (the picture never fails a run); --no-plot skips it.
TEST(Cli, ATrainRunEndsWithItsCurvesOrANote) {
  REQUIRE_TAPELINE();
  if (!fs::exists(fs::path(default_dataset_root("fashion-mnist")) / "train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Fashion-MNIST not installed (Debian package dataset-fashion-mnist)";
  testing::TempDir dir;
  const std::string cfg = (configs_dir() / "default.ini").string();
  const std::string tiny =
      " --data.train_limit=128 --data.test_limit=64 --train.epochs=1 --train.batch_size=64 --quiet";
  // The CLI tries python3 on the PATH, then /usr/bin/python3 (tasks/runner/compare.cpp), unless TAPELINE_PYTHON.
  if (std::getenv("TAPELINE_PYTHON")) GTEST_SKIP() << "TAPELINE_PYTHON is set: the interpreter is the user's choice";
  const bool matplotlib = std::system("python3 -c 'import matplotlib' >/dev/null 2>&1") == 0 ||
                          std::system("/usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1") == 0;
  const fs::path out = dir.path() / "run";
  Result r = run("train --config " + cfg + " --out " + out.string() + tiny);
  ASSERT_EQ(r.status, 0) << r.output;
  if (matplotlib) {
    ASSERT_TRUE(fs::exists(out / "curves.png")) << r.output;
    EXPECT_NE(r.output.find("curves: "), std::string::npos) << r.output;
    std::ifstream png(out / "curves.png", std::ios::binary);
    char magic[8] = {};
    png.read(magic, 8);
    EXPECT_EQ(std::string(magic + 1, 3), "PNG");
  } else {
    EXPECT_FALSE(fs::exists(out / "curves.png"));
    EXPECT_NE(r.output.find("note: "), std::string::npos) << r.output;
  }
  const fs::path quiet = dir.path() / "no_plot";
  r = run("train --config " + cfg + " --out " + quiet.string() + tiny + " --no-plot");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(fs::exists(quiet / "summary.json"));
  EXPECT_FALSE(fs::exists(quiet / "curves.png"));
}

// An executable outside the source tree (a build directory made with cmake -B /elsewhere, or a
// copy) still finds python/tapeline_plots.py: through the source path compiled into it, not only
// through its own directory's ancestors.
TEST(Cli, AnExecutableOutsideTheSourceTreeFindsThePlotModule) {
  REQUIRE_TAPELINE();
  if (!fs::exists(fs::path(default_dataset_root("fashion-mnist")) / "train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Fashion-MNIST not installed (Debian package dataset-fashion-mnist)";
  if (std::getenv("TAPELINE_PLOTS")) GTEST_SKIP() << "TAPELINE_PLOTS is set: the module is the user's choice";
  testing::TempDir dir;  // under the temporary directory, outside any source tree
  const fs::path exe = dir.path() / "bin" / "tapeline";
  fs::create_directories(exe.parent_path());
  fs::copy_file(tapeline_path(), exe);
  const fs::path out = dir.path() / "run";
  Result r = run("train --config " + (configs_dir() / "default.ini").string() + " --out " + out.string() +
                     " --data.train_limit=64 --data.test_limit=64 --train.epochs=1 --train.batch_size=64 --quiet",
                 exe);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.find("tapeline_plots.py was not found"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace tl
