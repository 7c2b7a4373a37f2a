// Lab 2, solution: the sign compressor's encode and decode (see labs/lab2/sign_compressor.h).
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
  at::Tensor scales = flat.abs().mean(1);                            // (rows): s_r = mean_j |x_rj|
  at::Tensor codes = flat.ge(0).reshape({-1});                       // (rows * n) bool: 1 where x >= 0
  BodyWriter body;
  body.put(scales);                         // rows x 4 bytes
  body.put(pack_bits(codes.to(at::kByte), 1));  // ceil(numel / 8) bytes
  p.body = body.finish();
  return p;
}

at::Tensor SignCompressor::decode(const Payload& p, const CodecContext& ctx) {
  TORCH_CHECK(p.codec == codec_id("sign"), "sign: cannot decode a payload of codec '", codec_name(p.codec), "'");
  TORCH_CHECK(p.params.empty(), "sign: corrupt payload: ", p.params.size(), " params, expected none");
  const int64_t numel = p.numel(), rows = sign_rows(p.shape);
  auto options = at::TensorOptions().dtype(p.dtype).device(p.body.defined() ? p.body.device() : at::kCPU);
  if (numel == 0) return at::empty(p.shape, options);
  BodyReader in(p, "sign");
  at::Tensor scales = in.take(at::kFloat, rows);             // (rows)
  at::Tensor packed = in.take(at::kByte, (numel + 7) / 8);   // the sign bits
  in.finish();
  at::Tensor bits = unpack_bits(packed, 1, numel).to(at::kFloat).view({rows, numel / rows});  // (rows, n) in {0, 1}
  at::Tensor out = (bits * 2 - 1) * scales.unsqueeze(1);                                         // s_r * (+1 | -1)
  return out.to(p.dtype).view(p.shape);
}

}  // namespace tl::lab2
