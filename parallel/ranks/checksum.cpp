#include "parallel/ranks/checksum.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "compression/codecs/x86.h"

namespace tl::ranks {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // Castagnoli, reflected

const std::array<uint32_t, 256>& table() {
  static const std::array<uint32_t, 256> t = [] {
    std::array<uint32_t, 256> out{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (kPoly & (0u - (c & 1u)));
      out[i] = c;
    }
    return out;
  }();
  return t;
}

#if defined(__x86_64__)
// crc(A B) from crc(A) and crc(B) when B is `len` bytes: crc(A) shifted over len zero bytes, xor
// crc(B). For the three-stream loop len is fixed, so the shift is one 32x32 GF(2) matrix,
// computed once.
uint32_t gf2_times(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  for (int i = 0; vec; vec >>= 1, ++i)
    if (vec & 1) sum ^= mat[i];
  return sum;
}
void gf2_square(uint32_t* square, const uint32_t* mat) {
  for (int n = 0; n < 32; ++n) square[n] = gf2_times(mat, mat[n]);
}
// The operator that appends `len` zero bytes to a CRC-32C register (zlib's crc32_combine method).
struct ZeroShift {
  uint32_t m[32];
  explicit ZeroShift(size_t len) {
    uint32_t odd[32], even[32];
    odd[0] = kPoly;  // one zero bit
    for (int n = 1; n < 32; ++n) odd[n] = 1u << (n - 1);
    gf2_square(even, odd);  // two zero bits
    gf2_square(odd, even);  // four
    // m = identity, then multiply by 8 zero bits per byte of len, squaring as we go.
    for (int n = 0; n < 32; ++n) m[n] = 1u << n;
    uint32_t* cur = odd;
    uint32_t* other = even;
    size_t bytes = len;
    gf2_square(other, cur);  // 8 bits = 1 byte
    std::swap(cur, other);
    while (bytes) {
      if (bytes & 1) {
        uint32_t r[32];
        for (int n = 0; n < 32; ++n) r[n] = gf2_times(cur, m[n]);
        std::memcpy(m, r, sizeof(r));
      }
      bytes >>= 1;
      if (!bytes) break;
      gf2_square(other, cur);
      std::swap(cur, other);
    }
  }
  uint32_t operator()(uint32_t crc) const { return gf2_times(m, crc); }
};

constexpr size_t kBlock = 8192;  // bytes per stream per round

__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const uint8_t* p, size_t n, uint32_t crc) {
  uint64_t c0 = ~crc;
  // Three independent streams hide the instruction's 3-cycle latency.
  static const ZeroShift shift(kBlock);
  while (n >= 3 * kBlock) {
    uint64_t c1 = 0xFFFFFFFFu, c2 = 0xFFFFFFFFu;
    const uint8_t* a = p;
    const uint8_t* b = p + kBlock;
    const uint8_t* d = p + 2 * kBlock;
    for (size_t i = 0; i < kBlock; i += 8) {
      uint64_t x, y, z;
      std::memcpy(&x, a + i, 8), std::memcpy(&y, b + i, 8), std::memcpy(&z, d + i, 8);
      c0 = _mm_crc32_u64(c0, x), c1 = _mm_crc32_u64(c1, y), c2 = _mm_crc32_u64(c2, z);
    }
    // Combine the finished CRCs as zlib's crc32_combine does: crc(A B) = shift_|B|(crc(A)) ^ crc(B).
    uint32_t r = shift(static_cast<uint32_t>(~c0)) ^ static_cast<uint32_t>(~c1);
    r = shift(r) ^ static_cast<uint32_t>(~c2);
    c0 = static_cast<uint32_t>(~r);
    p += 3 * kBlock, n -= 3 * kBlock;
  }
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t x;
    std::memcpy(&x, p, 8);
    c0 = _mm_crc32_u64(c0, x);
  }
  uint32_t c = static_cast<uint32_t>(c0);
  for (; n; ++p, --n) c = _mm_crc32_u8(c, *p);
  return ~c;
}

// Note [folding with carry-less multiplies]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The crc32 instruction takes 8 bytes per instruction, and on some CPUs (AMD Zen) one instruction
// per 3 cycles whatever the streams: ~2.7 bytes a cycle. With VPCLMULQDQ, 16 lanes of 128 bits
// (four 512-bit registers, 256 bytes) are folded forward 256 bytes at a time, then into one lane,
// whose CRC and that of the tail the crc32 instruction takes. Conventions (the reflected CRC's):
// a 128-bit little-endian load of message bytes holds in bit k the coefficient of x^(127 - k) of
// that chunk's polynomial; its low qword is the high part A_H (times x^64), its high qword A_L.
// Moving a lane F bits further, A x^F = A_H x^(64+F) + A_L x^F is congruent mod P to
// A_H (x^(64+F) mod P) + A_L (x^F mod P), two 64 x 32-bit products of at most 95 bits. A
// carry-less multiply of two reflected 64-bit values holds the product times x (bit k holds the
// coefficient of x^(126 - k)), so the constants are x^(63+F) mod P and x^(F-1) mod P. The register
// after all lanes are folded into one is congruent to the message (with the starting CRC xored
// into its first 4 bytes), so the crc32 instruction over its 16 bytes, from 0, gives the CRC of
// the folded part.
// x^d mod P (P = 0x1EDC6F41 plus x^32, not reflected), as a 64-bit reflected value: the
// coefficient of x^e at bit 63 - e.
uint64_t x_pow_mod_reflected(int d) {
  uint32_t r = 1;  // x^0
  for (int i = 0; i < d; ++i) r = (r << 1) ^ ((r & 0x80000000u) ? 0x1EDC6F41u : 0u);
  uint64_t out = 0;
  for (int e = 0; e < 32; ++e)
    if (r >> e & 1u) out |= uint64_t(1) << (63 - e);
  return out;
}
// The constants that move a lane by `bits`: {low qword: for A_H, high qword: for A_L}.
struct FoldConstant {
  uint64_t high, low;
  explicit FoldConstant(int bits) : high(x_pow_mod_reflected(63 + bits)), low(x_pow_mod_reflected(bits - 1)) {}
};

