// Image folders: root/<class>/<file>. Decoding with OpenCV's imgcodecs when OpenCV is built in
// (TL_HAVE_OPENCV), else stb_image (tasks/data/image_decode.h); resizing with OpenCV's INTER_AREA
// (good for downscaling) when OpenCV is built in, else ATen's bilinear resize.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "tasks/data/dataset.h"
#include "tasks/data/image_decode.h"

#ifdef TL_HAVE_OPENCV
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#endif

namespace tl {
namespace {
namespace fs = std::filesystem;

// The bytes of an image file (checked and decoded by decode_image).
std::vector<uint8_t> read_file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, path.string(), ": cannot open for reading");
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

bool is_image(const std::filesystem::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), ::tolower);
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg" || ext == ".bmp";
}

// (H, W, C) uint8 -> (C, size, size) uint8.
at::Tensor resize_hwc(const at::Tensor& hwc, int64_t size) {
  const int64_t h = hwc.size(0), w = hwc.size(1);
  if (size == 0 || (h == size && w == size)) return hwc.permute({2, 0, 1}).contiguous();
#ifdef TL_HAVE_OPENCV
  const int64_t c = hwc.size(2);
  cv::Mat src(static_cast<int>(h), static_cast<int>(w), CV_8UC(static_cast<int>(c)), hwc.data_ptr<uint8_t>());
  at::Tensor out = at::empty({size, size, c}, at::kByte);
  cv::Mat dst(static_cast<int>(size), static_cast<int>(size), CV_8UC(static_cast<int>(c)), out.data_ptr<uint8_t>());
  int interp = (size < h || size < w) ? cv::INTER_AREA : cv::INTER_LINEAR;
  cv::resize(src, dst, dst.size(), 0, 0, interp);
  return out.permute({2, 0, 1}).contiguous();
#else
  at::Tensor x = hwc.permute({2, 0, 1}).unsqueeze(0).to(at::kFloat);  // (1, C, H, W)
  at::Tensor y = at::upsample_bilinear2d(x, {size, size}, /*align_corners=*/false);
  return y.squeeze(0).round().clamp(0, 255).to(at::kByte).contiguous();
#endif
}

}  // namespace

ImageDataset read_image_folder(const std::string& root, int64_t channels, int64_t image_size,
                               const std::vector<std::string>& class_names, ImageDecoder decoder) {
  namespace fs = std::filesystem;
  TORCH_CHECK(channels == 1 || channels == 3, "data.channels: ", channels, " is not supported; accepted: 1, 3");
  TORCH_CHECK(image_size >= 0, "data.image_size: ", image_size, " must be >= 0");
  TORCH_CHECK(fs::is_directory(root), "image folder: '", root, "' is not a directory");
  std::vector<std::string> classes;
  for (const auto& entry : fs::directory_iterator(root))
    if (entry.is_directory()) classes.push_back(entry.path().filename().string());
  std::sort(classes.begin(), classes.end());
  TORCH_CHECK(!classes.empty(), "image folder '", root, "': no class subfolders; expected root/<class>/<image>");
  if (!class_names.empty()) {
    TORCH_CHECK(classes == class_names, "image folder '", root, "': its class subfolders differ from the ",
                class_names.size(), " classes of the training split");
  }
  std::vector<at::Tensor> images;
  std::vector<int64_t> labels;
  int64_t first_h = -1, first_w = -1;
  std::string first_path;
  for (size_t k = 0; k < classes.size(); ++k) {
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(fs::path(root) / classes[k]))
      if (entry.is_regular_file() && is_image(entry.path())) files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    TORCH_CHECK(!files.empty(), "image folder: class folder '", (fs::path(root) / classes[k]).string(),
                "' has no .png, .jpg, .jpeg or .bmp files");
    for (const auto& path : files) {
      const at::Tensor hwc = decode_image(read_file_bytes(path), path.string(), channels, decoder);
      const int64_t h = hwc.size(0), w = hwc.size(1);
      if (image_size == 0) {
        if (first_h < 0) {
          first_h = h, first_w = w, first_path = path.string();
        }
        TORCH_CHECK(h == first_h && w == first_w, path.string(), ": image is ", w, "x", h, " but ", first_path, " is ",
                    first_w, "x", first_h, "; set data.image_size to resize all images to one size");
      }
      images.push_back(resize_hwc(hwc, image_size));
      labels.push_back(static_cast<int64_t>(k));
    }
  }
  ImageDataset ds;
  ds.images = at::stack(images, 0);  // (N, C, H, W)
  ds.labels = at::tensor(labels, at::kLong);
  ds.num_classes = static_cast<int64_t>(classes.size());
  ds.class_names = classes;
  ds.description = "image folder " + root;
  return ds;
}

DatasetSplits load_image_folder_splits(const std::string& root, int64_t channels, int64_t image_size) {
  namespace fs = std::filesystem;
  fs::path train = fs::path(root) / "train", test = fs::path(root) / "test";
  TORCH_CHECK(fs::is_directory(train) && fs::is_directory(test), "data.root '", root,
              "': expected subfolders train/ and test/, each holding one folder per class");
  DatasetSplits s;
  s.train = read_image_folder(train.string(), channels, image_size);
  // load_dataset checks that both splits end up with the same (C, H, W).
  s.test = read_image_folder(test.string(), channels, image_size, s.train.class_names);
  return s;
}

}  // namespace tl
