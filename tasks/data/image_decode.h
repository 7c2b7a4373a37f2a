#pragma once
// Image decoding for image folders: PNG, JPEG and BMP files to (H, W, C) uint8 pixels, with
// stb_image (always built in) or OpenCV's imgcodecs (libpng, libjpeg-turbo and OpenCV's BMP
// reader; builds that found OpenCV, where it is the default). Note [which checks each decoder
// needs] in image_decode.cpp.
#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tl {

enum class ImageDecoder { stb, opencv };

/// "stb_image" or "OpenCV".
const char* image_decoder_name(ImageDecoder decoder);
/// The decoders this build has: stb, then OpenCV where built in (TL_HAVE_OPENCV).
std::vector<ImageDecoder> image_decoders();
/// OpenCV where built in, else stb.
ImageDecoder default_image_decoder();

/// A PNG, JPEG or BMP file's bytes decoded to `channels` (1 or 3): (H, W, C) uint8, RGB or luma.
/// The file is checked first (check_image_file in tasks/data/image_file.h); errors name `path`.
at::Tensor decode_image(const std::vector<uint8_t>& bytes, const std::string& path, int64_t channels,
                        ImageDecoder decoder);

}  // namespace tl
