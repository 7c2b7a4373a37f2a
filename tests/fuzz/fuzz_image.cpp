// Image folders: one image file (PNG, JPEG or BMP) in a class folder, decoded to 1 or 3 channels
// and resized to 8 x 8 (the first byte picks which), by every decoder the build has: stb_image,
// then OpenCV's imgcodecs where built in (tasks/data/image_decode.h). Each decoder must accept the
// file or reject it cleanly; the input counts as rejected when one of them rejects it, with the
// first one's error.
#include <c10/util/Exception.h>

#include <exception>
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
  std::exception_ptr rejected;
  for (const tl::ImageDecoder decoder : tl::image_decoders()) {
    try {
      const tl::ImageDataset d = tl::read_image_folder(root, channels, 8, {}, decoder);
      TL_FUZZ_CHECK(d.images.dim() == 4 && d.images.size(0) == 1 && d.images.size(1) == channels &&
                        d.images.size(2) == 8 && d.images.size(3) == 8,
                    std::string(tl::image_decoder_name(decoder)) + ": the image did not decode to (1, C, 8, 8)");
    } catch (const c10::Error&) {
      if (!rejected) rejected = std::current_exception();
    }
  }
  if (rejected) std::rethrow_exception(rejected);
}
