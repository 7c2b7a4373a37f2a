#pragma once
// Causal language modelling on real English text: the WordNet glosses as running text (one gloss
// per line; tasks/data/wordnet.h), byte-level tokens (vocabulary 256: no tokenizer to download,
// every byte of UTF-8 text representable). The corpus is cut into non-overlapping windows of
// data.seq_len + 1 bytes: the model reads the first seq_len and predicts the last seq_len (each
// byte's successor). Loss: mean cross-entropy per predicted token; metric: perplexity (per byte).

#include <memory>

#include "tasks/row_batched_task.h"

namespace tl {

class LanguageModelTask : public RowBatchedTask {
 public:
  explicit LanguageModelTask(const Config& config);

  std::string name() const override { return "lm"; }
  MetricInfo metric() const override { return {"perplexity", false}; }
  double metric_value(const Tally& t) const override;
  TaskShape shape() const override;
  std::string unit_name() const override { return "tok"; }

  void load_data() override;
  std::string describe() const override { return description_; }
  int64_t train_samples() const override { return train_.defined() ? train_.size(0) : 0; }
  int64_t test_samples() const override { return test_.defined() ? test_.size(0) : 0; }

  MicroBatchLoss loss(const Variable& output, const Batch& mb) const override { return next_token_loss(output, mb); }

  static constexpr int64_t kVocab = 256;  // bytes

  /// (N, seq_len + 1) int64 windows of `text`'s bytes, non-overlapping; the tail that does not
  /// fill a window is dropped. An error when not even one window fits.
  static at::Tensor windows(const std::string& text, int64_t seq_len, const std::string& what);

 private:
  Batch make_batch(bool train, const at::Tensor& rows, int64_t index) const override;

  Config config_;
  at::Tensor train_, test_;  // (N, seq_len + 1) int64
  std::string description_;
};

}  // namespace tl
