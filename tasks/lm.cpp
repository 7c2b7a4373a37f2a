#include "tasks/lm.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "tasks/data/wordnet.h"

namespace tl {

LanguageModelTask::LanguageModelTask(const Config& config) : config_(config) {}

double LanguageModelTask::metric_value(const Tally& t) const { return t.units > 0 ? std::exp(t.loss()) : 0.0; }

TaskShape LanguageModelTask::shape() const {
  TaskShape s;
  s.input = TaskShape::Input::Tokens;
  s.output = TaskShape::Output::NextToken;
  s.vocab_size = kVocab;
  s.seq_len = config_.data.seq_len;
  return s;
}

at::Tensor LanguageModelTask::windows(const std::string& text, int64_t seq_len, const std::string& what) {
  const int64_t span = seq_len + 1;
  const int64_t n = text.empty() ? 0 : (static_cast<int64_t>(text.size()) - 1) / seq_len;
  TORCH_CHECK(n > 0, "task lm: the ", what, " text has ", text.size(), " bytes, fewer than one window of data.seq_len + 1 = ",
              span);
  at::Tensor bytes = at::empty({static_cast<int64_t>(text.size())}, at::kByte);
  std::memcpy(bytes.data_ptr<uint8_t>(), text.data(), text.size());
  // Window i covers bytes [i L, i L + L]: its last byte is the next window's first input.
  return bytes.to(at::kLong).unfold(0, span, seq_len).narrow(0, 0, n).contiguous();  // (N, L + 1)
}

void LanguageModelTask::load_data() {
  TextCorpus corpus = wordnet_gloss_corpus(config_.data.root, config_.data.test_fraction);
  const int64_t L = config_.data.seq_len;
  train_ = windows(corpus.train, L, "training");
  test_ = windows(corpus.test, L, "test");
  if (config_.data.train_limit > 0) train_ = train_.narrow(0, 0, std::min(config_.data.train_limit, train_.size(0)));
  if (config_.data.test_limit > 0) test_ = test_.narrow(0, 0, std::min(config_.data.test_limit, test_.size(0)));
  set_rows(config_, train_.size(0), test_.size(0));
  std::ostringstream s;
  s << corpus.description << ", byte-level: " << train_.size(0) << " train / " << test_.size(0) << " test windows of "
    << L << " tokens (" << corpus.train.size() << " / " << corpus.test.size() << " bytes in the splits)";
  description_ = s.str();
}

Batch LanguageModelTask::make_batch(bool train, const at::Tensor& rows, int64_t index) const {
  const int64_t L = config_.data.seq_len;
  at::Tensor w = (train ? train_ : test_).index_select(0, rows);  // (B, L + 1)
  Batch b;
  b.input = w.narrow(1, 0, L).contiguous();   // (B, L) bytes read
  b.target = w.narrow(1, 1, L).contiguous();  // (B, L) each byte's successor
  b.side.token_ids = b.input;
  b.sample_ids = rows;
  b.units = at::full({rows.size(0)}, L, at::kLong);  // every position predicts a counted token
  b.index = index;
  return b;
}

}  // namespace tl
