// Image folders: root/<class>/<file>. Decoding with stb_image; resizing with OpenCV's INTER_AREA
// (good for downscaling) when OpenCV is built in (TL_HAVE_OPENCV), else ATen's bilinear resize.
#include <stb/stb_image.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <tuple>

#include "tasks/data/dataset.h"

#ifdef TL_HAVE_OPENCV
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#endif

namespace tl {
namespace {
namespace fs = std::filesystem;

// Images larger than this (64 Mpixel) are not decoded: a header's size is a claim, and stb
// allocates it before reading the pixels.
constexpr int64_t kMaxPixels = int64_t(1) << 26;

// Note [a JPEG holds its pixels]. stb fills a JPEG's missing entropy-coded data with zeros and
// decodes the whole declared image: a 718-byte progressive JPEG declaring 493 x 64307 pixels took
// over a second (found by tests/fuzz's image harness). Huffman coding spends at least one bit per
// 8x8 luma block on its DC coefficient, so a JPEG holding w x h pixels has at least w h / 512
// bytes; one with fewer than w h / 1024 (half that, for safety) is truncated, and is refused.
void check_jpeg_holds_its_pixels(size_t bytes, int64_t w, int64_t h, const std::string& path) {
  const int64_t least = w * h / 1024;
  TORCH_CHECK(static_cast<int64_t>(bytes) >= least, path, ": truncated JPEG: its ", w, "x", h,
              " pixels need at least ", least, " bytes of coded data, the file has ", bytes);
}

// Note [JPEG Huffman tables before stb_image]. Debian's stb_image (2.27, 2022) trusts the 16 code
// counts of a JPEG Huffman table (DHT segment): when they add up to more than 256 symbols,
// stbi__build_huffman writes past its 257-entry size array (found by tests/fuzz's image harness
// under UBSan; upstream 2.28 rejects such tables). The file is checked here first: every DHT
// table, in the header and between the scans of a progressive JPEG, must declare at most 256
// symbols and fit in its segment. stb also decodes a scan with a table no DHT segment defined,
// whose zeroed lookup arrays send its decoder far out of bounds (a read 9.9 MB past a 256-byte
// array, found the same way): every table a scan uses must be defined before it. Anything else
// malformed is left to stb, which rejects it.
void check_jpeg_headers(const std::vector<uint8_t>& b, const std::string& path) {
  auto bad = [&](size_t at, const std::string& why) {
    TORCH_CHECK(false, path, ": corrupt JPEG (", why, " at byte ", at, ")");
  };
  bool defined[2][4] = {};  // [DC, AC][table id]
  bool progressive = false;
  size_t i = 2;  // after SOI (FF D8)
  while (i + 1 < b.size()) {
    if (b[i] != 0xFF) bad(i, "expected a marker");
    while (i + 1 < b.size() && b[i + 1] == 0xFF) ++i;  // fill bytes
    if (i + 1 >= b.size()) break;
    const uint8_t m = b[i + 1];
    i += 2;
    if (m == 0xD9) return;                                  // EOI
    if (m == 0x01 || (m >= 0xD0 && m <= 0xD8)) continue;   // markers without a length
    if (i + 2 > b.size()) bad(i, "segment length past the end");
    const size_t len = (size_t(b[i]) << 8) | b[i + 1];
    if (len < 2 || i + len > b.size()) bad(i, "segment length " + std::to_string(len) + " past the end");
    if (m == 0xC4) {  // DHT: tables of 1 + 16 + n bytes
      size_t t = i + 2;
      const size_t end = i + len;
      while (t < end) {
        if (t + 17 > end) bad(t, "Huffman table header past its segment");
        const int table_class = b[t] >> 4, id = b[t] & 15;
        if (table_class > 1 || id > 3) bad(t, "Huffman table class " + std::to_string(table_class) + " id " +
                                                  std::to_string(id) + "; accepted: class 0 or 1, id 0 to 3");
        defined[table_class][id] = true;
        size_t n = 0;
        for (size_t k = 1; k <= 16; ++k) n += b[t + k];
        if (n > 256) bad(t, "Huffman table of " + std::to_string(n) + " symbols; at most 256");
        t += 17 + n;
        if (t > end) bad(t, "Huffman table symbols past its segment");
      }
    }
    if (m == 0xC2) progressive = true;
    if (m >= 0xC0 && m <= 0xC2 && len >= 7) {  // SOF: precision, height, width
      const int64_t h = (int64_t(b[i + 3]) << 8) | b[i + 4], w = (int64_t(b[i + 5]) << 8) | b[i + 6];
      check_jpeg_holds_its_pixels(b.size(), w, h, path);
    }
    if (m == 0xDA) {  // SOS: the tables its components use must exist
      const size_t ns = len >= 3 ? b[i + 2] : 0;
      if (len < 6 + 2 * ns) bad(i, "scan header of " + std::to_string(len) + " bytes for " + std::to_string(ns) +
                                       " components");
      const uint8_t ss = b[i + 3 + 2 * ns], ah = b[i + 5 + 2 * ns] >> 4;
      const bool uses_dc = !progressive || (ss == 0 && ah == 0), uses_ac = !progressive || ss > 0;
      for (size_t c = 0; c < ns; ++c) {
        const int dc = b[i + 4 + 2 * c] >> 4, ac = b[i + 4 + 2 * c] & 15;
        for (const auto& [used, table_class, id] : {std::tuple{uses_dc, 0, dc}, std::tuple{uses_ac, 1, ac}}) {
          if (used && (id > 3 || !defined[table_class][id]))
            bad(i, std::string("scan uses ") + (table_class ? "AC" : "DC") + " Huffman table " + std::to_string(id) +
                       ", which no DHT segment before it defines");
        }
      }
    }
    i += len;
    if (m == 0xDA) {  // SOS: entropy-coded data up to the next marker that is not a stuffed 00 or RSTn
      while (i + 1 < b.size() && !(b[i] == 0xFF && b[i + 1] != 0x00 && !(b[i + 1] >= 0xD0 && b[i + 1] <= 0xD7))) ++i;
    }
  }
}

// Note [PNG, JPEG and BMP only; a BMP holds its pixels]. stb_image decodes whatever format it
// recognises in the bytes, whatever the file's extension: TGA, PSD, GIF, HDR, PIC and PNM too.
// The image folder reads PNG, JPEG and BMP, so other decoders are never reached: the first bytes
// must be one of those three signatures. An uncompressed BMP (stb reads no other kind) declares
// its size in its header, and stb fills what the file lacks with zeros: a 90-byte file declaring
// 655408 x 48 pixels at 1 bit took stb over a second (found by tests/fuzz's image harness). Such
// a file is truncated, and is rejected as one before decoding.
uint32_t le32(const std::vector<uint8_t>& b, size_t at) {
  return uint32_t(b[at]) | uint32_t(b[at + 1]) << 8 | uint32_t(b[at + 2]) << 16 | uint32_t(b[at + 3]) << 24;
}
uint16_t le16(const std::vector<uint8_t>& b, size_t at) { return uint16_t(b[at] | b[at + 1] << 8); }

void check_bmp_holds_its_pixels(const std::vector<uint8_t>& b, const std::string& path) {
  TORCH_CHECK(b.size() >= 26, path, ": a BMP file of ", b.size(), " bytes ends inside its headers");
  const uint32_t offset = le32(b, 10), header = le32(b, 14);
  int64_t w = 0, h = 0, bpp = 0, compression = 0;
  if (header == 12) {  // OS/2 BITMAPCOREHEADER
    w = le16(b, 18), h = le16(b, 20), bpp = le16(b, 24);
  } else {
    TORCH_CHECK(b.size() >= 34, path, ": a BMP file of ", b.size(), " bytes ends inside its headers");
    w = static_cast<int32_t>(le32(b, 18)), h = static_cast<int32_t>(le32(b, 22)), bpp = le16(b, 28);
    compression = le32(b, 30);
  }
  // stb 2.27 refuses RLE (1, 2) itself and reads every other value as uncompressed rows.
  if (compression == 1 || compression == 2) return;
  if (w <= 0 || h == 0 || bpp <= 0 || bpp > 32) return;  // stb refuses these itself
  const int64_t row = (w * bpp + 31) / 32 * 4;  // rows are padded to 4 bytes
  const int64_t need = int64_t(offset) + row * std::abs(h);
  TORCH_CHECK(need <= static_cast<int64_t>(b.size()), path, ": truncated BMP: its ", w, "x", std::abs(h), " pixels at ",
              bpp, " bits need ", need, " bytes, the file has ", b.size());
}

// Note [a PNG's chunks fit in the file]. stb_image grows its buffer for the compressed data to
// each IDAT chunk's declared length before reading the chunk, so a 603-byte PNG declaring an IDAT
// of 1.8 GB made it allocate that much (found by tests/fuzz's image harness). Every chunk's
// declared length, its type and its CRC must fit in the file; the compressed data is then bounded
// by the file's size.
uint32_t be32(const std::vector<uint8_t>& b, size_t at) {
  return uint32_t(b[at]) << 24 | uint32_t(b[at + 1]) << 16 | uint32_t(b[at + 2]) << 8 | uint32_t(b[at + 3]);
}

void check_png_chunks_fit(const std::vector<uint8_t>& b, const std::string& path) {
  for (size_t at = 8; at + 8 <= b.size();) {
    const uint64_t length = be32(b, at);
    const std::string type(b.begin() + at + 4, b.begin() + at + 8);
    const uint64_t left = b.size() - at - 8;  // the chunk's data and CRC must follow
    TORCH_CHECK(length + 4 <= left, path, ": truncated PNG: chunk '", type, "' at byte ", at, " declares ", length,
                " bytes of data, the file has ", left, " bytes after its header");
    if (type == "IEND") return;
    at += 12 + length;
  }
}

// The file's bytes, checked: a PNG, JPEG or BMP signature (Note [PNG, JPEG and BMP only; a BMP
// holds its pixels]), a PNG's chunk lengths (Note [a PNG's chunks fit in the file]) and a JPEG's
// Huffman tables and size (Note [JPEG Huffman tables before stb_image], Note [a JPEG holds its
// pixels]).
std::vector<uint8_t> read_image_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, path.string(), ": cannot open for reading");
  std::vector<uint8_t> b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TORCH_CHECK(b.size() <= (size_t(1) << 31), path.string(), ": ", b.size(), " bytes; image files over 2 GiB are not read");
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  const bool png = b.size() >= 8 && std::equal(kPng, kPng + 8, b.begin());
  const bool jpeg = b.size() >= 2 && b[0] == 0xFF && b[1] == 0xD8;
  const bool bmp = b.size() >= 2 && b[0] == 'B' && b[1] == 'M';
  TORCH_CHECK(png || jpeg || bmp, path.string(), ": not a PNG, JPEG or BMP file (its first bytes are none of their ",
              "signatures); image folders read those three formats");
  if (jpeg) check_jpeg_headers(b, path.string());
  if (bmp) check_bmp_holds_its_pixels(b, path.string());
  if (png) check_png_chunks_fit(b, path.string());
  return b;
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
                               const std::vector<std::string>& class_names) {
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
      int w = 0, h = 0, n = 0;
      const std::vector<uint8_t> bytes = read_image_bytes(path);
      TORCH_CHECK(stbi_info_from_memory(bytes.data(), static_cast<int>(bytes.size()), &w, &h, &n), path.string(),
                  ": cannot decode image (", stbi_failure_reason(), "); expected a valid PNG, JPEG or BMP file");
      TORCH_CHECK(int64_t(w) * h <= kMaxPixels, path.string(), ": a ", w, "x", h, " image; at most ", kMaxPixels,
                  " pixels are decoded");
      std::unique_ptr<uint8_t, void (*)(void*)> pixels(
          stbi_load_from_memory(bytes.data(), static_cast<int>(bytes.size()), &w, &h, &n, static_cast<int>(channels)),
          stbi_image_free);
      TORCH_CHECK(pixels != nullptr, path.string(), ": cannot decode image (", stbi_failure_reason(),
                  "); expected a valid PNG, JPEG or BMP file");
      if (image_size == 0) {
        if (first_h < 0) {
          first_h = h, first_w = w, first_path = path.string();
        }
        TORCH_CHECK(h == first_h && w == first_w, path.string(), ": image is ", w, "x", h, " but ", first_path, " is ",
                    first_w, "x", first_h, "; set data.image_size to resize all images to one size");
      }
      at::Tensor hwc = at::from_blob(pixels.get(), {h, w, channels}, at::kByte);
      images.push_back(resize_hwc(hwc, image_size));  // copies out of the stb buffer
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
