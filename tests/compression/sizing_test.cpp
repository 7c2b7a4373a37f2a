// Note [sizing a payload] (compression/compressor.h): each codec's payload_size, computed from
// its wire format for a shape, against the bytes of a real encode of data of that shape. Exact
// sizes must be equal; worst cases must bound every real payload (and be reached where the data
// can reach them); a codec that cannot be sized is refused by name.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "compression/boundary.h"
#include "compression/spec.h"

namespace tl {
namespace {

int64_t real_bytes(const CompressorPtr& c, const at::Tensor& x) {
  CodecContext ctx;
  return static_cast<int64_t>(c->encode(x, ctx).nbytes());
}

struct Case {
  std::string spec;
  PayloadSize::Kind kind;
};

const std::vector<std::vector<int64_t>> kShapes = {{4, 16, 32}, {3, 50}, {2, 3, 5, 7}, {1000}, {8, 64, 129}};

TEST(Sizing, ExactCodecsEqualARealEncode) {
  const std::vector<std::string> specs = {"identity",
                                          "fp16",
                                          "bf16",
                                          "cast(fp16)",
                                          "quant(8)",
                                          "quant(4, scale=channel)",
                                          "quant(3, scale=block, block=64, mode=minmax)",
                                          "quant(2, scales=fp32)",
                                          "hadquant(4)",
                                          "hadquant(3, tile=64, scales=bf16)",
                                          "topk(0.1, index=int32)",
                                          "topk(7, scope=global, index=bitmap)",
                                          "randk(0.25, index=int32, values=fp32)",
                                          "powersgd(2)",
                                          "powersgd(4, dim=1, values=fp16)",
                                          "topk(0.1, index=int32) | quant(4)",
                                          "powersgd(2) | bf16",
                                          "ef(quant(4))",
                                          "ef21(topk(0.2, index=bitmap))"};
  at::manual_seed(3);
  for (const auto& spec : specs)
    for (const auto& shape : kShapes)
      for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
        if ((spec.find("channel") != std::string::npos || spec.find("dim=1") != std::string::npos) && shape.size() < 2)
          continue;  // needs 2 dims
        CompressorPtr c = parse_compressor(spec);
        const at::Tensor x = at::randn(shape).to(dtype);
        const PayloadSize s = c->payload_size(shape, dtype);
        EXPECT_EQ(s.kind, PayloadSize::Kind::Exact) << spec;
        EXPECT_EQ(s.bytes, real_bytes(c, x)) << spec << " on " << c10::IntArrayRef(shape) << " " << dtype;
      }
}

TEST(Sizing, DataDependentFormatsBoundEveryEncodeAndSaySo) {
  const std::vector<std::string> specs = {"topk(0.1)",      "topk(0.01, index=delta)",    "randk(0.3)",
                                          "threshold(0.5)", "threshold(0, index=bitmap)", "topk(0.05) | quant(4)"};
  for (const auto& spec : specs)
    for (const auto& shape : kShapes) {
      CompressorPtr c = parse_compressor(spec);
      const PayloadSize s = c->payload_size(shape, at::kFloat);
      EXPECT_EQ(s.kind, PayloadSize::Kind::WorstCase) << spec;
      int64_t most = 0;
      for (int seed = 0; seed < 4; ++seed) {
        at::manual_seed(seed);
        at::Tensor x = at::randn(shape);
        if (seed == 1) x = x.abs() + 1;  // every entry passes a threshold
        if (seed == 2) x = at::zeros(shape).index_fill_(-1, at::tensor({int64_t(0)}), 5.0);  // clustered support
        const int64_t real = real_bytes(c, x);
        EXPECT_LE(real, s.bytes) << spec << " on " << c10::IntArrayRef(shape) << " seed " << seed;
        most = std::max(most, real);
      }
      if (spec.rfind("threshold(0,", 0) == 0) {
        EXPECT_EQ(most, s.bytes) << spec;  // all kept: the worst case
      }
    }
}

TEST(Sizing, SharedModeGradientsEqualARealEncode) {
  for (const std::string spec : {"topk(0.1, index=int32)", "randk(0.2, index=bitmap)", "powersgd(2)"})
    for (const auto& shape : kShapes) {
      CompressorPtr c = parse_compressor(spec);
      CodecContext ctx;
      const at::Tensor x = at::randn(shape), g = at::randn(shape);
      const Payload fwd = c->encode(x, ctx);
      EXPECT_EQ(c->shared_payload_size(shape, at::kFloat).bytes,
                static_cast<int64_t>(c->encode_shared(g, fwd, ctx).nbytes()))
          << spec << " on " << c10::IntArrayRef(shape);
    }
}

TEST(Sizing, CodecsWithoutASizeAreRefusedByName) {
  for (const std::string spec : {"quantile(4)", "colsparse(0.1)"}) {
    CompressorPtr c = parse_compressor(spec);
    try {
      c->payload_size({4, 8, 16}, at::kFloat);
      ADD_FAILURE() << spec << " was sized";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot size codec '" + c->spec() + "'"), std::string::npos) << e.what();
    }
  }
}

// Note [sized messages]: a boundary given a meta tensor sends a payload of the sized bytes,
// decoded to a meta tensor of the shape; the statistics count the same bytes a real message has.
TEST(Sizing, BoundarySendsSizedPayloadsForMetaTensors) {
  Boundary real("b", "quant(4, scale=channel)", "topk(0.1, index=int32)");
  Boundary sized("b", "quant(4, scale=channel)", "topk(0.1, index=int32)");
  const std::vector<int64_t> shape = {4, 32, 64};
  CodecContext ctx;
  const Payload a = real.send_forward(at::randn(shape), ctx);
  const Payload b = sized.send_forward(at::empty(shape, at::TensorOptions().device(at::kMeta)), ctx);
  EXPECT_TRUE(Boundary::is_sized(b));
  EXPECT_EQ(a.nbytes(), b.nbytes());
  const at::Tensor z = sized.receive_forward(b, ctx);
  EXPECT_TRUE(z.is_meta());
  EXPECT_EQ(z.sizes().vec(), shape);
  const Payload ga = real.send_backward(at::randn(shape), ctx);
  const Payload gb = sized.send_backward(at::empty(shape, at::TensorOptions().device(at::kMeta)), ctx);
  EXPECT_EQ(ga.nbytes(), gb.nbytes());
  EXPECT_EQ(real.stats().forward.bytes, sized.stats().forward.bytes);
  EXPECT_EQ(real.stats().backward.bytes, sized.stats().backward.bytes);
  EXPECT_EQ(sized.forward_size_kind(), PayloadSize::Kind::Exact);

  sized.set_given_sizes(1000, -1);
  EXPECT_EQ(sized.send_forward(at::empty(shape, at::TensorOptions().device(at::kMeta)), ctx).nbytes(), 1000u);
  EXPECT_EQ(sized.forward_size_kind(), PayloadSize::Kind::Given);
}

}  // namespace
}  // namespace tl
