#include "tasks/data/loader.h"

#include <random>

namespace tl {

uint64_t mix_seed(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  auto splitmix = [](uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  uint64_t h = splitmix(seed);
  h = splitmix(h ^ a);
  h = splitmix(h ^ b);
  return splitmix(h ^ c);
}

DataLoader::DataLoader(ImageDataset data, LoaderOptions options)
    : data_(std::move(data)), options_(std::move(options)) {
  data_.validate(data_.description);
  TORCH_CHECK(options_.batch_size >= 1, "DataLoader: batch_size must be >= 1, got ", options_.batch_size);
  TORCH_CHECK(options_.crop_padding >= 0, "DataLoader: crop_padding must be >= 0, got ", options_.crop_padding);
  TORCH_CHECK(options_.prefetch >= 0, "DataLoader: prefetch must be >= 0, got ", options_.prefetch);
  TORCH_CHECK(options_.mean.size() == options_.std.size(), "DataLoader: ", options_.mean.size(), " mean values but ",
              options_.std.size(), " std values");
  if (!options_.mean.empty()) {
    const int64_t c = data_.channels();
    TORCH_CHECK(static_cast<int64_t>(options_.mean.size()) == c || options_.mean.size() == 1,
                "DataLoader: ", options_.mean.size(), " mean/std values for images with ", c, " channels; give 1 or ",
                c);
    for (double s : options_.std) TORCH_CHECK(s > 0, "DataLoader: std values must be > 0, got ", s);
    mean_ = at::tensor(options_.mean, at::kDouble).to(at::kFloat).expand({c}).reshape({1, c, 1, 1});
    std_ = at::tensor(options_.std, at::kDouble).to(at::kFloat).expand({c}).reshape({1, c, 1, 1});
  }
  TORCH_CHECK(!options_.drop_last || data_.size() >= options_.batch_size, "DataLoader: ", data_.description, " has ",
              data_.size(), " samples, fewer than one batch of ", options_.batch_size, " with drop_last");
}

DataLoader::~DataLoader() { stop(); }

int64_t DataLoader::num_batches() const {
  const int64_t n = data_.size(), b = options_.batch_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

at::Tensor shuffled_order(int64_t n, uint64_t seed, int64_t epoch) {
  at::Tensor order = at::arange(n, at::kLong);
  // Fisher-Yates with a fully specified generator (std::mt19937_64; no std distribution, whose
  // output differs between standard libraries).
  std::mt19937_64 rng(mix_seed(seed, static_cast<uint64_t>(epoch), 0, /*purpose=*/1));
  int64_t* p = order.data_ptr<int64_t>();
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1))]);
  return order;
}

at::Tensor DataLoader::epoch_order(int64_t epoch) const {
  if (!options_.shuffle) return at::arange(data_.size(), at::kLong);
  return shuffled_order(data_.size(), options_.seed, epoch);
}

IndexBatches::IndexBatches(int64_t rows, int64_t batch_size, bool shuffle, bool drop_last, uint64_t seed)
    : rows_(rows), batch_size_(batch_size), shuffle_(shuffle), drop_last_(drop_last), seed_(seed) {
  TORCH_CHECK(batch_size >= 1, "batches: batch_size must be >= 1, got ", batch_size);
  TORCH_CHECK(!drop_last || rows >= batch_size, "batches: ", rows, " samples, fewer than one batch of ", batch_size,
              " with drop_last");
}

int64_t IndexBatches::num_batches() const {
  return drop_last_ ? rows_ / batch_size_ : (rows_ + batch_size_ - 1) / batch_size_;
}

at::Tensor IndexBatches::ids(int64_t epoch, int64_t index) const {
  TORCH_CHECK(index >= 0 && index < num_batches(), "batches: batch ", index, " out of range [0, ", num_batches(), ")");
  if (epoch != cached_epoch_) {
    cached_order_ = shuffle_ ? shuffled_order(rows_, seed_, epoch) : at::arange(rows_, at::kLong);
    cached_epoch_ = epoch;
  }
  const int64_t start = index * batch_size_;
  return cached_order_.narrow(0, start, std::min(batch_size_, rows_ - start)).clone();  // (B)
}

