// tapeline compare: run directories read by column and key name in both schemas (the first
// vision one and the task-generic one), the table, what does not compare, and the plots drawn by
// python/tapeline_plots.py (skipped with a note, never an error, when matplotlib is missing).
#include "tasks/runner/compare.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "tests/tasks/task_testing.h"

namespace tl {
namespace {
namespace fs = std::filesystem;
using testing::expect_error;
using testing::TempDir;

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

// A finished run of the first vision schema: test_acc_* columns, no task keys.
fs::path old_run(const fs::path& root, const std::string& name, const std::string& fingerprint = "fp-a") {
  fs::path d = root / name;
  write(d / "metrics.csv",
        "epoch,train_loss,test_acc_compressed,test_acc_uncompressed,bytes_forward,bytes_backward,bytes_uncompressed,"
        "wall_s,train_acc,steps,lr\n"
        "1,0.9,0.70,0.30,1000,3000,40000,50.5,0.6,10,0.05\n"
        "2,0.6,0.8043,0.3704,1000,3000,40000,101,0.7,10,0.01\n");
  write(d / "summary.json", R"J({"name": ")J" + name + R"J(", "config": "configs/topk10.ini",
        "forward": "topk(0.1)", "backward": "topk(0.1)", "stages": 4, "epochs": 2, "epoch": 2,
        "test_acc_compressed": 0.8043, "test_acc_uncompressed": 0.3704, "bytes_forward": 1000,
        "bytes_backward": 3000, "bytes_uncompressed": 40000, "steps": 10, "wall_s": 101,
        "fingerprint": ")J" + fingerprint + R"J("})J");
  return d;
}

// A run of the task-generic schema: test_metric_* columns, task, metric, target.
fs::path new_run(const fs::path& root, const std::string& name, const std::string& task, const std::string& metric,
                 bool finished = true) {
  fs::path d = root / name;
  write(d / "metrics.csv",
        "epoch,train_loss,train_metric,test_loss_compressed,test_loss_uncompressed,test_metric_compressed,"
        "test_metric_uncompressed,bytes_forward,bytes_backward,bytes_uncompressed,steps,lr,wall_s\n"
        "1,3.2,40.5,3.1,3.0,35.25,33.5,8000,8000,64000,20,0.001,12.25\n");
  write(d / "summary.json", R"J({"name": ")J" + name + R"J(", "config": "/abs/configs/lm.ini", "task": ")J" + task +
                                R"J(", "metric": ")J" + metric + R"J(", "higher_is_better": false,
        "forward": "quant(bits=4)", "backward": "identity", "epochs": )J" + (finished ? "1" : "3") +
                                R"J(, "epoch": 1, "test_metric_compressed": 35.25, "test_metric_uncompressed": 33.5,
        "target": 36.0, "time_to_target_s": 9.5, "fingerprint": "fp-lm"})J");
  return d;
}

TEST(Compare, ReadsTheFirstVisionSchemaByName) {
  TempDir dir;
  RunRecord r = read_run_record(old_run(dir.path(), "topk10").string());
  EXPECT_EQ(r.label, "topk10");
  EXPECT_EQ(r.task, "vision");
  EXPECT_EQ(r.metric, "accuracy");
  EXPECT_TRUE(r.higher_is_better);
  EXPECT_EQ(r.forward, "topk(0.1)");
  ASSERT_TRUE(r.metric_on && r.metric_off);
  EXPECT_DOUBLE_EQ(*r.metric_on, 0.8043);
  EXPECT_DOUBLE_EQ(*r.metric_off, 0.3704);
  EXPECT_DOUBLE_EQ(r.bytes_per_step, 400.0);  // (1000 + 3000) / 10 steps
  EXPECT_DOUBLE_EQ(r.uncompressed_bytes_per_step, 4000.0);
  EXPECT_DOUBLE_EQ(r.wall_s, 101.0);
  EXPECT_EQ(r.last_epoch, 2);
  EXPECT_FALSE(r.target.has_value());
}

TEST(Compare, ReadsTheTaskGenericSchemaAndFillsGapsFromTheCsv) {
  TempDir dir;
  fs::path d = new_run(dir.path(), "lm-q4", "lm", "perplexity");
  RunRecord r = read_run_record(d.string());
  EXPECT_EQ(r.task, "lm");
  EXPECT_EQ(r.metric, "perplexity");
  EXPECT_FALSE(r.higher_is_better);
  EXPECT_DOUBLE_EQ(*r.metric_on, 35.25);
  EXPECT_DOUBLE_EQ(r.bytes_per_step, 800.0);  // from the csv: the summary has no bytes
  EXPECT_DOUBLE_EQ(r.wall_s, 12.25);
  ASSERT_TRUE(r.target && r.time_to_target_s);
  EXPECT_DOUBLE_EQ(*r.time_to_target_s, 9.5);
  // A trailing slash names the same run.
  EXPECT_EQ(read_run_record(d.string() + "/").label, "lm-q4");
}

