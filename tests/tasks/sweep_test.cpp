// tapeline sweep: seeds parsed, bad input refused before anything runs, and a real sweep of the
// smallest config (ResNet-8 on 128 Fashion-MNIST images, 2 epochs of 2 steps) that stops after
// one epoch, resumes, skips what is finished and refuses a directory of other settings.
#include "tasks/runner/sweep.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "tasks/data/dataset.h"
#include "tasks/runner/compare.h"
#include "tasks/runner/report.h"
#include "tasks/runner/trainer.h"
#include "tests/tasks/task_testing.h"

namespace tl {
namespace {
namespace fs = std::filesystem;
using testing::expect_error;
using testing::TempDir;

using testing::configs_dir;

TEST(Sweep, ParsesSeedsListsAndRanges) {
  EXPECT_EQ(parse_seeds("1,2,3"), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(parse_seeds("1-3"), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(parse_seeds("0, 5-6"), (std::vector<int64_t>{0, 5, 6}));
  EXPECT_EQ(parse_seeds("7"), (std::vector<int64_t>{7}));
  expect_error([] { parse_seeds(""); }, {"--seeds ''", "no seed", "1,2,3"});
  expect_error([] { parse_seeds("1,x"); }, {"'x' is not an integer >= 0"});
  expect_error([] { parse_seeds("-1"); }, {"is not an integer >= 0"});
  expect_error([] { parse_seeds("3-1"); }, {"the range '3-1' is empty"});
  expect_error([] { parse_seeds("1,2,1"); }, {"seed 1 is given twice"});
  expect_error([] { parse_seeds("1,"); }, {"no seed"});
}

TEST(Sweep, RefusesBadInputBeforeAnythingRuns) {
  TempDir dir;
  const std::string a = (configs_dir() / "baseline.ini").string(),
                    b = (configs_dir() / "text" / "finetune.ini").string();
  const auto runs = plan_sweep({a, b}, {1, 2}, dir.path().string(), {});
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_EQ(runs[0].name, "baseline.seed1");
  EXPECT_EQ(runs[3].name, "finetune.seed2");
  EXPECT_EQ(runs[3].dir, (dir.path() / "finetune.seed2").string());
  EXPECT_FALSE(fs::exists(dir.path() / "baseline.seed1"));  // planning writes nothing
  expect_error([&] { plan_sweep({}, {1}, dir.path().string(), {}); }, {"no config given"});
  expect_error([&] { plan_sweep({a}, {}, dir.path().string(), {}); }, {"no seed given"});
  expect_error([&] { plan_sweep({"nope.ini"}, {1}, dir.path().string(), {}); }, {"nope.ini is not a file"});
  const std::string other = (configs_dir() / "lm" / "baseline.ini").string();
  expect_error(
      [&] {
        plan_sweep({a, other}, {1}, dir.path().string(), {});
      },
      {"would share the run directories baseline.seedN", other});
  expect_error([&] { plan_sweep({a}, {1}, dir.path().string(), {{"train.epochz", "1"}}); }, {"train.epochz"});
  expect_error([&] { plan_sweep({a}, {1}, dir.path().string(), {{"boundary.forward", "nonsense(1)"}}); }, {"nonsense"});
}

TEST(Sweep, StateOfARunDirectory) {
  TempDir dir;
  const fs::path d = dir.path() / "r";
  EXPECT_EQ(run_state(d.string()), RunState::kNew);
  fs::create_directories(d);
  EXPECT_EQ(run_state(d.string()), RunState::kRestart);  // started, no checkpoint yet
  std::ofstream(d / "checkpoint.safetensors") << "x";
  EXPECT_EQ(run_state(d.string()), RunState::kResume);
  RunSummary s;
  s.epochs = 2;
  s.last.epoch = 1;
  write_file_atomic((d / "summary.json").string(), summary_json(s));
  EXPECT_EQ(run_state(d.string()), RunState::kResume);
  s.last.epoch = 2;
  write_file_atomic((d / "summary.json").string(), summary_json(s));
  EXPECT_EQ(run_state(d.string()), RunState::kFinished);
}

TEST(Sweep, StudyConfigsDifferOnlyInTheirCodecs) {
  // configs/studies/{finetune,lm}/ (docs/TIME.md): one sweep each, whose runs compare.
  // finetune: dense bf16, quant 8, 4 and 2, hadquant 4, 3 and 2 (and 3-bit forward, 2-bit backward),
  // AQ-SGD, TopK 10% and EF TopK 5%, AE (float32 and bf16 wire), adaptive; lm: dense bf16, quant 8 and 4, hadquant, AQ-SGD, TopK, AE, adaptive.
  for (const auto& [folder, expected] : std::vector<std::pair<std::string, int>>{{"finetune", 14}, {"lm", 8}}) {
    const fs::path dir = configs_dir() / "studies" / folder;
    const Config dense = Config::load((dir / "dense_bf16.ini").string());
    EXPECT_EQ(dense.timeline.device, "h100") << folder;
    int count = 0;
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.path().extension() != ".ini") continue;
      ++count;
      EXPECT_EQ(config_fingerprint(Config::load(entry.path().string())), config_fingerprint(dense))
          << folder << "/" << entry.path().filename().string() << " differs from dense_bf16.ini outside [boundary]";
    }
    EXPECT_EQ(count, expected) << folder;
  }
}

std::string file_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Sweep, StopsResumesSkipsAndRefusesOtherSettings) {
  if (!fs::exists(testing::tapeline_path())) GTEST_SKIP() << testing::tapeline_path() << " not built";
  if (!fs::exists(fs::path(default_dataset_root("fashion-mnist")) / "train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Fashion-MNIST not installed (Debian package dataset-fashion-mnist)";
  TempDir dir;
  SweepOptions o;
  o.configs = {(configs_dir() / "baseline.ini").string()};
  o.seeds = {1, 2};
  o.out_dir = (dir.path() / "runs").string();
  o.overrides = {{"data.train_limit", "128"},
                 {"data.test_limit", "64"},
                 {"train.epochs", "2"},
                 {"train.batch_size", "64"},
                 {"run.threads", "1"}};
  o.jobs = 2;
  o.executable = testing::tapeline_path().string();
  o.plot = false;
  o.stop_after_epochs = 1;
  // Every poll (200 ms) shows each running run's latest log line: a run takes about 2 s, so a line
  // of at least one of them shows in between. (Every second was too seldom: on a clean clone's CI
  // run seed 1 finished in 1.8 s before its first report.)
  o.report_every_s = 0;
  std::ostringstream log;
  ASSERT_EQ(run_sweep(o, log), 0) << log.str();
  EXPECT_TRUE(log.str().find("] baseline.seed1: ") != std::string::npos ||
              log.str().find("] baseline.seed2: ") != std::string::npos)
      << log.str();
  const fs::path one = fs::path(o.out_dir) / "baseline.seed1", two = fs::path(o.out_dir) / "baseline.seed2";
  EXPECT_NE(log.str().find("2 to run, 2 at a time"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("stopped baseline.seed1 after epoch 1 of 2"), std::string::npos) << log.str();
  EXPECT_EQ(run_state(one.string()), RunState::kResume);
  EXPECT_NE(file_text(one / "config.ini").find("seed = 1"), std::string::npos);
  EXPECT_NE(file_text(two / "config.ini").find("seed = 2"), std::string::npos);

  // Again: both resume from their checkpoints and finish.
  o.stop_after_epochs = 0;
  log.str("");
  ASSERT_EQ(run_sweep(o, log), 0) << log.str();
  EXPECT_NE(log.str().find("start baseline.seed2 (resuming from its checkpoint)"), std::string::npos) << log.str();
  EXPECT_NE(file_text(two / "train.log").find("resuming"), std::string::npos);
  EXPECT_EQ(run_state(one.string()), RunState::kFinished);
  EXPECT_EQ(run_state(two.string()), RunState::kFinished);
  // The seeds differ, so the runs do (data order and initialisation).
  const RunRecord r1 = read_run_record(one.string()), r2 = read_run_record(two.string());
  ASSERT_TRUE(r1.seed && r2.seed);
  EXPECT_EQ(*r1.seed, 1);
  EXPECT_EQ(*r2.seed, 2);
  EXPECT_EQ(r1.settings, r2.settings);
  EXPECT_NE(r1.fingerprint, r2.fingerprint);
  EXPECT_NE(file_text(one / "metrics.csv"), file_text(two / "metrics.csv"));
  const SeedComparison c = compare_seeds({r1, r2}, {});
  ASSERT_EQ(c.groups.size(), 1u);
  EXPECT_EQ(c.groups[0].label, "baseline");
  EXPECT_EQ(c.groups[0].metric_on.n, 2);

  // A third time: nothing to run.
  log.str("");
  ASSERT_EQ(run_sweep(o, log), 0) << log.str();
  EXPECT_NE(log.str().find("2 finished, 0 to run"), std::string::npos) << log.str();

  // Other settings into the same directories: refused, naming the directory and the setting.
  o.overrides.emplace_back("train.lr", "0.5");
  expect_error([&] { run_sweep(o, log); }, {"baseline.seed1", "holds a run of other settings", "train.lr"});
  // A directory no sweep started: refused.
  fs::create_directories(fs::path(o.out_dir) / "x" / "baseline.seed1");
  o.out_dir = (fs::path(o.out_dir) / "x").string();
  expect_error([&] { run_sweep(o, log); }, {"no tapeline sweep started it"});
}

}  // namespace
}  // namespace tl
