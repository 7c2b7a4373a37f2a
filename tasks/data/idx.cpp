// IDX files (MNIST, Fashion-MNIST): a 4-byte magic 0x00 0x00 TYPE NDIM (TYPE 0x08 = unsigned
// byte), NDIM big-endian uint32 dimensions, then the data in row-major order. The files are
// usually gzip-compressed; zlib's gzread reads compressed and raw files alike.
#include <zlib.h>

#include <array>
#include <filesystem>
#include <sstream>

#include "tasks/data/dataset.h"

namespace tl {
namespace {

struct GzFile {
  gzFile f = nullptr;
  explicit GzFile(const std::string& path) : f(gzopen(path.c_str(), "rb")) {}
  ~GzFile() {
    if (f) gzclose(f);
  }
  // Reads up to n bytes; returns how many were read (errors other than EOF throw).
  int64_t read(void* dst, int64_t n, const std::string& path) {
    int64_t done = 0;
    auto* p = static_cast<uint8_t*>(dst);
    while (done < n) {
      unsigned chunk = static_cast<unsigned>(std::min<int64_t>(n - done, 1 << 30));
      int got = gzread(f, p + done, chunk);
      if (got < 0) {
        int err = 0;
        const char* msg = gzerror(f, &err);
        TORCH_CHECK(false, path, ": read error (", msg ? msg : "unknown", "); the file is corrupt or truncated");
      }
      if (got == 0) break;
      done += got;
    }
    return done;
  }
};

std::string hex32(uint32_t v) {
  std::ostringstream s;
  s << "0x" << std::hex;
  s.width(8);
  s.fill('0');
  s << v;
  return s.str();
}

// root/base.gz or root/base, whichever exists (the .gz first).
std::string resolve(const std::string& root, const std::string& base, const std::string& dataset) {
  namespace fs = std::filesystem;
  for (const std::string& name : {base + ".gz", base}) {
    fs::path p = fs::path(root) / name;
    if (fs::is_regular_file(p)) return p.string();
  }
  TORCH_CHECK(false, dataset, ": missing file ", (fs::path(root) / (base + ".gz")).string(), " (or ", base,
              " uncompressed) in data.root '", root, "'; expected the IDX files train-images-idx3-ubyte, ",
              "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte");
}

}  // namespace

at::Tensor read_idx_file(const std::string& path, int64_t expected_dims) {
  TORCH_CHECK(std::filesystem::is_regular_file(path), path, ": no such file");
  GzFile file(path);
  TORCH_CHECK(file.f != nullptr, path, ": cannot open for reading");
  std::array<uint8_t, 4> magic{};
  int64_t got = file.read(magic.data(), 4, path);
  TORCH_CHECK(got == 4, path, ": file ends after ", got, " bytes; expected a 4-byte IDX magic number");
  uint32_t magic_value = (uint32_t(magic[0]) << 24) | (uint32_t(magic[1]) << 16) | (uint32_t(magic[2]) << 8) | magic[3];
  uint32_t expected_magic = 0x800u | static_cast<uint32_t>(expected_dims);
  TORCH_CHECK(magic_value == expected_magic, path, ": magic number ", hex32(magic_value), " but expected ",
              hex32(expected_magic), " (IDX, unsigned bytes, ", expected_dims, " dimensions)");
  std::vector<int64_t> dims(expected_dims);
  int64_t total = 1;
  for (int64_t d = 0; d < expected_dims; ++d) {
    std::array<uint8_t, 4> b{};
    got = file.read(b.data(), 4, path);
    TORCH_CHECK(got == 4, path, ": file ends inside the header (dimension ", d, " of ", expected_dims, ")");
    dims[d] = (int64_t(b[0]) << 24) | (int64_t(b[1]) << 16) | (int64_t(b[2]) << 8) | b[3];
    TORCH_CHECK(dims[d] > 0 && dims[d] < (int64_t(1) << 31), path, ": dimension ", d, " is ", dims[d],
                "; expected a positive size");
    TORCH_CHECK(dims[d] < (int64_t(1) << 40) / total, path, ": header declares an implausible size (more than 2^40 bytes)");
    total *= dims[d];
  }
  // The header's size is only a claim: the buffer grows as the data arrives (doubling), so a short
  // file whose header declares gigabytes costs what it holds, not what it claims.
  at::Tensor out = at::empty({std::min<int64_t>(total, int64_t(1) << 24)}, at::kByte);
  got = 0;
  while (true) {
    const int64_t want = out.numel() - got;
    const int64_t n = file.read(out.data_ptr<uint8_t>() + got, want, path);
    got += n;
    if (n < want || got == total) break;
    out.resize_({std::min<int64_t>(total, 2 * out.numel())});
  }
  std::ostringstream shape;
  for (size_t d = 0; d < dims.size(); ++d) shape << (d ? "x" : "") << dims[d];
  TORCH_CHECK(got == total, path, ": truncated: the header declares ", shape.str(), " = ", total,
              " data bytes but the file ends after ", got);
  uint8_t extra = 0;
  TORCH_CHECK(file.read(&extra, 1, path) == 0, path, ": has data after the ", total, " bytes its header (", shape.str(),
              ") declares");
  return out.view(dims);
}

DatasetSplits load_mnist_dir(const std::string& root, const std::string& name,
                             const std::vector<std::string>& class_names) {
  auto load = [&](const std::string& prefix, const std::string& split) {
    std::string images_path = resolve(root, prefix + "-images-idx3-ubyte", name);
    std::string labels_path = resolve(root, prefix + "-labels-idx1-ubyte", name);
    at::Tensor images = read_idx_file(images_path, 3);  // (N, H, W)
    at::Tensor labels = read_idx_file(labels_path, 1);  // (N)
    TORCH_CHECK(images.size(0) == labels.size(0), name, " ", split, ": ", images_path, " holds ", images.size(0),
                " images but ", labels_path, " holds ", labels.size(0), " labels; expected the same count");
    int64_t k = static_cast<int64_t>(class_names.size());
    at::Tensor bad = (labels >= k).nonzero();
    if (bad.numel() > 0) {
      int64_t i = bad[0][0].item<int64_t>();
      TORCH_CHECK(false, labels_path, ": label ", int(labels[i].item<uint8_t>()), " at index ", i,
                  " is out of range; expected labels in [0, ", k, ")");
    }
    ImageDataset ds;
    ds.images = images.unsqueeze(1).contiguous();  // (N, 1, H, W)
    ds.labels = labels.to(at::kLong);
    ds.num_classes = k;
    ds.class_names = class_names;
    ds.description = name + " " + split + " (" + root + ")";
    return ds;
  };
  DatasetSplits s;
  s.train = load("train", "train");
  s.test = load("t10k", "test");
  return s;
}

}  // namespace tl
