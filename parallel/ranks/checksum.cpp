#include "parallel/ranks/checksum.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

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
#endif

}  // namespace

uint32_t crc32c_portable(const uint8_t* p, size_t n, uint32_t crc) {
  const auto& t = table();
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; ++i) c = t[(c ^ p[i]) & 0xFFu] ^ (c >> 8);
  return ~c;
}

uint32_t crc32c(const uint8_t* p, size_t n, uint32_t crc) {
#if defined(__x86_64__)
  static const bool sse42 = __builtin_cpu_supports("sse4.2");
  if (sse42) return crc32c_sse42(p, n, crc);
#endif
  return crc32c_portable(p, n, crc);
}

}  // namespace tl::ranks
