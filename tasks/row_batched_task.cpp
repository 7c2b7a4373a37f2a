#include "tasks/row_batched_task.h"

namespace tl {

void RowBatchedTask::set_rows(const Config& config, int64_t train_rows, int64_t test_rows) {
  train_order_ = std::make_unique<IndexBatches>(train_rows, config.train.batch_size, /*shuffle=*/true,
                                                config.train.drop_last, config.run.seed);
  test_order_ = std::make_unique<IndexBatches>(test_rows, config.train.eval_batch_size, false, false, 0);
}

std::optional<Batch> RowBatchedTask::next_train_batch() {
  if (next_ >= train_batches()) return std::nullopt;
  const int64_t index = next_++;
  return train_batch(epoch_, index);
}

Batch RowBatchedTask::train_batch(int64_t epoch, int64_t index) const {
  return make_batch(/*train=*/true, train_order_->ids(epoch, index), index);
}

Batch RowBatchedTask::eval_batch(int64_t index) const { return make_batch(false, test_order_->ids(0, index), index); }

}  // namespace tl
