// Compressor specs (config files, --boundary.forward=...): parse, build, then one encode/decode
// round trip of a small tensor; the decoded tensor must have the input's shape.
#include <ATen/ATen.h>

#include "compression/spec.h"
#include "tests/fuzz/fuzz.h"

TL_FUZZ_TARGET(spec) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  tl::CompressorPtr c = tl::parse_compressor(text);
  TL_FUZZ_CHECK(c, "parse_compressor returned null for '" + text + "'");
  // The canonical spec builds an equivalent compressor.
  const std::string canonical = c->spec();
  tl::CompressorPtr again = tl::parse_compressor(canonical);
  TL_FUZZ_CHECK(again->spec() == canonical, "'" + text + "' -> '" + canonical + "' -> '" + again->spec() + "'");
  if (c->has_transform() || c->constrains_model()) return;  // learned / projecting: need a model
  at::Generator gen = at::detail::createCPUGenerator(7);
  const at::Tensor x = at::randn({2, 3, 4, 4}, gen);  // (B, C, H, W)
  tl::CodecContext ctx;
  ctx.sample_ids = at::arange(2, at::kLong);
  const tl::Payload p = c->encode(x, ctx);
  const at::Tensor y = c->decode(p, ctx);
  TL_FUZZ_CHECK(y.sizes() == x.sizes(), "'" + canonical + "' decoded a (2,3,4,4) message to another shape");
}