ImageBatch DataLoader::make_batch(int64_t epoch, int64_t index) const { return assemble(epoch_order(epoch), epoch, index); }

ImageBatch DataLoader::assemble(const at::Tensor& order, int64_t epoch, int64_t index) const {
  TORCH_CHECK(index >= 0 && index < num_batches(), "DataLoader: batch ", index, " out of range [0, ", num_batches(),
              ")");
  const int64_t start = index * options_.batch_size;
  const int64_t b = std::min(options_.batch_size, data_.size() - start);
  ImageBatch batch;
  batch.index = index;
  batch.ids = order.narrow(0, start, b).clone();                                      // (B)
  batch.labels = data_.labels.index_select(0, batch.ids);                             // (B)
  at::Tensor x = data_.images.index_select(0, batch.ids).to(at::kFloat).div_(255.0);  // (B, C, H, W)
  const int64_t h = x.size(2), w = x.size(3);
  if (options_.crop_padding > 0 || options_.hflip) {
    std::mt19937_64 rng(mix_seed(options_.seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(index), 2));
    const int64_t p = options_.crop_padding;
    at::Tensor padded = p > 0 ? at::constant_pad_nd(x, {p, p, p, p}, 0.0) : x;  // (B, C, H+2p, W+2p)
    at::Tensor out = p > 0 ? at::empty_like(x) : x;
    for (int64_t i = 0; i < b; ++i) {
      // Draw in a fixed order (crop y, crop x, flip) whatever is enabled, so that toggling one
      // augmentation does not shift the other's draws.
      const uint64_t r_y = rng(), r_x = rng(), r_flip = rng();
      at::Tensor img = padded[i];  // (C, H+2p, W+2p)
      if (p > 0) {
        const int64_t oy = static_cast<int64_t>(r_y % static_cast<uint64_t>(2 * p + 1));
        const int64_t ox = static_cast<int64_t>(r_x % static_cast<uint64_t>(2 * p + 1));
        img = img.narrow(1, oy, h).narrow(2, ox, w);  // (C, H, W)
      }
      if (options_.hflip && (r_flip >> 63)) img = img.flip({2});
      if (p > 0 || options_.hflip) out[i].copy_(img);
    }
    x = out;
  }
  if (mean_.defined()) x = x.sub_(mean_).div_(std_);
  batch.images = x;
  return batch;
}

void DataLoader::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.clear();
  error_ = nullptr;
  stop_ = false;
}

void DataLoader::start_epoch(int64_t epoch) {
  stop();
  epoch_ = epoch;
  next_index_ = 0;
  order_ = epoch_order(epoch);
  if (options_.prefetch > 0) worker_ = std::thread([this, epoch] { produce(epoch, order_); });
}

void DataLoader::produce(int64_t epoch, at::Tensor order) {
  for (int64_t i = 0; i < num_batches(); ++i) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || static_cast<int64_t>(queue_.size()) < options_.prefetch; });
      if (stop_) return;
    }
    try {
      ImageBatch b = assemble(order, epoch, i);
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(b));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::current_exception();
      cv_.notify_all();
      return;
    }
    cv_.notify_all();
  }
}

std::optional<ImageBatch> DataLoader::next() {
  TORCH_CHECK(epoch_ >= 0, "DataLoader::next: call start_epoch first");
  if (next_index_ >= num_batches()) return std::nullopt;
  if (options_.prefetch == 0) return assemble(order_, epoch_, next_index_++);
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return !queue_.empty() || error_ != nullptr; });
  if (queue_.empty() && error_) std::rethrow_exception(error_);
  ImageBatch b = std::move(queue_.front());
  queue_.pop_front();
  ++next_index_;
  lock.unlock();
  cv_.notify_all();
  return b;
}

}  // namespace tl
