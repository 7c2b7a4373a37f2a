// tapeline compare: run directories read by column and key name in both schemas (the first
// vision one and the task-generic one), the table, what does not compare, and the plots drawn by
// python/tapeline_plots.py (skipped with a note, never an error, when matplotlib is missing).
#include "tasks/runner/compare.h"

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

}  // namespace
}  // namespace tl
