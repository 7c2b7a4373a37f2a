// CIFAR binary batches. CIFAR-10: records of <1 x label><3072 x pixel>; CIFAR-100: records of
// <1 x coarse label><1 x fine label><3072 x pixel>. Pixels are 1024 red, then green, then blue
// values of a 32x32 image in row-major order, i.e. already (C, H, W).
#include <filesystem>
#include <fstream>

#include "tasks/data/dataset.h"

namespace tl {

ImageDataset read_cifar_files(const std::vector<std::string>& paths, int64_t num_classes) {
  TORCH_CHECK(num_classes == 10 || num_classes == 100, "read_cifar_files: num_classes must be 10 or 100, got ",
              num_classes);
  const int64_t label_bytes = num_classes == 10 ? 1 : 2, pixel_bytes = 3 * 32 * 32;
  const int64_t record = label_bytes + pixel_bytes;
  std::vector<at::Tensor> images, labels;
  for (const auto& path : paths) {
    TORCH_CHECK(std::filesystem::is_regular_file(path), "cifar", num_classes, ": missing file ", path);
    int64_t size = static_cast<int64_t>(std::filesystem::file_size(path));
    TORCH_CHECK(size > 0 && size % record == 0, path, ": size ", size, " bytes is not a whole number of ", record,
                "-byte CIFAR-", num_classes, " records (", label_bytes, " label byte", label_bytes > 1 ? "s" : "",
                " + 3072 pixel bytes); the file is truncated or not a CIFAR-", num_classes, " binary batch");
    int64_t n = size / record;
    at::Tensor raw = at::empty({n, record}, at::kByte);
    std::ifstream in(path, std::ios::binary);
    in.read(reinterpret_cast<char*>(raw.data_ptr<uint8_t>()), size);
    TORCH_CHECK(in.gcount() == size, path, ": read ", in.gcount(), " of ", size, " bytes");
    at::Tensor lab = raw.select(1, label_bytes - 1).to(at::kLong);  // the fine label for CIFAR-100
    at::Tensor bad = (lab >= num_classes).nonzero();
    if (bad.numel() > 0) {
      int64_t i = bad[0][0].item<int64_t>();
      TORCH_CHECK(false, path, ": record ", i, " has label ", lab[i].item<int64_t>(), "; expected [0, ", num_classes,
                  ") (is this a CIFAR-", num_classes == 10 ? 100 : 10, " file?)");
    }
    images.push_back(raw.narrow(1, label_bytes, pixel_bytes).reshape({n, 3, 32, 32}));
    labels.push_back(lab);
  }
  ImageDataset ds;
  ds.images = at::cat(images, 0).contiguous();
  ds.labels = at::cat(labels, 0);
  ds.num_classes = num_classes;
  static const std::vector<std::string> cifar10 = {"airplane", "automobile", "bird",  "cat",  "deer",
                                                   "dog",      "frog",       "horse", "ship", "truck"};
  if (num_classes == 10) {
    ds.class_names = cifar10;
  } else {
    for (int64_t c = 0; c < num_classes; ++c) ds.class_names.push_back(std::to_string(c));
  }
  return ds;
}

DatasetSplits load_cifar_dir(const std::string& root, int64_t num_classes) {
  namespace fs = std::filesystem;
  const std::string sub = num_classes == 10 ? "cifar-10-batches-bin" : "cifar-100-binary";
  fs::path dir = fs::is_directory(fs::path(root) / sub) ? fs::path(root) / sub : fs::path(root);
  std::vector<std::string> train, test;
  if (num_classes == 10) {
    for (int i = 1; i <= 5; ++i) train.push_back((dir / ("data_batch_" + std::to_string(i) + ".bin")).string());
    test.push_back((dir / "test_batch.bin").string());
  } else {
    train.push_back((dir / "train.bin").string());
    test.push_back((dir / "test.bin").string());
  }
  std::string name = "cifar" + std::to_string(num_classes);
  DatasetSplits s;
  s.train = read_cifar_files(train, num_classes);
  s.train.description = name + " train (" + dir.string() + ")";
  s.test = read_cifar_files(test, num_classes);
  s.test.description = name + " test (" + dir.string() + ")";
  return s;
}

}  // namespace tl
