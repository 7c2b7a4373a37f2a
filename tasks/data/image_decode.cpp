// PNG, JPEG and BMP decoding with stb_image or OpenCV's imgcodecs, after the header walks of
// tasks/data/image_file.cpp.
#include "tasks/data/image_decode.h"

#include <stb/stb_image.h>

#include <memory>

#include "tasks/data/image_file.h"

#ifdef TL_HAVE_OPENCV
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#endif

namespace tl {

// Note [which checks each decoder needs]. stb_image is one file that trusts what headers declare:
// five fuzz findings were stb allocating or decoding a size a header claimed, or indexing with a
// table a header defined (docs/FUZZING.md). OpenCV decodes PNG with libpng and JPEG with
// libjpeg-turbo, both hardened and fuzzed upstream, and BMP with its own reader. Which header walk
// (tasks/data/image_file.cpp) runs for which decoder:
//   signature (PNG, JPEG, BMP only)    both: each decoder reads other formats too
//   kMaxImagePixels (64 Mpixel)        both: OpenCV's own limit (CV_IO_MAX_IMAGE_PIXELS) is 2^30
//                                      pixels, a 3 GiB image, over the 1 GiB the fuzzers allow
//   a JPEG holds its pixels            both: libjpeg-turbo zero-fills a truncated JPEG as stb
//                                      does (the 718-byte finding takes it 1.0 s)
//   a BMP holds its pixels             both: OpenCV's BMP reader is its own code, not a fuzzed
//                                      library, and the error says the file is truncated
//   a PNG's chunks fit in the file     both: libpng refuses the finding itself; the walk is a few
//                                      lines and its error names the chunk and its length
//   JPEG Huffman tables                stb only: libjpeg-turbo checks its tables itself
// Both decoders must then give the size the header declared, so the pixel limit holds for what
// they allocate.
//
// Note [one image, either decoder]. OpenCV gives the pixels stb gives where the format is exact:
// PNG (any bit depth, palette, alpha dropped, 16 bits to their high byte) and BMP decode to the
// same RGB bytes. Grey from a colour PNG or BMP is stb's luma, (77 R + 150 G + 29 B) >> 8,
// computed here, not libpng's or OpenCV's (which round otherwise and differ by up to 11 levels).
// JPEG is not exact: libjpeg-turbo's inverse DCT and chroma upsampling are not stb's, and pixels
// differ by a level or two (a JPEG's grey is its luma plane in both). EXIF orientation is ignored,
// as stb ignores it.

const char* image_decoder_name(ImageDecoder decoder) { return decoder == ImageDecoder::stb ? "stb_image" : "OpenCV"; }

std::vector<ImageDecoder> image_decoders() {
#ifdef TL_HAVE_OPENCV
  return {ImageDecoder::stb, ImageDecoder::opencv};
#else
  return {ImageDecoder::stb};
#endif
}

ImageDecoder default_image_decoder() { return image_decoders().back(); }

namespace {

void check_decoded_size(int64_t w, int64_t h, const ImageHeader& header, ImageDecoder decoder, const std::string& path) {
  TORCH_CHECK(w == header.width && h == header.height, path, ": cannot decode image (", image_decoder_name(decoder),
              " reads ", w, "x", h, " pixels, its header declares ", header.width, "x", header.height,
              "); expected a valid PNG, JPEG or BMP file");
}

at::Tensor decode_stb(const std::vector<uint8_t>& bytes, const std::string& path, int64_t channels,
                      const ImageHeader& header) {
  if (header.format == ImageFormat::jpeg) check_jpeg_huffman_tables(bytes, path);
  const int size = static_cast<int>(bytes.size());
  int w = 0, h = 0, n = 0;
  TORCH_CHECK(stbi_info_from_memory(bytes.data(), size, &w, &h, &n), path, ": cannot decode image (",
              stbi_failure_reason(), "); expected a valid PNG, JPEG or BMP file");
  check_decoded_size(w, h, header, ImageDecoder::stb, path);  // before stb allocates
  std::unique_ptr<uint8_t, void (*)(void*)> pixels(
      stbi_load_from_memory(bytes.data(), size, &w, &h, &n, static_cast<int>(channels)), stbi_image_free);
  TORCH_CHECK(pixels != nullptr, path, ": cannot decode image (", stbi_failure_reason(),
              "); expected a valid PNG, JPEG or BMP file");
  check_decoded_size(w, h, header, ImageDecoder::stb, path);
  return at::from_blob(pixels.release(), {h, w, channels}, stbi_image_free, at::kByte);  // frees with stb's free
}

#ifdef TL_HAVE_OPENCV
const char* opencv_reader(ImageFormat format) {
  return format == ImageFormat::png ? "libpng" : format == ImageFormat::jpeg ? "libjpeg-turbo" : "OpenCV's BMP reader";
}

at::Tensor decode_opencv(const std::vector<uint8_t>& bytes, const std::string& path, int64_t channels,
                         const ImageHeader& header) {
  // A JPEG's grey is its luma plane (as stb's); anything else is decoded in its own colours and
  // converted below (Note [one image, either decoder]).
  const bool jpeg_luma = channels == 1 && header.format == ImageFormat::jpeg;
  const int flags = (jpeg_luma ? cv::IMREAD_GRAYSCALE : cv::IMREAD_ANYCOLOR) | cv::IMREAD_IGNORE_ORIENTATION;
  const cv::Mat buf(1, static_cast<int>(bytes.size()), CV_8U, const_cast<uint8_t*>(bytes.data()));
  cv::Mat m;
  try {
    m = cv::imdecode(buf, flags);
  } catch (const cv::Exception& e) {
    TORCH_CHECK(false, path, ": cannot decode image (", opencv_reader(header.format), ": ", e.err,
                "); expected a valid PNG, JPEG or BMP file");
  }
  TORCH_CHECK(!m.empty(), path, ": cannot decode image (", opencv_reader(header.format),
              " refused it); expected a valid PNG, JPEG or BMP file");
  check_decoded_size(m.cols, m.rows, header, ImageDecoder::opencv, path);
  TORCH_CHECK(m.depth() == CV_8U && (m.channels() == 1 || m.channels() == 3), path, ": OpenCV decoded ",
              m.channels(), " channels of depth ", m.depth(), "; expected 8-bit grey or BGR");
  at::Tensor out = at::empty({m.rows, m.cols, channels}, at::kByte);  // (H, W, C)
  cv::Mat dst(m.rows, m.cols, CV_8UC(static_cast<int>(channels)), out.data_ptr<uint8_t>());
  if (m.channels() == 1) {
    if (channels == 1) m.copyTo(dst);
    else cv::cvtColor(m, dst, cv::COLOR_GRAY2RGB);
  } else if (channels == 3) {
    cv::cvtColor(m, dst, cv::COLOR_BGR2RGB);
  } else {
    for (int y = 0; y < m.rows; ++y) {  // stb's luma
      const uint8_t* bgr = m.ptr<uint8_t>(y);
      uint8_t* grey = dst.ptr<uint8_t>(y);
      for (int x = 0; x < m.cols; ++x, bgr += 3) grey[x] = uint8_t((77 * bgr[2] + 150 * bgr[1] + 29 * bgr[0]) >> 8);
    }
  }
  return out;
}
#endif

}  // namespace

at::Tensor decode_image(const std::vector<uint8_t>& bytes, const std::string& path, int64_t channels,
                        ImageDecoder decoder) {
  TORCH_CHECK(channels == 1 || channels == 3, path, ": decoding to ", channels, " channels; accepted: 1, 3");
  TORCH_CHECK(bytes.size() < (size_t(1) << 31), path, ": ", bytes.size(),
              " bytes; image files of 2 GiB or more are not read");
  const ImageHeader header = check_image_file(bytes, path);
  if (decoder == ImageDecoder::stb) return decode_stb(bytes, path, channels, header);
#ifdef TL_HAVE_OPENCV
  return decode_opencv(bytes, path, channels, header);
#else
  TORCH_CHECK(false, path, ": this build has no OpenCV (tasks/CMakeLists.txt); its image decoder is stb_image");
#endif
}

}  // namespace tl
