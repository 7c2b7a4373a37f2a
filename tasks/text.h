#pragma once
// Text classification: WordNet glosses labelled with their synset's supersense (the 45
// lexicographer files, noun.animal, verb.motion, ...; tasks/data/wordnet.h), tokenized with the
// pretrained model's WordPiece vocabulary, fine-tuned as sequence classification (the [CLS]
// pooled output into a linear head). Loss: mean cross-entropy per sample; metric: accuracy.
//
// Every text is tokenized once, padded to data.max_length; a batch keeps only the columns up to
// its longest sequence, with the attention mask marking the padding (StageInputs travel to every
// stage, and the token ids to the codecs that need them).

#include <memory>

#include "layers/models/wordpiece.h"
#include "tasks/row_batched_task.h"

namespace tl {

class TextClassificationTask : public RowBatchedTask {
 public:
  explicit TextClassificationTask(const Config& config);

  std::string name() const override { return "text"; }
  MetricInfo metric() const override { return {"accuracy", true}; }
  double metric_value(const Tally& t) const override { return t.units > 0 ? t.correct / t.units : 0.0; }
  TaskShape shape() const override;
  std::string unit_name() const override { return "seq"; }

  void load_data() override;
  std::string describe() const override { return description_; }
  int64_t train_samples() const override { return train_.labels.defined() ? train_.labels.size(0) : 0; }
  int64_t test_samples() const override { return test_.labels.defined() ? test_.labels.size(0) : 0; }

  MicroBatchLoss loss(const Variable& output, const Batch& mb) const override { return classification_loss(output, mb); }

  /// The share of the most frequent class in the test split (the majority-class baseline).
  double majority_baseline() const { return majority_; }

 private:
  struct Encoded {
    at::Tensor ids, mask, labels;  // (N, max_length) int64, (N, max_length) int64, (N) int64
  };
  Batch make_batch(bool train, const at::Tensor& rows, int64_t index) const override;

  Config config_;
  std::unique_ptr<WordPieceTokenizer> tokenizer_;
  int64_t num_classes_ = 0;
  Encoded train_, test_;
  double majority_ = 0;
  std::string description_;
};

}  // namespace tl
