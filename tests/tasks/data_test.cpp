// Dataset readers on small generated files of every format, corrupt files rejected with messages
// that name the file and the expectation, and the loader's determinism and augmentations.
#include <stb/stb_image_write.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "tasks/data/dataset.h"
#include "tasks/data/loader.h"
#include "tests/tasks/task_testing.h"

namespace tl {
namespace {
namespace fs = std::filesystem;
using testing::expect_error;
using testing::TempDir;

std::vector<uint8_t> idx_bytes(uint8_t ndim, const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out = {0, 0, 0x08, ndim};
  for (uint32_t d : dims) {
    out.push_back(uint8_t(d >> 24)), out.push_back(uint8_t(d >> 16)), out.push_back(uint8_t(d >> 8));
    out.push_back(uint8_t(d));
  }
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

void write_raw(const fs::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

void write_gz(const fs::path& p, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(p.string().c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  gzclose(f);
}

// An MNIST-layout directory with n train and m test images of h x w; pixel = (i * 7 + j) % 256,
// label = i % 10. gz: compressed files.
void write_mnist(const fs::path& dir, int n, int m, int h, int w, bool gz) {
  auto put = [&](const std::string& base, int count, bool images) {
    std::vector<uint8_t> data;
    if (images) {
      for (int i = 0; i < count; ++i)
        for (int j = 0; j < h * w; ++j) data.push_back(uint8_t((i * 7 + j) % 256));
    } else {
      for (int i = 0; i < count; ++i) data.push_back(uint8_t(i % 10));
    }
    auto bytes = images ? idx_bytes(3, {uint32_t(count), uint32_t(h), uint32_t(w)}, data)
                        : idx_bytes(1, {uint32_t(count)}, data);
    if (gz)
      write_gz(dir / (base + ".gz"), bytes);
    else
      write_raw(dir / base, bytes);
  };
  put("train-images-idx3-ubyte", n, true);
  put("train-labels-idx1-ubyte", n, false);
  put("t10k-images-idx3-ubyte", m, true);
  put("t10k-labels-idx1-ubyte", m, false);
}

TEST(IdxReader, ReadsGzipAndRawFilesAlike) {
  for (bool gz : {true, false}) {
    TempDir dir;
    write_mnist(dir.path(), 12, 5, 4, 3, gz);
    DatasetSource src{"mnist", dir.path().string()};
    DatasetSplits s = load_dataset(src);
    ASSERT_EQ(s.train.images.sizes(), at::IntArrayRef({12, 1, 4, 3})) << "gz=" << gz;
    ASSERT_EQ(s.test.images.sizes(), at::IntArrayRef({5, 1, 4, 3}));
    EXPECT_EQ(s.train.images[7][0][1][2].item<uint8_t>(), uint8_t((7 * 7 + 1 * 3 + 2) % 256));
    EXPECT_EQ(s.train.labels[7].item<int64_t>(), 7);
    EXPECT_EQ(s.test.labels[4].item<int64_t>(), 4);
    EXPECT_EQ(s.train.num_classes, 10);
    EXPECT_EQ(s.train.labels.scalar_type(), at::kLong);
  }
}

TEST(IdxReader, RejectsWrongMagic) {
  TempDir dir;
  // A labels file (idx1) where images (idx3) are expected.
  write_raw(dir.path() / "x", idx_bytes(1, {4}, {1, 2, 3, 4}));
  expect_error([&] { read_idx_file((dir.path() / "x").string(), 3); },
               {(dir.path() / "x").string(), "magic number 0x00000801", "expected 0x00000803"});
}

TEST(IdxReader, RejectsTruncatedAndOversizedData) {
  TempDir dir;
  auto bytes = idx_bytes(3, {2, 3, 3}, std::vector<uint8_t>(18, 5));
  auto truncated = std::vector<uint8_t>(bytes.begin(), bytes.end() - 4);
  write_gz(dir.path() / "t.gz", truncated);
  expect_error([&] { read_idx_file((dir.path() / "t.gz").string(), 3); },
               {"t.gz", "truncated", "2x3x3 = 18 data bytes", "ends after 14"});
  // A gzip stream cut in the middle.
  write_gz(dir.path() / "full.gz", bytes);
  auto size = fs::file_size(dir.path() / "full.gz");
  fs::resize_file(dir.path() / "full.gz", size - 10);
  expect_error([&] { read_idx_file((dir.path() / "full.gz").string(), 3); }, {"full.gz"});
  auto longer = bytes;
  longer.push_back(1);
  write_raw(dir.path() / "long", longer);
  expect_error([&] { read_idx_file((dir.path() / "long").string(), 3); }, {"long", "data after the 18 bytes"});
  write_raw(dir.path() / "short", {0, 0, 8});
  expect_error([&] { read_idx_file((dir.path() / "short").string(), 3); }, {"short", "4-byte IDX magic"});
}

TEST(IdxReader, MissingFileAndMismatchedCountsAndBadLabels) {
  TempDir dir;
  write_mnist(dir.path(), 6, 3, 2, 2, true);
  fs::remove(dir.path() / "t10k-labels-idx1-ubyte.gz");
  DatasetSource src{"mnist", dir.path().string()};
  expect_error([&] { load_dataset(src); }, {"missing file", "t10k-labels-idx1-ubyte.gz"});

  write_gz(dir.path() / "t10k-labels-idx1-ubyte.gz", idx_bytes(1, {4}, {0, 1, 2, 3}));
  expect_error([&] { load_dataset(src); }, {"holds 3 images", "4 labels"});

  write_gz(dir.path() / "t10k-labels-idx1-ubyte.gz", idx_bytes(1, {3}, {0, 11, 2}));
  expect_error([&] { load_dataset(src); }, {"t10k-labels-idx1-ubyte.gz", "label 11 at index 1", "[0, 10)"});
}

TEST(DatasetSource, UnknownNameAndMissingRoot) {
  expect_error([] { load_dataset({"imagenet", "/tmp"}); }, {"unknown dataset 'imagenet'", "fashion-mnist"});
  expect_error([] { load_dataset({"mnist", ""}); }, {"data.root", "no default location"});
  expect_error([] { load_dataset({"mnist", "/nonexistent/dir"}); }, {"/nonexistent/dir", "not a directory"});
}

std::vector<uint8_t> cifar_records(int n, int label_bytes, int label_mod) {
  std::vector<uint8_t> out;
  for (int i = 0; i < n; ++i) {
    if (label_bytes == 2) out.push_back(uint8_t(i % 20));  // coarse
    out.push_back(uint8_t(i % label_mod));
    for (int j = 0; j < 3072; ++j) out.push_back(uint8_t((i + j) % 251));
  }
  return out;
}

TEST(CifarReader, ReadsCifar10AndCifar100) {
  TempDir dir;
  fs::create_directories(dir.path() / "cifar-10-batches-bin");
  for (int b = 1; b <= 5; ++b)
    write_raw(dir.path() / "cifar-10-batches-bin" / ("data_batch_" + std::to_string(b) + ".bin"),
              cifar_records(3, 1, 10));
  write_raw(dir.path() / "cifar-10-batches-bin" / "test_batch.bin", cifar_records(4, 1, 10));
  DatasetSplits s = load_dataset({"cifar10", dir.path().string()});
  ASSERT_EQ(s.train.images.sizes(), at::IntArrayRef({15, 3, 32, 32}));
  ASSERT_EQ(s.test.size(), 4);
  // Record 2 of a batch: pixel (c, y, x) = (2 + c*1024 + y*32 + x) % 251.
  EXPECT_EQ(s.train.images[2][1][3][4].item<uint8_t>(), uint8_t((2 + 1024 + 3 * 32 + 4) % 251));
  EXPECT_EQ(s.train.labels[2].item<int64_t>(), 2);
  EXPECT_EQ(s.train.class_names[0], "airplane");

  TempDir dir100;
  write_raw(dir100.path() / "train.bin", cifar_records(7, 2, 100));
  write_raw(dir100.path() / "test.bin", cifar_records(2, 2, 100));
  DatasetSplits c = load_dataset({"cifar100", dir100.path().string()});
  EXPECT_EQ(c.train.size(), 7);
  EXPECT_EQ(c.train.num_classes, 100);
  EXPECT_EQ(c.train.labels[5].item<int64_t>(), 5);  // the fine label, not the coarse one
  EXPECT_EQ(c.train.images[5][0][0][1].item<uint8_t>(), uint8_t((5 + 1) % 251));
}

TEST(CifarReader, RejectsTruncatedFilesAndBadLabels) {
  TempDir dir;
  auto recs = cifar_records(3, 1, 10);
  recs.resize(recs.size() - 100);
  write_raw(dir.path() / "a.bin", recs);
  expect_error([&] { read_cifar_files({(dir.path() / "a.bin").string()}, 10); },
               {"a.bin", "not a whole number of 3073-byte CIFAR-10 records"});
  // CIFAR-100 records read as CIFAR-10: sizes differ.
  write_raw(dir.path() / "b.bin", cifar_records(3, 2, 100));
  expect_error([&] { read_cifar_files({(dir.path() / "b.bin").string()}, 10); }, {"b.bin", "3073-byte"});
  // Label out of range.
  write_raw(dir.path() / "c.bin", cifar_records(20, 1, 20));
  expect_error([&] { read_cifar_files({(dir.path() / "c.bin").string()}, 10); },
               {"c.bin", "record 10 has label 10", "[0, 10)"});
  expect_error([&] { read_cifar_files({(dir.path() / "missing.bin").string()}, 10); }, {"missing file", "missing.bin"});
}

// An RGB image whose pixel (y, x) = (10 * k + y, x, 200).
void write_png(const fs::path& p, int w, int h, int k) {
  std::vector<uint8_t> px;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) px.insert(px.end(), {uint8_t(10 * k + y), uint8_t(x), 200});
  ASSERT_TRUE(stbi_write_png(p.string().c_str(), w, h, 3, px.data(), w * 3));
}

TEST(ImageFolder, DecodesPngAndJpegPerClassFolder) {
  TempDir dir;
  for (const std::string split : {"train", "test"}) {
    for (const std::string cls : {"cat", "dog"}) fs::create_directories(dir.path() / split / cls);
    write_png(dir.path() / split / "cat" / "a.png", 6, 5, 1);
    write_png(dir.path() / split / "dog" / "b.png", 6, 5, 2);
  }
  // A JPEG in train/dog (lossy: checked loosely).
  std::vector<uint8_t> grey(6 * 5 * 3, 128);
  ASSERT_TRUE(stbi_write_jpg((dir.path() / "train" / "dog" / "c.jpg").string().c_str(), 6, 5, 3, grey.data(), 95));
  DatasetSplits s = load_dataset({"folder", dir.path().string(), 0, 3});
  ASSERT_EQ(s.train.images.sizes(), at::IntArrayRef({3, 3, 5, 6}));
  EXPECT_EQ(s.train.class_names, (std::vector<std::string>{"cat", "dog"}));
  EXPECT_TRUE(at::equal(s.train.labels, at::tensor({0, 1, 1}, at::kLong)));
  EXPECT_EQ(s.train.images[0][0][3][0].item<uint8_t>(), 13);  // (c=R, y=3): 10 * 1 + 3
  EXPECT_EQ(s.train.images[1][1][0][4].item<uint8_t>(), 4);   // (c=G, x=4)
  EXPECT_EQ(s.train.images[1][2][2][2].item<uint8_t>(), 200);
  EXPECT_NEAR(s.train.images[2].to(at::kFloat).mean().item<double>(), 128.0, 3.0);

  // Grey decoding and resizing to 8 x 8 (OpenCV or ATen): a constant image stays constant.
  DatasetSplits g = load_dataset({"folder", dir.path().string(), 8, 1});
  ASSERT_EQ(g.train.images.sizes(), at::IntArrayRef({3, 1, 8, 8}));
  EXPECT_NEAR(g.train.images[2].to(at::kFloat).mean().item<double>(), 128.0, 3.0);
  EXPECT_NEAR(g.train.images[2].to(at::kFloat).std().item<double>(), 0.0, 1.5);
}

TEST(ImageFolder, RejectsCorruptImagesAndMixedSizes) {
  TempDir dir;
  fs::create_directories(dir.path() / "a");
  write_png(dir.path() / "a" / "1.png", 4, 4, 0);
  write_png(dir.path() / "a" / "2.png", 5, 4, 0);
  expect_error([&] { read_image_folder(dir.path().string(), 3, 0); }, {"2.png", "5x4", "data.image_size"});
  write_raw(dir.path() / "a" / "2.png", {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n', 1, 2, 3});
  expect_error([&] { read_image_folder(dir.path().string(), 3, 0); }, {"2.png", "cannot decode"});
  // Another format stb_image reads (a PNM) is refused before any decoder sees it.
  write_raw(dir.path() / "a" / "2.png", {'P', '5', ' ', '1', ' ', '1', ' ', '2', '5', '5', '\n', 7});
  expect_error([&] { read_image_folder(dir.path().string(), 3, 0); }, {"2.png", "not a PNG, JPEG or BMP file"});
  // A BMP whose header declares more pixels than the file holds (Note [PNG, JPEG and BMP only; a
  // BMP holds its pixels]): a whole 4x4 24-bit BMP, then the same cut short by one byte.
  fs::remove(dir.path() / "a" / "2.png");
  ASSERT_TRUE(stbi_write_bmp((dir.path() / "a" / "2.bmp").string().c_str(), 4, 4, 3, std::vector<uint8_t>(48, 9).data()));
  EXPECT_EQ(read_image_folder(dir.path().string(), 3, 0).images.size(0), 2);
  std::ifstream bmp_in(dir.path() / "a" / "2.bmp", std::ios::binary);
  std::vector<uint8_t> bmp((std::istreambuf_iterator<char>(bmp_in)), std::istreambuf_iterator<char>());
  bmp.pop_back();
  write_raw(dir.path() / "a" / "2.bmp", bmp);
  expect_error([&] { read_image_folder(dir.path().string(), 3, 0); }, {"2.bmp", "truncated BMP", "4x4 pixels at 24 bits"});
  fs::remove(dir.path() / "a" / "2.bmp");
  // A PNG chunk that declares more bytes than the file has (Note [a PNG's chunks fit in the file]).
  write_png(dir.path() / "a" / "2.png", 4, 4, 0);
  std::ifstream png_in(dir.path() / "a" / "2.png", std::ios::binary);
  std::vector<uint8_t> png((std::istreambuf_iterator<char>(png_in)), std::istreambuf_iterator<char>());
  png_in.close();
  const auto idat = std::search(png.begin(), png.end(), std::begin("IDAT"), std::end("IDAT") - 1);
  ASSERT_NE(idat, png.end());
  std::fill(idat - 4, idat, uint8_t(0x6c));  // length 0x6c6c6c6c
  write_raw(dir.path() / "a" / "2.png", png);
  expect_error([&] { read_image_folder(dir.path().string(), 3, 0); }, {"2.png", "truncated PNG", "'IDAT'", "1819044972"});
  fs::remove(dir.path() / "a" / "2.png");
  fs::create_directories(dir.path() / "b");
  expect_error([&] { read_image_folder(dir.path().string(), 3, 0); }, {"b", "no .png"});
}

// Every decoder the build has (stb_image, OpenCV) gives stb's pixels for PNG and BMP, grey
// included, and a JPEG's within a few levels (Note [one image, either decoder] in
// tasks/data/image_decode.cpp).
TEST(ImageFolder, DecodersGiveTheSamePixels) {
  TempDir dir;
  const int w = 16, h = 12;
  std::vector<uint8_t> rgb, rgba, grey;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const uint8_t r = uint8_t(16 * y + x), g = uint8_t(15 * x), b = uint8_t(200 - 7 * y);
      rgb.insert(rgb.end(), {r, g, b});
      rgba.insert(rgba.end(), {r, g, b, uint8_t(x * y)});
      grey.push_back(uint8_t(x * y));
    }
  const fs::path d = dir.path();
  ASSERT_TRUE(stbi_write_png((d / "rgb.png").string().c_str(), w, h, 3, rgb.data(), w * 3));
  ASSERT_TRUE(stbi_write_png((d / "rgba.png").string().c_str(), w, h, 4, rgba.data(), w * 4));
  ASSERT_TRUE(stbi_write_png((d / "grey.png").string().c_str(), w, h, 1, grey.data(), w));
  ASSERT_TRUE(stbi_write_bmp((d / "rgb.bmp").string().c_str(), w, h, 3, rgb.data()));
  ASSERT_TRUE(stbi_write_jpg((d / "rgb.jpg").string().c_str(), w, h, 3, rgb.data(), 95));
  for (const std::string name : {"rgb.png", "rgba.png", "grey.png", "rgb.bmp", "rgb.jpg"}) {
    std::ifstream in(d / name, std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const int64_t tolerance = name == "rgb.jpg" ? 4 : 0;
    for (const int64_t channels : {1, 3}) {
      const at::Tensor ref = decode_image(bytes, name, channels, ImageDecoder::stb);  // (H, W, C)
      ASSERT_EQ(ref.sizes(), at::IntArrayRef({h, w, channels})) << name;
      for (const ImageDecoder decoder : image_decoders()) {
        const at::Tensor x = decode_image(bytes, name, channels, decoder);
        ASSERT_EQ(x.sizes(), ref.sizes()) << name << " " << image_decoder_name(decoder);
        EXPECT_LE((x.to(at::kInt) - ref.to(at::kInt)).abs().max().item<int>(), tolerance)
            << name << ", " << channels << " channels, " << image_decoder_name(decoder);
      }
    }
  }
}

ImageDataset toy_dataset(int64_t n, int64_t c = 1, int64_t h = 6, int64_t w = 6) {
  ImageDataset ds;
  ds.images = at::arange(n * c * h * w, at::kLong).remainder(256).to(at::kByte).reshape({n, c, h, w});
  ds.labels = at::arange(n, at::kLong).remainder(3);
  ds.num_classes = 3;
  ds.class_names = {"a", "b", "c"};
  ds.description = "toy";
  return ds;
}

std::vector<ImageBatch> epoch_batches(DataLoader& loader, int64_t epoch) {
  std::vector<ImageBatch> out;
  loader.start_epoch(epoch);
  while (auto b = loader.next()) out.push_back(*b);
  return out;
}

TEST(DataLoader, DeterministicForASeedWithOrWithoutPrefetch) {
  LoaderOptions opt;
  opt.batch_size = 7;
  opt.seed = 42;
  opt.crop_padding = 2;
  opt.hflip = true;
  opt.mean = {0.5};
  opt.std = {0.25};
  opt.prefetch = 3;
  DataLoader a(toy_dataset(40), opt);
  opt.prefetch = 0;
  DataLoader b(toy_dataset(40), opt);
  for (int64_t epoch : {0, 1}) {
    auto xa = epoch_batches(a, epoch), xb = epoch_batches(b, epoch);
    ASSERT_EQ(xa.size(), 6u);  // 40 / 7 rounded up
    ASSERT_EQ(xb.size(), 6u);
    for (size_t i = 0; i < xa.size(); ++i) {
      EXPECT_TRUE(at::equal(xa[i].ids, xb[i].ids));
      EXPECT_TRUE(at::equal(xa[i].images, xb[i].images)) << "epoch " << epoch << " batch " << i;
      // Random access gives the same batch as iteration.
      EXPECT_TRUE(at::equal(a.make_batch(epoch, i).images, xa[i].images));
    }
  }
  // Different epochs and seeds give different orders; every sample appears exactly once.
  at::Tensor o0 = a.epoch_order(0), o1 = a.epoch_order(1);
  EXPECT_FALSE(at::equal(o0, o1));
  EXPECT_TRUE(at::equal(std::get<0>(o0.sort()), at::arange(40, at::kLong)));
  opt.seed = 43;
  DataLoader c(toy_dataset(40), opt);
  EXPECT_FALSE(at::equal(c.epoch_order(0), o0));
}

TEST(DataLoader, BatchesCarryIdsLabelsAndNormalisedPixels) {
  LoaderOptions opt;
  opt.batch_size = 8;
  opt.seed = 1;
  opt.drop_last = true;
  opt.mean = {0.25};
  opt.std = {0.5};
  ImageDataset ds = toy_dataset(20);
  DataLoader loader(ds, opt);
  auto batches = epoch_batches(loader, 3);
  ASSERT_EQ(batches.size(), 2u);  // 20 / 8 with drop_last
  std::vector<int64_t> seen;
  for (const auto& b : batches) {
    ASSERT_EQ(b.images.sizes(), at::IntArrayRef({8, 1, 6, 6}));
    EXPECT_EQ(b.images.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(b.labels, ds.labels.index_select(0, b.ids)));
    at::Tensor expected = (ds.images.index_select(0, b.ids).to(at::kFloat) / 255.0 - 0.25) / 0.5;
    EXPECT_TRUE(testing::all_close(b.images, expected, "normalised pixels", 1e-6, 1e-6));
    for (int64_t i = 0; i < b.ids.numel(); ++i) seen.push_back(b.ids[i].item<int64_t>());
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::unique(seen.begin(), seen.end()), seen.end());  // no sample twice in an epoch
  opt.drop_last = false;
  DataLoader keep(ds, opt);
  EXPECT_EQ(keep.num_batches(), 3);
  EXPECT_EQ(keep.make_batch(0, 2).ids.numel(), 4);
}

TEST(DataLoader, CropAndFlipMoveWholeImages) {
  // Each augmented image must equal its source image shifted by at most `pad` pixels in each
  // direction (zeros entering) and possibly mirrored; and both flips must occur.
  LoaderOptions opt;
  opt.batch_size = 16;
  opt.seed = 5;
  opt.crop_padding = 2;
  opt.hflip = true;
  opt.shuffle = false;
  ImageDataset ds = toy_dataset(16, 2, 5, 5);
  ds.images.clamp_min_(1);  // no zero pixels in the source, so padding is recognisable
  DataLoader loader(ds, opt);
  ImageBatch b = loader.make_batch(0, 0);
  int flipped = 0, shifted = 0;
  for (int64_t i = 0; i < 16; ++i) {
    at::Tensor src = ds.images[i].to(at::kFloat) / 255.0;
    at::Tensor padded = at::constant_pad_nd(src, {2, 2, 2, 2}, 0.0);
    bool found = false;
    for (int64_t oy = 0; oy <= 4 && !found; ++oy)
      for (int64_t ox = 0; ox <= 4 && !found; ++ox)
        for (bool flip : {false, true}) {
          at::Tensor crop = padded.narrow(1, oy, 5).narrow(2, ox, 5);
          if (flip) crop = crop.flip({2});
          if (at::equal(crop, b.images[i])) {
            found = true;
            flipped += flip;
            shifted += (oy != 2 || ox != 2);
            break;
          }
        }
    EXPECT_TRUE(found) << "image " << i << " is not a shifted/flipped copy of its source";
  }
  EXPECT_GT(flipped, 0);
  EXPECT_LT(flipped, 16);
  EXPECT_GT(shifted, 0);
}

TEST(DataLoader, ChannelStatsAndHead) {
  ImageDataset ds = toy_dataset(10, 3, 2, 2);
  auto [mean, std] = ds.channel_stats();
  at::Tensor x = ds.images.to(at::kDouble) / 255.0;
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(mean[c], x.select(1, c).mean().item<double>(), 1e-9);
    EXPECT_NEAR(std[c], x.select(1, c).std(false).item<double>(), 1e-9);
  }
  EXPECT_EQ(ds.head(4).size(), 4);
  EXPECT_EQ(ds.head(0).size(), 10);
  EXPECT_EQ(ds.head(100).size(), 10);
}

}  // namespace
}  // namespace tl