TEST(Compare, TableShowsMetricsBytesRatioAndWallTime) {
  TempDir dir;
  Comparison c = compare_runs({read_run_record(old_run(dir.path(), "topk10").string()),
                               read_run_record(old_run(dir.path(), "baseline").string())});
  EXPECT_NE(c.table.find("test acc, on"), std::string::npos) << c.table;
  EXPECT_NE(c.table.find("80.43%"), std::string::npos) << c.table;
  EXPECT_NE(c.table.find("37.04%"), std::string::npos) << c.table;
  EXPECT_NE(c.table.find("400 B"), std::string::npos) << c.table;
  EXPECT_NE(c.table.find("0.100x"), std::string::npos) << c.table;
  EXPECT_NE(c.table.find("vision / topk10.ini"), std::string::npos) << c.table;
  EXPECT_EQ(c.table.find("time to target"), std::string::npos) << "no run knows a target";
  EXPECT_TRUE(c.notes.empty()) << c.notes.front();
}

TEST(Compare, SaysWhatDoesNotCompare) {
  TempDir dir;
  auto a = read_run_record(old_run(dir.path(), "a", "fp-a").string());
  auto b = read_run_record(old_run(dir.path(), "b", "fp-b").string());
  auto lm = read_run_record(new_run(dir.path(), "lm", "lm", "perplexity", /*finished=*/false).string());
  Comparison c = compare_runs({a, b, lm});
  auto has_note = [&](const std::string& fragment) {
    for (const auto& n : c.notes)
      if (n.find(fragment) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(has_note("different tasks or metrics and do not compare")) << c.table;
  EXPECT_TRUE(has_note("{a} {b}")) << "a and b differ in settings";
  EXPECT_TRUE(has_note("lm *: unfinished (epoch 1 of 3)"));
  EXPECT_TRUE(has_note("lower is better for perplexity"));
  EXPECT_NE(c.table.find("perplexity 35.250"), std::string::npos) << c.table;
  EXPECT_NE(c.table.find("9.5 s to 36.000"), std::string::npos) << c.table;
}

TEST(Compare, TargetZeroIsNoneAndMinusOneIsNotReached) {
  TempDir dir;
  fs::path d = old_run(dir.path(), "topk10");
  auto with_target = [&](const std::string& target, const std::string& time) {
    std::ifstream in(d / "summary.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    text.insert(text.find('{') + 1, "\"target\": " + target + ", \"time_to_target_s\": " + time + ", ");
    write(dir.path() / "t" / "summary.json", text);
    return read_run_record((dir.path() / "t").string());
  };
  RunRecord none = with_target("0.0", "-1.0");
  EXPECT_FALSE(none.target.has_value());
  EXPECT_EQ(compare_runs({none}).table.find("time to target"), std::string::npos);
  RunRecord missed = with_target("0.9", "-1.0");
  ASSERT_TRUE(missed.target.has_value());
  EXPECT_FALSE(missed.time_to_target_s.has_value());
  EXPECT_NE(compare_runs({missed}).table.find("not reached (90.00%)"), std::string::npos);
  RunRecord reached = with_target("0.75", "42.0");
  EXPECT_NE(compare_runs({reached}).table.find("42.0 s to 75.00%"), std::string::npos) << compare_runs({reached}).table;
}

TEST(Compare, TimeToTargetComesWithStepsToItAndTimePerStep) {
  // docs/TIME.md: a run on the pipeline's timeline that reached its target after 48 of 64 steps.
  TempDir dir;
  fs::path d = dir.path() / "dense";
  write(d / "metrics.csv",
        "epoch,train_loss,train_metric,test_loss_compressed,test_loss_uncompressed,test_metric_compressed,"
        "test_metric_uncompressed,bytes_forward,bytes_backward,bytes_uncompressed,steps,lr,wall_s,train_time_s\n"
        "4,2.7,15.8,2.7,2.7,15.1,15.1,8000,8000,64000,16,0.0,100.0,64.256\n");
  write(d / "summary.json", R"J({"name": "dense", "config": "configs/slowlink/dense_bf16.ini", "task": "lm",
        "metric": "perplexity", "higher_is_better": false, "forward": "bf16", "backward": "bf16", "epochs": 4,
        "epoch": 4, "target": 15.4, "time_to_target_s": 48.2, "steps_to_target": 48, "total_steps": 64,
        "fingerprint": "fp"})J");
  const RunRecord r = read_run_record(d.string());
  ASSERT_TRUE(r.steps_to_target.has_value());
  EXPECT_EQ(*r.steps_to_target, 48);
  ASSERT_TRUE(r.time_per_step_s.has_value());
  EXPECT_DOUBLE_EQ(*r.time_per_step_s, 64.256 / 64);
  const std::string table = compare_runs({r}).table;
  for (const char* cell : {"steps to target", "time/step", "1.004 s", "48.2 s to 15.400"})
    EXPECT_NE(table.find(cell), std::string::npos) << cell << " missing from\n" << table;
}

TEST(Compare, ErrorsNameTheDirectory) {
  TempDir dir;
  const std::string missing = (dir.path() / "nope").string();
  expect_error([&] { read_run_record(missing); }, {missing, "not a directory"});
  fs::create_directories(dir.path() / "empty");
  expect_error([&] { read_run_record((dir.path() / "empty").string()); }, {"empty", "no summary.json"});
  write(dir.path() / "bad" / "summary.json", "{not json");
  expect_error([&] { read_run_record((dir.path() / "bad").string()); }, {"summary.json", "not a tapeline summary.json"});
  fs::path d = old_run(dir.path(), "ragged");
  write(d / "metrics.csv", "epoch,train_loss\n1\n");
  expect_error([&] { read_run_record(d.string()); }, {"metrics.csv", "1 cells", "2 columns"});
}

// Sets an environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      ::setenv(name_, old_.c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(Compare, MissingMatplotlibIsANoteNotAnError) {
  TempDir dir;
  fs::path d = old_run(dir.path(), "topk10");
  ScopedEnv python("TAPELINE_PYTHON", "/nonexistent/python3");
  std::string note;
  EXPECT_FALSE(write_run_plot(d.string(), &note));
  EXPECT_NE(note.find("no Python with matplotlib"), std::string::npos) << note;
  EXPECT_NE(note.find("/nonexistent/python3"), std::string::npos) << note;
  EXPECT_FALSE(fs::exists(d / "curves.png"));
  PlotResult p = write_compare_plots({d.string()}, (dir.path() / "figs").string());
  EXPECT_FALSE(p.written);
  EXPECT_TRUE(p.missing_matplotlib);
}

