#pragma once
// The image classification task: Fashion-MNIST (the main job), MNIST, CIFAR-10/100 or a folder
// of images, read fully validated into memory and served by a DataLoader (seeded shuffle,
// crop/flip augmentation, per-channel normalisation, prefetch thread). Loss: mean cross-entropy
// per sample; metric: accuracy.

#include <memory>

#include "tasks/data/loader.h"
#include "tasks/task.h"

namespace tl {

class VisionTask : public Task {
 public:
  explicit VisionTask(const Config& config);

  std::string name() const override { return "vision"; }
  MetricInfo metric() const override { return {"accuracy", true}; }
  double metric_value(const Tally& t) const override { return t.units > 0 ? t.correct / t.units : 0.0; }
  TaskShape shape() const override;
  std::string unit_name() const override { return "img"; }

  void load_data() override;
  std::string describe() const override;
  int64_t train_samples() const override { return loaded().train_loader_->num_samples(); }
  int64_t test_samples() const override { return loaded().test_loader_->num_samples(); }

  int64_t train_batches() const override { return loaded().train_loader_->num_batches(); }
  void start_epoch(int64_t epoch) override { train_loader_->start_epoch(epoch); }
  std::optional<Batch> next_train_batch() override;
  Batch train_batch(int64_t epoch, int64_t index) const override;
  int64_t eval_batches() const override { return loaded().test_loader_->num_batches(); }
  Batch eval_batch(int64_t index) const override;

  MicroBatchLoss loss(const Variable& output, const Batch& mb) const override { return classification_loss(output, mb); }

 private:
  const VisionTask& loaded() const;
  static Batch convert(ImageBatch b);

  Config config_;
  DatasetSource source_;
  DatasetShape shape_;
  std::unique_ptr<DataLoader> train_loader_, test_loader_;
};

}  // namespace tl
