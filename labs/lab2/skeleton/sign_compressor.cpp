// Lab 2: write the sign compressor's encode and decode (see labs/lab2/sign_compressor.h for the
// maths and the wire format). Then rebuild and run its test:
//
//   cmake --build build --target lab2_skeleton_test && build/labs/bin/lab2_skeleton_test
//
// Useful pieces (compression/payload.h): BodyWriter (put sections into a body), BodyReader (take
// them back out), pack_bits / unpack_bits (1-bit codes <-> bytes), codec_id("sign").
#include <c10/util/Exception.h>

#include "compression/payload.h"
#include "labs/lab2/sign_compressor.h"

namespace tl::lab2 {

Payload SignCompressor::encode(const at::Tensor& x, const CodecContext& ctx) {
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), "sign: expects a floating-point tensor, got ", x.scalar_type());
  const int64_t rows = sign_rows(x.sizes());
  Payload p;
  p.codec = codec_id("sign");
  p.dtype = x.scalar_type();
  p.shape = x.sizes().vec();
  if (x.numel() == 0) return p;  // nothing to send but the header
  at::Tensor flat = x.detach().reshape({rows, -1}).to(at::kFloat);  // (rows, n)

  // TODO(lab 2): compute the scales s_r = mean_j |x_rj| (a (rows) float tensor) and the sign
  // codes (1 where x >= 0, else 0), then write the body: the scales first, then the codes packed
  // with pack_bits(codes, 1). For example:
  //   BodyWriter body;
  //   body.put(...);
  //   body.put(...);
  //   p.body = body.finish();
  (void)flat;
  return p;
}

at::Tensor SignCompressor::decode(const Payload& p, const CodecContext& ctx) {
  TORCH_CHECK(p.codec == codec_id("sign"), "sign: cannot decode a payload of codec '", codec_name(p.codec), "'");
  TORCH_CHECK(p.params.empty(), "sign: corrupt payload: ", p.params.size(), " params, expected none");
  const int64_t numel = p.numel(), rows = sign_rows(p.shape);
  auto options = at::TensorOptions().dtype(p.dtype).device(p.body.defined() ? p.body.device() : at::kCPU);
  if (numel == 0) return at::empty(p.shape, options);

  // TODO(lab 2): read the body back in the order encode wrote it (BodyReader in(p, "sign");
  // in.take(at::kFloat, rows); in.take(at::kByte, (numel + 7) / 8); in.finish();), unpack the
  // bits (unpack_bits(packed, 1, numel)) and return s_r * (2 b - 1) in p.dtype and p.shape.
  (void)rows;
  return at::zeros(p.shape, options);
}

}  // namespace tl::lab2