TEST(Compare, WritesCurvesAndComparisonFigures) {
  ASSERT_FALSE(plot_module_path().empty()) << "python/tapeline_plots.py not found (TAPELINE_PLOTS, the source tree, the executable's ancestors)";
  TempDir dir;
  fs::path a = old_run(dir.path(), "topk10"), b = new_run(dir.path(), "lm", "lm", "perplexity");
  std::string note;
  if (!write_run_plot(a.string(), &note)) {
    if (note.find("no Python with matplotlib") != std::string::npos) GTEST_SKIP() << note;
    FAIL() << note;
  }
  EXPECT_GT(fs::file_size(a / "curves.png"), 10000u);
  PlotResult p = write_compare_plots({a.string(), b.string()}, (dir.path() / "figs").string());
  ASSERT_TRUE(p.written) << p.note;
  EXPECT_EQ(p.files.size(), 8u);  // 4 figures, PNG and SVG
  for (const char* f : {"metric_per_epoch.png", "frontier.svg", "train_loss.png", "boundary_stats.svg"})
    EXPECT_TRUE(fs::exists(dir.path() / "figs" / f)) << f;
  // A directory that is not a run: a note naming it, no exception.
  EXPECT_FALSE(write_run_plot((dir.path() / "nope").string(), &note));
  EXPECT_NE(note.find("nope"), std::string::npos) << note;
}

// ---- seeds of one config -------------------------------------------------------------------------

TEST(CompareSeeds, StudentTQuantilesMatchPublishedTables) {
  // t_{0.975, df} from any statistics table.
  const std::vector<std::pair<int64_t, double>> table = {{1, 12.706}, {2, 4.303},  {3, 3.182},  {4, 2.776},
                                                         {9, 2.262},  {10, 2.228}, {30, 2.042}, {120, 1.980}};
  for (const auto& [df, t] : table) EXPECT_NEAR(student_t95(df), t, 1e-3) << "df " << df;
  expect_error([] { student_t95(0); }, {"degrees of freedom must be >= 1"});
}

