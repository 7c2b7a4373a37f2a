#pragma once
// A task whose samples are the rows of tensors it holds in memory (the language-model and text
// tasks): its epochs as batches of row ids (IndexBatches), the part of Task both share.

#include <memory>
#include <optional>

#include "tasks/data/loader.h"
#include "tasks/task.h"

namespace tl {

/// Task's batch iteration over in-memory rows: each epoch's training batches in the order
/// IndexBatches draws from run.seed, the test split in order. A subclass gives the row counts once
/// its data is loaded (set_rows) and makes a batch from row ids (make_batch).
class RowBatchedTask : public Task {
 public:
  int64_t train_batches() const override { return train_order_->num_batches(); }
  void start_epoch(int64_t epoch) override { epoch_ = epoch, next_ = 0; }
  std::optional<Batch> next_train_batch() override;
  Batch train_batch(int64_t epoch, int64_t index) const override;
  int64_t eval_batches() const override { return test_order_->num_batches(); }
  Batch eval_batch(int64_t index) const override;

 protected:
  /// `train_rows` training samples in train.batch_size batches (shuffled per epoch, train.drop_last),
  /// `test_rows` test samples in train.eval_batch_size batches, in order.
  void set_rows(const Config& config, int64_t train_rows, int64_t test_rows);
  /// Batch `index` of the training split (`train`) or of the test split: the samples at `rows`.
  virtual Batch make_batch(bool train, const at::Tensor& rows, int64_t index) const = 0;

 private:
  std::unique_ptr<IndexBatches> train_order_, test_order_;
  int64_t epoch_ = 0, next_ = 0;
};

}  // namespace tl
