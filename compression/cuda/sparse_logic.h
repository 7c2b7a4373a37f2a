#pragma once
// The per-entry and per-byte logic of the fused sparse packing kernels (sparse_cuda.cu), written
// once for nvcc and g++ (Note [one logic, two compilers] in quant_logic.h); the CPU tests run it
// through sparse_cuda_host.cpp and compare the payload bytes with the CPU and ATen paths.
//
// Note [sparse packing, one writer per byte]. Encoding has max(n, bitmap bytes) work items:
//   - item i < n (an entry): value x[idx[i]] cast to the wire type at values + i * size, and for
//     an int index idx[i] as `index_width` little-endian bytes at i * index_width;
//   - item b < ceil(universe / 8) (a bitmap byte): the bits of the indices in [8b, 8b + 8), found
//     by a binary search in the sorted idx (lower_bound of 8b), written as one byte.
// Every byte of the body has exactly one writer and is written once: no atomics, no memset, and
// the bytes do not depend on the order the items run in. Decoding an int index scatters entry i
// to out[idx[i]]; a bitmap byte needs the rank of its first set bit, an exclusive prefix sum of
// the bytes' popcounts (bitmap_count per byte, then a scan with ATen's cumsum, then
// unpack_bitmap_byte writes all 8 outputs of its byte, zeros included). Decoding is memory-safe
// on corrupt bytes (indices outside the tensor and ranks past n write nothing / zero); the checks
// that name the corruption stay with the ATen path (the kernels decode only bytes this process
// made or already checked: Note [fused sparse packing] in compression/codecs/sparse.cpp).
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

/// The first position p in sorted idx[0, n) with idx[p] >= v.
TL_HD int64_t lower_bound(const int64_t* idx, int64_t n, int64_t v) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (idx[mid] < v)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/// Work items of an encode (Note [sparse packing, one writer per byte]).
TL_HD int64_t pack_items(const SparseLayout& s) { return s.bitmap && s.index_bytes > s.n ? s.index_bytes : s.n; }

/// Item t of an encode: entry t (its value, and its index for an int index) and bitmap byte t.
TL_HD void pack_item(const float* x, const int64_t* idx, int64_t t, const SparseLayout& s, uint8_t* body) {
  if (t < s.n) {
    const int64_t j = idx[t];
    if (!s.bitmap) store_le(body + t * s.index_width, static_cast<uint64_t>(j), s.index_width);
    store_wire(body + s.index_bytes + t * wire_size(s.wire), x[j], s.wire);
  }
  if (s.bitmap && t < s.index_bytes) {
    uint32_t byte = 0;
    for (int64_t p = lower_bound(idx, s.n, 8 * t); p < s.n && idx[p] < 8 * t + 8; ++p) byte |= 1u << (idx[p] - 8 * t);
    body[t] = static_cast<uint8_t>(byte);
  }
}

/// Int index: entry i of the body scattered into out (zeros elsewhere, written beforehand).
TL_HD void unpack_entry(const uint8_t* body, int64_t i, const SparseLayout& s, float* out) {
  const uint64_t j = load_le(body + i * s.index_width, s.index_width);
  if (j < static_cast<uint64_t>(s.universe)) out[j] = load_wire(body + s.index_bytes + i * wire_size(s.wire), s.wire);
}

/// Bitmap index: the 8 outputs of byte b; `rank` is the inclusive prefix sum of popcounts at b.
TL_HD void unpack_bitmap_byte(const uint8_t* body, const int64_t* rank, int64_t b, const SparseLayout& s, float* out) {
  const uint32_t byte = body[b];
  int64_t r = rank[b] - popcount8(byte);
  for (int j = 0; j < 8 && 8 * b + j < s.universe; ++j) {
    float v = 0.0f;
    if (byte >> j & 1) {
      if (r < s.n) v = load_wire(body + s.index_bytes + r * wire_size(s.wire), s.wire);
      ++r;
    }
    out[8 * b + j] = v;
  }
}

/// Work items of a decode: entries (int index) or bitmap bytes.
TL_HD int64_t unpack_items(const SparseLayout& s) { return s.bitmap ? s.index_bytes : s.n; }

TL_HD void unpack_item(const uint8_t* body, const int64_t* rank, int64_t t, const SparseLayout& s, float* out) {
  if (s.bitmap)
    unpack_bitmap_byte(body, rank, t, s, out);
  else
    unpack_entry(body, t, s, out);
}

}  // namespace tl::codec::gpu
