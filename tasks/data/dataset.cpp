#include "tasks/data/dataset.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <filesystem>

namespace tl {

ImageDataset ImageDataset::head(int64_t n) const {
  if (n <= 0 || n >= size()) return *this;
  ImageDataset out = *this;
  out.images = images.narrow(0, 0, n);
  out.labels = labels.narrow(0, 0, n);
  out.description = description + " (first " + std::to_string(n) + ")";
  return out;
}

std::pair<std::vector<double>, std::vector<double>> ImageDataset::channel_stats() const {
  TORCH_CHECK(size() > 0, "channel_stats: ", description, " is empty");
  // (C, N*H*W) in float64 so that 60000 x 784 sums stay exact enough.
  at::Tensor x = images.transpose(0, 1).reshape({channels(), -1}).to(at::kDouble).div_(255.0);
  at::Tensor mean = x.mean(1);                                     // (C)
  at::Tensor std = (x - mean.unsqueeze(1)).pow(2).mean(1).sqrt();  // (C), population std
  std::vector<double> m(channels()), s(channels());
  for (int64_t c = 0; c < channels(); ++c) {
    m[c] = mean[c].item<double>();
    s[c] = std::max(std[c].item<double>(), 1e-6);  // a constant channel must not divide by zero
  }
  return {m, s};
}

void ImageDataset::validate(const std::string& where) const {
  TORCH_CHECK(images.defined() && images.dim() == 4 && images.scalar_type() == at::kByte, where,
              ": images must be a (N, C, H, W) uint8 tensor");
  TORCH_CHECK(labels.defined() && labels.dim() == 1 && labels.scalar_type() == at::kLong, where,
              ": labels must be a (N) int64 tensor");
  TORCH_CHECK(images.size(0) == labels.size(0), where, ": ", images.size(0), " images but ", labels.size(0), " labels");
  TORCH_CHECK(images.size(0) > 0, where, ": no samples");
  TORCH_CHECK(num_classes > 0 && static_cast<int64_t>(class_names.size()) == num_classes, where, ": num_classes ",
              num_classes, " but ", class_names.size(), " class names");
  int64_t lo = labels.min().item<int64_t>(), hi = labels.max().item<int64_t>();
  TORCH_CHECK(lo >= 0 && hi < num_classes, where, ": label values in [", lo, ", ", hi, "] but expected [0, ",
              num_classes, ")");
}

const std::vector<std::string>& known_datasets() {
  static const std::vector<std::string> names = {"fashion-mnist", "mnist", "cifar10", "cifar100", "folder"};
  return names;
}

std::string default_dataset_root(const std::string& name) {
  if (name == "fashion-mnist") return "/usr/share/datasets/fashion-mnist";
  return "";
}

DatasetShape dataset_shape(const DatasetSource& source) {
  if (source.name == "fashion-mnist" || source.name == "mnist") return {1, 10};
  if (source.name == "cifar10") return {3, 10};
  if (source.name == "cifar100") return {3, 100};
  TORCH_CHECK(source.name == "folder", "data.dataset: unknown dataset '", source.name, "'");
  namespace fs = std::filesystem;
  fs::path train = fs::path(source.root) / "train";
  TORCH_CHECK(!source.root.empty() && fs::is_directory(train), "data.root '", source.root,
              "': expected subfolders train/ and test/, each holding one folder per class");
  int64_t classes = 0;
  for (const auto& entry : fs::directory_iterator(train)) classes += entry.is_directory();
  TORCH_CHECK(classes > 0, "data.root '", source.root, "': no class folders in train/");
  return {source.channels == 0 ? 3 : source.channels, classes};
}

DatasetSplits load_dataset(const DatasetSource& source) {
  const auto& known = known_datasets();
  if (std::find(known.begin(), known.end(), source.name) == known.end()) {
    std::string list;
    for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
    TORCH_CHECK(false, "data.dataset: unknown dataset '", source.name, "'; known: ", list);
  }
  std::string root = source.root.empty() ? default_dataset_root(source.name) : source.root;
  TORCH_CHECK(!root.empty(), "data.root: dataset '", source.name,
              "' has no default location; set data.root to the directory holding its files");
  TORCH_CHECK(std::filesystem::is_directory(root), "data.root: '", root, "' is not a directory",
              source.name == "fashion-mnist" && source.root.empty()
                  ? " (install the Debian package dataset-fashion-mnist, or set data.root)"
                  : "");
  DatasetSplits splits;
  if (source.name == "fashion-mnist") {
    splits = load_mnist_dir(
        root, "fashion-mnist",
        {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"});
  } else if (source.name == "mnist") {
    splits = load_mnist_dir(root, "mnist", {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"});
  } else if (source.name == "cifar10") {
    splits = load_cifar_dir(root, 10);
  } else if (source.name == "cifar100") {
    splits = load_cifar_dir(root, 100);
  } else {
    splits = load_image_folder_splits(root, source.channels == 0 ? 3 : source.channels, source.image_size);
  }
  splits.train.validate(splits.train.description);
  splits.test.validate(splits.test.description);
  TORCH_CHECK(splits.train.images.sizes().slice(1) == splits.test.images.sizes().slice(1), source.name,
              ": train images are ", splits.train.images.sizes().slice(1), " but test images are ",
              splits.test.images.sizes().slice(1), "; both splits must have the same (C, H, W)");
  return splits;
}

}  // namespace tl
