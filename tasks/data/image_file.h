#pragma once
// What a PNG, JPEG or BMP file declares, checked before any decoder sees it
// (tasks/data/image_decode.cpp; Note [which checks each decoder needs] there).
#include <cstdint>
#include <string>
#include <vector>

namespace tl {

enum class ImageFormat { png, jpeg, bmp };

/// The format and the size (pixels) that an image file's header declares.
struct ImageHeader {
  ImageFormat format = ImageFormat::png;
  int64_t width = 0, height = 0;
};

/// Images of more pixels than this (64 Mpixel) are not decoded: a header's size is a claim, and a
/// decoder allocates it before reading the pixels.
constexpr int64_t kMaxImagePixels = int64_t(1) << 26;

/// Checks an image file's bytes before a decoder reads them, whichever decoder: a PNG, JPEG or BMP
/// signature, a JPEG coded as baseline, extended or progressive Huffman, that the file holds the
/// pixels its header declares (a PNG's chunks fit in the file, a BMP's rows are there, a JPEG has
/// the least coded data its size needs) and at most kMaxImagePixels pixels. Returns the header.
/// Errors name `path` and what is wrong.
ImageHeader check_image_file(const std::vector<uint8_t>& bytes, const std::string& path);

/// For stb_image only: every Huffman table of a JPEG declares at most 256 symbols, fits in its
/// segment, and is defined before a scan uses it (Note [JPEG Huffman tables before stb_image]).
void check_jpeg_huffman_tables(const std::vector<uint8_t>& bytes, const std::string& path);

}  // namespace tl
