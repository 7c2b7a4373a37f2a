// Payload wire format: exact byte counts, serialize/deserialize round trips, rejection of corrupt
// buffers, bounds-checked body sections and nested payloads, and bit packing on both paths.
#include "compression/payload.h"

#include <cstring>

#include "tests/common/testing.h"
#include "tests/compression/codec_testing.h"

namespace tl {
namespace {

using testing::header_formula;

Payload sample_payload() {
  Payload p;
  p.codec = codec_id("topk");
  p.dtype = at::kHalf;
  p.shape = {3, 5, 7};
  p.params = {0, 1, -2, int64_t(1) << 40};
  p.body = at::arange(37, at::kByte);
  return p;
}

TEST(Payload, SizeFormulaAndRoundTrip) {
  Payload p = sample_payload();
  EXPECT_EQ(p.header_bytes(), static_cast<size_t>(header_formula(3, 4)));
  EXPECT_EQ(p.nbytes(), p.header_bytes() + 37);
  EXPECT_EQ(p.numel(), 105);
  std::vector<uint8_t> bytes = p.serialize();
  ASSERT_EQ(bytes.size(), p.nbytes());
  Payload q = Payload::deserialize(bytes.data(), bytes.size());
  EXPECT_EQ(q.codec, p.codec);
  EXPECT_EQ(q.dtype, p.dtype);
  EXPECT_EQ(q.shape, p.shape);
  EXPECT_EQ(q.params, p.params);
  EXPECT_TRUE(at::equal(q.body, p.body));
  EXPECT_EQ(q.serialize(), bytes);
}

// serialize_into writes serialize()'s bytes; deserialize_view reads a payload inside a larger
// buffer with its body a view of it (no copy), and rejects ranges outside the buffer.
TEST(Payload, SerializeIntoAndDeserializeView) {
  const Payload p = sample_payload();
  const std::vector<uint8_t> bytes = p.serialize();
  at::Tensor buffer = at::zeros({static_cast<int64_t>(bytes.size() + 11)}, at::kByte);
  p.serialize_into(buffer.data_ptr<uint8_t>() + 5);
  EXPECT_EQ(std::memcmp(buffer.data_ptr<uint8_t>() + 5, bytes.data(), bytes.size()), 0);
  const Payload q = Payload::deserialize_view(buffer, 5, bytes.size());
  EXPECT_TRUE(q.from_wire);
  EXPECT_EQ(q.shape, p.shape);
  EXPECT_EQ(q.params, p.params);
  EXPECT_TRUE(at::equal(q.body, p.body));
  EXPECT_EQ(q.body.data_ptr<uint8_t>(), buffer.data_ptr<uint8_t>() + 5 + p.header_bytes());  // a view
  EXPECT_ERROR_CONTAINS(Payload::deserialize_view(buffer, 12, bytes.size()), "outside a buffer");
  EXPECT_ERROR_CONTAINS(Payload::deserialize_view(buffer, 5, bytes.size() - 1), "body length mismatch");
}

TEST(Payload, EmptyBodyAndScalar) {
  Payload p;
  p.codec = codec_id("identity");
  p.dtype = at::kFloat;
  std::vector<uint8_t> bytes = p.serialize();
  EXPECT_EQ(bytes.size(), static_cast<size_t>(header_formula(0, 0)));
  Payload q = Payload::deserialize(bytes.data(), bytes.size());
  EXPECT_EQ(q.body_bytes(), 0u);
  EXPECT_EQ(q.numel(), 1);
}

TEST(Payload, CorruptBuffersAreRejected) {
  const std::vector<uint8_t> good = sample_payload().serialize();
  auto parse = [](std::vector<uint8_t> b) { return Payload::deserialize(b.data(), b.size()); };
  EXPECT_ERROR_CONTAINS(parse({good.begin(), good.begin() + 5}), "truncated");
  EXPECT_ERROR_CONTAINS(parse({good.begin(), good.begin() + 20}), "header alone needs");
  EXPECT_ERROR_CONTAINS(parse({good.begin(), good.end() - 1}), "body length mismatch");
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  EXPECT_ERROR_CONTAINS(parse(longer), "body length mismatch");
  std::vector<uint8_t> b = good;
  b[0] = 'X';
  EXPECT_ERROR_CONTAINS(parse(b), "bad magic");
  b = good;
  b[1] = 9;
  EXPECT_ERROR_CONTAINS(parse(b), "unsupported version");
  b = good;
  b[2] = 0xee;
  EXPECT_ERROR_CONTAINS(parse(b), "unknown codec id");
  b = good;
  b[4] = 3;  // int32 is no payload dtype
  EXPECT_ERROR_CONTAINS(parse(b), "unknown dtype");
  b = good;
  b[8 + 7] = 0x80;  // first extent negative
  EXPECT_ERROR_CONTAINS(parse(b), "negative extent");
  b = good;
  b[7] = 1;
  EXPECT_ERROR_CONTAINS(parse(b), "reserved");
}

TEST(Payload, CodecIds) {
  EXPECT_EQ(codec_name(codec_id("quant")), "quant");
  EXPECT_NE(codec_id("topk"), codec_id("randk"));
  EXPECT_ERROR_CONTAINS(codec_id("nosuch"), "no codec id for 'nosuch'");
  EXPECT_ERROR_CONTAINS(codec_name(999), "unknown codec id 999");
  register_codec_id("test_codec_x", 900);
  register_codec_id("test_codec_x", 900);  // same pair: no-op
  EXPECT_EQ(codec_name(900), "test_codec_x");
  EXPECT_ERROR_CONTAINS(register_codec_id("test_codec_y", 900), "taken by 'test_codec_x'");
  EXPECT_ERROR_CONTAINS(register_codec_id("topk", 901), "already has id");
}

TEST(BodyReader, SectionsAndBounds) {
  BodyWriter w;
  at::Tensor f = at::randn({5});
  at::Tensor h = at::randn({3}).to(at::kHalf);
  w.put(f);
  w.put(h);
  w.put(at::arange(3, at::kByte));
  Payload p = sample_payload();
  p.body = w.finish();
  EXPECT_EQ(p.body_bytes(), 5u * 4 + 3 * 2 + 3);
  BodyReader r(p, "test");
  EXPECT_TRUE(at::equal(r.take(at::kFloat, 5), f));
  EXPECT_TRUE(at::equal(r.take(at::kHalf, 3), h));
  EXPECT_ERROR_CONTAINS(r.finish(), "length mismatch");
  EXPECT_ERROR_CONTAINS(r.take(at::kFloat, 1), "test: payload body truncated");
  EXPECT_TRUE(at::equal(r.take(at::kByte, 3), at::arange(3, at::kByte)));
  r.finish();
}

TEST(BodyReader, UnalignedSectionIsCopied) {
  BodyWriter w;
  w.put(at::ones({1}, at::kByte));
  at::Tensor f = at::randn({4});
  w.put(f);
  Payload p = sample_payload();
  p.body = w.finish();
  BodyReader r(p, "test");
  r.take(at::kByte, 1);
  EXPECT_TRUE(at::equal(r.take(at::kFloat, 4), f));
  r.finish();
}

TEST(BodyReader, NestedPayloads) {
  Payload inner = sample_payload();
  BodyWriter w;
  w.put_payload(inner);
  w.put(at::full({2}, 7, at::kByte));
  Payload outer = sample_payload();
  outer.body = w.finish();
  EXPECT_EQ(outer.body_bytes(), inner.nbytes() + 2);
  BodyReader r(outer, "outer");
  Payload back = r.take_payload();
  EXPECT_EQ(back.params, inner.params);
  EXPECT_TRUE(at::equal(back.body, inner.body));
  EXPECT_EQ(r.remaining(), 2);
  r.take(at::kByte, 2);
  r.finish();

  // A nested payload cut short, and one with a bad magic byte.
  Payload cut = outer;
  cut.body = outer.body.narrow(0, 0, static_cast<int64_t>(inner.nbytes()) - 3);
  BodyReader rc(cut, "outer");
  EXPECT_ERROR_CONTAINS(rc.take_payload(), "nested payload truncated");
  Payload bad = outer;
  bad.body = outer.body.clone();
  bad.body[0] = 0;
  BodyReader rb(bad, "outer");
  EXPECT_ERROR_CONTAINS(rb.take_payload(), "bad magic");
}

TEST(BitPacking, RoundTripAllWidthsBothPaths) {
  at::manual_seed(0);
  for (int64_t bits = 1; bits <= 8; ++bits) {
    for (int64_t n : {0, 1, 7, 8, 9, 63, 1000, 70001}) {
      at::Tensor codes = at::randint(0, int64_t(1) << bits, {n}, at::kByte);
      at::Tensor fast = pack_bits(codes, bits);
      at::Tensor portable;
      {
        codec::PortableKernelsGuard g;
        portable = pack_bits(codes, bits);
        EXPECT_TRUE(at::equal(unpack_bits(portable, bits, n), codes)) << "portable, bits=" << bits << " n=" << n;
      }
      ASSERT_EQ(fast.numel(), (n * bits + 7) / 8) << "bits=" << bits << " n=" << n;
      EXPECT_TRUE(at::equal(fast, portable)) << "fast and portable packing differ, bits=" << bits << " n=" << n;
      EXPECT_TRUE(at::equal(unpack_bits(fast, bits, n), codes)) << "bits=" << bits << " n=" << n;
    }
  }
}

TEST(BitPacking, LayoutIsLittleEndianBitStream) {
  // Codes 1, 2, 3 at 3 bits: bits 0-2 = 001, 3-5 = 010, 6-8 = 011 -> 0b11'010'001, 0b0000000'0.
  at::Tensor packed = pack_bits(at::tensor({1, 2, 3}, at::kByte), 3);
  ASSERT_EQ(packed.numel(), 2);
  EXPECT_EQ(packed[0].item<uint8_t>(), 0b11010001);
  EXPECT_EQ(packed[1].item<uint8_t>(), 0b00000000 | (3 >> 2));
  EXPECT_ERROR_CONTAINS(pack_bits(at::zeros({4}, at::kByte), 9), "bits=9");
  EXPECT_ERROR_CONTAINS(unpack_bits(packed, 3, 9), "need 4 bytes");
}

}  // namespace
}  // namespace tl
