// End to end on real data: a short Fashion-MNIST training run must learn (>= 75% test accuracy
// with a ResNet-8 and uncompressed boundaries), and a run interrupted after an epoch and resumed
// must end with exactly the metrics of the uninterrupted run. Skipped with a message when the
// dataset (Debian package dataset-fashion-mnist) is not installed.
#include "tasks/runner/trainer.h"

#include "tasks/data/dataset.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/tasks/task_testing.h"

namespace tl {
namespace {
namespace fs = std::filesystem;
using testing::expect_error;
using testing::TempDir;

bool have_fashion_mnist() {
  return fs::exists(fs::path(default_dataset_root("fashion-mnist")) / "train-images-idx3-ubyte.gz");
}

#define REQUIRE_FASHION_MNIST()                                                          \
  if (!have_fashion_mnist())                                                             \
  GTEST_SKIP() << "Fashion-MNIST not found in " << default_dataset_root("fashion-mnist") \
               << " (install the Debian package dataset-fashion-mnist)"

Config small_config(std::vector<std::pair<std::string, std::string>> extra) {
  std::vector<std::pair<std::string, std::string>> kv = {
      {"model.arch", "resnet8"},  {"model.width", "0.5"}, {"model.cuts", "layer1, layer2, layer3"},
      {"train.batch_size", "32"}, {"train.lr", "0.05"},   {"train.schedule", "cosine"},
      {"run.progress", "none"},   {"data.prefetch", "1"}, {"run.seed", "3"}};
  kv.insert(kv.end(), extra.begin(), extra.end());
  return Config::load("", kv);
}

// Trains `cfg` uninterrupted into dir/full, and into dir/part stopping after epoch 1 then
// resuming there; returns both runs' summaries (uninterrupted first).
std::pair<RunSummary, RunSummary> full_and_resumed(const Config& cfg, const TempDir& dir) {
  TrainRequest full;
  full.config = cfg;
  full.out_dir = (dir.path() / "full").string();
  full.quiet = true;
  RunSummary a = run_training(full);
  TrainRequest first = full;
  first.out_dir = (dir.path() / "part").string();
  first.stop_after_epochs = 1;
  RunSummary partial = run_training(first);
  EXPECT_EQ(partial.last.epoch, 1);
  TrainRequest rest = full;
  rest.out_dir = rest.resume_dir = first.out_dir;
  return {a, run_training(rest)};
}

TEST(Trainer, ShortFashionMnistRunLearns) {
  REQUIRE_FASHION_MNIST();
  TempDir dir;
  TrainRequest req;
  // 3000 samples, 2 epochs: 75.6% here (a third of the 6000 x 3 it once ran, for CI time).
  req.config = small_config({{"data.train_limit", "3000"}, {"data.test_limit", "1000"}, {"train.epochs", "2"}});
  req.out_dir = (dir.path() / "run").string();
  req.quiet = true;
  RunSummary s = run_training(req);
  EXPECT_EQ(s.last.epoch, 2);
  EXPECT_EQ(s.stages, 4);
  EXPECT_GE(s.last.test_metric_uncompressed, 0.70) << "ResNet-8 on 3000 Fashion-MNIST samples, 2 epochs";
  // Identity boundaries: compression on and off are the same model.
  EXPECT_EQ(s.last.test_metric_compressed, s.last.test_metric_uncompressed);
  // Bytes: an identity payload is the raw tensor plus a 48-byte header (4-D), each way.
  EXPECT_EQ(s.last.bytes_forward, s.last.bytes_backward);
  const int64_t messages = 3 * s.last.steps;
  EXPECT_EQ(s.last.bytes_forward + s.last.bytes_backward, s.last.bytes_uncompressed + 2 * 48 * messages);
  // The run directory.
  for (const char* f : {"config.ini", "metrics.csv", "metrics.jsonl", "summary.json", "checkpoint.safetensors"})
    EXPECT_TRUE(fs::exists(fs::path(req.out_dir) / f)) << f;
  auto rows = read_metrics_csv((fs::path(req.out_dir) / "metrics.csv").string());
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_LT(rows[1].train_loss, rows[0].train_loss);
  auto summary = read_summary_json((fs::path(req.out_dir) / "summary.json").string());
  ASSERT_TRUE(summary.has_value());
  EXPECT_EQ(summary->last.test_metric_compressed, s.last.test_metric_compressed);
  EXPECT_EQ(summary->fingerprint, config_fingerprint(req.config));
  // `tapeline eval` on the checkpoint reproduces the last epoch's accuracy.
  auto acc = evaluate_run(req.out_dir, {true, false});
  ASSERT_EQ(acc.size(), 2u);
  EXPECT_DOUBLE_EQ(acc[0], s.last.test_metric_compressed);
  EXPECT_DOUBLE_EQ(acc[1], s.last.test_metric_uncompressed);
  std::printf("[ short run ] 3000 train / 1000 test samples, 2 epochs: test accuracy %.2f%%\n",
              100.0 * s.last.test_metric_uncompressed);
}

TEST(Trainer, ResumeReachesTheSameFinalMetrics) {
  REQUIRE_FASHION_MNIST();
  // Stateful codecs (error feedback residual, EF21 estimates), a stochastic-rounding generator,
  // augmentation and two micro-batches: everything a checkpoint must carry.
  Config cfg = small_config({{"data.train_limit", "640"},
                             {"data.test_limit", "300"},
                             {"train.epochs", "3"},
                             {"train.micro_batches", "2"},
                             {"data.crop_padding", "2"},
                             {"data.hflip", "true"},
                             {"boundary.forward", "ef(topk(0.2))"},
                             {"boundary.backward", "ef21(topk(0.3))"},
                             {"boundary.2.forward", "quant(bits=4, round=stochastic)"}});
  TempDir dir;
  const auto [a, b] = full_and_resumed(cfg, dir);
  const fs::path full = dir.path() / "full", part = dir.path() / "part";

  EXPECT_EQ(b.last.epoch, 3);
  auto ra = read_metrics_csv((full / "metrics.csv").string());
  auto rb = read_metrics_csv((part / "metrics.csv").string());
  ASSERT_EQ(ra.size(), 3u);
  ASSERT_EQ(rb.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE("epoch " + std::to_string(i + 1));
    EXPECT_EQ(ra[i].train_loss, rb[i].train_loss);
    EXPECT_EQ(ra[i].test_metric_compressed, rb[i].test_metric_compressed);
    EXPECT_EQ(ra[i].test_metric_uncompressed, rb[i].test_metric_uncompressed);
    EXPECT_EQ(ra[i].bytes_forward, rb[i].bytes_forward);
    EXPECT_EQ(ra[i].bytes_backward, rb[i].bytes_backward);
    EXPECT_EQ(ra[i].lr, rb[i].lr);
  }
  // metrics.jsonl of the resumed run has each step once.
  std::ifstream in(part / "metrics.jsonl");
  std::string line;
  int64_t epoch_lines = 0;
  while (std::getline(in, line)) epoch_lines += line.find("\"epoch_end\"") != std::string::npos;
  EXPECT_EQ(epoch_lines, 3);
}

TEST(Trainer, AdaptiveCodecsLogTheirLevelsAndResumeExactly) {
  REQUIRE_FASHION_MNIST();
  // The three codecs whose level changes (docs/COMPRESSION.md 4.5): levels.csv has a row per
  // step, boundary and direction with a level; the schedule switches at 60% of the run's steps;
  // a run resumed after epoch 1 ends with the same metrics and the same levels.csv.
  Config cfg = small_config({{"data.train_limit", "160"},
                             {"data.test_limit", "64"},
                             {"train.epochs", "2"},
                             {"train.micro_batches", "2"},
                             {"boundary.forward", "adaptive(topk, error=0.3)"},
                             {"boundary.backward", "schedule(quant(bits=4), 0.6, quant(bits=8))"},
                             {"boundary.3.forward", "budget(quant(bits=2), quant(bits=4), topk(0.3), error=0.2)"}});
  TempDir dir;
  const auto [a, b] = full_and_resumed(cfg, dir);
  EXPECT_EQ(b.last.test_metric_compressed, a.last.test_metric_compressed);
  EXPECT_EQ(b.last.bytes_forward, a.last.bytes_forward);
  EXPECT_EQ(b.last.bytes_backward, a.last.bytes_backward);

  auto read = [](const std::string& run) {
    std::ifstream in(fs::path(run) / "levels.csv");
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  };
  const auto la = read((dir.path() / "full").string()), lb = read((dir.path() / "part").string());
  const int64_t steps = 2 * a.last.steps;  // 5 steps of 32 samples per epoch
  ASSERT_EQ(la.size(), static_cast<size_t>(1 + steps * 6));  // 3 cuts x 2 directions, each adaptive
  EXPECT_EQ(la[0], "step,epoch,boundary,direction,level,label,bytes");
  EXPECT_EQ(lb, la);
  ASSERT_EQ(steps, 10);
  // Step s has progress (s - 1) / 10: steps 1..6 (progress < 0.6) send 4-bit gradients, then 8.
  for (const std::string& line : la) {
    if (line.find(",backward,") == std::string::npos) continue;
    const int64_t step = std::stoll(line);
    EXPECT_NE(line.find(step <= 6 ? ",0,\"quant(4," : ",1,\"quant(8,"), std::string::npos) << line;
  }
  // Adaptive starts at the top of its ladder (k = 1) and walks down from the first messages on.
  ASSERT_EQ(la[1].rfind("1,1,1,forward,", 0), 0u) << la[1];
  EXPECT_LT(std::stod(la[1].substr(std::string("1,1,1,forward,").size())), 1.0) << la[1];
}

TEST(Trainer, ConfigurationErrorsStopBeforeTraining) {
  // These fail while the experiment is assembled (no data read for the first three).
  expect_error([] { Experiment e(small_config({{"model.cuts", "layer1, layer9"}})); }, {"model.cuts", "layer9"});
  expect_error(
      [] {
        Experiment e(small_config({{"boundary.4.forward", "topk(0.1)"}}));
      },
      {"boundary.4", "3 cuts", "1..3"});
  expect_error([] { Experiment e(small_config({{"model.arch", "resnet7"}})); }, {"model.arch = resnet7"});
  expect_error(
      [] {
        Experiment e(small_config({{"boundary.forward", "quant(4)"}, {"boundary.backward_mode", "shared"}}));
      },
      {"boundary.1", "shared"});
  expect_error([] { Experiment e(small_config({{"data.root", "/nonexistent/fmnist"}})); }, {"/nonexistent/fmnist"});
  TrainRequest req;
  req.config = small_config({});
  req.out_dir = "/tmp/never-written";
  req.resume_dir = "/nonexistent/run";
  if (have_fashion_mnist()) expect_error([&] { run_training(req); }, {"--resume /nonexistent/run", "no checkpoint"});
}

// Note [OpenBLAS threads]: where the process's BLAS is OpenBLAS (Debian's libtorch), run.threads
// reaches its worker pool too, not only ATen's.
TEST(Trainer, RunThreadsReachOpenBlas) {
  using Getter = int (*)();
  using Setter = void (*)(int);
  auto get = reinterpret_cast<Getter>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  auto set = reinterpret_cast<Setter>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (!get || !set) GTEST_SKIP() << "this libtorch's BLAS is not OpenBLAS (PyTorch's wheels use MKL)";
  const int blas_before = get(), aten_before = at::get_num_threads();
  set(static_cast<int>(std::max(2u, std::thread::hardware_concurrency())));
  {
    Experiment e(small_config({{"run.threads", "1"}}));
    EXPECT_EQ(get(), 1);
    EXPECT_EQ(at::get_num_threads(), 1);
  }
  set(blas_before);
  at::set_num_threads(aten_before);
}

TEST(Trainer, BaselineConfigAndFingerprint) {
  Config c = small_config({{"boundary.forward", "topk(0.1)"},
                           {"boundary.2.backward", "quant(4)"},
                           {"run.progress", "plain"},
                           {"data.root", "/x"}});
  Config b = baseline_config(c);
  EXPECT_EQ(b.boundary_at(1).forward, "identity");
  EXPECT_EQ(b.boundary_at(2).backward, "identity");
  EXPECT_TRUE(b.boundary_override_indices().empty());
  EXPECT_EQ(config_fingerprint(b), config_fingerprint(c));  // comparable: only boundaries and presentation differ
  EXPECT_NE(config_fingerprint(small_config({{"train.epochs", "4"}})), config_fingerprint(small_config({})));
}

TEST(Trainer, StudyConfigsShareEverythingButTheBoundaries) {
  // configs/*.ini are comparable runs: the same data, model and training settings as default.ini.
  const fs::path configs = fs::path(tl::testing::source_dir()) / "configs";
  const std::string fp = config_fingerprint(Config::load((configs / "default.ini").string()));
  int count = 0;
  for (const auto& entry : fs::directory_iterator(configs)) {
    if (entry.path().extension() != ".ini") continue;
    ++count;
    EXPECT_EQ(config_fingerprint(Config::load(entry.path().string())), fp)
        << entry.path().filename() << " differs from default.ini outside [boundary]";
  }
  EXPECT_GE(count, 13);
}

TEST(Trainer, StudyFoldersShareEverythingButTheBoundaries) {
  // configs/{text,lm,pipeline,slowlink}/: each folder's runs compare (text's from-scratch run differs in
  // model.pretrained, on purpose, and AQ-SGD's pads every batch to data.max_length, as its
  // per-sample cache needs one shape; the pipeline configs differ in their links, under [boundary]).
  const fs::path configs = fs::path(tl::testing::source_dir()) / "configs";
  for (const auto& [folder, base] : std::vector<std::pair<std::string, std::string>>{
           {"text", "finetune.ini"}, {"lm", "baseline.ini"}, {"pipeline", "slow_baseline.ini"},
           {"slowlink", "dense_bf16.ini"}}) {
    const std::string fp = config_fingerprint(Config::load((configs / folder / base).string()));
    int count = 0;
    for (const auto& entry : fs::directory_iterator(configs / folder)) {
      if (entry.path().extension() != ".ini" || entry.path().filename() == "finetune_scratch.ini") continue;
      ++count;
      const bool padded = folder == "text" && entry.path().filename() == "aqsgd4.ini";
      const Config c = padded ? Config::load(entry.path().string(), {{"data.pad_to_max_length", "false"}})
                              : Config::load(entry.path().string());
      EXPECT_EQ(config_fingerprint(c), fp)
          << folder << "/" << entry.path().filename().string() << " differs from " << base << " outside [boundary]";
    }
    EXPECT_GE(count, 4) << folder;
  }
}

}  // namespace
}  // namespace tl
