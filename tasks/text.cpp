#include "tasks/text.h"

#include <sstream>

#include "layers/models/pretrained.h"
#include "tasks/data/wordnet.h"

namespace tl {

TextClassificationTask::TextClassificationTask(const Config& config) : config_(config) {
  // The vocabulary is the model's own: cheap to read, and needed to size the model.
  PretrainedDir dir = find_minilm(config_.model.weights);
  tokenizer_ = std::make_unique<WordPieceTokenizer>(dir.vocab);
  num_classes_ = static_cast<int64_t>(wordnet_supersense_names().size());
}

TaskShape TextClassificationTask::shape() const {
  TaskShape s;
  s.input = TaskShape::Input::Tokens;
  s.output = TaskShape::Output::Classes;
  s.num_classes = num_classes_;
  s.vocab_size = static_cast<int64_t>(tokenizer_->vocab_size());
  s.seq_len = config_.data.max_length;
  return s;
}

void TextClassificationTask::load_data() {
  TextSplits splits = wordnet_supersenses(config_.data.root, config_.data.test_fraction);
  TextExamples train = splits.train.head(config_.data.train_limit);
  TextExamples test = splits.test.head(config_.data.test_limit);
  TORCH_CHECK(train.size() > 0 && test.size() > 0, "task text: the WordNet split is empty (data.train_limit / test_limit)");
  auto encode = [&](const TextExamples& ex) {
    EncodedBatch e = tokenizer_->encode_batch(ex.texts, config_.data.max_length, /*pad_to_max=*/true);
    return Encoded{e.ids, e.attention_mask, at::tensor(ex.labels, at::kLong)};
  };
  train_ = encode(train);
  test_ = encode(test);
  set_rows(config_, train.size(), test.size());
  const at::Tensor counts = at::bincount(test_.labels, {}, num_classes_);
  majority_ = counts.max().item<double>() / static_cast<double>(test.size());
  const double truncated =
      train_.mask.select(1, config_.data.max_length - 1).to(at::kDouble).mean().item<double>();  // last column used
  std::ostringstream s;
  s << train.description << ": " << train.size() << " train / " << test.size() << " test texts, " << num_classes_
    << " classes (majority class " << 100 * majority_ << "% of test), max " << config_.data.max_length
    << " tokens (" << 100 * truncated << "% of training texts reach it)";
  description_ = s.str();
}

Batch TextClassificationTask::make_batch(bool train, const at::Tensor& rows, int64_t index) const {
  const Encoded& data = train ? train_ : test_;
  at::Tensor mask = data.mask.index_select(0, rows);  // (B, max_length)
  const int64_t used = config_.data.pad_to_max_length
                           ? config_.data.max_length
                           : std::max<int64_t>(1, mask.sum(1).max().item<int64_t>());  // the longest text of the batch
  Batch b;
  b.input = data.ids.index_select(0, rows).narrow(1, 0, used).contiguous();  // (B, T)
  b.target = data.labels.index_select(0, rows);                             // (B)
  b.side.token_ids = b.input;
  b.side.attention_mask = mask.narrow(1, 0, used).contiguous();  // (B, T) 1 = token
  b.sample_ids = rows;
  b.units = at::ones({rows.size(0)}, at::kLong);
  b.index = index;
  return b;
}

}  // namespace tl
