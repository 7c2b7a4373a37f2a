// Run-directory files: metrics.csv and summary.json read back what was written, malformed files
// are errors naming the file, atomic writes replace whole files, and the comparison table.
#include "tasks/runner/report.h"

#include <filesystem>
#include <fstream>

#include "tasks/runner/compare.h"
#include "tests/tasks/task_testing.h"

namespace tl {
namespace {
namespace fs = std::filesystem;
using testing::expect_error;
using testing::TempDir;

EpochMetrics row(int64_t epoch) {
  EpochMetrics m;
  m.epoch = epoch;
  m.train_loss = 1.0 / double(epoch) + 1e-7;
  m.train_metric = 0.5;
  m.test_metric_compressed = 0.8125;
  m.test_metric_uncompressed = 0.375;
  m.bytes_forward = 1000 + epoch;
  m.bytes_backward = 2000;
  m.bytes_uncompressed = 30000;
  m.steps = 10;
  m.lr = 0.0125;
  m.wall_s = 12.5 * double(epoch);
  return m;
}

TEST(Report, MetricsCsvRoundTrip) {
  TempDir dir;
  const std::string path = (dir.path() / "metrics.csv").string();
  write_file_atomic(path, metrics_csv({row(1), row(2)}));
  std::ifstream in(path);
  std::string header;
  std::getline(in, header);
  EXPECT_EQ(header,
            "epoch,train_loss,train_metric,test_loss_compressed,test_loss_uncompressed,test_metric_compressed,"
            "test_metric_uncompressed,bytes_forward,bytes_backward,bytes_uncompressed,steps,lr,wall_s,train_time_s,"
            "compute_s,comm_s,bubble,bytes_dp,bytes_dp_uncompressed,bytes_tp,bytes_tp_uncompressed");
  auto rows = read_metrics_csv(path);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].epoch, 2);
  EXPECT_DOUBLE_EQ(rows[1].train_loss, row(2).train_loss);
  EXPECT_EQ(rows[1].bytes_forward, 1002);
  EXPECT_DOUBLE_EQ(rows[1].wall_s, 25.0);
  EXPECT_DOUBLE_EQ(rows[1].test_metric_uncompressed, 0.375);
  write_file_atomic(path, "epoch,x\n1,2\n");
  expect_error([&] { read_metrics_csv(path); }, {path, "no column 'train_loss'"});
  write_file_atomic(path, metrics_csv({row(1)}) + "2,abc,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0\n");
  expect_error([&] { read_metrics_csv(path); }, {path + ":3", "not a number"});
  write_file_atomic(path, metrics_csv({row(1)}) + "2,1\n");
  expect_error([&] { read_metrics_csv(path); }, {path + ":3", "expected 21 columns"});
  // Files written before the tensor-parallel columns read with them 0.
  std::string old = metrics_csv({row(1)});
  for (const std::string col : {",bytes_tp_uncompressed", ",bytes_tp"}) old.replace(old.find(col), col.size(), "");
  for (int i = 0; i < 2; ++i) old.erase(old.rfind(','), old.rfind('\n') - old.rfind(','));
  write_file_atomic(path, old);
  EXPECT_EQ(read_metrics_csv(path).at(0).bytes_tp, 0);
  // Columns are read by name: an extra one (a later version's) is ignored.
  std::string csv = metrics_csv({row(1)});
  csv.replace(csv.find('\n'), 1, ",extra\n");
  csv.replace(csv.rfind('\n'), 1, ",7\n");
  write_file_atomic(path, csv);
  EXPECT_EQ(read_metrics_csv(path).at(0).bytes_forward, 1001);
}

TEST(Report, SummaryJsonRoundTripAndTable) {
  TempDir dir;
  RunSummary s;
  s.name = "default";
  s.forward = "topk(0.1)";
  s.backward = "topk(0.1)";
  s.stages = 4;
  s.epochs = 2;
  s.fingerprint = "abc";
  s.last = row(2);
  const std::string path = (dir.path() / "summary.json").string();
  EXPECT_FALSE(read_summary_json(path).has_value());
  write_file_atomic(path, summary_json(s));
  auto r = read_summary_json(path);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->name, "default");
  EXPECT_EQ(r->fingerprint, "abc");
  EXPECT_EQ(r->metric, "accuracy");
  EXPECT_TRUE(r->higher_is_better);
  EXPECT_EQ(r->last.bytes_forward, s.last.bytes_forward);
  EXPECT_DOUBLE_EQ(r->bytes_per_step(), (1002.0 + 2000.0) / 10.0);
  write_file_atomic(path, "{\"name\": 3");
  expect_error([&] { read_summary_json(path); }, {path, "not a tapeline summary.json"});

  RunSummary base = s;
  base.name = "baseline";
  base.forward = base.backward = "identity";
  base.last.bytes_forward = base.last.bytes_backward = 15000;
  base.last.test_metric_compressed = base.last.test_metric_uncompressed = 0.875;
  // The end-of-run table of `tapeline train` is compare's, from the summaries in memory.
  std::string table = compare_runs({run_record(s, "default"), run_record(base, "baseline")}).table;
  for (const char* cell : {"81.25%", "37.50%", "87.50%", "300 B", "0.100x", "1.000x", "topk(0.1) / topk(0.1)"})
    EXPECT_NE(table.find(cell), std::string::npos) << cell << " missing from\n" << table;
  // Another metric is shown as a number, and named in the header.
  RunSummary lm = s;
  lm.metric = "perplexity";
  lm.higher_is_better = false;
  lm.last.test_metric_compressed = 3.14159;
  std::string lm_table = compare_runs({run_record(lm, "lm")}).table;
  EXPECT_NE(lm_table.find("perplexity 3.142"), std::string::npos) << lm_table;
  EXPECT_EQ(lm_table.find("%"), std::string::npos) << lm_table;
  EXPECT_EQ(lm_table.find("steps to target"), std::string::npos) << "no target, no columns for it";
  // With a target: steps to it, time per step and time to it (summary.json keeps them).
  lm.target = 3.5;
  lm.steps = 64, lm.steps_to_target = 48;
  lm.last.train_time_s = 64.0, lm.time_to_target_s = 48.0;
  RunSummary missed = lm;
  missed.steps_to_target = -1, missed.time_to_target_s = -1;
  write_file_atomic(path, summary_json(lm));
  r = read_summary_json(path);
  EXPECT_EQ(r->steps_to_target, 48);
  EXPECT_EQ(r->steps, 64);
  EXPECT_DOUBLE_EQ(r->time_per_step_s(), 1.0);
  const std::string timed = compare_runs({run_record(*r, "lm"), run_record(missed, "missed")}).table;
  for (const char* cell : {"steps to target", "time/step", "time to target", "48", "1.000 s", "48.0 s", "not reached"})
    EXPECT_NE(timed.find(cell), std::string::npos) << cell << " missing from\n" << timed;
}

TEST(Report, AtomicWriteReplacesAndLeavesNoTemporaries) {
  TempDir dir;
  const std::string path = (dir.path() / "f.txt").string();
  write_file_atomic(path, "first");
  write_file_atomic(path, "second");
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "second");
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
  expect_error([&] { write_file_atomic((dir.path() / "no" / "such" / "dir.txt").string(), "x"); },
               {"cannot be written"});
  EXPECT_EQ(human_bytes(512), "512 B");
  EXPECT_EQ(human_bytes(22478848), "22.48 MB");
}

}  // namespace
}  // namespace tl