__attribute__((target("sse4.2,pclmul"))) __m128i fold128(__m128i a, const FoldConstant& k) {
  const __m128i c = _mm_set_epi64x(static_cast<int64_t>(k.low), static_cast<int64_t>(k.high));
  return _mm_xor_si128(_mm_clmulepi64_si128(a, c, 0x00), _mm_clmulepi64_si128(a, c, 0x11));
}

constexpr size_t kFoldBlock = 256;  // bytes folded per round: four 512-bit registers

__attribute__((target("sse4.2,pclmul,avx512f,vpclmulqdq"))) uint32_t crc32c_fold(const uint8_t* p, size_t n,
                                                                                  uint32_t crc) {
  if (n < 2 * kFoldBlock) return crc32c_sse42(p, n, crc);
  static const FoldConstant by_block(8 * kFoldBlock);
  static const std::array<FoldConstant, 16> to_last = [] {  // lane g moved by (15 - g) lanes
    std::array<FoldConstant, 16> out{FoldConstant(128), FoldConstant(128), FoldConstant(128), FoldConstant(128),
                                     FoldConstant(128), FoldConstant(128), FoldConstant(128), FoldConstant(128),
                                     FoldConstant(128), FoldConstant(128), FoldConstant(128), FoldConstant(128),
                                     FoldConstant(128), FoldConstant(128), FoldConstant(128), FoldConstant(128)};
    for (int g = 0; g < 15; ++g) out[g] = FoldConstant(128 * (15 - g));
    return out;
  }();
  const __m512i k = _mm512_broadcast_i32x4(
      _mm_set_epi64x(static_cast<int64_t>(by_block.low), static_cast<int64_t>(by_block.high)));
  __m512i acc[4];
  for (int j = 0; j < 4; ++j) acc[j] = _mm512_loadu_si512(p + 64 * j);
  acc[0] = _mm512_xor_si512(acc[0], _mm512_castsi128_si512(_mm_cvtsi32_si128(static_cast<int>(~crc))));
  p += kFoldBlock, n -= kFoldBlock;
  for (; n >= kFoldBlock; p += kFoldBlock, n -= kFoldBlock) {
    for (int j = 0; j < 4; ++j) {
      const __m512i moved =
          _mm512_xor_si512(_mm512_clmulepi64_epi128(acc[j], k, 0x00), _mm512_clmulepi64_epi128(acc[j], k, 0x11));
      acc[j] = _mm512_xor_si512(moved, _mm512_loadu_si512(p + 64 * j));
    }
  }
  alignas(64) __m128i lanes[16];
  for (int j = 0; j < 4; ++j) _mm512_store_si512(reinterpret_cast<__m512i*>(lanes + 4 * j), acc[j]);
  __m128i r = lanes[15];
  for (int g = 0; g < 15; ++g) r = _mm_xor_si128(r, fold128(lanes[g], to_last[g]));
  uint64_t c = _mm_crc32_u64(0, static_cast<uint64_t>(_mm_cvtsi128_si64(r)));
  c = _mm_crc32_u64(c, static_cast<uint64_t>(_mm_extract_epi64(r, 1)));
  return crc32c_sse42(p, n, ~static_cast<uint32_t>(c));  // the tail, from the folded part's CRC
}
#endif

}  // namespace

uint32_t crc32c_copy(uint8_t* dst, const uint8_t* src, size_t n, uint32_t crc) {
  constexpr size_t kChunk = 32 << 10;  // copied, then summed while in L1/L2
  for (size_t off = 0; off < n; off += kChunk) {
    const size_t m = std::min(kChunk, n - off);
    std::memcpy(dst + off, src + off, m);
    crc = crc32c(dst + off, m, crc);
  }
  return crc;
}

uint32_t crc32c_portable(const uint8_t* p, size_t n, uint32_t crc) {
  const auto& t = table();
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; ++i) c = t[(c ^ p[i]) & 0xFFu] ^ (c >> 8);
  return ~c;
}

uint32_t crc32c_sse42_only(const uint8_t* p, size_t n, uint32_t crc) {
#if defined(__x86_64__)
  static const bool sse42 = __builtin_cpu_supports("sse4.2");
  if (sse42) return crc32c_sse42(p, n, crc);
#endif
  return crc32c_portable(p, n, crc);
}

uint32_t crc32c(const uint8_t* p, size_t n, uint32_t crc) {
#if defined(__x86_64__)
  static const bool fold = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq") &&
                           __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.2");
  if (fold) return crc32c_fold(p, n, crc);
  static const bool sse42 = __builtin_cpu_supports("sse4.2");
  if (sse42) return crc32c_sse42(p, n, crc);
#endif
  return crc32c_portable(p, n, crc);
}

}  // namespace tl::ranks
