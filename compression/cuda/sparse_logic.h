#pragma once
// The per-entry and per-byte logic of the fused sparse packing kernels (sparse_cuda.cu), written
// once for nvcc and g++ (Note [one logic, two compilers] in quant_logic.h); the CPU tests run it
// through sparse_cuda_host.cpp and compare the payload bytes with the CPU and ATen paths.
//
// Note [sparse packing, one writer per byte]. Encoding has n work items, one an entry: value
// x[idx[i]] cast to the wire type at values + i * size, and for an int index idx[i] as
// `index_width` little-endian bytes at i * index_width; for a bitmap, the first entry of each
// bitmap byte (idx sorted: entries of one byte are consecutive) writes that byte whole, after the
// bitmap was zeroed (a memset; a binary search per byte for its entries cost twice as long).
// After the zeros, every byte of the body has one writer: no atomics, and the bytes do not depend
// on the order the items run in. Decoding an int index scatters entry i
// to out[idx[i]]; a bitmap byte needs the rank of its first set bit, an exclusive prefix sum of
// the bytes' popcounts (Note [bitmap ranks by chunks]), and writes all 8 outputs of its byte,
// zeros included. Decoding is memory-safe on corrupt bytes (indices outside the tensor and ranks
// past n write nothing / zero); the checks that name the corruption stay with the ATen path (the
// kernels decode only bytes this process made or already checked: Note [fused sparse packing] in
// compression/codecs/sparse.cpp).
//
// Wire values: fp32 is copied; bf16 rounds to nearest even (NaN -> 0x7fc0), as c10::BFloat16;
// fp16 first clamps to +-65504, as SectionedCodec does before its cast, then rounds to nearest
// even (NaN -> 0x7e00 with its sign), as c10::Half. Integer arithmetic only, so both compilers
// give the same bits; bytes are written little-endian one at a time (the values section need
// not be aligned after a bitmap).

#include <cstdint>
#include <cstring>

#include "compression/cuda/hd.h"
#include "compression/cuda/sparse_cuda.h"

namespace tl::codec::gpu {

TL_HD uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

TL_HD float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

/// float -> IEEE half bits, round to nearest even; overflow to +-inf, NaN to 0x7e00 | sign.
TL_HD uint16_t half_bits(float f) {
  const uint32_t u = float_bits(f), a = u & 0x7fffffffu;
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  if (a > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf (and inf itself)
  if (a >= 0x38800000u) {                       // a normal half: exponent >= -14
    const uint32_t rest = a & 0x1fffu;
    uint32_t h = ((a >> 23) - 112) << 10 | (a >> 13 & 0x3ffu);
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) ++h;  // a carry moves into the exponent
    return sign | static_cast<uint16_t>(h);
  }
  if (a < 0x33000000u) return sign;  // below 2^-25: zero (2^-25 itself ties to even 0)
  // A subnormal half m * 2^-24: the 24-bit significand shifted right by 126 - exponent (14..24).
  const uint32_t mant = (a & 0x7fffffu) | 0x800000u, shift = 126 - (a >> 23);
  uint32_t m = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1), halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (m & 1))) ++m;
  return sign | static_cast<uint16_t>(m);
}

/// IEEE half bits -> float (exact).
TL_HD float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exp = h >> 10 & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | mant << 13);
  if (exp != 0) return bits_float(sign | (exp + 112) << 23 | mant << 13);
  if (mant == 0) return bits_float(sign);
  uint32_t e = 113;  // normalise the subnormal m * 2^-24
  while (!(mant & 0x400u)) {
    mant <<= 1;
    --e;
  }
  return bits_float(sign | e << 23 | (mant & 0x3ffu) << 13);
}

/// float -> bfloat16 bits, round to nearest even; NaN to 0x7fc0 (c10::BFloat16's rule).
TL_HD uint16_t bf16_bits(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  return static_cast<uint16_t>((u + ((u >> 16) & 1) + 0x7fffu) >> 16);
}

TL_HD float bf16_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

TL_HD void store_le(uint8_t* p, uint64_t v, int bytes) {
  for (int k = 0; k < bytes; ++k) p[k] = static_cast<uint8_t>(v >> (8 * k));
}

TL_HD uint64_t load_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int k = 0; k < bytes; ++k) v |= static_cast<uint64_t>(p[k]) << (8 * k);
  return v;
}

TL_HD void store_wire(uint8_t* p, float v, WireType w) {
  if (w == WireType::kF32) return store_le(p, float_bits(v), 4);
  if (w == WireType::kBF16) return store_le(p, bf16_bits(v), 2);
  v = v < -65504.0f ? -65504.0f : v;  // the clamp SectionedCodec applies before an fp16 cast
  v = 65504.0f < v ? 65504.0f : v;
  store_le(p, half_bits(v), 2);
}

