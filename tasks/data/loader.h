#pragma once
// DataLoader: batches of an in-memory ImageDataset, shuffled, augmented and normalised.
//
// Note [determinism]. Every batch is a pure function of (seed, epoch, batch index): the sample
// order of an epoch comes from a generator seeded with (seed, epoch), and the augmentation draws
// of a batch from one seeded with (seed, epoch, batch). Nothing depends on the batches drawn
// before, on the prefetch thread's timing, or on a global RNG, so a run resumed at an epoch
// boundary sees exactly the data an uninterrupted run would.

#include <ATen/ATen.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "tasks/data/dataset.h"

namespace tl {

struct LoaderOptions {
  int64_t batch_size = 128;
  bool shuffle = true;
  bool drop_last = false;  // drop the last, smaller batch of an epoch
  uint64_t seed = 0;
  std::vector<double> mean, std;  // per channel, on pixel values in [0, 1]; empty: no normalisation
  int64_t crop_padding = 0;       // > 0: random crop of the original size from the image zero-padded by this
  bool hflip = false;             // random horizontal flip with probability 1/2
  int64_t prefetch = 2;           // batches prepared ahead by a background thread; 0: made on demand
};

struct ImageBatch {
  at::Tensor images;  // (B, C, H, W) float32, normalised
  at::Tensor labels;  // (B) int64
  at::Tensor ids;     // (B) int64 sample ids: the samples' indices in the dataset (AQ-SGD caches key on them)
  int64_t index = 0;  // position of the batch in its epoch
};

class DataLoader {
 public:
  DataLoader(ImageDataset data, LoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  int64_t num_samples() const { return data_.size(); }
  int64_t num_batches() const;
  const ImageDataset& dataset() const { return data_; }
  const LoaderOptions& options() const { return options_; }

  /// (N) int64: the sample order of `epoch` (identity when not shuffling).
  at::Tensor epoch_order(int64_t epoch) const;
  /// ImageBatch `index` of `epoch`, computed in the calling thread.
  ImageBatch make_batch(int64_t epoch, int64_t index) const;

  /// Begins iterating `epoch` (stopping any epoch in progress); with prefetch > 0 a background
  /// thread prepares up to `prefetch` batches ahead.
  void start_epoch(int64_t epoch);
  /// The next batch of the current epoch, or nullopt after the last one. Errors raised while
  /// preparing a batch are rethrown here.
  std::optional<ImageBatch> next();

 private:
  void stop();
  void produce(int64_t epoch, at::Tensor order);
  ImageBatch assemble(const at::Tensor& order, int64_t epoch, int64_t index) const;

  ImageDataset data_;
  LoaderOptions options_;
  at::Tensor mean_, std_;  // (1, C, 1, 1) float32, or undefined

  // Iteration state.
  int64_t epoch_ = -1, next_index_ = 0;
  at::Tensor order_;
  std::thread worker_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<ImageBatch> queue_;
  std::exception_ptr error_;
  bool stop_ = false;
};

/// splitmix64 of the combined inputs: independent seeds for (seed, epoch, batch, purpose).
uint64_t mix_seed(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0);

/// (n) int64: the sample order of `epoch` under `seed` (Fisher-Yates, fully specified generator).
at::Tensor shuffled_order(int64_t n, uint64_t seed, int64_t epoch);

/// The row ids of fixed-size batches over `rows` in-memory samples, in the order DataLoader uses
/// (shuffled per epoch from the seed, or in order): for datasets already held as tensors (text).
/// Not thread-safe (caches the current epoch's order).
class IndexBatches {
 public:
  IndexBatches(int64_t rows, int64_t batch_size, bool shuffle, bool drop_last, uint64_t seed);
  int64_t num_batches() const;
  int64_t rows() const { return rows_; }
  /// (B) int64 row ids of batch `index` of `epoch`.
  at::Tensor ids(int64_t epoch, int64_t index) const;

 private:
  int64_t rows_, batch_size_;
  bool shuffle_, drop_last_;
  uint64_t seed_;
  mutable int64_t cached_epoch_ = -1;
  mutable at::Tensor cached_order_;
};

}  // namespace tl
