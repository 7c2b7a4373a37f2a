#include "tasks/vision.h"

#include <sstream>

namespace tl {

VisionTask::VisionTask(const Config& config) : config_(config) {
  source_ = {config_.data.dataset, config_.data.root, config_.data.image_size, config_.data.channels};
  shape_ = dataset_shape(source_);  // fixed for named datasets; counts class folders otherwise
}

TaskShape VisionTask::shape() const {
  TaskShape s;
  s.input = TaskShape::Input::Images;
  s.output = TaskShape::Output::Classes;
  s.channels = shape_.channels;
  s.num_classes = shape_.num_classes;
  return s;
}

const VisionTask& VisionTask::loaded() const {
  TORCH_CHECK(train_loader_ && test_loader_, "VisionTask: load_data() has not been called");
  return *this;
}

void VisionTask::load_data() {
  DatasetSplits data = load_dataset(source_);
  ImageDataset train = data.train.head(config_.data.train_limit);
  ImageDataset test = data.test.head(config_.data.test_limit);
  LoaderOptions train_opt;
  train_opt.batch_size = config_.train.batch_size;
  train_opt.shuffle = true;
  train_opt.drop_last = config_.train.drop_last;
  train_opt.seed = config_.run.seed;
  if (config_.data.mean.empty()) {
    std::tie(train_opt.mean, train_opt.std) = train.channel_stats();
  } else {
    train_opt.mean = config_.data.mean;
    train_opt.std = config_.data.std;
  }
  train_opt.crop_padding = config_.data.crop_padding;
  train_opt.hflip = config_.data.hflip;
  train_opt.prefetch = config_.data.prefetch;
  LoaderOptions test_opt = train_opt;
  test_opt.batch_size = config_.train.eval_batch_size;
  test_opt.shuffle = false;
  test_opt.drop_last = false;
  test_opt.crop_padding = 0;
  test_opt.hflip = false;
  train_loader_ = std::make_unique<DataLoader>(train, train_opt);
  test_loader_ = std::make_unique<DataLoader>(test, test_opt);
}

std::string VisionTask::describe() const {
  const auto& train = loaded().train_loader_->dataset();
  std::ostringstream s;
  s << train.description << ": " << train.size() << " train / " << test_loader_->num_samples() << " test samples of "
    << train.channels() << "x" << train.height() << "x" << train.width() << ", " << shape_.num_classes << " classes";
  return s.str();
}

Batch VisionTask::convert(ImageBatch b) {
  Batch out;
  out.input = std::move(b.images);   // (B, C, H, W) float32
  out.target = std::move(b.labels);  // (B) int64
  out.sample_ids = std::move(b.ids);
  out.units = at::ones({out.input.size(0)}, at::kLong);
  out.index = b.index;
  return out;
}

std::optional<Batch> VisionTask::next_train_batch() {
  auto b = train_loader_->next();
  if (!b) return std::nullopt;
  return convert(std::move(*b));
}

Batch VisionTask::train_batch(int64_t epoch, int64_t index) const {
  return convert(loaded().train_loader_->make_batch(epoch, index));
}

Batch VisionTask::eval_batch(int64_t index) const { return convert(loaded().test_loader_->make_batch(0, index)); }

}  // namespace tl