TEST(CompareSeeds, MeanAndIntervalOfASample) {
  const MeanCI m = mean_ci({1.0, 2.0, 3.0});  // sd 1
  EXPECT_EQ(m.n, 3);
  EXPECT_DOUBLE_EQ(m.mean, 2.0);
  ASSERT_TRUE(m.half_width.has_value());
  EXPECT_NEAR(*m.half_width, 4.3027 / std::sqrt(3.0), 1e-4);
  const MeanCI one = mean_ci({5.0});
  EXPECT_EQ(one.n, 1);
  EXPECT_FALSE(one.half_width.has_value());
  EXPECT_EQ(mean_ci({}).n, 0);
}

// A run of `name` with seed `seed` and the per-epoch test accuracies `acc` (10 steps and 15 s of
// timeline each), target 0.8, its config.ini saying the seed and the forward codec.
fs::path seed_run(const fs::path& root, const std::string& name, int seed, const std::string& forward,
                  const std::vector<double>& acc) {
  fs::path d = root / name;
  std::string csv =
      "epoch,train_loss,test_metric_compressed,test_metric_uncompressed,bytes_forward,bytes_backward,"
      "bytes_uncompressed,steps,wall_s,train_time_s\n";
  for (size_t e = 0; e < acc.size(); ++e)
    csv += std::to_string(e + 1) + ",0.5," + std::to_string(acc[e]) + "," + std::to_string(acc[e]) +
           ",1000,1000,4000,10," + std::to_string(20 * (e + 1)) + "," + std::to_string(15 * (e + 1)) + "\n";
  write(d / "metrics.csv", csv);
  const std::string n = std::to_string(acc.size());
  write(d / "summary.json",
        R"J({"name": ")J" + name + R"J(", "config": "configs/)J" + name.substr(0, name.find('.')) +
            R"J(.ini", "forward": ")J" + forward + R"J(", "backward": "identity", "epochs": )J" + n +
            R"J(, "epoch": )J" + n + R"J(, "test_metric_compressed": )J" + std::to_string(acc.back()) +
            R"J(, "test_metric_uncompressed": )J" + std::to_string(acc.back()) +
            R"J(, "target": 0.8, "total_steps": )J" + std::to_string(10 * acc.size()) + R"J(, "train_time_s": )J" +
            std::to_string(15 * acc.size()) + R"J(, "timeline_device": "h100", "fingerprint": "fp-)J" +
            std::to_string(seed) + R"J("})J");
  write(d / "config.ini", "[run]\nseed = " + std::to_string(seed) + "\n\n[boundary]\nforward = " + forward + "\n");
  return d;
}

std::vector<RunRecord> seed_runs(const fs::path& root) {
  std::vector<RunRecord> runs;
  // dense reaches 0.8 after 10, 20 and 30 steps (15, 30, 45 s); quant after 10 steps with seed 1, never with seed 2.
  runs.push_back(read_run_record(seed_run(root, "dense.seed1", 1, "identity", {0.80, 0.81, 0.80}).string()));
  runs.push_back(read_run_record(seed_run(root, "quant.seed1", 1, "quant(bits=4)", {0.85, 0.84, 0.86}).string()));
  runs.push_back(read_run_record(seed_run(root, "dense.seed2", 2, "identity", {0.70, 0.80, 0.82}).string()));
  runs.push_back(read_run_record(seed_run(root, "dense.seed3", 3, "identity", {0.70, 0.75, 0.84}).string()));
  runs.push_back(read_run_record(seed_run(root, "quant.seed2", 2, "quant(bits=4)", {0.60, 0.70, 0.78}).string()));
  return runs;
}

TEST(CompareSeeds, GroupsSeedsAndCountsRunsThatMissTheTarget) {
  TempDir dir;
  const auto runs = seed_runs(dir.path());
  ASSERT_TRUE(runs[0].seed.has_value());
  EXPECT_EQ(*runs[0].seed, 1);
  EXPECT_EQ(runs[0].settings, runs[2].settings);  // seeds of one config
  EXPECT_NE(runs[0].settings, runs[1].settings);  // another codec
  const SeedComparison c = compare_seeds(runs, {});
  ASSERT_EQ(c.groups.size(), 2u);
  const SeedGroup& dense = c.groups[0];
  EXPECT_EQ(dense.label, "dense");
  EXPECT_EQ(dense.dirs.size(), 3u);
  EXPECT_NEAR(dense.metric_on.mean, 0.82, 1e-9);
  ASSERT_TRUE(dense.metric_on.half_width.has_value());
  EXPECT_NEAR(*dense.metric_on.half_width, 4.3027 * 0.02 / std::sqrt(3.0), 1e-5);
  EXPECT_EQ(dense.steps_to_target.n, 3);
  EXPECT_DOUBLE_EQ(dense.steps_to_target.mean, 20.0);
  EXPECT_NEAR(*dense.steps_to_target.half_width, 4.3027 * 10 / std::sqrt(3.0), 1e-3);
  EXPECT_DOUBLE_EQ(dense.time_to_target_s.mean, 30.0);
  const SeedGroup& quant = c.groups[1];
  EXPECT_EQ(quant.steps_to_target.n, 1);
  EXPECT_FALSE(quant.steps_to_target.half_width.has_value());
  ASSERT_EQ(quant.missed.size(), 1u);
  EXPECT_EQ(quant.missed[0], "quant.seed2 (30 steps)");
  for (const char* cell : {"82.00% ± 4.97%", "3 of 3", "20 ± 24.8", "30.0 s ± 37.3 s", "1 of 2",
                           "10 (n=1, no interval)", "1,2,3", "quant(bits=4) / identity"})
    EXPECT_NE(c.table.find(cell), std::string::npos) << cell << " missing from\n" << c.table;
  std::string notes;
  for (const auto& n : c.notes) notes += n + "\n";
  for (const char* text : {"1 of 2 runs did not reach the target", "quant.seed2", "measured by training",
                           "timeline.device = h100: compute modelled", "Student t"})
    EXPECT_NE(notes.find(text), std::string::npos) << text << " missing from\n" << notes;
}

