// Header walks of PNG, JPEG and BMP files: what a file declares, checked against what it holds
// before a decoder allocates anything (Note [which checks each decoder needs] in image_decode.cpp).
#include "tasks/data/image_file.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <tuple>

namespace tl {
namespace {

uint32_t be32(const std::vector<uint8_t>& b, size_t at) {
  return uint32_t(b[at]) << 24 | uint32_t(b[at + 1]) << 16 | uint32_t(b[at + 2]) << 8 | uint32_t(b[at + 3]);
}
uint32_t le32(const std::vector<uint8_t>& b, size_t at) {
  return uint32_t(b[at]) | uint32_t(b[at + 1]) << 8 | uint32_t(b[at + 2]) << 16 | uint32_t(b[at + 3]) << 24;
}
uint16_t le16(const std::vector<uint8_t>& b, size_t at) { return uint16_t(b[at] | b[at + 1] << 8); }

[[noreturn]] void cannot_decode(const std::string& path, const std::string& why) {
  TORCH_CHECK(false, path, ": cannot decode image (", why, "); expected a valid PNG, JPEG or BMP file");
}

// ---- JPEG ----------------------------------------------------------------------------------------

[[noreturn]] void corrupt_jpeg(const std::string& path, size_t at, const std::string& why) {
  TORCH_CHECK(false, path, ": corrupt JPEG (", why, " at byte ", at, ")");
}

// Walks a JPEG's marker segments after SOI: visit(marker, at, length) for each segment that has a
// length, `at` being the offset of its 2-byte length field and `length` the length it declares
// (which counts those 2 bytes). The entropy-coded data after a scan header (SOS) is skipped. Stops
// at EOI, at the end of the bytes, or when visit returns false.
template <class Visit>
void walk_jpeg(const std::vector<uint8_t>& b, const std::string& path, Visit visit) {
  size_t i = 2;  // after SOI (FF D8)
  while (i + 1 < b.size()) {
    if (b[i] != 0xFF) corrupt_jpeg(path, i, "expected a marker");
    while (i + 1 < b.size() && b[i + 1] == 0xFF) ++i;  // fill bytes
    if (i + 1 >= b.size()) break;
    const uint8_t m = b[i + 1];
    i += 2;
    if (m == 0xD9) return;                                 // EOI
    if (m == 0x01 || (m >= 0xD0 && m <= 0xD8)) continue;  // markers without a length
    if (i + 2 > b.size()) corrupt_jpeg(path, i, "segment length past the end");
    const size_t len = (size_t(b[i]) << 8) | b[i + 1];
    if (len < 2 || i + len > b.size()) corrupt_jpeg(path, i, "segment length " + std::to_string(len) + " past the end");
    if (!visit(m, i, len)) return;
    i += len;
    if (m == 0xDA) {  // SOS: entropy-coded data up to the next marker that is not a stuffed 00 or RSTn
      while (i + 1 < b.size() && !(b[i] == 0xFF && b[i + 1] != 0x00 && !(b[i + 1] >= 0xD0 && b[i + 1] <= 0xD7))) ++i;
    }
  }
}

bool is_frame_header(uint8_t m) { return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC; }

// Note [a JPEG holds its pixels]. A decoder fills a JPEG's missing entropy-coded data with zeros
// and decodes the whole declared image: a 718-byte progressive JPEG declaring 493 x 64307 pixels
// took stb over a second (found by tests/fuzz's image harness), and libjpeg-turbo through OpenCV
// 1.0 s too (its "premature end of data segment" is a warning). Huffman coding spends at least one
// bit per 8x8 luma block on its DC coefficient, so a JPEG holding w x h pixels has at least
// w h / 512 bytes; one with fewer than w h / 1024 (half that, for safety) is truncated, and is
// refused. The rule needs Huffman coding: arithmetic coding (SOF9 to SOF11, which libjpeg-turbo
// decodes and stb does not) can spend less than a bit per block, so only the Huffman frames SOF0,
// SOF1 and SOF2 (baseline, extended, progressive: what stb reads) are accepted, by both decoders.
ImageHeader jpeg_header(const std::vector<uint8_t>& b, const std::string& path) {
  ImageHeader h{ImageFormat::jpeg};
  bool found = false;
  walk_jpeg(b, path, [&](uint8_t m, size_t i, size_t len) {
    if (m == 0xDA) corrupt_jpeg(path, i, "a scan before any frame header");
    if (!is_frame_header(m)) return true;
    if (m > 0xC2) {
      TORCH_CHECK(false, path, ": a JPEG coded as SOF", m - 0xC0, " (lossless, hierarchical or arithmetic); image ",
                  "folders read baseline, extended and progressive Huffman-coded JPEGs (SOF0, SOF1, SOF2)");
    }
    if (len < 7) corrupt_jpeg(path, i, "frame header of " + std::to_string(len) + " bytes");
    h.height = (int64_t(b[i + 3]) << 8) | b[i + 4], h.width = (int64_t(b[i + 5]) << 8) | b[i + 6];
    found = true;
    return false;
  });
  if (!found) cannot_decode(path, "a JPEG without a frame header");
  const int64_t least = h.width * h.height / 1024;
  TORCH_CHECK(static_cast<int64_t>(b.size()) >= least, path, ": truncated JPEG: its ", h.width, "x", h.height,
              " pixels need at least ", least, " bytes of coded data, the file has ", b.size());
  return h;
}

// ---- BMP -----------------------------------------------------------------------------------------

// Note [a BMP holds its pixels]. An uncompressed BMP declares its size in its header, and stb fills
// what the file lacks with zeros: a 90-byte file declaring 655408 x 48 pixels at 1 bit took stb
// over a second (found by tests/fuzz's image harness). Such a file is truncated, and is refused as
// one before any decoder. stb 2.27 refuses RLE (compression 1, 2) and reads every other
// compression value as uncompressed rows, so only RLE is left out of the rule (OpenCV's reader
// decodes RLE; kMaxImagePixels bounds what it fills).
ImageHeader bmp_header(const std::vector<uint8_t>& b, const std::string& path) {
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
  if (w <= 0 || h == 0) cannot_decode(path, "a BMP of " + std::to_string(w) + "x" + std::to_string(h) + " pixels");
  h = std::abs(h);  // a negative height: rows top to bottom
  const bool rle = compression == 1 || compression == 2;
  if (!rle && bpp > 0 && bpp <= 32) {  // the decoders refuse other depths themselves
    // Below 2^64: w < 2^31, bpp <= 32, h <= 2^31, offset < 2^32.
    const uint64_t row = (uint64_t(w) * uint64_t(bpp) + 31) / 32 * 4;  // rows are padded to 4 bytes
    const uint64_t need = uint64_t(offset) + row * uint64_t(h);
    TORCH_CHECK(need <= b.size(), path, ": truncated BMP: its ", w, "x", h, " pixels at ", bpp,
                " bits need ", need, " bytes, the file has ", b.size());
  }
  return {ImageFormat::bmp, w, h};
}

// ---- PNG -----------------------------------------------------------------------------------------

// Note [a PNG's chunks fit in the file]. stb_image grows its buffer for the compressed data to
// each IDAT chunk's declared length before reading the chunk, so a 603-byte PNG declaring an IDAT
// of 1.8 GB made it allocate that much (found by tests/fuzz's image harness). Every chunk's
// declared length, its type and its CRC must fit in the file; the compressed data is then bounded
// by the file's size. (libpng reads a chunk as it arrives and refuses this file itself; the check
// is kept for both decoders because its error names the chunk and what it declares.)
ImageHeader png_header(const std::vector<uint8_t>& b, const std::string& path) {
  if (b.size() < 33 || be32(b, 8) != 13 || !std::equal(b.begin() + 12, b.begin() + 16, "IHDR"))
    cannot_decode(path, "a PNG starts with its 13-byte IHDR chunk");
  const ImageHeader h{ImageFormat::png, be32(b, 16), be32(b, 20)};
  if (h.width == 0 || h.height == 0)
    cannot_decode(path, "a PNG of " + std::to_string(h.width) + "x" + std::to_string(h.height) + " pixels");
  for (size_t at = 8; at + 8 <= b.size();) {
    const uint64_t length = be32(b, at);
    const std::string type(b.begin() + at + 4, b.begin() + at + 8);
    const uint64_t left = b.size() - at - 8;  // the chunk's data and CRC must follow
    TORCH_CHECK(length + 4 <= left, path, ": truncated PNG: chunk '", type, "' at byte ", at, " declares ", length,
                " bytes of data, the file has ", left, " bytes after its header");
    if (type == "IEND") break;
    at += 12 + length;
  }
  return h;
}

}  // namespace

// Note [PNG, JPEG and BMP only]. Both decoders read more formats than an image folder does (stb:
// TGA, PSD, GIF, HDR, PIC, PNM unless compiled out; OpenCV: PNM, TIFF, WebP, EXR, ...), whatever
// the file's extension. The image folder reads PNG, JPEG and BMP, so other decoders are never
// reached: the first bytes must be one of those three signatures.
ImageHeader check_image_file(const std::vector<uint8_t>& b, const std::string& path) {
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  const bool png = b.size() >= 8 && std::equal(kPng, kPng + 8, b.begin());
  const bool jpeg = b.size() >= 2 && b[0] == 0xFF && b[1] == 0xD8;
  const bool bmp = b.size() >= 2 && b[0] == 'B' && b[1] == 'M';
  TORCH_CHECK(png || jpeg || bmp, path, ": not a PNG, JPEG or BMP file (its first bytes are none of their ",
              "signatures); image folders read those three formats");
  const ImageHeader h = png ? png_header(b, path) : jpeg ? jpeg_header(b, path) : bmp_header(b, path);
  // Each side first: a PNG's are 32-bit, and their product could overflow.
  const bool small = h.width <= kMaxImagePixels && h.height <= kMaxImagePixels && h.width * h.height <= kMaxImagePixels;
  TORCH_CHECK(small, path, ": a ", h.width, "x", h.height, " image; at most ",
              kMaxImagePixels, " pixels are decoded");
  return h;
}

// Note [JPEG Huffman tables before stb_image]. Debian's stb_image (2.27, 2022) trusts the 16 code
// counts of a JPEG Huffman table (DHT segment): when they add up to more than 256 symbols,
// stbi__build_huffman writes past its 257-entry size array (found by tests/fuzz's image harness
// under UBSan; upstream 2.28 rejects such tables). The file is checked here first: every DHT
// table, in the header and between the scans of a progressive JPEG, must declare at most 256
// symbols and fit in its segment. stb also decodes a scan with a table no DHT segment defined,
// whose zeroed lookup arrays send its decoder far out of bounds (a read 9.9 MB past a 256-byte
// array, found the same way): every table a scan uses must be defined before it. Anything else
// malformed is left to stb, which rejects it. libjpeg-turbo needs neither check: it refuses a
// table of over 256 symbols ("Bogus Huffman table definition") and decodes a scan that names an
// undefined table with the standard tables (as motion JPEG omits them).
void check_jpeg_huffman_tables(const std::vector<uint8_t>& b, const std::string& path) {
  bool defined[2][4] = {};  // [DC, AC][table id]
  bool progressive = false;
  walk_jpeg(b, path, [&](uint8_t m, size_t i, size_t len) {
    if (m == 0xC4) {  // DHT: tables of 1 + 16 + n bytes
      size_t t = i + 2;
      const size_t end = i + len;
      while (t < end) {
        if (t + 17 > end) corrupt_jpeg(path, t, "Huffman table header past its segment");
        const int table_class = b[t] >> 4, id = b[t] & 15;
        if (table_class > 1 || id > 3)
          corrupt_jpeg(path, t, "Huffman table class " + std::to_string(table_class) + " id " + std::to_string(id) +
                                    "; accepted: class 0 or 1, id 0 to 3");
        defined[table_class][id] = true;
        size_t n = 0;
        for (size_t k = 1; k <= 16; ++k) n += b[t + k];
        if (n > 256) corrupt_jpeg(path, t, "Huffman table of " + std::to_string(n) + " symbols; at most 256");
        t += 17 + n;
        if (t > end) corrupt_jpeg(path, t, "Huffman table symbols past its segment");
      }
    }
    if (m == 0xC2) progressive = true;
    if (m == 0xDA) {  // SOS: the tables its components use must exist
      const size_t ns = len >= 3 ? b[i + 2] : 0;
      if (len < 6 + 2 * ns)
        corrupt_jpeg(path, i, "scan header of " + std::to_string(len) + " bytes for " + std::to_string(ns) + " components");
      const uint8_t ss = b[i + 3 + 2 * ns], ah = b[i + 5 + 2 * ns] >> 4;
      const bool uses_dc = !progressive || (ss == 0 && ah == 0), uses_ac = !progressive || ss > 0;
      for (size_t c = 0; c < ns; ++c) {
        const int dc = b[i + 4 + 2 * c] >> 4, ac = b[i + 4 + 2 * c] & 15;
        for (const auto& [used, table_class, id] : {std::tuple{uses_dc, 0, dc}, std::tuple{uses_ac, 1, ac}}) {
          if (used && (id > 3 || !defined[table_class][id]))
            corrupt_jpeg(path, i, std::string("scan uses ") + (table_class ? "AC" : "DC") + " Huffman table " +
                                      std::to_string(id) + ", which no DHT segment before it defines");
        }
      }
    }
    return true;
  });
}

}  // namespace tl
