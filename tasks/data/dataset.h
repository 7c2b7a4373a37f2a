#pragma once
// ImageDataset: a labelled image classification set held in memory as raw bytes, plus the
// readers that fill it (IDX for MNIST / Fashion-MNIST, CIFAR binary, folders of PNG/JPEG files).
// Every reader validates its files completely before returning: a missing, truncated or
// mislabelled file is an error that names the file and what was expected.

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tasks/data/image_decode.h"

namespace tl {

struct ImageDataset {
  at::Tensor images;  // (N, C, H, W) uint8, CPU, contiguous
  at::Tensor labels;  // (N) int64 in [0, num_classes)
  int64_t num_classes = 0;
  std::vector<std::string> class_names;  // num_classes entries (may be "0", "1", ... when unnamed)
  std::string description;               // e.g. "fashion-mnist train (/usr/share/...)"

  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
  int64_t channels() const { return images.size(1); }
  int64_t height() const { return images.size(2); }
  int64_t width() const { return images.size(3); }

  /// The first `n` samples (a copy-free view); n <= 0 or n >= size() returns the whole set.
  ImageDataset head(int64_t n) const;
  /// Per-channel mean and standard deviation of the pixel values scaled to [0, 1].
  std::pair<std::vector<double>, std::vector<double>> channel_stats() const;
  /// Checks shapes, dtypes and label range; `where` prefixes the error.
  void validate(const std::string& where) const;
};

/// A train/test pair.
struct DatasetSplits {
  ImageDataset train;
  ImageDataset test;
};

/// Where a dataset lives and how to read it (from the [data] section of a config).
struct DatasetSource {
  std::string name;        // fashion-mnist | mnist | cifar10 | cifar100 | folder
  std::string root;        // directory; empty = the default for `name` (see default_dataset_root)
  int64_t image_size = 0;  // folder: resize every image to image_size x image_size (0 = keep)
  int64_t channels = 0;    // folder: 1 or 3 (0 = 3)
};

/// Known dataset names, for error messages and validation.
const std::vector<std::string>& known_datasets();
/// Default root of a dataset: /usr/share/datasets/fashion-mnist for fashion-mnist (the Debian
/// package dataset-fashion-mnist), empty where there is none.
std::string default_dataset_root(const std::string& name);
/// Channels and classes of `source` without reading its images (fixed for the named datasets;
/// folder: `channels` and the number of class folders in root/train), so that a model can be
/// built and checked before the data is loaded.
struct DatasetShape {
  int64_t channels = 0, num_classes = 0;
};
DatasetShape dataset_shape(const DatasetSource& source);
/// Reads both splits of `source`, fully validated.
DatasetSplits load_dataset(const DatasetSource& source);

// ---- IDX (MNIST, Fashion-MNIST) ------------------------------------------------------------------
/// Reads one IDX file, gzip-compressed or raw (zlib reads both), of unsigned bytes. Checks the
/// magic number (0x0000 08 NDIM with NDIM == expected_dims) and that the data is exactly
/// prod(dims) bytes. Returns a uint8 tensor of the stored dims.
at::Tensor read_idx_file(const std::string& path, int64_t expected_dims);
/// MNIST-layout directory: {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz].
DatasetSplits load_mnist_dir(const std::string& root, const std::string& name,
                             const std::vector<std::string>& class_names);

// ---- CIFAR binary --------------------------------------------------------------------------------
/// Reads CIFAR-10 (records of 1 label byte + 3072 pixel bytes) or CIFAR-100 (coarse and fine label
/// bytes + 3072; the fine label is used) binary batches. Errors name the file when its size is not
/// a whole number of records or a label is out of range.
ImageDataset read_cifar_files(const std::vector<std::string>& paths, int64_t num_classes);
/// root holds data_batch_{1..5}.bin and test_batch.bin (CIFAR-10) or train.bin and test.bin
/// (CIFAR-100), directly or in cifar-10-batches-bin/ or cifar-100-binary/.
DatasetSplits load_cifar_dir(const std::string& root, int64_t num_classes);

// ---- image folders -------------------------------------------------------------------------------
/// root/<class>/<image>.{png,jpg,jpeg,bmp}: classes are the subfolder names in sorted order (or
/// `class_names` when given, which must then match). Images are decoded by `decoder` (OpenCV's
/// imgcodecs where built in, else stb_image: tasks/data/image_decode.h) to `channels` (1 or 3)
/// and resized to image_size x image_size (OpenCV where built in, else ATen bilinear);
/// image_size 0 requires every image to have the size of the first.
ImageDataset read_image_folder(const std::string& root, int64_t channels, int64_t image_size,
                               const std::vector<std::string>& class_names = {},
                               ImageDecoder decoder = default_image_decoder());
/// root/train/<class>/... and root/test/<class>/... with the same classes.
DatasetSplits load_image_folder_splits(const std::string& root, int64_t channels, int64_t image_size);

}  // namespace tl