TL_HD float load_wire(const uint8_t* p, WireType w) {
  if (w == WireType::kF32) return bits_float(static_cast<uint32_t>(load_le(p, 4)));
  const uint16_t h = static_cast<uint16_t>(load_le(p, 2));
  return w == WireType::kBF16 ? bf16_to_float(h) : half_to_float(h);
}

TL_HD int popcount8(uint32_t v) {
  v = v - ((v >> 1) & 0x55u);
  v = (v & 0x33u) + ((v >> 2) & 0x33u);
  return static_cast<int>((v + (v >> 4)) & 0x0fu);
}

/// Work items of an encode: the entries (Note [sparse packing, one writer per byte]).
TL_HD int64_t pack_items(const SparseLayout& s) { return s.n; }

/// Entry t of an encode: its value, and its index (int), or its bitmap byte if t is the first of
/// the entries in that byte (which it writes whole: the bits of entries t, t + 1, ... in it). The
/// bitmap's other bytes are the zeros written before.
TL_HD void pack_item(const float* x, const int64_t* idx, int64_t t, const SparseLayout& s, uint8_t* body) {
  const int64_t j = idx[t];
  if (!s.bitmap) store_le(body + t * s.index_width, static_cast<uint64_t>(j), s.index_width);
  store_wire(body + s.index_bytes + t * wire_size(s.wire), x[j], s.wire);
  if (s.bitmap && (t == 0 || idx[t - 1] >> 3 != j >> 3)) {
    uint32_t byte = 0;
    for (int64_t p = t; p < s.n && idx[p] >> 3 == j >> 3; ++p) byte |= 1u << (idx[p] & 7);
    body[j >> 3] = static_cast<uint8_t>(byte);
  }
}

/// Int index: entry i of the body scattered into out (zeros elsewhere, written beforehand).
TL_HD void unpack_entry(const uint8_t* body, int64_t i, const SparseLayout& s, float* out) {
  const uint64_t j = load_le(body + i * s.index_width, s.index_width);
  if (j < static_cast<uint64_t>(s.universe)) out[j] = load_wire(body + s.index_bytes + i * wire_size(s.wire), s.wire);
}

// Note [bitmap ranks by chunks]. A bitmap byte's outputs need the rank of its first set bit: the
// bits set in every byte before it. The decode counts them per chunk of kBitmapChunk bytes (a
// thread a chunk), turns the counts into inclusive prefix sums (cumsum: one int64 per 32 bytes, not
// per byte), and then each warp takes a chunk, a lane a byte: a warp scan of the lanes' popcounts
// adds the bits before the byte within its chunk. Each lane writes its byte's 8 outputs, zeros
// included, as 32 contiguous bytes (two 16-byte stores on the device).
/// Set bits of chunk c of a bitmap of `bytes` bytes.
TL_HD int64_t bitmap_chunk_count(const uint8_t* bitmap, int64_t bytes, int64_t c) {
  int64_t n = 0;
  for (int64_t b = c * kBitmapChunk; b < bytes && b < (c + 1) * kBitmapChunk; ++b) n += popcount8(bitmap[b]);
  return n;
}

/// Bitmap index: the 8 outputs of byte b, whose first set bit has rank `before` (set bits in the
/// bytes before it).
TL_HD void unpack_bitmap_byte(const uint8_t* body, int64_t before, int64_t b, const SparseLayout& s, float* out) {
  const uint32_t byte = body[b];
  int64_t r = before;
  float v[8];
  TL_UNROLL for (int j = 0; j < 8; ++j) {
    v[j] = 0.0f;
    if (byte >> j & 1) {
      if (r < s.n) v[j] = load_wire(body + s.index_bytes + r * wire_size(s.wire), s.wire);
      ++r;
    }
  }
  float* o = out + 8 * b;
  if (8 * b + 8 <= s.universe) {
#if defined(__CUDA_ARCH__)
    reinterpret_cast<float4*>(o)[0] = make_float4(v[0], v[1], v[2], v[3]);  // out: 16-byte aligned
    reinterpret_cast<float4*>(o)[1] = make_float4(v[4], v[5], v[6], v[7]);
#else
    memcpy(o, v, sizeof(v));
#endif
  } else {
    for (int j = 0; 8 * b + j < s.universe; ++j) o[j] = v[j];
  }
}

}  // namespace tl::codec::gpu