TEST(CompareSeeds, TargetFromAConfigAndPlannedTime) {
  TempDir dir;
  const auto runs = seed_runs(dir.path());
  write(dir.path() / "plan.json", R"({"step_s": 100.0, "device": "h100", "config": "configs/plan/x.ini"})");
  SeedOptions o;
  o.target_from = "dense";
  o.target_delta = 0.015;  // 0.835: dense seeds 1 and 2 never reach it
  o.plans = {{"", read_plan((dir.path() / "plan.json").string())}};
  const SeedComparison c = compare_seeds(runs, o);
  ASSERT_TRUE(c.groups[0].target.has_value());
  EXPECT_NEAR(*c.groups[0].target, 0.835, 1e-9);
  EXPECT_EQ(c.groups[0].missed.size(), 2u);
  EXPECT_EQ(c.groups[0].steps_to_target.n, 1);
  EXPECT_DOUBLE_EQ(c.groups[0].planned_time_to_target_s.mean, 30 * 100.0);  // 30 steps (measured) x 100 s (planned)
  EXPECT_DOUBLE_EQ(c.groups[1].planned_time_to_target_s.mean, 10 * 100.0);
  std::string notes;
  for (const auto& n : c.notes) notes += n + "\n";
  for (const char* text :
       {"steps to target (measured) x 100.000 s per step (modelled", "plan.json", "device h100", "--target-from dense"})
    EXPECT_NE(notes.find(text), std::string::npos) << text << " missing from\n" << notes;
  EXPECT_NE(c.table.find("planned time to target"), std::string::npos) << c.table;
  EXPECT_NE(c.json.find("\"planned_time_to_target_s\""), std::string::npos);

  o.target_from = "nope";
  expect_error([&] { compare_seeds(runs, o); }, {"no config named 'nope'", "dense, quant"});
  o.target_from.clear();
  o.plans = {{"nope", o.plans[0].second}};
  expect_error([&] { compare_seeds(runs, o); }, {"no config named 'nope'"});
}

TEST(CompareSeeds, APlanWithoutStepTimeIsAnErrorNamingTheFile) {
  TempDir dir;
  const std::string p = (dir.path() / "plan.json").string();
  write(p, R"({"bytes_per_token": 4096})");
  expect_error([&] { read_plan(p); }, {p, "no \"step_s\"", "tapeline plan"});
  write(p, R"({"step_s": -1})");
  expect_error([&] { read_plan(p); }, {p, "must be a number > 0"});
  write(p, "{oops");
  expect_error([&] { read_plan(p); }, {p, "not JSON"});
  expect_error([&] { read_plan((dir.path() / "none.json").string()); }, {"none.json", "cannot be read"});
}

TEST(CompareSeeds, DrawsErrorBars) {
  TempDir dir;
  const SeedComparison c = compare_seeds(seed_runs(dir.path()), {});
  const PlotResult p = write_seed_plots(c, (dir.path() / "figs").string());
  if (p.missing_matplotlib) GTEST_SKIP() << p.note;
  ASSERT_TRUE(p.written) << p.note;
  EXPECT_TRUE(fs::exists(dir.path() / "figs" / "seeds.json"));
  EXPECT_GT(fs::file_size(dir.path() / "figs" / "seeds.png"), 10000u);
  EXPECT_TRUE(fs::exists(dir.path() / "figs" / "seeds.svg"));
}

}  // namespace
}  // namespace tl
