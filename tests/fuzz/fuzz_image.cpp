// Image folders: one image file (PNG, JPEG, BMP, ... as stb_image reads them) in a class folder,
// decoded to 1 or 3 channels and resized to 8 x 8 (the first byte picks which).
#include <filesystem>

#include "tasks/data/dataset.h"
#include "tests/fuzz/fuzz.h"

TL_FUZZ_TARGET(image) {
  tl::fuzz::Reader in(data, size);
  const uint8_t how = in.byte();
  const int64_t channels = how % 2 ? 3 : 1;
  const char* ext = (how / 2) % 3 == 0 ? "png" : (how / 2) % 3 == 1 ? "jpg" : "bmp";
  const std::string root = tl::fuzz::scratch_dir() + "/images";
  std::filesystem::remove_all(root);
  tl::fuzz::write_file(std::string("images/a/x.") + ext, in.ptr(), in.left());
  const tl::ImageDataset d = tl::read_image_folder(root, channels, 8);
  TL_FUZZ_CHECK(d.images.dim() == 4 && d.images.size(0) == 1 && d.images.size(1) == channels &&
                    d.images.size(2) == 8 && d.images.size(3) == 8,
                "the image did not decode to (1, C, 8, 8)");
}
