#include "compression/codecs/quant_kernels.h"

#include <ATen/Parallel.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <numeric>
#include <type_traits>
#include <vector>

#include "compression/codecs/inline_parallel.h"
#include "compression/codecs/x86.h"
#include "compression/cuda/quant_logic.h"

// Note [target clones]. The hot loops below are plain C++ written so that GCC vectorises them;
// `target_clones` builds each for AVX2 and for the baseline x86-64 ISA and dispatches at load
// time (ifunc), so the binary still runs on any x86-64. Elsewhere the attribute is dropped. FMA
// is deliberately not enabled: without contraction the results equal the portable ATen path's.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define TL_TARGET_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TL_TARGET_CLONES
#endif
#define TL_INLINE inline __attribute__((always_inline))

namespace tl::codec {
namespace {

constexpr int64_t kTile = 8192;  // elements per work item (a multiple of 8: tiles pack to whole bytes)
constexpr int64_t kColumnBlock = 2048;  // columns per work item (Note [channel min/max by columns])

// Round half to even for |v| < 2^22 (the values here are clamped to [-128, 255] first).
TL_INLINE float round_even(float v) {
  const float m = 12582912.0f;  // 1.5 * 2^23
  return (v + m) - m;
}

// U[0, 1) from the counter hash of (seed, i), shared with the CUDA kernels (one definition, so
// both draw the same stream: Note [one logic, two compilers] in compression/cuda/quant_logic.h).
using gpu::uniform01;

// Codes of x[0, len): one scale (a, b) for all (Row = false) or one per element (Row = true).
template <bool Row, bool MinMax, bool Stochastic>
TL_INLINE void quantise_span(const float* x, int64_t len, const float* a, const float* b, float p, float hi,
                             uint64_t seed, int64_t i0, uint8_t* codes) {
  const float lo = MinMax ? 0.0f : -p;
  const float off = MinMax ? 0.0f : p;
  for (int64_t j = 0; j < len; ++j) {
    const float aj = Row ? a[j] : a[0];
    float v = MinMax ? (x[j] - aj) * (Row ? b[j] : b[0]) : x[j] / aj * p;
    if (Stochastic) {
      // floor(v + u): after the shift by `off` the value is >= 0, where truncation is floor
      // (up to the float rounding of that addition, below 2^-16 of a step).
      v = std::min(std::max(v + uniform01(seed, static_cast<uint64_t>(i0 + j)), lo), hi);
      codes[j] = static_cast<uint8_t>(static_cast<int32_t>(v + off));
    } else {
      v = std::min(std::max(v, lo), hi);
      codes[j] = static_cast<uint8_t>(static_cast<int32_t>(round_even(v) + off));
    }
  }
}

template <bool Row, bool MinMax>
TL_INLINE void dequantise_span(const uint8_t* codes, int64_t len, const float* step, const float* lo, float p,
                               float* out) {
  for (int64_t j = 0; j < len; ++j) {
    const float c = static_cast<float>(codes[j]);
    out[j] = MinMax ? c * (Row ? step[j] : step[0]) + (Row ? lo[j] : lo[0]) : (c - p) * (Row ? step[j] : step[0]);
  }
}

// Bit packing of n codes (see pack_bits): groups of 8 codes fill exactly Bits bytes. Inside the
// buffer, groups are moved as whole 8-byte words (a store overlapping the next group is
// overwritten by it, in order); the groups near the end use their exact size, so nothing outside
// [out, out + ceil(n * Bits / 8)) is touched.
template <int Bits>
TL_INLINE uint64_t pack_group(uint64_t w) {
  constexpr uint64_t mask = (1u << Bits) - 1;
  uint64_t acc = 0;
  for (int j = 0; j < 8; ++j) acc |= ((w >> (8 * j)) & mask) << (j * Bits);
  return acc;
}

template <int Bits>
TL_INLINE uint64_t unpack_group(uint64_t acc) {
  constexpr uint64_t mask = (1u << Bits) - 1;
  uint64_t w = 0;
  for (int j = 0; j < 8; ++j) w |= ((acc >> (j * Bits)) & mask) << (8 * j);
  return w;
}

// Widths that divide 8 pack byte by byte (loops the compiler vectorises); 1 bit gathers the low
// bits of 8 bytes with one multiply. Same layout as the general case.
template <int Bits>
TL_INLINE void pack_bytewise(const uint8_t* codes, int64_t n, uint8_t* out) {
  constexpr int per = 8 / Bits;
  constexpr uint32_t mask = (1u << Bits) - 1;
  const int64_t full = n / per;
  if constexpr (Bits == 1) {
    for (int64_t i = 0; i < full; ++i) {
      uint64_t w;
      std::memcpy(&w, codes + 8 * i, 8);
      // bit j of byte j moves to bit 56 + j: the exponents 8j + 7k + 7 never collide, no carries
      out[i] = static_cast<uint8_t>(((w & 0x0101010101010101ull) * 0x0102040810204080ull) >> 56);
    }
  } else {
    for (int64_t i = 0; i < full; ++i) {
      uint32_t b = 0;
      for (int j = 0; j < per; ++j) b |= (codes[per * i + j] & mask) << (Bits * j);
      out[i] = static_cast<uint8_t>(b);
    }
  }
  if (n % per) {
    uint32_t b = 0;
    for (int64_t j = 0; j < n % per; ++j) b |= (codes[per * full + j] & mask) << (Bits * j);
    out[full] = static_cast<uint8_t>(b);
  }
}

// 2-bit codes: byte b unpacks to the four bytes of kUnpack2[b] (little-endian), one load and one
// store a byte (the shift-and-mask loop did not vectorise: 3x the time of the 4-bit unpack).
constexpr std::array<uint32_t, 256> make_unpack2() {
  std::array<uint32_t, 256> t{};
  for (uint32_t b = 0; b < 256; ++b)
    t[b] = (b & 3u) | ((b >> 2) & 3u) << 8 | ((b >> 4) & 3u) << 16 | ((b >> 6) & 3u) << 24;
  return t;
}
constexpr std::array<uint32_t, 256> kUnpack2 = make_unpack2();

template <int Bits>
TL_INLINE void unpack_bytewise(const uint8_t* in, int64_t n, uint8_t* codes) {
  constexpr int per = 8 / Bits;
  constexpr uint32_t mask = (1u << Bits) - 1;
  const int64_t full = n / per;
  if constexpr (Bits == 2) {
    for (int64_t i = 0; i < full; ++i) std::memcpy(codes + 4 * i, &kUnpack2[in[i]], 4);
  } else if constexpr (Bits == 1) {
    for (int64_t i = 0; i < full; ++i) {
      // byte k keeps bit k of the input, then becomes 0 or 1 (adding 0x7f carries into bit 7
      // exactly when the byte is non-zero, never across bytes)
      const uint64_t spread = (in[i] * 0x0101010101010101ull) & 0x8040201008040201ull;
      const uint64_t w = ((spread + 0x7f7f7f7f7f7f7f7full) >> 7) & 0x0101010101010101ull;
      std::memcpy(codes + 8 * i, &w, 8);
    }
  } else {
    for (int64_t i = 0; i < full; ++i)
      for (int j = 0; j < per; ++j) codes[per * i + j] = static_cast<uint8_t>((in[i] >> (Bits * j)) & mask);
  }
  for (int64_t j = 0; j < n % per; ++j) codes[per * full + j] = static_cast<uint8_t>((in[full] >> (Bits * j)) & mask);
}

template <int Bits>
TL_INLINE void pack_t(const uint8_t* codes, int64_t n, uint8_t* out) {
  if constexpr (8 % Bits == 0) {
    pack_bytewise<Bits>(codes, n, out);
    return;
  }
  constexpr uint64_t mask = (1u << Bits) - 1;
  const int64_t groups = n / 8;
  const int64_t wide = groups * Bits >= 8 ? (groups * Bits - 8) / Bits + 1 : 0;  // g * Bits + 8 <= groups * Bits
  for (int64_t g = 0; g < wide; ++g) {
    uint64_t w;
    std::memcpy(&w, codes + 8 * g, 8);
    const uint64_t acc = pack_group<Bits>(w);
    std::memcpy(out + g * Bits, &acc, 8);  // little-endian host
  }
  for (int64_t g = wide; g < groups; ++g) {
    uint64_t w;
    std::memcpy(&w, codes + 8 * g, 8);
    const uint64_t acc = pack_group<Bits>(w);
    std::memcpy(out + g * Bits, &acc, Bits);
  }
  const int64_t rest = n - 8 * groups;
  if (rest > 0) {
    uint64_t acc = 0;
    for (int64_t j = 0; j < rest; ++j) acc |= (codes[8 * groups + j] & mask) << (j * Bits);
    std::memcpy(out + groups * Bits, &acc, (rest * Bits + 7) / 8);
  }
}

template <int Bits>
TL_INLINE void unpack_t(const uint8_t* in, int64_t n, uint8_t* codes) {
  if constexpr (8 % Bits == 0) {
    unpack_bytewise<Bits>(in, n, codes);
    return;
  }
  constexpr uint64_t mask = (1u << Bits) - 1;
  const int64_t groups = n / 8;
  const int64_t wide = groups * Bits >= 8 ? (groups * Bits - 8) / Bits + 1 : 0;
  for (int64_t g = 0; g < wide; ++g) {
    uint64_t acc;
    std::memcpy(&acc, in + g * Bits, 8);  // the bytes past this group are masked off
    const uint64_t w = unpack_group<Bits>(acc);
    std::memcpy(codes + 8 * g, &w, 8);
  }
  for (int64_t g = wide; g < groups; ++g) {
    uint64_t acc = 0;
    std::memcpy(&acc, in + g * Bits, Bits);
    const uint64_t w = unpack_group<Bits>(acc);
    std::memcpy(codes + 8 * g, &w, 8);
  }
  const int64_t rest = n - 8 * groups;
  if (rest > 0) {
    uint64_t acc = 0;
    std::memcpy(&acc, in + groups * Bits, (rest * Bits + 7) / 8);
    for (int64_t j = 0; j < rest; ++j) codes[8 * groups + j] = static_cast<uint8_t>((acc >> (j * Bits)) & mask);
  }
}

TL_INLINE void pack(const uint8_t* codes, int64_t n, int bits, uint8_t* out) {
  switch (bits) {
    case 1:
      pack_t<1>(codes, n, out);
      break;
    case 2:
      pack_t<2>(codes, n, out);
      break;
    case 3:
      pack_t<3>(codes, n, out);
      break;
    case 4:
      pack_t<4>(codes, n, out);
      break;
    case 5:
      pack_t<5>(codes, n, out);
      break;
    case 6:
      pack_t<6>(codes, n, out);
      break;
    case 7:
      pack_t<7>(codes, n, out);
      break;
    default:
      if (n > 0) std::memcpy(out, codes, n);  // an empty tensor's pointers may be null
      break;
  }
}

TL_INLINE void unpack(const uint8_t* in, int64_t n, int bits, uint8_t* codes) {
  switch (bits) {
    case 1:
      unpack_t<1>(in, n, codes);
      break;
    case 2:
      unpack_t<2>(in, n, codes);
      break;
    case 3:
      unpack_t<3>(in, n, codes);
      break;
    case 4:
      unpack_t<4>(in, n, codes);
      break;
    case 5:
      unpack_t<5>(in, n, codes);
      break;
    case 6:
      unpack_t<6>(in, n, codes);
      break;
    case 7:
      unpack_t<7>(in, n, codes);
      break;
    default:
      if (n > 0) std::memcpy(codes, in, n);
      break;
  }
}

TL_TARGET_CLONES
void pack_tile(const uint8_t* codes, int64_t n, int bits, uint8_t* out) { pack(codes, n, bits, out); }

TL_TARGET_CLONES
void unpack_tile(const uint8_t* in, int64_t n, int bits, uint8_t* codes) { unpack(in, n, bits, codes); }

// Walks [t0, t1) in spans of one scale group (run > 1) or along rows of `groups` elements with a
// scale per element (run == 1), calling f(begin, len, group of begin, row-wise?).
template <class F>
TL_INLINE void for_spans(const QuantGeometry& g, int64_t t0, int64_t t1, F f) {
  for (int64_t i = t0; i < t1;) {
    if (g.run == 1) {
      const int64_t c = i % g.groups;
      const int64_t e = std::min(t1, i - c + g.groups);
      f(i, e - i, c, true);
      i = e;
    } else {
      const int64_t r = i / g.run;
      const int64_t e = std::min(t1, (r + 1) * g.run);
      f(i, e - i, r % g.groups, false);
      i = e;
    }
  }
}

// Note [quotient by a reciprocal]. A max-abs code rounds v = x / a * 2^(bits-1) to nearest: one
// division per element, the slowest instruction of the loop (an 8-wide divide issues about every
// 5 cycles on the development machine's Zen 4, the rest of the loop about 2). w = x * r, with
// r = 2^(bits-1) / a per group, differs from v by at most three float roundings of |v| <= 128,
// i.e. by less than 2^-15, so round(w) = round(v) unless w lies that close to a half-integer
// (clamping to the integer bounds first changes nothing: both sides clamp to the same integer).
// Spans of kCheckSpan elements are coded from w while noting whether any clamped w lies within
// kHalfMargin (2^-13, 4x the bound) of a half-integer; such a span (about one in 30 of random
// data: 128 x 2^-12) is coded again with the division. The bytes are always the division's.
constexpr int64_t kCheckSpan = 128;
constexpr float kHalfMargin = 1.0f / 8192;

// Codes of x[0, len) from w = x * r (max-abs, nearest); true when a w lay near a half-integer.
template <bool Row>
TL_INLINE bool quantise_by_reciprocal(const float* x, int64_t len, const float* r, float p, float hi, uint8_t* codes) {
  int32_t near = 0;
  for (int64_t j = 0; j < len; ++j) {
    const float w = std::min(std::max(x[j] * (Row ? r[j] : r[0]), -p), hi);
    const float q = round_even(w);
    near |= std::fabs(w - q) > 0.5f - kHalfMargin;  // NaN compares false: its code is the same either way
    codes[j] = static_cast<uint8_t>(static_cast<int32_t>(q + p));
  }
  return near != 0;
}

template <bool MinMax, bool Stochastic>
TL_INLINE void quantise_tile_impl(const float* x, int64_t t0, int64_t t1, const QuantGeometry& g, const QuantParams& q,
                                  const float* recip, uint8_t* codes) {
  const float p = static_cast<float>(1 << (q.bits - 1));
  const float hi = MinMax ? static_cast<float>((1 << q.bits) - 1) : p - 1;
  for_spans(
      g, t0, t1, [&](int64_t i, int64_t len, int64_t s, bool row) __attribute__((always_inline)) {
        if (!MinMax && !Stochastic) {  // Note [quotient by a reciprocal]
          for (int64_t b = 0; b < len; b += kCheckSpan) {
            const int64_t e = std::min(len, b + kCheckSpan);
            uint8_t* c = codes + (i - t0) + b;
            const bool near = row ? quantise_by_reciprocal<true>(x + i + b, e - b, recip + s + b, p, hi, c)
                                  : quantise_by_reciprocal<false>(x + i + b, e - b, recip + s, p, hi, c);
            if (near) {
              if (row)
                quantise_span<true, false, false>(x + i + b, e - b, q.a + s + b, q.a + s + b, p, hi, 0, 0, c);
              else
                quantise_span<false, false, false>(x + i + b, e - b, q.a + s, q.a + s, p, hi, 0, 0, c);
            }
          }
          return;
        }
        if (row)
          quantise_span<true, MinMax, Stochastic>(x + i, len, q.a + s, MinMax ? q.b + s : q.a + s, p, hi, q.seed, i,
                                                  codes + (i - t0));
        else
          quantise_span<false, MinMax, Stochastic>(x + i, len, q.a + s, MinMax ? q.b + s : q.a + s, p, hi, q.seed, i,
                                                   codes + (i - t0));
      });
}

// Note [8-bit codes in place]. Packing 8-bit codes is a copy (pack_bits' layout is the codes
// themselves), so the tile loops write them straight into the payload and read them straight from
// it instead of through a tile buffer: the same bytes, one 8 KiB copy a tile less each way.
TL_TARGET_CLONES
void quantise_tile(const float* x, int64_t t0, int64_t t1, const QuantGeometry& g, const QuantParams& q,
                   const float* recip, uint8_t* out) {
  uint8_t buf[kTile];
  uint8_t* codes = q.bits == 8 ? out + t0 : buf;  // Note [8-bit codes in place]
  if (q.minmax) {
    if (q.stochastic)
      quantise_tile_impl<true, true>(x, t0, t1, g, q, recip, codes);
    else
      quantise_tile_impl<true, false>(x, t0, t1, g, q, recip, codes);
  } else {
    if (q.stochastic)
      quantise_tile_impl<false, true>(x, t0, t1, g, q, recip, codes);
    else
      quantise_tile_impl<false, false>(x, t0, t1, g, q, recip, codes);
  }
  if (q.bits != 8) pack(codes, t1 - t0, q.bits, out + t0 / 8 * q.bits);
}

TL_TARGET_CLONES
void dequantise_tile(const uint8_t* in, int64_t t0, int64_t t1, const QuantGeometry& g, const DequantParams& q,
                     float* out) {
  uint8_t buf[kTile];
  const uint8_t* codes = q.bits == 8 ? in + t0 : buf;  // Note [8-bit codes in place]
  if (q.bits != 8) unpack(in + t0 / 8 * q.bits, t1 - t0, q.bits, buf);
  const float p = static_cast<float>(1 << (q.bits - 1));
  for_spans(
      g, t0, t1, [&](int64_t i, int64_t len, int64_t s, bool row) __attribute__((always_inline)) {
        const uint8_t* c = codes + (i - t0);
        const float* lo = q.minmax ? q.lo + s : q.step + s;
        if (q.minmax)
          row ? dequantise_span<true, true>(c, len, q.step + s, lo, p, out + i)
              : dequantise_span<false, true>(c, len, q.step + s, lo, p, out + i);
        else
          row ? dequantise_span<true, false>(c, len, q.step + s, lo, p, out + i)
              : dequantise_span<false, false>(c, len, q.step + s, lo, p, out + i);
      });
}

// A min/max reduction is only vectorised by the compiler when it may reorder it, which float
// semantics forbid; GCC vector types make the 8 lanes explicit (per-lane updates reorder nothing).
// With Nan, a NaN propagates, as in at::aminmax (one scale group: the whole tensor, whose NaN then
// gets the error about a non-finite scale); without, it is skipped, as the per-group path always
// did (its NaN checks per short span cost 3x the whole pass).
typedef float Float8 __attribute__((vector_size(32)));

template <bool Nan>
TL_INLINE float min_of(float v, float m) {
  return Nan ? (((v < m) | (v != v)) ? v : m) : (v < m ? v : m);
}
template <bool Nan>
TL_INLINE float max_of(float v, float m) {
  return Nan ? (((v > m) | (v != v)) ? v : m) : (v > m ? v : m);
}

template <bool Nan>
TL_INLINE void minmax_span_t(const float* x, int64_t len, float& mn, float& mx) {
  Float8 a, b;
  for (int k = 0; k < 8; ++k) {
    a[k] = mn;
    b[k] = mx;
  }
  int64_t j = 0;
  for (; j + 8 <= len; j += 8) {
    Float8 v;
    std::memcpy(&v, x + j, sizeof(v));
    if (Nan) {
      const auto nan = v != v;
      a = (v < a) | nan ? v : a;
      b = (v > b) | nan ? v : b;
    } else {
      a = v < a ? v : a;
      b = v > b ? v : b;
    }
  }
  for (int k = 0; k < 8; ++k) {
    mn = min_of<Nan>(a[k], mn);
    mx = max_of<Nan>(b[k], mx);
  }
  for (; j < len; ++j) {
    mn = min_of<Nan>(x[j], mn);
    mx = max_of<Nan>(x[j], mx);
  }
}

// Note [four chains]. minmax_span_t carries one vector of minima and one of maxima from iteration
// to iteration: each step waits for the compare-and-blend before it (about 5 cycles for 8
// elements, 60 us for a 1 MiB tensor that L2 delivers in 15). Four independent pairs of vectors
// run at the loads' pace, and a NaN is noted aside (`v < a ? v : a` is then one min instruction,
// which skips a NaN: any NaN makes both results NaN, as propagation does). Minima and maxima do not
// depend on the order of the elements except for the sign of a zero result (-0 and +0 compare
// equal), which no longer matters: a zero scale goes on the wire as +0 (Note [zero scales] in
// quant_logic.h; a zero min or max, as after a ReLU, was walked again in one chain's order).
template <bool Nan>
TL_INLINE void minmax_span_chains(const float* x, int64_t len, float& mn, float& mx) {
  constexpr int kChains = 4;
  if (len < 1024) return minmax_span_t<Nan>(x, len, mn, mx);  // short spans (blocks): the combine would dominate
  Float8 a[kChains], b[kChains];
  Float8 nan{};  // a lane that saw a NaN holds one
  for (int c = 0; c < kChains; ++c)
    for (int k = 0; k < 8; ++k) {
      a[c][k] = mn;
      b[c][k] = mx;
    }
  int64_t j = 0;
  for (; j + 8 * kChains <= len; j += 8 * kChains) {
    for (int c = 0; c < kChains; ++c) {
      Float8 v;
      std::memcpy(&v, x + j + 8 * c, sizeof(v));
      if (Nan) nan = v != v ? v : nan;
      a[c] = v < a[c] ? v : a[c];
      b[c] = v > b[c] ? v : b[c];
    }
  }
  for (int c = 0; c < kChains; ++c)
    for (int k = 0; k < 8; ++k) {
      mn = min_of<false>(a[c][k], mn);
      mx = max_of<false>(b[c][k], mx);
    }
  for (int k = 0; k < 8; ++k)
    if (Nan && nan[k] != nan[k]) mn = mx = nan[k];
  for (; j < len; ++j) {
    mn = min_of<Nan>(x[j], mn);
    mx = max_of<Nan>(x[j], mx);
  }
}

TL_TARGET_CLONES
void minmax_span(const float* x, int64_t len, bool nan, float& mn, float& mx) {
  if (nan)
    minmax_span_chains<true>(x, len, mn, mx);
  else
    minmax_span_chains<false>(x, len, mn, mx);
}

TL_TARGET_CLONES
void minmax_row(const float* x, int64_t len, float* mn, float* mx) {
  for (int64_t j = 0; j < len; ++j) {
    mn[j] = x[j] < mn[j] ? x[j] : mn[j];
    mx[j] = x[j] > mx[j] ? x[j] : mx[j];
  }
}

// Columns [0, width) of `rows` rows `stride` apart (Note [channel min/max by columns]), four rows a
// pass, by plain loops GCC vectorises (minps / maxps: the comparisons of minmax_row).
TL_TARGET_CLONES
void minmax_columns(const float* x, int64_t rows, int64_t stride, int64_t width, float* mn, float* mx) {
  std::fill(mn, mn + width, std::numeric_limits<float>::infinity());
  std::fill(mx, mx + width, -std::numeric_limits<float>::infinity());
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    const float* x0 = x + r * stride;
    const float* x1 = x0 + stride;
    const float* x2 = x1 + stride;
    const float* x3 = x2 + stride;
    for (int64_t j = 0; j < width; ++j) {
      float lo = mn[j], hi = mx[j];
      lo = x0[j] < lo ? x0[j] : lo;
      hi = x0[j] > hi ? x0[j] : hi;
      lo = x1[j] < lo ? x1[j] : lo;
      hi = x1[j] > hi ? x1[j] : hi;
      lo = x2[j] < lo ? x2[j] : lo;
      hi = x2[j] > hi ? x2[j] : hi;
      lo = x3[j] < lo ? x3[j] : lo;
      hi = x3[j] > hi ? x3[j] : hi;
      mn[j] = lo;
      mx[j] = hi;
    }
  }
  for (; r < rows; ++r) minmax_row(x + r * stride, width, mn, mx);
}

// The division's codes of a span (Note [quotient by a reciprocal]) by the plain loop, compiled
// as it always was (no FMA contraction).
TL_TARGET_CLONES
void recode_by_division(const float* x, int64_t len, const float* a, bool row, float p, float hi, uint8_t* codes) {
  if (row)
    quantise_span<true, false, false>(x, len, a, a, p, hi, 0, 0, codes);
  else
    quantise_span<false, false, false>(x, len, a, a, p, hi, 0, 0, codes);
}

// ---- AVX-512 loops (Note [quant by AVX-512]) ------------------------------------------------------

// Note [quant by AVX-512]. Where the CPU has AVX-512 (F, BW, DQ, VL and VBMI: this machine's Zen 4)
// uniform quantisation runs hand-written loops of 16 lanes; the loops GCC made of the plain C++
// above cost ~15 instructions per 8 elements (a 1 MiB max-abs encode: 56 us for the codes alone,
// its check for half-integers carried through a stack slot; ~25 us here, about 8 instructions per
// 16 elements, bound by their issue). Per 16 elements here:
// - max-abs, nearest: t = fma(x, r, 2^(bits-1) + 1.5 * 2^23): one rounding to an integer,
//   round(x r + 2^(bits-1)), whose low byte is the code once t is clamped above at 2^bits - 1 +
//   1.5 * 2^23; f = fma(x, r, 2^(bits-1) + 1.5 * 2^23 - t), the distance to it (taken before the
//   clamp: with 1 bit a quarter of the elements clamp). An element whose |f| exceeds 1/2 - 2^-13
//   (or is NaN) gets a bit in a mask per 64 elements and is coded again by the division after the
//   span (Note [quotient by a reciprocal]: x r differs from the division's value by under 2^-15,
//   the fused operations add no rounding before the code's, and f is off by at most 2^-25). About
//   2 elements in 8192 (the earlier 128-element spans' end-of-span test and the recoding of whole
//   spans cost ~25% of the loop). No clamp below: a finite x never takes x r + 2^(bits-1) below
//   -2^-17, which rounds to code 0, as the division path's clamp gives.
// - min-max: (x - lo) * b clamped to [0, 2^bits - 1] and converted to nearest even, the plain
//   loop's operations; decoding's c * step + lo by the intrinsics with a rounding argument, which
//   GCC does not contract into an FMA (it does the plain ones: the test caught it).
// - codes are packed in registers: 4 vectors of int32 to 64 bytes by unsigned saturation (a
//   NaN's 0x80000000 becomes 0, as the truncating cast gives) or by a byte permute of the low
//   bytes (max-abs's t), then 4, 2 and 1 bits from those bytes by multiply-adds of adjacent bytes
//   and words (c0 + 16 c1; c0 + 4 c1 + 16 c2 + 64 c3) or a byte test mask, 3, 5, 6 and 7 bits by
//   a tree of multiply-adds and shifts and a byte permute (pack_avx512).
// - decoding: codes are unpacked in registers (nibbles by shifts, 1 bit by a mask, the other
//   widths by a byte permute and a multishift); with up to 4 bits a span's 2^bits values are
//   computed once, by the plain loop's operations, and looked up by a permute; 8 bits convert
//   and scale.
// - the min/max of a tensor or of blocks of 64 elements and more: four chains of 16 lanes, NaN
//   noted in a mask (one group) or skipped (blocks: 27 -> ~10 us for the 8192 blocks of 128 of a
//   1 MiB tensor).
// The payload bytes and decoded values are the plain loops' (cpu_paths_test checks both, with the
// AVX-512 loops on and off: set_quant_avx512).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TL_QUANT_AVX512 1
// The lambdas' vector returns warn about an ABI they never use (they are inlined). (GCC 12's false
// uninitialized warnings of the AVX-512 headers are off through x86.h.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#define TL_AVX512_ISA "avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi"
#define TL_AVX512 __attribute__((target(TL_AVX512_ISA)))
// A lambda takes no target from the function around it; one called from a loop of plain C++
// (for_spans) cannot be inlined there, the others are.
#define TL_AVX512_LAMBDA TL_AVX512
#define TL_AVX512_INLINE_LAMBDA __attribute__((always_inline, target(TL_AVX512_ISA)))

std::atomic<bool> quant_avx512_allowed{true};

bool quant_avx512() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512vbmi");
  return has && quant_avx512_allowed.load(std::memory_order_relaxed);
}

// The first min(max(n, 0), 16) lanes.
TL_INLINE __mmask16 lanes16(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : n > 0 ? __mmask16((1u << n) - 1) : __mmask16(0);
}
TL_INLINE __mmask64 lanes64(int64_t n) { return n >= 64 ? ~__mmask64(0) : (__mmask64(1) << n) - 1; }

// 4 vectors of int32 codes (elements 0-15, 16-31, ...) to 64 bytes in element order, saturated to
// [0, 255]: the packs interleave 128-bit lanes, the permute puts the 4-byte pieces back in order.
TL_AVX512 TL_INLINE __m512i bytes_of(const __m512i* q) {
  const __m512i b = _mm512_packus_epi16(_mm512_packus_epi32(q[0], q[1]), _mm512_packus_epi32(q[2], q[3]));
  return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), b);
}

// The low bytes of 4 vectors of dwords (elements 0-15, 16-31, ...), in element order: two
// two-table byte permutes and an insert.
struct LowByteIndex {
  alignas(64) uint8_t idx[64];
  constexpr LowByteIndex() : idx{} {
    for (int j = 0; j < 64; ++j) idx[j] = static_cast<uint8_t>(j % 32 < 16 ? 4 * (j % 16) : 64 + 4 * (j % 16));
  }
};
constexpr LowByteIndex kLowBytes{};

TL_AVX512 TL_INLINE __m512i low_bytes_of(const __m512i* q) {
  const __m512i idx = _mm512_load_si512(kLowBytes.idx);
  const __m512i ab = _mm512_permutex2var_epi8(q[0], idx, q[1]), cd = _mm512_permutex2var_epi8(q[2], idx, q[3]);
  return _mm512_inserti64x4(ab, _mm512_castsi512_si256(cd), 1);
}

// Codes of 64 elements from 4 vectors of int32 per step: x[j, j + 64) with the lanes `live(k)` of
// vector k (full masks in the main loop, which the compiler folds away; the end's at the tail).
// code(k, v, live) maps a vector of 16 loaded lanes to their int32 codes.
template <bool LowBytes, class Code, class After>
TL_AVX512 TL_INLINE void codes_by_64(const float* x, int64_t len, uint8_t* codes, Code code, After after) {
  auto bytes = [](const __m512i* q) TL_AVX512_INLINE_LAMBDA { return LowBytes ? low_bytes_of(q) : bytes_of(q); };
  int64_t j = 0;
  for (; j + 64 <= len; j += 64) {
    __m512i q[4];
    for (int k = 0; k < 4; ++k) q[k] = code(k, j + 16 * k, _mm512_loadu_ps(x + j + 16 * k), __mmask16(0xffff));
    _mm512_storeu_si512(codes + j, bytes(q));
    after(j);
  }
  if (j == len) return;
  __m512i q[4];
  for (int k = 0; k < 4; ++k) {
    const __mmask16 live = lanes16(len - j - 16 * k);  // lanes past the end load 0
    q[k] = code(k, j + 16 * k, _mm512_maskz_loadu_ps(live, x + j + 16 * k), live);
  }
  _mm512_mask_storeu_epi8(codes + j, lanes64(len - j), bytes(q));
  after(j);
}

// Codes of x[0, len) by the reciprocal (max-abs, nearest; Row: r per element), and for each step
// of 64 elements a bit per element whose u lay within kHalfMargin of a half-integer, or was NaN
// (near[(len + 63) / 64]).
template <bool Row>
TL_AVX512 TL_INLINE void recip_codes_avx512(const float* x, int64_t len, const float* r, float p, float hi,
                                            uint8_t* codes, uint64_t* near) {
  const float magic = 12582912.0f;  // 1.5 * 2^23
  const __m512 shift = _mm512_set1_ps(p + magic), top = _mm512_set1_ps(hi + magic), r0 = _mm512_set1_ps(r[0]),
               margin = _mm512_set1_ps(0.5f - kHalfMargin);
  __mmask16 m[4];
  codes_by_64<true>(
      x, len, codes,
      [&](int k, int64_t j, __m512 v, __mmask16 live) TL_AVX512_INLINE_LAMBDA {
        // lanes past the end: x = 0 and r = 0, so u = p, an integer
        const __m512 rr = Row ? _mm512_maskz_loadu_ps(live, r + j) : r0;
        // t = 1.5 * 2^23 + round(x r + p) in one rounding: the code in the low byte once clamped
        // (min: its second operand for NaN); f = x r + p - round(x r + p), rounded once
        const __m512 t = _mm512_fmadd_ps(v, rr, shift);
        const __m512 f = _mm512_fmadd_ps(v, rr, _mm512_sub_ps(shift, t));
        m[k] = _mm512_cmp_ps_mask(_mm512_abs_ps(f), margin, _CMP_NLE_UQ);
        return _mm512_castps_si512(_mm512_min_ps(top, t));
      },
      [&](int64_t j) TL_AVX512_INLINE_LAMBDA {
        near[j / 64] = _cvtmask64_u64(_mm512_kunpackd(_mm512_kunpackw(m[3], m[2]), _mm512_kunpackw(m[1], m[0])));
      });
}

// Min-max codes of x[0, len): clamp((x - lo) * b, 0, hi) rounded to nearest even (Row: lo, b per
// element).
template <bool Row>
TL_AVX512 TL_INLINE void minmax_codes_avx512(const float* x, int64_t len, const float* lo, const float* b, float hi,
                                             uint8_t* codes) {
  const __m512 vhi = _mm512_set1_ps(hi), zero = _mm512_setzero_ps(), lo0 = _mm512_set1_ps(lo[0]),
               b0 = _mm512_set1_ps(b[0]);
  codes_by_64<false>(
      x, len, codes,
      [&](int, int64_t j, __m512 v, __mmask16 live) TL_AVX512_INLINE_LAMBDA {
        const __m512 l = Row ? _mm512_maskz_loadu_ps(live, lo + j) : lo0;
        const __m512 s = Row ? _mm512_maskz_loadu_ps(live, b + j) : b0;
        // std::max(v, 0) then std::min(v, hi): a NaN stays NaN (max/min return their second operand)
        const __m512 u = _mm512_min_ps(vhi, _mm512_max_ps(zero, _mm512_mul_ps(_mm512_sub_ps(v, l), s)));
        return _mm512_cvt_roundps_epi32(u, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      },
      [](int64_t) {});
}

// Stochastic codes of x[0, len) (element indices i0, i0 + 1, ...): quantise_span's operations
// op for op, floor(v + u) as the truncation of v + u + off after the clamp, u from uniform01's
// hash 16 lanes at a time (32-bit multiplies and shifts); the multiply and the add by their
// rounding forms, which GCC does not contract (the plain loop rounds both).
template <bool Row, bool MinMax>
TL_AVX512 TL_INLINE void stochastic_codes_avx512(const float* x, int64_t len, const float* a, const float* b, float p,
                                                 float hi, uint64_t seed, int64_t i0, uint8_t* codes) {
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m512 vp = _mm512_set1_ps(p), vhi = _mm512_set1_ps(hi), vlo = _mm512_set1_ps(MinMax ? 0.0f : -p),
               off = _mm512_set1_ps(MinMax ? 0.0f : p), a0 = _mm512_set1_ps(a[0]), b0 = _mm512_set1_ps(b[0]),
               unit = _mm512_set1_ps(1.0f / 16777216.0f);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                base = _mm512_set1_epi32(
                    static_cast<int32_t>(static_cast<uint32_t>(seed) + static_cast<uint32_t>(seed >> 32)));
  codes_by_64<false>(
      x, len, codes,
      [&](int, int64_t j, __m512 v, __mmask16 live) TL_AVX512_INLINE_LAMBDA {
        const __m512 aa = Row ? _mm512_maskz_loadu_ps(live, a + j) : a0;  // past the end: NaN codes, not stored
        __m512 w;
        if (MinMax)
          w = _mm512_mul_round_ps(_mm512_sub_ps(v, aa), Row ? _mm512_maskz_loadu_ps(live, b + j) : b0, kNearest);
        else
          w = _mm512_mul_round_ps(_mm512_div_ps(v, aa), vp, kNearest);
        // uniform01(seed, i0 + j + lane)
        __m512i z = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(static_cast<uint32_t>(i0 + j))), lane);
        z = _mm512_add_epi32(_mm512_mullo_epi32(z, _mm512_set1_epi32(static_cast<int32_t>(0x9E3779B9u))), base);
        z = _mm512_xor_si512(z, _mm512_srli_epi32(z, 16));
        z = _mm512_mullo_epi32(z, _mm512_set1_epi32(0x7feb352d));
        z = _mm512_xor_si512(z, _mm512_srli_epi32(z, 15));
        z = _mm512_mullo_epi32(z, _mm512_set1_epi32(static_cast<int32_t>(0x846ca68bu)));
        z = _mm512_xor_si512(z, _mm512_srli_epi32(z, 16));
        const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(z, 8)), unit);
        // std::max(v + u, lo), std::min(.., hi): maxps(lo, .), minps(hi, .) (NaN stays)
        w = _mm512_min_ps(vhi, _mm512_max_ps(vlo, _mm512_add_round_ps(w, u, kNearest)));
        return _mm512_cvttps_epi32(_mm512_add_ps(w, off));
      },
      [](int64_t) {});
}

// pack_bits of n codes, 64 codes a step (the rest by pack()). Widths that divide 8 by multiply-adds
// or a test mask; the others (3, 5, 6, 7) build each group of 8 codes as a 64-bit lane, sum c_j
// 2^(bits j), by a tree (bytes to words, words to dwords by multiply-adds, dwords to the lane by
// shifts), then a byte permute packs the `bits` low bytes of the 8 lanes.
TL_AVX512 void pack_avx512(const uint8_t* codes, int64_t n, int bits, uint8_t* out) {
  alignas(64) uint8_t squeeze[64];  // the permute: byte g * bits + k <- byte 8 g + k
  for (int m = 0; m < 64; ++m) squeeze[m] = static_cast<uint8_t>(m < 8 * bits ? 8 * (m / bits) + m % bits : 0);
  const __m512i idx = _mm512_load_si512(squeeze);
  const __m128i shift_b = _mm_cvtsi32_si128(bits), shift_4b = _mm_cvtsi32_si128(4 * bits);
  const __m512i pair = _mm512_set1_epi16(static_cast<int16_t>(1 | (1 << bits) << 8)),
                quad = _mm512_set1_epi32(1 | (1 << (2 * bits)) << 16), low32 = _mm512_set1_epi64(0xffffffffll);
  const __mmask64 group_bytes = lanes64(8 * bits);
  int64_t j = 0;
  for (; j + 64 <= n; j += 64) {
    const __m512i c = _mm512_loadu_si512(codes + j);
    uint8_t* o = out + j / 8 * bits;
    if (bits == 4) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o),
                          _mm512_cvtepi16_epi8(_mm512_maddubs_epi16(c, _mm512_set1_epi16(0x1001))));
    } else if (bits == 2) {
      const __m512i w =
          _mm512_madd_epi16(_mm512_maddubs_epi16(c, _mm512_set1_epi16(0x0401)), _mm512_set1_epi32(0x00100001));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o), _mm512_cvtepi32_epi8(w));
    } else if (bits == 1) {
      const uint64_t m = _mm512_test_epi8_mask(c, c);
      std::memcpy(o, &m, 8);
    } else {
      const __m512i w = bits < 7 ? _mm512_maddubs_epi16(c, pair)  // c0 + 2^bits c1 (2^7 is no signed byte)
                                 : _mm512_or_si512(_mm512_and_si512(c, _mm512_set1_epi16(0x00ff)),
                                                   _mm512_sll_epi16(_mm512_srli_epi16(c, 8), shift_b));
      const __m512i d = _mm512_madd_epi16(w, quad);  // w0 + 2^(2 bits) w1
      const __m512i lane =
          _mm512_or_si512(_mm512_and_si512(d, low32), _mm512_sll_epi64(_mm512_srli_epi64(d, 32), shift_4b));
      _mm512_mask_storeu_epi8(o, group_bytes, _mm512_permutexvar_epi8(idx, lane));
    }
  }
  if (j < n) pack(codes + j, n - j, bits, out + j / 8 * bits);
}

// unpack_bits, 64 codes a step (the rest by unpack()). 4 bits by shifts, 1 bit by a mask; the others
// spread each group's `bits` bytes into a 64-bit lane (a byte permute) and take code k from bits
// [bits k, bits k + bits) by a multishift.
TL_AVX512 void unpack_avx512(const uint8_t* in, int64_t n, int bits, uint8_t* codes) {
  // 2 bits: byte k of each 64-bit lane takes bits [2k, 2k + 2) of the lane's low dword for
  // k < 4, of its high dword (bit 32 on) for k >= 4
  const __m512i shifts = _mm512_set1_epi64(0x2624222006040200ll);
  alignas(64) uint8_t spread[64];  // byte 8 g + k <- byte g * bits + k
  uint64_t offsets = 0;            // byte k: bits * k
  for (int m = 0; m < 64; ++m) spread[m] = static_cast<uint8_t>(std::min(63, (m / 8) * bits + m % 8));
  for (int k = 0; k < 8; ++k) offsets |= static_cast<uint64_t>(bits * k) << (8 * k);
  const __m512i idx = _mm512_load_si512(spread), field = _mm512_set1_epi64(static_cast<int64_t>(offsets)),
                mask = _mm512_set1_epi8(static_cast<char>((1 << bits) - 1));
  const __mmask64 group_bytes = lanes64(8 * bits);
  int64_t j = 0;
  for (; j + 64 <= n; j += 64) {
    const uint8_t* i = in + j / 8 * bits;
    __m512i c;
    if (bits == 4) {
      const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(i)));
      c = _mm512_or_si512(_mm512_and_si512(w, _mm512_set1_epi16(0x000f)),
                          _mm512_and_si512(_mm512_slli_epi16(w, 4), _mm512_set1_epi16(0x0f00)));
    } else if (bits == 2) {
      const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(i)));
      c = _mm512_and_si512(_mm512_multishift_epi64_epi8(shifts, d), _mm512_set1_epi8(3));
    } else if (bits == 1) {
      uint64_t m;
      std::memcpy(&m, i, 8);
      c = _mm512_maskz_mov_epi8(m, _mm512_set1_epi8(1));
    } else {
      const __m512i lane = _mm512_permutexvar_epi8(idx, _mm512_maskz_loadu_epi8(group_bytes, i));
      c = _mm512_and_si512(_mm512_multishift_epi64_epi8(field, lane), mask);
    }
    _mm512_storeu_si512(codes + j, c);
  }
  if (j < n) unpack(in + j / 8 * bits, n - j, bits, codes + j);
}

// Values of codes[0, len): max-abs (c - p) * step, min-max c * step + lo (Row: per element). With
// up to 4 bits and one scale, the 16 possible values by the same operations, then a permute.
template <bool Row, bool MinMax>
TL_AVX512 TL_INLINE void dequantise_span_avx512(const uint8_t* codes, int64_t len, const float* step, const float* lo,
                                                float p, bool small, bool stream, float* out) {
  const __m512 vp = _mm512_set1_ps(p), s0 = _mm512_set1_ps(step[0]), l0 = _mm512_set1_ps(lo[0]);
  auto value = [&](__m512 c, __m512 s, __m512 l) TL_AVX512_INLINE_LAMBDA {
    // c * step + lo by the rounding forms: GCC contracts _mm512_add_ps(_mm512_mul_ps(..)) into an
    // FMA (one rounding, not the plain loop's two)
    constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    return MinMax ? _mm512_add_round_ps(_mm512_mul_round_ps(c, s, kNearest), l, kNearest)
                  : _mm512_mul_ps(_mm512_sub_ps(c, vp), s);
  };
  const __m512 table =
      value(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), s0, l0);  // codes < 16
  auto values = [&](int64_t j, __m512i c, __mmask16 live) TL_AVX512_INLINE_LAMBDA {
    if (!Row && small) return _mm512_permutexvar_ps(c, table);
    const __m512 s = Row ? _mm512_maskz_loadu_ps(live, step + j) : s0;
    const __m512 l = Row && MinMax ? _mm512_maskz_loadu_ps(live, lo + j) : l0;
    return value(_mm512_cvtepi32_ps(c), s, l);
  };
  int64_t j = 0;
  for (; j + 16 <= len; j += 16) {
    const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + j)));
    const __m512 v = values(j, c, __mmask16(0xffff));
    if (stream && (reinterpret_cast<uintptr_t>(out + j) & 63) == 0)
      _mm512_stream_ps(out + j, v);
    else
      _mm512_storeu_ps(out + j, v);
  }
  if (j < len) {
    const __mmask16 live = lanes16(len - j);
    const __m512i c = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(live, codes + j));
    _mm512_mask_storeu_ps(out + j, live, values(j, c, live));
  }
}

// quantise_tile by the loops above.
TL_AVX512 void quantise_tile_avx512(const float* x, int64_t t0, int64_t t1, const QuantGeometry& g,
                                    const QuantParams& q, const float* recip, uint8_t* out) {
  alignas(64) uint8_t buf[kTile];
  uint8_t* codes = q.bits == 8 ? out + t0 : buf;  // Note [8-bit codes in place]
  const float p = static_cast<float>(1 << (q.bits - 1));
  const float hi = q.minmax ? static_cast<float>((1 << q.bits) - 1) : p - 1;
  for_spans(g, t0, t1, [&](int64_t i, int64_t len, int64_t s, bool row) TL_AVX512_LAMBDA {
    uint8_t* c = codes + (i - t0);
    if (q.stochastic) {
      const float* b = q.minmax ? q.b + s : q.a + s;
      if (q.minmax)
        row ? stochastic_codes_avx512<true, true>(x + i, len, q.a + s, b, p, hi, q.seed, i, c)
            : stochastic_codes_avx512<false, true>(x + i, len, q.a + s, b, p, hi, q.seed, i, c);
      else
        row ? stochastic_codes_avx512<true, false>(x + i, len, q.a + s, b, p, hi, q.seed, i, c)
            : stochastic_codes_avx512<false, false>(x + i, len, q.a + s, b, p, hi, q.seed, i, c);
      return;
    }
    if (q.minmax) {
      row ? minmax_codes_avx512<true>(x + i, len, q.a + s, q.b + s, hi, c)
          : minmax_codes_avx512<false>(x + i, len, q.a + s, q.b + s, hi, c);
      return;
    }
    uint64_t near[kTile / 64];  // a span lies inside a tile
    row ? recip_codes_avx512<true>(x + i, len, recip + s, p, 2 * p - 1, c, near)
        : recip_codes_avx512<false>(x + i, len, recip + s, p, 2 * p - 1, c, near);
    for (int64_t st = 0; st < (len + 63) / 64; ++st)
      for (uint64_t bits = near[st]; bits != 0; bits &= bits - 1) {
        const int64_t e = 64 * st + __builtin_ctzll(bits);
        if (e < len) recode_by_division(x + i + e, 1, q.a + s + (row ? e : 0), row, p, hi, c + e);
      }
  });
  if (q.bits == 8) return;
  uint8_t* o = out + t0 / 8 * q.bits;
  pack_avx512(codes, t1 - t0, q.bits, o);
}

TL_AVX512 void dequantise_tile_avx512(const uint8_t* in, int64_t t0, int64_t t1, const QuantGeometry& g,
                                      const DequantParams& q, bool stream, float* out) {
  alignas(64) uint8_t buf[kTile];
  const uint8_t* codes = q.bits == 8 ? in + t0 : buf;  // Note [8-bit codes in place]
  const uint8_t* packed = in + t0 / 8 * q.bits;
  if (q.bits != 8) unpack_avx512(packed, t1 - t0, q.bits, buf);
  const float p = static_cast<float>(1 << (q.bits - 1));
  const bool small = q.bits <= 4;
  for_spans(g, t0, t1, [&](int64_t i, int64_t len, int64_t s, bool row) TL_AVX512_LAMBDA {
    const uint8_t* c = codes + (i - t0);
    const float* lo = q.minmax ? q.lo + s : q.step + s;
    if (q.minmax)
      row ? dequantise_span_avx512<true, true>(c, len, q.step + s, lo, p, small, stream, out + i)
          : dequantise_span_avx512<false, true>(c, len, q.step + s, lo, p, small, stream, out + i);
    else
      row ? dequantise_span_avx512<true, false>(c, len, q.step + s, lo, p, small, stream, out + i)
          : dequantise_span_avx512<false, false>(c, len, q.step + s, lo, p, small, stream, out + i);
  });
}

// minmax_span_chains with 16 lanes; a NaN noted in a mask (Nan) or skipped.
template <bool Nan>
TL_AVX512 TL_INLINE void minmax_chains_avx512(const float* x, int64_t len, float& mn, float& mx) {
  constexpr int kChains = 4;
  __m512 a[kChains], b[kChains];
  for (int c = 0; c < kChains; ++c) {
    a[c] = _mm512_set1_ps(mn);
    b[c] = _mm512_set1_ps(mx);
  }
  __mmask16 nan = 0;
  int64_t j = 0;
  for (; j + 16 * kChains <= len; j += 16 * kChains)
    for (int c = 0; c < kChains; ++c) {
      const __m512 v = _mm512_loadu_ps(x + j + 16 * c);
      if (Nan) nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      a[c] = _mm512_min_ps(v, a[c]);  // a NaN v: a[c] (its second operand)
      b[c] = _mm512_max_ps(v, b[c]);
    }
  for (; j < len; j += 16) {
    const __mmask16 live = lanes16(len - j);
    const __m512 v = _mm512_maskz_loadu_ps(live, x + j);
    if (Nan) nan |= _mm512_mask_cmp_ps_mask(live, v, v, _CMP_UNORD_Q);
    a[0] = _mm512_mask_min_ps(a[0], live, v, a[0]);
    b[0] = _mm512_mask_max_ps(b[0], live, v, b[0]);
  }
  // the lanes hold no NaN (skipped above); their order only decides the sign of a zero result
  mn = _mm512_reduce_min_ps(_mm512_min_ps(_mm512_min_ps(a[0], a[1]), _mm512_min_ps(a[2], a[3])));
  mx = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(b[0], b[1]), _mm512_max_ps(b[2], b[3])));
  if (Nan && nan) mn = mx = std::numeric_limits<float>::quiet_NaN();
}

TL_AVX512 void minmax_span_avx512(const float* x, int64_t len, bool nan, float& mn, float& mx) {
  if (nan)
    minmax_chains_avx512<true>(x, len, mn, mx);
  else
    minmax_chains_avx512<false>(x, len, mn, mx);
}
// minmax_row with 16 lanes: `x < m ? x : m` is minps(x, m) (its second operand for NaN and equal
// zeros), likewise the maximum.
TL_AVX512 void minmax_row_avx512(const float* x, int64_t len, float* mn, float* mx) {
  int64_t j = 0;
  for (; j + 16 <= len; j += 16) {
    const __m512 v = _mm512_loadu_ps(x + j);
    _mm512_storeu_ps(mn + j, _mm512_min_ps(v, _mm512_loadu_ps(mn + j)));
    _mm512_storeu_ps(mx + j, _mm512_max_ps(v, _mm512_loadu_ps(mx + j)));
  }
  if (j < len) {
    const __mmask16 live = lanes16(len - j);
    const __m512 v = _mm512_maskz_loadu_ps(live, x + j);
    _mm512_mask_storeu_ps(mn + j, live, _mm512_min_ps(v, _mm512_maskz_loadu_ps(live, mn + j)));
    _mm512_mask_storeu_ps(mx + j, live, _mm512_max_ps(v, _mm512_maskz_loadu_ps(live, mx + j)));
  }
}

// Note [channel min/max by columns]. With one scale per element of a row (channel scales along the
// last dim: run = 1), minmax_row walked each thread's tiles updating a private copy of all G
// minima and maxima, then merged the copies under a lock (two G-sized vectors per thread per
// call). Here the columns go in blocks of kColumnBlock, each thread owning whole blocks, whose
// minima and maxima stay in L1 (16 KiB) while the rows pass over them four at a time (8 KiB read
// in sequence from each; one load and store of the minima and maxima per four rows). NaN is
// skipped as before; the order of the comparisons decides only the sign of a zero result, which
// no wire scale keeps (Note [zero scales] in quant_logic.h). One thread, (64, 65536) float32:
// 1.45 ms -> 1.1-1.3 ms, bound by reading x (a block of 128 columns in registers, and blocks of
// 8192 or 32768, were no faster); (64, 4096): 21 -> ~13 us with four rows a pass. Without AVX-512
// the same walk by plain loops (minmax_columns; GCC's 8-lane vectors): docs/COMPRESSION.md,
// "Block scales in one pass; channel min/max by columns on AVX2".
TL_AVX512 void minmax_columns_avx512(const float* x, int64_t rows, int64_t stride, int64_t width, float* mn,
                                     float* mx) {
  std::fill(mn, mn + width, std::numeric_limits<float>::infinity());
  std::fill(mx, mx + width, -std::numeric_limits<float>::infinity());
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    const float* x0 = x + r * stride;
    for (int64_t j = 0; j < width; j += 16) {
      const __mmask16 live = lanes16(width - j);
      __m512 v[4];
      for (int k = 0; k < 4; ++k) v[k] = _mm512_maskz_loadu_ps(live, x0 + k * stride + j);
      // minps(v, m): m for a NaN v, as minmax_row
      const __m512 lo = _mm512_min_ps(
          v[3], _mm512_min_ps(v[2], _mm512_min_ps(v[1], _mm512_min_ps(v[0], _mm512_maskz_loadu_ps(live, mn + j)))));
      const __m512 hi = _mm512_max_ps(
          v[3], _mm512_max_ps(v[2], _mm512_max_ps(v[1], _mm512_max_ps(v[0], _mm512_maskz_loadu_ps(live, mx + j)))));
      _mm512_mask_storeu_ps(mn + j, live, lo);
      _mm512_mask_storeu_ps(mx + j, live, hi);
    }
  }
  for (; r < rows; ++r) minmax_row_avx512(x + r * stride, width, mn, mx);
}

// Note [fp16 scales by AVX-512]. quant_logic.h's scales_group and derive_group for 16 groups at
// once with fp16 wire scales (the default), op for op: round_outward_bits as a conversion to
// nearest even (vcvtps2ph: IEEE's, as half_bits for every value but NaN, whose scale is refused
// anyway), the conversion back (exact), the comparison and the step of one in the int16 pattern;
// then w + 1e-6 and w / 2^(bits-1), or range = hi - lo, levels / range (0 unless range > 0) and
// range / levels. The scalar form converts with branches and a loop per subnormal: 15 ns a
// group, 60 us of a 1 MiB encode with channel scales (4096 groups), 3.8 ms at 64 MiB.
TL_AVX512 TL_INLINE __m256i round_outward_f16(__m512 v, bool up, __mmask16 live) {
  v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_EQ_OQ), v, _mm512_setzero_ps());
  const __m256i r = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 rf = _mm512_cvtph_ps(r);
  const __mmask16 wrong = live & _mm512_cmp_ps_mask(rf, v, up ? _CMP_LT_OQ : _CMP_GT_OQ);
  const __m512i bits = _mm512_cvtepi16_epi32(r);
  const __mmask16 neg = _mm512_cmplt_epi32_mask(bits, _mm512_setzero_si512());
  const __m512i one = _mm512_set1_epi32(1), minus = _mm512_set1_epi32(-1);
  const __m512i step = up ? _mm512_mask_blend_epi32(neg, one, minus) : _mm512_mask_blend_epi32(neg, minus, one);
  return _mm512_cvtepi32_epi16(_mm512_mask_add_epi32(bits, wrong, bits, step));
}

TL_AVX512 TL_INLINE __mmask16 finite16(__m512 w) {
  return _mm512_cmp_ps_mask(_mm512_abs_ps(w), _mm512_set1_ps(std::numeric_limits<float>::infinity()), _CMP_LT_OQ);
}

// Groups [s0, s1) from their wire scales (all of them when `round`, else derive only); false when a
// wire scale of these groups is not finite.
TL_AVX512 bool scales_f16_avx512(int64_t s0, int64_t s1, const float* mn, const float* mx, const gpu::ScaleParams& p,
                                 bool round, uint8_t* wire, float* a, float* b, float* step, float* lo) {
  const __m512 levels = _mm512_set1_ps(static_cast<float>((1 << p.bits) - 1)),
               half = _mm512_set1_ps(static_cast<float>(1 << (p.bits - 1))), eps = _mm512_set1_ps(1e-6f);
  bool ok = true;
  for (int64_t s = s0; s < s1; s += 16) {
    const __mmask16 live = lanes16(s1 - s);
    __m256i r, rh;
    if (round) {
      const __m512 lo_in = _mm512_maskz_loadu_ps(live, mn + s), hi_in = _mm512_maskz_loadu_ps(live, mx + s);
      if (p.minmax) {
        r = round_outward_f16(lo_in, false, live);
        rh = round_outward_f16(hi_in, true, live);
        _mm256_mask_storeu_epi16(reinterpret_cast<uint16_t*>(wire) + p.groups + s, live, rh);
      } else {
        // at::maximum(-mn, mx): std::max(-mn, mx) is maxps(mx, -mn); NaN in either propagates
        const __m512 neg = _mm512_sub_ps(_mm512_set1_ps(-0.0f), lo_in);
        __m512 v = _mm512_max_ps(hi_in, neg);
        v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(neg, hi_in, _CMP_UNORD_Q), v,
                                 _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()));
        r = round_outward_f16(v, true, live);
      }
      _mm256_mask_storeu_epi16(reinterpret_cast<uint16_t*>(wire) + s, live, r);
    } else {
      r = _mm256_maskz_loadu_epi16(live, reinterpret_cast<const uint16_t*>(wire) + s);
      if (p.minmax) rh = _mm256_maskz_loadu_epi16(live, reinterpret_cast<const uint16_t*>(wire) + p.groups + s);
    }
    const __m512 w = _mm512_cvtph_ps(r);
    ok = ok && (finite16(w) & live) == live;
    if (!p.minmax) {
      if (a) _mm512_mask_storeu_ps(a + s, live, _mm512_add_ps(w, eps));
      _mm512_mask_storeu_ps(step + s, live, _mm512_div_ps(w, half));
      continue;
    }
    const __m512 hi = _mm512_cvtph_ps(rh);
    ok = ok && (finite16(hi) & live) == live;
    const __m512 range = _mm512_sub_ps(hi, w);
    if (a) _mm512_mask_storeu_ps(a + s, live, w);
    if (b)
      _mm512_mask_storeu_ps(
          b + s, live, _mm512_maskz_div_ps(_mm512_cmp_ps_mask(range, _mm512_setzero_ps(), _CMP_GT_OQ), levels, range));
    _mm512_mask_storeu_ps(step + s, live, _mm512_div_ps(range, levels));
    _mm512_mask_storeu_ps(lo + s, live, w);
  }
  return ok;
}
#pragma GCC diagnostic pop
#undef TL_AVX512_INLINE_LAMBDA
#undef TL_AVX512_LAMBDA
#undef TL_AVX512
#undef TL_AVX512_ISA
#endif

// ---- AVX2 loops (Note [quant by AVX2]) ------------------------------------------------------------

// Note [quant by AVX2]. Where the CPU has AVX2 and FMA but not AVX-512 (this project's CI and
// most x86-64 machines: AMD before Zen 4, Intel's client cores), Note [quant by AVX-512]'s loops
// with 8 lanes, 32 elements a step: max-abs nearest codes by the fused reciprocal (t and f as
// there, a mask bit per element whose |f| exceeds 1/2 - 2^-13 or is NaN, those coded again by the
// division), min-max and stochastic codes and decoding by the plain loop's operations 8 lanes at a
// time, packing and unpacking of every width in registers. Four vectors of int32 codes become 32
// bytes by two unsigned packs and a dword permute (max-abs's t first masked to its low byte).
// Spans' last len % 32 codes (and % 8 values) take the plain loops. The payload and decoded bits
// are the plain loops' (cpu_paths_test, with these loops on and off: set_quant_avx2). Measured
// here (Zen 3): docs/COMPRESSION.md 3.11, "AVX2 loops".
//
// Note [runs in one call]. Scale groups that are runs of a multiple of 32 elements (block scales,
// hadquant's tiles of 64 or 128, channels along dim 0) are decoded, and coded where max-abs and
// nearest, a whole tile per call, the group's scale looked up where a 32-element step starts a
// run, instead of a call per run: at runs of 64 the calls and their set-up cost about as much as
// the codes (hadquant(2, tile=64) at 1 MiB: the span lambdas 13% of the run against the loops'
// 19%). Min-max and stochastic codes still go run by run.
//
// Only the reciprocal's loop is compiled with FMA (a function of its own, called once a span): GCC
// contracts a multiply and an add into one (Note [quant by AVX-512]), so the rest, whose min-max
// decoding is c * step + lo rounded twice, is compiled for AVX2 alone.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TL_QUANT_AVX2 1
#define TL_AVX2_FMA __attribute__((target("avx2,fma")))
#define TL_AVX2 __attribute__((target("avx2")))

std::atomic<bool> quant_avx2_allowed{true};

bool quant_avx2() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has && quant_avx2_allowed.load(std::memory_order_relaxed);
}

// 4 vectors of int32 codes in [0, 255] or negative (elements 0-7, 8-15, ...) to 32 bytes in element
// order, negatives to 0: the packs interleave 128-bit lanes, the permute puts the dwords in order.
TL_AVX2 TL_INLINE __m256i bytes_of_avx2(const __m256i* q) {
  const __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(q[0], q[1]), _mm256_packus_epi32(q[2], q[3]));
  return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Max-abs nearest codes of x[0, len) by the reciprocal (Row: r per element), 32 elements a step,
// len rounded down to 32 (the caller codes the rest). With Runs, element j of the tile at x
// (whose first element is t0) is in group ((t0 + j) / g.run) % g.groups, r being the groups'
// reciprocals, and g.run and t0 multiples of 32 (a step lies in one group). Each step with an
// element that lay within kHalfMargin of a half-integer or was NaN appends (step's first element
// << 32 | a bit per element) to near; returns the number appended (at most len / 32).
template <bool Row, bool Runs = false>
TL_AVX2_FMA int64_t recip_codes_avx2(const float* x, int64_t len, const float* r, float p, float hi, uint8_t* codes,
                                     uint64_t* near, const QuantGeometry* g = nullptr, int64_t t0 = 0) {
  const float magic = 12582912.0f;  // 1.5 * 2^23
  const __m256 shift = _mm256_set1_ps(p + magic), top = _mm256_set1_ps(hi + magic),
               margin = _mm256_set1_ps(0.5f - kHalfMargin), abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 r0 = _mm256_set1_ps(r[Runs ? (t0 / g->run) % g->groups : 0]);
  const __m256i low = _mm256_set1_epi32(0xff);
  int64_t count = 0;
  for (int64_t j = 0; j + 32 <= len; j += 32) {
    if (Runs && (t0 + j) % g->run == 0) r0 = _mm256_set1_ps(r[((t0 + j) / g->run) % g->groups]);
    __m256i q[4];
    uint32_t m = 0;
    for (int k = 0; k < 4; ++k) {
      const __m256 v = _mm256_loadu_ps(x + j + 8 * k);
      const __m256 rr = Row ? _mm256_loadu_ps(r + j + 8 * k) : r0;
      // t = 1.5 * 2^23 + round(x r + p), one rounding; f = x r + p - round(x r + p)
      const __m256 t = _mm256_fmadd_ps(v, rr, shift);
      const __m256 f = _mm256_fmadd_ps(v, rr, _mm256_sub_ps(shift, t));
      m |= static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(f, abs), margin, _CMP_NLE_UQ)))
           << (8 * k);
      // min: its second operand for NaN (recoded: its mask bit is set)
      q[k] = _mm256_and_si256(_mm256_castps_si256(_mm256_min_ps(top, t)), low);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + j), bytes_of_avx2(q));
    if (m != 0) near[count++] = static_cast<uint64_t>(j) << 32 | m;  // about 1 step in 128 (random data)
  }
  return count;
}

// Min-max nearest codes of x[0, len) (Row: lo, b per element): quantise_span's operations, 32
// elements a step. Returns the elements coded (len rounded down to 32).
template <bool Row>
TL_AVX2 TL_INLINE int64_t minmax_codes_avx2(const float* x, int64_t len, const float* lo, const float* b, float hi,
                                            uint8_t* codes) {
  const __m256 vhi = _mm256_set1_ps(hi), zero = _mm256_setzero_ps(), lo0 = _mm256_set1_ps(lo[0]),
               b0 = _mm256_set1_ps(b[0]);
  int64_t j = 0;
  for (; j + 32 <= len; j += 32) {
    __m256i q[4];
    for (int k = 0; k < 4; ++k) {
      const int64_t e = j + 8 * k;
      const __m256 l = Row ? _mm256_loadu_ps(lo + e) : lo0, s = Row ? _mm256_loadu_ps(b + e) : b0;
      // std::max(v, 0) then std::min(v, hi): maxps/minps keep a NaN (their second operand), whose
      // conversion 0x80000000 packs to 0, as the plain loop's truncating cast gives
      const __m256 u =
          _mm256_min_ps(vhi, _mm256_max_ps(zero, _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + e), l), s)));
      q[k] = _mm256_cvtps_epi32(u);  // the current rounding mode: nearest even
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + j), bytes_of_avx2(q));
  }
  return j;
}

// Stochastic codes of x[0, len) (element indices i0, i0 + 1, ...), 32 elements a step:
// quantise_span's operations op for op (the file's AVX2 code has no FMA to contract them into),
// u from uniform01's hash 8 lanes at a time. Returns the elements coded (len rounded down to 32).
template <bool Row, bool MinMax>
TL_AVX2 TL_INLINE int64_t stochastic_codes_avx2(const float* x, int64_t len, const float* a, const float* b, float p,
                                                float hi, uint64_t seed, int64_t i0, uint8_t* codes) {
  const __m256 vp = _mm256_set1_ps(p), vhi = _mm256_set1_ps(hi), vlo = _mm256_set1_ps(MinMax ? 0.0f : -p),
               off = _mm256_set1_ps(MinMax ? 0.0f : p), a0 = _mm256_set1_ps(a[0]), b0 = _mm256_set1_ps(b[0]),
               unit = _mm256_set1_ps(1.0f / 16777216.0f);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                base = _mm256_set1_epi32(
                    static_cast<int32_t>(static_cast<uint32_t>(seed) + static_cast<uint32_t>(seed >> 32)));
  int64_t j = 0;
  for (; j + 32 <= len; j += 32) {
    __m256i q[4];
    for (int k = 0; k < 4; ++k) {
      const int64_t e = j + 8 * k;
      const __m256 v = _mm256_loadu_ps(x + e), aa = Row ? _mm256_loadu_ps(a + e) : a0;
      __m256 w = MinMax ? _mm256_mul_ps(_mm256_sub_ps(v, aa), Row ? _mm256_loadu_ps(b + e) : b0)
                        : _mm256_mul_ps(_mm256_div_ps(v, aa), vp);
      // uniform01(seed, i0 + e + lane)
      __m256i z = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int32_t>(static_cast<uint32_t>(i0 + e))), lane);
      z = _mm256_add_epi32(_mm256_mullo_epi32(z, _mm256_set1_epi32(static_cast<int32_t>(0x9E3779B9u))), base);
      z = _mm256_xor_si256(z, _mm256_srli_epi32(z, 16));
      z = _mm256_mullo_epi32(z, _mm256_set1_epi32(0x7feb352d));
      z = _mm256_xor_si256(z, _mm256_srli_epi32(z, 15));
      z = _mm256_mullo_epi32(z, _mm256_set1_epi32(static_cast<int32_t>(0x846ca68bu)));
      z = _mm256_xor_si256(z, _mm256_srli_epi32(z, 16));
      const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(z, 8)), unit);
      // std::max(v + u, lo), std::min(.., hi): maxps(lo, .), minps(hi, .) (a NaN stays, packs to 0)
      w = _mm256_min_ps(vhi, _mm256_max_ps(vlo, _mm256_add_ps(w, u)));
      q[k] = _mm256_cvttps_epi32(_mm256_add_ps(w, off));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + j), bytes_of_avx2(q));
  }
  return j;
}

// pack_bits of n codes, the rest of a step's multiple by pack(). 4 bits, 64 codes a step: c0 + 16 c1
// by a multiply-add of adjacent bytes, words to bytes by an unsigned pack; 2 bits, 128 codes: c0 + 4
// c1 + 16 c2 + 64 c3 by multiply-adds of bytes then words, dwords to bytes by packs; 1 bit, 32
// codes: the byte mask of c << 7. 3, 5, 6 and 7 bits, 32 codes (4 groups of 8, a 64-bit lane
// each) a step: a group's 8 codes become one lane, sum c_j 2^(bits j), by multiply-adds of adjacent bytes and
// words and a shift of the high dword, as pack_avx512; a byte shuffle moves each 128-bit half's two
// groups (2 bits bytes) to its front, stored by two 16-byte stores, the second overlapping the
// first's tail. A step writes 16 - 2 bits bytes past its own: steps run while those stay inside
// [out, out + n bits / 8), so nothing outside is touched (another thread packs the next tile).
TL_AVX2 void pack_avx2(const uint8_t* codes, int64_t n, int bits, uint8_t* out) {
  auto load = [codes](int64_t j) __attribute__((always_inline, target("avx2"))) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + j));
  };
  int64_t j = 0;
  if (bits == 4) {
    const __m256i nibbles = _mm256_set1_epi16(0x1001);
    for (; j + 64 <= n; j += 64) {
      const __m256i b =
          _mm256_packus_epi16(_mm256_maddubs_epi16(load(j), nibbles), _mm256_maddubs_epi16(load(j + 32), nibbles));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j / 2), _mm256_permute4x64_epi64(b, 0xd8));
    }
  } else if (bits == 2) {
    const __m256i pairs = _mm256_set1_epi16(0x0401), quads = _mm256_set1_epi32(0x00100001);
    auto dwords = [&](int64_t k) __attribute__((always_inline, target("avx2"))) {
      return _mm256_madd_epi16(_mm256_maddubs_epi16(load(k), pairs), quads);
    };
    for (; j + 128 <= n; j += 128) {
      const __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(dwords(j), dwords(j + 32)),
                                            _mm256_packus_epi32(dwords(j + 64), dwords(j + 96)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j / 4),
                          _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
  } else if (bits == 1) {
    for (; j + 32 <= n; j += 32) {
      const uint32_t m = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_slli_epi16(load(j), 7)));
      std::memcpy(out + j / 8, &m, 4);
    }
  } else if (bits == 3 || bits == 5 || bits == 6 || bits == 7) {
    const __m256i pair = _mm256_set1_epi16(static_cast<int16_t>(1 | (1 << bits) << 8)),
                  quad = _mm256_set1_epi32(1 | (1 << (2 * bits)) << 16), low32 = _mm256_set1_epi64x(0xffffffffll),
                  low8 = _mm256_set1_epi16(0x00ff);
    const __m128i shift_b = _mm_cvtsi32_si128(bits), shift_4b = _mm_cvtsi32_si128(4 * bits);
    alignas(16) int8_t front[16];  // bytes [0, bits) and [8, 8 + bits) of the half, then zeros
    for (int k = 0; k < 16; ++k) front[k] = static_cast<int8_t>(k < bits ? k : k < 2 * bits ? 8 + k - bits : -1);
    const __m256i idx = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(front)));
    const int64_t bytes = n * bits / 8;
    for (; j + 32 <= n && j / 8 * bits + 2 * bits + 16 <= bytes; j += 32) {
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + j));
      const __m256i w =
          bits < 7 ? _mm256_maddubs_epi16(c, pair)  // c0 + 2^bits c1 (2^7 is no signed byte)
                   : _mm256_or_si256(_mm256_and_si256(c, low8), _mm256_sll_epi16(_mm256_srli_epi16(c, 8), shift_b));
      const __m256i d = _mm256_madd_epi16(w, quad);  // w0 + 2^(2 bits) w1
      const __m256i lane =
          _mm256_or_si256(_mm256_and_si256(d, low32), _mm256_sll_epi64(_mm256_srli_epi64(d, 32), shift_4b));
      const __m256i packed = _mm256_shuffle_epi8(lane, idx);
      uint8_t* o = out + j / 8 * bits;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o), _mm256_castsi256_si128(packed));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 2 * bits), _mm256_extracti128_si256(packed, 1));
    }
  }
  if (j < n) pack(codes + j, n - j, bits, out + j / 8 * bits);
}

// unpack_bits, the rest of a step's multiple by unpack(). 4 bits, 32 codes a step: bytes to words,
// the high nibble shifted into the high byte; 2 bits, 32 codes: bytes to dwords, then two splits
// as below; 1 bit, 32 codes: each byte of the 4 broadcast to 8, tested against its bit. 3, 5, 6 and
// 7 bits, 32 codes a step: each 128-bit half loads two groups (two 16-byte loads, the second at 2 bits bytes:
// steps run while both stay inside the n codes' bytes), a byte shuffle gives each group a 64-bit
// lane, and three splits in halves (a lane's two dwords of 4 codes, a dword's two words of 2, a
// word's two bytes: a mask and a shifted mask each) put each code in a byte of its own.
TL_AVX2 void unpack_avx2(const uint8_t* in, int64_t n, int bits, uint8_t* codes) {
  auto store = [codes](int64_t j, __m256i c) __attribute__((always_inline, target("avx2"))) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + j), c);
  };
  int64_t j = 0;
  if (bits == 4) {
    for (; j + 32 <= n; j += 32) {
      const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + j / 2)));
      store(j, _mm256_or_si256(_mm256_and_si256(w, _mm256_set1_epi16(0x000f)),
                               _mm256_and_si256(_mm256_slli_epi16(w, 4), _mm256_set1_epi16(0x0f00))));
    }
  } else if (bits == 2) {
    for (; j + 32 <= n; j += 32) {
      const __m256i d = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(in + j / 4)));
      const __m256i w = _mm256_or_si256(_mm256_and_si256(d, _mm256_set1_epi32(0x0000000f)),
                                        _mm256_and_si256(_mm256_slli_epi32(d, 12), _mm256_set1_epi32(0x000f0000)));
      store(j, _mm256_or_si256(_mm256_and_si256(w, _mm256_set1_epi16(0x0003)),
                               _mm256_and_si256(_mm256_slli_epi16(w, 6), _mm256_set1_epi16(0x0300))));
    }
  } else if (bits == 1) {
    const __m256i which = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                           3, 3, 3, 3, 3, 3),
                  bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull)), one = _mm256_set1_epi8(1);
    for (; j + 32 <= n; j += 32) {
      int32_t m;
      std::memcpy(&m, in + j / 8, 4);
      const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(m), which), bit);
      store(j, _mm256_and_si256(_mm256_cmpeq_epi8(b, bit), one));
    }
  } else if (bits == 3 || bits == 5 || bits == 6 || bits == 7) {
    alignas(16) int8_t spread[16];  // lane 0: bytes [0, 8); lane 1: bytes [bits, bits + 8)
    for (int k = 0; k < 16; ++k) spread[k] = static_cast<int8_t>(k < 8 ? k : bits + k - 8);
    const __m256i idx = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(spread)));
    const int64_t m4 = (int64_t(1) << (4 * bits)) - 1;
    const int32_t m2 = (1 << (2 * bits)) - 1;
    const int16_t m1 = static_cast<int16_t>((1 << bits) - 1);
    const __m256i lo4 = _mm256_set1_epi64x(m4), hi4 = _mm256_set1_epi64x(m4 << 32), lo2 = _mm256_set1_epi32(m2),
                  hi2 = _mm256_set1_epi32(m2 << 16), lo1 = _mm256_set1_epi16(m1),
                  hi1 = _mm256_set1_epi16(static_cast<int16_t>(m1 << 8));
    const __m128i up4 = _mm_cvtsi32_si128(32 - 4 * bits), up2 = _mm_cvtsi32_si128(16 - 2 * bits),
                  up1 = _mm_cvtsi32_si128(8 - bits);
    const int64_t bytes = n * bits / 8;
    for (; j + 32 <= n && j / 8 * bits + 2 * bits + 16 <= bytes; j += 32) {
      const uint8_t* i = in + j / 8 * bits;
      const __m256i src =
          _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(i))),
                                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(i + 2 * bits)), 1);
      const __m256i lane = _mm256_shuffle_epi8(src, idx);  // bits [0, 8 bits) of each lane: its group
      const __m256i d =
          _mm256_or_si256(_mm256_and_si256(lane, lo4), _mm256_and_si256(_mm256_sll_epi64(lane, up4), hi4));
      const __m256i w = _mm256_or_si256(_mm256_and_si256(d, lo2), _mm256_and_si256(_mm256_sll_epi32(d, up2), hi2));
      store(j, _mm256_or_si256(_mm256_and_si256(w, lo1), _mm256_and_si256(_mm256_sll_epi16(w, up1), hi1)));
    }
  }
  if (j < n) unpack(in + j / 8 * bits, n - j, bits, codes + j);
}

// quantise_tile_avx2's codes span by span (for_spans).
TL_AVX2 void quantise_spans_avx2(const float* x, int64_t t0, int64_t t1, const QuantGeometry& g, const QuantParams& q,
                                 const float* recip, float p, float hi, uint8_t* codes) {
  for_spans(g, t0, t1, [&](int64_t i, int64_t len, int64_t s, bool row) TL_AVX2 {
    uint8_t* c = codes + (i - t0);
    if (q.stochastic) {
      const float* a = q.a + s;
      const float* b = q.minmax ? q.b + s : a;
      int64_t done;
      if (q.minmax)
        done = row ? stochastic_codes_avx2<true, true>(x + i, len, a, b, p, hi, q.seed, i, c)
                   : stochastic_codes_avx2<false, true>(x + i, len, a, b, p, hi, q.seed, i, c);
      else
        done = row ? stochastic_codes_avx2<true, false>(x + i, len, a, b, p, hi, q.seed, i, c)
                   : stochastic_codes_avx2<false, false>(x + i, len, a, b, p, hi, q.seed, i, c);
      const int64_t o = row ? done : 0;
      auto rest = [&](auto row_tag, auto minmax_tag) __attribute__((always_inline)) {
        quantise_span<decltype(row_tag)::value, decltype(minmax_tag)::value, true>(
            x + i + done, len - done, a + o, b + o, p, hi, q.seed, i + done, c + done);
      };
      if (q.minmax)
        row ? rest(std::true_type{}, std::true_type{}) : rest(std::false_type{}, std::true_type{});
      else
        row ? rest(std::true_type{}, std::false_type{}) : rest(std::false_type{}, std::false_type{});
      return;
    }
    if (q.minmax) {
      const int64_t done = row ? minmax_codes_avx2<true>(x + i, len, q.a + s, q.b + s, hi, c)
                               : minmax_codes_avx2<false>(x + i, len, q.a + s, q.b + s, hi, c);
      const int64_t o = row ? done : 0;
      if (row)
        quantise_span<true, true, false>(x + i + done, len - done, q.a + s + o, q.b + s + o, p, hi, 0, 0, c + done);
      else
        quantise_span<false, true, false>(x + i + done, len - done, q.a + s, q.b + s, p, hi, 0, 0, c + done);
      return;
    }
    uint64_t near[kTile / 32];  // a span lies inside a tile
    const int64_t steps = row ? recip_codes_avx2<true>(x + i, len, recip + s, p, 2 * p - 1, c, near)
                              : recip_codes_avx2<false>(x + i, len, recip + s, p, 2 * p - 1, c, near);
    for (int64_t k = 0; k < steps; ++k)
      for (uint32_t bits = static_cast<uint32_t>(near[k]); bits != 0; bits &= bits - 1) {
        const int64_t e = static_cast<int64_t>(near[k] >> 32) + __builtin_ctz(bits);
        recode_by_division(x + i + e, 1, q.a + s + (row ? e : 0), row, p, hi, c + e);
      }
    const int64_t done = len / 32 * 32;
    recode_by_division(x + i + done, len - done, q.a + s + (row ? done : 0), row, p, hi, c + done);
  });
}

// quantise_tile by the loops above; spans' ends by the plain loops.
TL_AVX2 void quantise_tile_avx2(const float* x, int64_t t0, int64_t t1, const QuantGeometry& g, const QuantParams& q,
                                const float* recip, uint8_t* out) {
  alignas(32) uint8_t buf[kTile];
  uint8_t* codes = q.bits == 8 ? out + t0 : buf;  // Note [8-bit codes in place]
  const float p = static_cast<float>(1 << (q.bits - 1));
  const float hi = q.minmax ? static_cast<float>((1 << q.bits) - 1) : p - 1;
  if (!q.minmax && !q.stochastic && g.run > 1 && g.run % 32 == 0 && (t1 - t0) % 32 == 0) {
    // Note [runs in one call]: blocks of 32 elements and more (hadquant's tiles, block scales)
    uint64_t near[kTile / 32];
    const int64_t steps = recip_codes_avx2<false, true>(x + t0, t1 - t0, recip, p, 2 * p - 1, codes, near, &g, t0);
    for (int64_t k = 0; k < steps; ++k)
      for (uint32_t bits = static_cast<uint32_t>(near[k]); bits != 0; bits &= bits - 1) {
        const int64_t e = static_cast<int64_t>(near[k] >> 32) + __builtin_ctz(bits);
        recode_by_division(x + t0 + e, 1, q.a + ((t0 + e) / g.run) % g.groups, false, p, hi, codes + e);
      }
  } else {
    quantise_spans_avx2(x, t0, t1, g, q, recip, p, hi, codes);
  }
  if (q.bits != 8) pack_avx2(codes, t1 - t0, q.bits, out + t0 / 8 * q.bits);
}

// Values of codes[0, len): max-abs (c - p) * step, min-max c * step + lo (Row: per element), the
// plain loop's operations 8 lanes at a time (stream: non-temporal stores where aligned, Note
// [streamed outputs]). With Runs, element j is in group ((t0 + j) / g.run) % g.groups, step and lo
// being the groups', g.run and t0 multiples of 32 and len one too (Note [runs in one call]).
template <bool Row, bool MinMax, bool Runs = false>
TL_AVX2 TL_INLINE void dequantise_span_avx2(const uint8_t* codes, int64_t len, const float* step, const float* lo,
                                            float p, bool stream, float* out, const QuantGeometry* g = nullptr,
                                            int64_t t0 = 0) {
  const int64_t s = Runs ? (t0 / g->run) % g->groups : 0;
  const __m256 vp = _mm256_set1_ps(p);
  __m256 s0 = _mm256_set1_ps(step[s]), l0 = _mm256_set1_ps(lo[s]);
  auto put = [&](int64_t j, __m128i eight) __attribute__((always_inline, target("avx2"))) {
    const __m256 c = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(eight));
    const __m256 sj = Row ? _mm256_loadu_ps(step + j) : s0;
    const __m256 v = MinMax ? _mm256_add_ps(_mm256_mul_ps(c, sj), Row ? _mm256_loadu_ps(lo + j) : l0)
                            : _mm256_mul_ps(_mm256_sub_ps(c, vp), sj);
    if (stream && (reinterpret_cast<uintptr_t>(out + j) & 31) == 0)
      _mm256_stream_ps(out + j, v);
    else
      _mm256_storeu_ps(out + j, v);
  };
  // 32 codes a load: with a load of 8 a step, decoding ran 1.9x slower in some processes here
  // (21.6 against 40.7 us for 1 MiB, by where the buffers landed), 32 at once 24.0 against 28.8
  int64_t j = 0;
  for (; j + 32 <= len; j += 32) {
    if (Runs && (t0 + j) % g->run == 0) {
      const int64_t r = ((t0 + j) / g->run) % g->groups;
      s0 = _mm256_set1_ps(step[r]);
      l0 = _mm256_set1_ps(lo[r]);
    }
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + j));
    const __m128i a = _mm256_castsi256_si128(w), b = _mm256_extracti128_si256(w, 1);
    put(j, a);
    put(j + 8, _mm_srli_si128(a, 8));
    put(j + 16, b);
    put(j + 24, _mm_srli_si128(b, 8));
  }
  if (Runs) return;  // len is a multiple of 32
  for (; j + 8 <= len; j += 8) put(j, _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + j)));
  const int64_t o = Row ? j : 0;
  dequantise_span<Row, MinMax>(codes + j, len - j, step + o, lo + o, p, out + j);
}

TL_AVX2 void dequantise_tile_avx2(const uint8_t* in, int64_t t0, int64_t t1, const QuantGeometry& g,
                                  const DequantParams& q, bool stream, float* out) {
  alignas(32) uint8_t buf[kTile];
  const uint8_t* codes = q.bits == 8 ? in + t0 : buf;  // Note [8-bit codes in place]
  if (q.bits != 8) unpack_avx2(in + t0 / 8 * q.bits, t1 - t0, q.bits, buf);
  const float p = static_cast<float>(1 << (q.bits - 1));
  if (g.run > 1 && g.run % 32 == 0 && (t1 - t0) % 32 == 0) {  // Note [runs in one call]
    if (q.minmax)
      dequantise_span_avx2<false, true, true>(codes, t1 - t0, q.step, q.lo, p, stream, out + t0, &g, t0);
    else
      dequantise_span_avx2<false, false, true>(codes, t1 - t0, q.step, q.step, p, stream, out + t0, &g, t0);
    return;
  }
  for_spans(g, t0, t1, [&](int64_t i, int64_t len, int64_t s, bool row) TL_AVX2 {
    const uint8_t* c = codes + (i - t0);
    const float* lo = q.minmax ? q.lo + s : q.step + s;
    if (q.minmax)
      row ? dequantise_span_avx2<true, true>(c, len, q.step + s, lo, p, stream, out + i)
          : dequantise_span_avx2<false, true>(c, len, q.step + s, lo, p, stream, out + i);
    else
      row ? dequantise_span_avx2<true, false>(c, len, q.step + s, lo, p, stream, out + i)
          : dequantise_span_avx2<false, false>(c, len, q.step + s, lo, p, stream, out + i);
  });
}
#undef TL_AVX2
#undef TL_AVX2_FMA
#endif

// Note [fp16 scales by F16C]. The same as Note [fp16 scales by AVX-512] for 8 groups at once with
// AVX2 and F16C (vcvtps2ph/vcvtph2ps, on every x86-64 CPU since 2013), for the machines without
// AVX-512 (this project's CI): the same operations, so the same bytes and floats as
// quant_logic.h's scalar scales_group and derive_group, which take the last s1 - s0 mod 8 groups.
// The scalar form was about a quarter of quant(4, scale=channel)'s encode at 16 MiB here.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TL_SCALES_F16C 1
#define TL_F16C __attribute__((target("avx2,f16c")))

TL_F16C TL_INLINE __m128i round_outward_f16c(__m256 v, bool up) {
  const __m256 zero = _mm256_setzero_ps();
  v = _mm256_blendv_ps(v, zero, _mm256_cmp_ps(v, zero, _CMP_EQ_OQ));  // -0 -> +0
  const __m128i r = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256i wrong = _mm256_castps_si256(_mm256_cmp_ps(_mm256_cvtph_ps(r), v, up ? _CMP_LT_OQ : _CMP_GT_OQ));
  const __m256i bits = _mm256_cvtepi16_epi32(r);
  const __m256i neg = _mm256_cmpgt_epi32(_mm256_setzero_si256(), bits);
  const __m256i one = _mm256_set1_epi32(1), minus = _mm256_set1_epi32(-1);
  const __m256i step = up ? _mm256_blendv_epi8(one, minus, neg) : _mm256_blendv_epi8(minus, one, neg);
  const __m256i out = _mm256_add_epi32(bits, _mm256_and_si256(wrong, step));
  return _mm_packs_epi32(_mm256_castsi256_si128(out), _mm256_extracti128_si256(out, 1));  // int16 range: exact
}

TL_F16C TL_INLINE bool finite8(__m256 w) {
  const __m256 abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), w);
  return _mm256_movemask_ps(_mm256_cmp_ps(abs, _mm256_set1_ps(std::numeric_limits<float>::infinity()), _CMP_LT_OQ)) ==
         0xff;
}

// Groups [s0, s1), s1 - s0 a multiple of 8, as scales_f16_avx512.
TL_F16C bool scales_f16_f16c(int64_t s0, int64_t s1, const float* mn, const float* mx, const gpu::ScaleParams& p,
                             bool round, uint8_t* wire, float* a, float* b, float* step, float* lo) {
  const __m256 levels = _mm256_set1_ps(static_cast<float>((1 << p.bits) - 1)),
               half = _mm256_set1_ps(static_cast<float>(1 << (p.bits - 1))), eps = _mm256_set1_ps(1e-6f),
               zero = _mm256_setzero_ps();
  auto* w16 = reinterpret_cast<uint16_t*>(wire);
  bool ok = true;
  for (int64_t s = s0; s < s1; s += 8) {
    __m128i r, rh = _mm_setzero_si128();
    if (round) {
      const __m256 lo_in = _mm256_loadu_ps(mn + s), hi_in = _mm256_loadu_ps(mx + s);
      if (p.minmax) {
        r = round_outward_f16c(lo_in, false);
        rh = round_outward_f16c(hi_in, true);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(w16 + p.groups + s), rh);
      } else {
        // at::maximum(-mn, mx): std::max(-mn, mx) is maxps(mx, -mn); NaN in either propagates
        const __m256 neg = _mm256_sub_ps(_mm256_set1_ps(-0.0f), lo_in);
        const __m256 v = _mm256_blendv_ps(_mm256_max_ps(hi_in, neg),
                                          _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN()),
                                          _mm256_cmp_ps(neg, hi_in, _CMP_UNORD_Q));
        r = round_outward_f16c(v, true);
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(w16 + s), r);
    } else {
      r = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w16 + s));
      if (p.minmax) rh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w16 + p.groups + s));
    }
    const __m256 w = _mm256_cvtph_ps(r);
    ok = ok && finite8(w);
    if (!p.minmax) {
      if (a) _mm256_storeu_ps(a + s, _mm256_add_ps(w, eps));
      _mm256_storeu_ps(step + s, _mm256_div_ps(w, half));
      continue;
    }
    const __m256 hi = _mm256_cvtph_ps(rh);
    ok = ok && finite8(hi);
    const __m256 range = _mm256_sub_ps(hi, w);
    if (a) _mm256_storeu_ps(a + s, w);
    if (b)
      _mm256_storeu_ps(b + s, _mm256_and_ps(_mm256_cmp_ps(range, zero, _CMP_GT_OQ), _mm256_div_ps(levels, range)));
    _mm256_storeu_ps(step + s, _mm256_div_ps(range, levels));
    _mm256_storeu_ps(lo + s, w);
  }
  return ok;
}

bool use_f16c() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return has;
}
#endif

// The min and max of one group's span x[0, len), folded into mn and mx: by the AVX-512 loop where
// the machine has it and the span is 64 elements or more (Note [quant by AVX-512]).
TL_INLINE void minmax_group_span(const float* x, int64_t len, bool nan, float& mn, float& mx) {
#ifdef TL_QUANT_AVX512
  if (len >= 64 && quant_avx512()) return minmax_span_avx512(x, len, nan, mn, mx);
#endif
  minmax_span(x, len, nan, mn, mx);
}

// Codes of x[t0, t1) (at most kTile elements, t0 a multiple of 8), packed into their bytes of out.
TL_INLINE void quantise_tile_any(const float* x, int64_t t0, int64_t t1, const QuantGeometry& g, const QuantParams& q,
                                 const float* recip, uint8_t* out) {
#ifdef TL_QUANT_AVX512
  if (quant_avx512()) return quantise_tile_avx512(x, t0, t1, g, q, recip, out);
#endif
#ifdef TL_QUANT_AVX2
  if (quant_avx2()) return quantise_tile_avx2(x, t0, t1, g, q, recip, out);
#endif
  quantise_tile(x, t0, t1, g, q, recip, out);
}

}  // namespace

void group_minmax_cpu(const float* x, const QuantGeometry& g, float* mn, float* mx) {
  const float inf = std::numeric_limits<float>::infinity();
  std::fill(mn, mn + g.groups, inf);
  std::fill(mx, mx + g.groups, -inf);
  const int64_t tiles = (g.n + kTile - 1) / kTile;
#ifdef TL_QUANT_AVX512
  const bool avx512 = quant_avx512();
#endif
  if (g.run == 1 && g.n % g.groups == 0) {  // Note [channel min/max by columns]
    const int64_t rows = g.n / g.groups, blocks = (g.groups + kColumnBlock - 1) / kColumnBlock;
    parallel_for(0, blocks, rows * kColumnBlock * int64_t(sizeof(float)), [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t j = c * kColumnBlock, width = std::min(kColumnBlock, g.groups - j);
#ifdef TL_QUANT_AVX512
        if (avx512) {
          minmax_columns_avx512(x + j, rows, g.groups, width, mn + j, mx + j);
          continue;
        }
#endif
        minmax_columns(x + j, rows, g.groups, width, mn + j, mx + j);
      }
    });
    return;
  }
  // Note [minima merged in task order]. Each task's minima and maxima (the first task's in mn and
  // mx), merged in task order after the loop: where the order matters (-0 against +0, two NaNs)
  // the result is the same whichever thread finishes first, and one task is the loop as it was.
  const int64_t tasks = task_count(g.n * int64_t(sizeof(float)), tiles);
  std::vector<float> rest(2 * (tasks - 1) * g.groups);
  parallel_for(0, tasks, g.n * int64_t(sizeof(float)) / tasks, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* lmn = t == 0 ? mn : rest.data() + 2 * (t - 1) * g.groups;
      float* lmx = t == 0 ? mx : lmn + g.groups;
      std::fill(lmn, lmn + g.groups, inf);
      std::fill(lmx, lmx + g.groups, -inf);
      const int64_t b0 = t * tiles / tasks, b1 = (t + 1) * tiles / tasks;
      for_spans(g, b0 * kTile, std::min(g.n, b1 * kTile), [&](int64_t i, int64_t len, int64_t s, bool row) {
        if (row)  // a channel scale of a tensor that is not whole rows of channels
          minmax_row(x + i, len, lmn + s, lmx + s);
        else
          minmax_group_span(x + i, len, g.groups == 1, lmn[s], lmx[s]);
      });
    }
  });
  for (int64_t t = 1; t < tasks; ++t) {
    const float* lmn = rest.data() + 2 * (t - 1) * g.groups;
    const float* lmx = lmn + g.groups;
    for (int64_t s = 0; s < g.groups; ++s) {
      mn[s] = g.groups == 1 ? min_of<true>(lmn[s], mn[s]) : std::min(mn[s], lmn[s]);
      mx[s] = g.groups == 1 ? max_of<true>(lmx[s], mx[s]) : std::max(mx[s], lmx[s]);
    }
  }
}

void quantise_pack_cpu(const float* x, const QuantGeometry& g, const QuantParams& q, uint8_t* out) {
  const int64_t tiles = (g.n + kTile - 1) / kTile;
  // Max-abs, nearest: the reciprocal of each group's divisor (Note [quotient by a reciprocal]).
  std::vector<float> recip(!q.minmax && !q.stochastic ? g.groups : 0);
  const float p = static_cast<float>(1 << (q.bits - 1));
  for (size_t s = 0; s < recip.size(); ++s) recip[s] = p / q.a[s];
  // A tile reads kTile floats and writes kTile * bits / 8 bytes.
  parallel_for(0, tiles, kTile * int64_t(sizeof(float)) + kTile * q.bits / 8, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) quantise_tile_any(x, b * kTile, std::min(g.n, (b + 1) * kTile), g, q, recip.data(), out);
  });
}

namespace {

// Note [streamed outputs]. A decoded output of at least kStreamBytes is written by non-temporal
// stores: half this machine's 32 MiB L3 (a fixed size: sysconf reports 320 MiB on this VM), so it
// would not stay in the cache anyway, and ordinary stores first read every line they fill (a 64 MiB
// decode moved 64 MiB more). Measured with the AVX-512 loops (bench_compression, 2 threads, three
// runs alternating): quant(8/4/2) decode at 64 MiB 3.3-5.3 ms -> 2.2-2.6 ms, at 16 MiB 0.80-1.36
// ms -> 0.56-0.80 ms. (An earlier try with the plain loops found streaming slower at 64 MiB.)
constexpr int64_t kStreamBytes = int64_t(16) << 20;  // the AVX-512 and AVX2 loops

}  // namespace

void unpack_dequantise_cpu(const uint8_t* in, const QuantGeometry& g, const DequantParams& q, float* out) {
  const int64_t tiles = (g.n + kTile - 1) / kTile;
  [[maybe_unused]] const bool stream = g.n * int64_t(sizeof(float)) >= kStreamBytes;
#ifdef TL_QUANT_AVX512
  const bool avx512 = quant_avx512();
#endif
#ifdef TL_QUANT_AVX2
  const bool avx2 = quant_avx2();
#endif
  // A tile reads kTile * bits / 8 bytes and writes kTile floats.
  parallel_for(0, tiles, kTile * int64_t(sizeof(float)) + kTile * q.bits / 8, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t t0 = b * kTile, t1 = std::min(g.n, (b + 1) * kTile);
#ifdef TL_QUANT_AVX512
      if (avx512) {
        dequantise_tile_avx512(in, t0, t1, g, q, stream, out);
        continue;
      }
#endif
#ifdef TL_QUANT_AVX2
      if (avx2) {
        dequantise_tile_avx2(in, t0, t1, g, q, stream, out);
        continue;
      }
#endif
      dequantise_tile(in, t0, t1, g, q, out);
    }
#if defined(TL_QUANT_AVX512) || defined(TL_QUANT_AVX2)
    if (stream) _mm_sfence();
#endif
  });
}

// Note [scales on the CPU]. Per scale group the work is a few casts and divisions; a channel or
// block scale has up to n / 2 groups (262144 channels of a (64, 262144) tensor), where the ATen
// form (twenty ops on (G) tensors, each its own parallel region) cost more than quantising: on a
// loaded 2-core machine every region waits for both threads. One region does all of it here.
// A group reads its min and max and writes its wire scales and four derived floats.
constexpr int64_t kScaleBytes = 32;

namespace {

// The wire scales and per-group quantities of groups [s0, s1) (Note [scales on the CPU]); v: the
// groups' max(-mn, mx) (max-abs), written here. False when a wire scale is not finite.
bool scales_of_groups(int64_t s0, int64_t s1, const float* mn, const float* mx, const gpu::ScaleParams& p, float* v,
                      uint8_t* wire, float* a, float* b, float* step, float* lo) {
#ifdef TL_QUANT_AVX512
  if (p.wire == gpu::WireType::kF16 && quant_avx512())  // Note [fp16 scales by AVX-512]
    return scales_f16_avx512(s0, s1, mn, mx, p, /*round=*/true, wire, a, b, step, lo);
#endif
  bool ok = true;
  int64_t s = s0;
#ifdef TL_SCALES_F16C
  if (p.wire == gpu::WireType::kF16 && use_f16c()) {  // Note [fp16 scales by F16C]
    s = s0 + (s1 - s0) / 8 * 8;
    ok = scales_f16_f16c(s0, s, mn, mx, p, /*round=*/true, wire, a, b, step, lo);
  }
#endif
  const int size = gpu::wire_size(p.wire);
  for (; s < s1; ++s) {
    if (!p.minmax) {
      const float neg = -mn[s];  // at::maximum(-mn, mx): NaN propagates
      v[s] = std::isnan(neg) || std::isnan(mx[s]) ? std::numeric_limits<float>::quiet_NaN() : std::max(neg, mx[s]);
    }
    gpu::scales_group(s, p.minmax ? mn : v, mx, p, wire, a, b, step, lo);
    ok = ok && std::isfinite(gpu::load_wire(wire + s * size, p.wire));
    if (p.minmax) ok = ok && std::isfinite(gpu::load_wire(wire + (p.groups + s) * size, p.wire));
  }
  return ok;
}

}  // namespace

bool quant_scales_cpu(const float* mn, const float* mx, const gpu::ScaleParams& p, uint8_t* wire, float* a, float* b,
                      float* step, float* lo) {
  std::vector<float> v(p.minmax ? 0 : p.groups);
  std::atomic<bool> finite{true};
  parallel_for(0, p.groups, kScaleBytes, [&](int64_t s0, int64_t s1) {
    if (!scales_of_groups(s0, s1, mn, mx, p, v.data(), wire, a, b, step, lo)) finite = false;
  });
  return finite;
}

// Note [block scales in one pass]. With a scale per block (or per channel of dim 0, whose elements
// are one run), group_minmax_cpu, quant_scales_cpu and quantise_pack_cpu in turn read x twice:
// from memory twice once x outgrows the cache (a 64 MiB encode is bound by those reads). Here the
// work goes by tiles of whole blocks (about kTile elements; a multiple of 8, so that a tile's codes
// pack into bytes of their own): each tile's blocks get their min and max, then their scales, then
// their codes, while the tile is still in the cache. Every block is one call of the functions the
// three passes call, so the bytes are theirs (cpu_paths_test compares them with the ATen path's).
bool block_quantise_cpu(const float* x, const QuantGeometry& g, const gpu::ScaleParams& sp, const QuantParams& q,
                        uint8_t* wire, float* a, float* b, float* step, float* lo, uint8_t* out) {
  TORCH_INTERNAL_ASSERT(g.run >= 1 && g.groups * g.run >= g.n && sp.groups == g.groups && !q.a && !q.b,
                        "block_quantise_cpu: every run of the geometry must be a group of its own");
  const float inf = std::numeric_limits<float>::infinity();
  const int64_t per = 8 / std::gcd<int64_t>(g.run, 8);  // blocks whose elements are a multiple of 8
  const int64_t blocks = std::max<int64_t>(per, kTile / g.run / per * per);
  const int64_t tile = blocks * g.run, tiles = (g.n + tile - 1) / tile;
  const bool by_recip = !q.minmax && !q.stochastic;  // Note [quotient by a reciprocal]
  std::vector<float> mn(g.groups), mx(g.groups), v(sp.minmax ? 0 : g.groups), recip(by_recip ? g.groups : 0);
  QuantParams qq = q;
  qq.a = a;
  qq.b = q.minmax ? b : a;
  const float pw = static_cast<float>(1 << (q.bits - 1));
  std::atomic<bool> finite{true};
  parallel_for(0, tiles, tile * int64_t(sizeof(float)) + tile * q.bits / 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i0 = t * tile, i1 = std::min(g.n, i0 + tile);
      const int64_t s0 = i0 / g.run, s1 = (i1 + g.run - 1) / g.run;
      for (int64_t s = s0; s < s1; ++s) {
        const int64_t e0 = s * g.run, len = std::min(g.n, e0 + g.run) - e0;
        mn[s] = inf;
        mx[s] = -inf;
        minmax_group_span(x + e0, len, g.groups == 1, mn[s], mx[s]);
      }
      if (!scales_of_groups(s0, s1, mn.data(), mx.data(), sp, v.data(), wire, a, b, step, lo)) finite = false;
      for (int64_t s = s0; s < s1 && by_recip; ++s) recip[s] = pw / a[s];
      for (int64_t j = i0; j < i1; j += kTile)  // the tile loops' buffers hold kTile codes
        quantise_tile_any(x, j, std::min(i1, j + kTile), g, qq, recip.data(), out);
    }
  });
  return finite;
}

void quant_derive_cpu(const uint8_t* wire, const gpu::ScaleParams& p, float* step, float* lo) {
#ifdef TL_QUANT_AVX512
  if (p.wire == gpu::WireType::kF16 && quant_avx512()) {  // Note [fp16 scales by AVX-512]
    parallel_for(0, p.groups, kScaleBytes, [&](int64_t s0, int64_t s1) {
      scales_f16_avx512(s0, s1, nullptr, nullptr, p, /*round=*/false, const_cast<uint8_t*>(wire), nullptr, nullptr,
                        step, lo);
    });
    return;
  }
#endif
  parallel_for(0, p.groups, kScaleBytes, [&](int64_t s0, int64_t s1) {
    int64_t s = s0;
#ifdef TL_SCALES_F16C
    if (p.wire == gpu::WireType::kF16 && use_f16c()) {  // Note [fp16 scales by F16C]
      s = s0 + (s1 - s0) / 8 * 8;
      scales_f16_f16c(s0, s, nullptr, nullptr, p, /*round=*/false, const_cast<uint8_t*>(wire), nullptr, nullptr, step,
                      lo);
    }
#endif
    for (; s < s1; ++s) gpu::derive_group(s, wire, p, nullptr, nullptr, step, lo);
  });
}

}  // namespace tl::codec

namespace tl::codec {
namespace {

// Note [grid codes]. Sorted midpoints and a uniform grid of cells over [mid[0], mid[L-2]]. The
// cell of v, cell(v) = trunc(clamp((v - a) * inv, 0, cells - 1)) (NaN: cell 0), is a chain of
// rounded float operations, each monotone, so cell(m) < cell(v) implies m < v and cell(m) > cell(v)
// implies m > v. With start[c] = the number of midpoints whose own cell is below c, the code of v
// (the number of midpoints < v) is start[c] plus those of cell c that are < v: where cell c holds
// at most one midpoint, start[c] + (mid[start[c]] < v) exactly (a midpoint of a later cell is > v).
// Cells holding several are flagged (kCrowded) and walked.
constexpr int32_t kCrowded = int32_t(1) << 30;

struct MidGrid {
  const float* mid;
  int64_t count;  // L - 1
  float a, b, inv, last;
  std::vector<int32_t> start;  // per cell; | kCrowded where the cell holds several midpoints
  std::vector<float> padded;   // mid, +inf: padded[count] = +inf
};

// cell(v) as the AVX2 loop computes it (maxps/minps: a NaN becomes the second operand, 0).
TL_INLINE int32_t cell_of(const MidGrid& g, float v) {
  float t = (v - g.a) * g.inv;
  t = t > 0.0f ? t : 0.0f;
  t = t < g.last ? t : g.last;
  return static_cast<int32_t>(t);
}

MidGrid make_grid(const float* mid, int64_t count) {
  MidGrid g{mid, count, mid[0], mid[count - 1], 0.0f, 0.0f, {}, {}};
  g.padded.assign(mid, mid + count);
  g.padded.push_back(std::numeric_limits<float>::infinity());
  const int64_t cells = 8 * (count + 1);
  if (g.b > g.a) {
    g.inv = static_cast<float>(cells) / (g.b - g.a);
    g.last = static_cast<float>(cells - 1);
    std::vector<int32_t> held(cells, 0);
    for (int64_t k = 0; k < count; ++k) ++held[cell_of(g, mid[k])];
    g.start.resize(cells);
    int32_t below = 0;
    for (int64_t c = 0; c < cells; ++c) {
      g.start[c] = below | (held[c] > 1 ? kCrowded : 0);
      below += held[c];
    }
  }
  return g;
}

// The number of midpoints < v (as at::bucketize with right=false); NaN counts as below all.
TL_INLINE int32_t nearest_code(const MidGrid& g, float v) {
  if (!(v > g.a)) return 0;
  if (v > g.b) return static_cast<int32_t>(g.count);
  const int32_t s = g.start[cell_of(g, v)];
  if (C10_LIKELY(!(s & kCrowded))) return s + (g.padded[s] < v);
  int32_t code = s & ~kCrowded;
  while (code < g.count && g.mid[code] < v) ++code;
  return code;
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TL_GATHER_CODES 1
std::atomic<bool> quantile_avx2_allowed{true};  // set_quantile_avx2
// nearest_code for 8 elements at once with AVX2 gathers (the scalar form waits on dependent loads:
// 10 ns an element): the cell's start and one comparison, two gathers; lanes of crowded cells take
// nearest_code. Same codes as nearest_code (Note [grid codes]).
__attribute__((target("avx2"))) void grid_codes_avx2(const float* x, int64_t len, const MidGrid& g, uint8_t* codes) {
  const int64_t cells = static_cast<int64_t>(g.start.size());
  int64_t j = 0;
  if (cells > 0) {
    const __m256 a = _mm256_set1_ps(g.a), inv = _mm256_set1_ps(g.inv), last = _mm256_set1_ps(g.last),
                 zero = _mm256_setzero_ps();
    const int* start = g.start.data();
    const float* pm = g.padded.data();
    const __m256i crowded = _mm256_set1_epi32(kCrowded);
    for (; j + 8 <= len; j += 8) {
      const __m256 v = _mm256_loadu_ps(x + j);
      // maxps returns its second operand for a NaN: NaN -> cell 0
      const __m256 t = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_sub_ps(v, a), inv), zero), last);
      const __m256i s = _mm256_i32gather_epi32(start, _mm256_cvttps_epi32(t), 4);
      const __m256i flagged = _mm256_and_si256(s, crowded);
      const __m256i idx = _mm256_andnot_si256(crowded, s);
      const __m256 below = _mm256_cmp_ps(_mm256_i32gather_ps(pm, idx, 4), v, _CMP_LT_OQ);
      const __m256i code = _mm256_sub_epi32(idx, _mm256_castps_si256(below));  // + (mid[s] < v)
      // 8 int32 codes (0..255) to 8 bytes
      const __m128i lo = _mm256_castsi256_si128(code), hi = _mm256_extracti128_si256(code, 1);
      const __m128i bytes = _mm_packus_epi16(_mm_packus_epi32(lo, hi), _mm_setzero_si128());
      _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + j), bytes);
      if (C10_UNLIKELY(!_mm256_testz_si256(flagged, flagged))) {
        alignas(32) int32_t f[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(f), flagged);
        for (int k = 0; k < 8; ++k)
          if (f[k]) codes[j + k] = static_cast<uint8_t>(nearest_code(g, x[j + k]));
      }
    }
  }
  for (; j < len; ++j) codes[j] = static_cast<uint8_t>(nearest_code(g, x[j]));
}

// Note [small codebooks by a search in registers]. Up to 4 bits (2^bits - 1 <= 15 sorted
// midpoints), the code of v, #{k : mid[k] < v}, by a branch-free binary search 8 elements at a
// time: the step of 2^l compares v with mid[c + 2^l - 1], c the steps taken so far (a multiple
// of 2^(l+1)), looked up by a permute of the 2^(bits-1-l) <= 8 midpoints that step can ask for.
// The predicate mid[k] < v is monotone in k (sorted midpoints, ties included), so the steps count
// it exactly; a NaN compares false everywhere: code 0, as count_codes gives. The compiler left
// count_codes scalar here (~7.6 cycles an element at 4 bits: 29% of quantile(4)'s 1 MiB encode).
template <int Bits>
__attribute__((target("avx2"))) void search_codes_avx2(const float* x, int64_t len, const float* mid, uint8_t* codes) {
  __m256 table[Bits];  // table[l]: mid[(2i + 1) 2^l - 1] for i < 2^(Bits-1-l), the step of 2^l
  for (int l = 0; l < Bits; ++l) {
    alignas(32) float t[8] = {};
    for (int i = 0; i < (1 << (Bits - 1 - l)); ++i) t[i] = mid[(2 * i + 1) * (1 << l) - 1];
    table[l] = _mm256_load_ps(t);
  }
  auto code = [&](__m256 v) __attribute__((always_inline, target("avx2"))) {
    __m256i c = _mm256_setzero_si256();
    for (int l = Bits - 1; l >= 0; --l) {  // unrolled: Bits is a constant
      const __m256 m = _mm256_permutevar8x32_ps(table[l], _mm256_srli_epi32(c, l + 1));
      const __m256i below = _mm256_castps_si256(_mm256_cmp_ps(m, v, _CMP_LT_OQ));
      c = _mm256_add_epi32(c, _mm256_and_si256(below, _mm256_set1_epi32(1 << l)));
    }
    return c;
  };
  int64_t j = 0;
  for (; j + 32 <= len; j += 32) {
    const __m256i q[4] = {code(_mm256_loadu_ps(x + j)), code(_mm256_loadu_ps(x + j + 8)),
                          code(_mm256_loadu_ps(x + j + 16)), code(_mm256_loadu_ps(x + j + 24))};
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + j), bytes_of_avx2(q));  // Note [quant by AVX2]'s packing
  }
  for (; j < len; ++j) {
    int32_t c = 0;
    for (int k = 0; k < (1 << Bits) - 1; ++k) c += mid[k] < x[j];
    codes[j] = static_cast<uint8_t>(c);
  }
}
#endif

// Note [codes by a search in registers]. With AVX-512 the code of v, the number of sorted midpoints
// < v, is found by a branch-free binary search whose tables sit in registers, 16 elements at a
// time, no gather (on this machine's Zen 4 two gathers per 8 elements cost ~1.4 ns an element, the
// search ~0.7). The midpoints are padded to 256 with +inf, P[k] (never < v, NaN included), and
// seen as 16 groups of 16: B[g] = P[16g + 15] bounds group g, T_j[g] = P[16g + j].
// - The group h = #{g : B[g] < v}: step 8 compares with B[7], then B[h + 3], B[h + 1], B[h] by
//   permutes of B shifted (one register each); a sorted table makes this the count exactly.
// - Within the group, the same four steps over P[16h + j], j < 16 (P[16h + 15] = B[h] >= v is never
//   counted): step 8 compares with T_7[h] (one permute), step 4 with T_3 or T_11 at h (a two-table
//   permute, the table picked by the index's bit 4), step 2 with T_1, T_5, T_9 or T_13 (two such
//   permutes and a blend), step 1 with the eight even tables (four permutes, three blends).
// - code = 16 h + the steps taken. Midpoints of groups below h are <= B[g] < v and all counted;
//   those above are >= B[h] >= v. Up to 4 bits only the second level runs (h = 0).
// NaN compares false: code 0, as nearest_code. Used only where the midpoints are sorted and hold no
// NaN (a midpoint of -inf and +inf codewords is NaN); otherwise the grid.
struct SearchTables {
  bool two_level;                // more than 15 midpoints
  alignas(64) float top[4][16];  // the 16-entry table of the first search (B, or P[0, 16) up to 4
                                 // bits) shifted by 7 (only entry 0 used), 3, 1 and 0; +inf past its end
  alignas(64) float t[16][16];   // t[j][g] = P[16g + j]
};

// False where the midpoints are not sorted or hold a NaN.
[[maybe_unused]] bool make_search_tables(const float* mid, int64_t count, SearchTables& s) {
  for (int64_t k = 0; k < count; ++k)
    if (std::isnan(mid[k]) || (k > 0 && mid[k] < mid[k - 1])) return false;
  const float inf = std::numeric_limits<float>::infinity();
  auto padded = [&](int64_t k) { return k < count ? mid[k] : inf; };
  s.two_level = count > 15;
  auto first = [&](int g) { return g >= 16 ? inf : s.two_level ? padded(16 * g + 15) : padded(g); };
  const int shift[4] = {7, 3, 1, 0};
  for (int g = 0; g < 16; ++g) {
    for (int j = 0; j < 16; ++j) s.t[j][g] = padded(16 * g + j);
    for (int l = 0; l < 4; ++l) s.top[l][g] = first(g + shift[l]);
  }
  return true;
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TL_SEARCH_CODES 1
std::atomic<bool> search_allowed{true};  // set_quantile_avx512

bool use_avx512() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has && search_allowed.load(std::memory_order_relaxed);
}

// table[idx] per lane (the merge-masked form: the plain intrinsic's undefined source trips GCC 12's
// -Wmaybe-uninitialized).
__attribute__((target("avx512f"))) TL_INLINE __m512 lookup16(__m512i idx, __m512 table) {
  return _mm512_mask_permutexvar_ps(table, __mmask16(0xffff), idx, table);
}

// The number of entries < v of a sorted 16-entry table, given as the table shifted by 7 (only its
// first entry is used), 3, 1 and 0 (past the end: +inf).
__attribute__((target("avx512f"))) TL_INLINE __m512i count_below16(__m512 v, __m512 s7, __m512 s3, __m512 s1,
                                                                   __m512 s0) {
  __m512i c = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(s7, v, _CMP_LT_OQ), _mm512_set1_epi32(8));
  c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(lookup16(c, s3), v, _CMP_LT_OQ), c, _mm512_set1_epi32(4));
  c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(lookup16(c, s1), v, _CMP_LT_OQ), c, _mm512_set1_epi32(2));
  return _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(lookup16(c, s0), v, _CMP_LT_OQ), c, _mm512_set1_epi32(1));
}

template <bool TwoLevel>
__attribute__((target("avx512f"))) void search_codes_avx512(const float* x, int64_t len, const SearchTables& s,
                                                            uint8_t* codes) {
  const __m512 b7 = _mm512_set1_ps(s.top[0][0]), b3 = _mm512_load_ps(s.top[1]), b1 = _mm512_load_ps(s.top[2]),
               b0 = _mm512_load_ps(s.top[3]);
  __m512 t[16];
  for (int j = 0; j < 16; ++j) t[j] = _mm512_load_ps(s.t[j]);
  const __m512i c16 = _mm512_set1_epi32(16);
  for (int64_t i = 0; i < len; i += 16) {
    const __mmask16 live = len - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (len - i)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(live, x + i);
    __m512i code = count_below16(v, b7, b3, b1, b0);  // the group h, or up to 4 bits the code
    if (TwoLevel) {
      const __m512i h = code;
      const __mmask16 m8 = _mm512_cmp_ps_mask(lookup16(h, t[7]), v, _CMP_LT_OQ);
      const __mmask16 m4 =
          _mm512_cmp_ps_mask(_mm512_permutex2var_ps(t[3], _mm512_mask_add_epi32(h, m8, h, c16), t[11]), v, _CMP_LT_OQ);
      const __m512i i2 = _mm512_mask_add_epi32(h, m4, h, c16);
      const __m512 s2 =
          _mm512_mask_blend_ps(m8, _mm512_permutex2var_ps(t[1], i2, t[5]), _mm512_permutex2var_ps(t[9], i2, t[13]));
      const __mmask16 m2 = _mm512_cmp_ps_mask(s2, v, _CMP_LT_OQ);
      const __m512i i1 = _mm512_mask_add_epi32(h, m2, h, c16);
      const __m512 q0 =
          _mm512_mask_blend_ps(m4, _mm512_permutex2var_ps(t[0], i1, t[2]), _mm512_permutex2var_ps(t[4], i1, t[6]));
      const __m512 q1 =
          _mm512_mask_blend_ps(m4, _mm512_permutex2var_ps(t[8], i1, t[10]), _mm512_permutex2var_ps(t[12], i1, t[14]));
      const __mmask16 m1 = _mm512_cmp_ps_mask(_mm512_mask_blend_ps(m8, q0, q1), v, _CMP_LT_OQ);
      code = _mm512_mask_slli_epi32(h, __mmask16(0xffff), h, 4);  // 16 h (merge-masked: as lookup16)
      code = _mm512_mask_add_epi32(code, m8, code, _mm512_set1_epi32(8));
      code = _mm512_mask_add_epi32(code, m4, code, _mm512_set1_epi32(4));
      code = _mm512_mask_add_epi32(code, m2, code, _mm512_set1_epi32(2));
      code = _mm512_mask_add_epi32(code, m1, code, _mm512_set1_epi32(1));
    }
    _mm512_mask_cvtepi32_storeu_epi8(codes + i, live, code);
  }
}
#endif

// Up to 4 bits (15 midpoints) a code is a count of comparisons, with no branch: the compiler
// vectorises it over the elements. NaN compares false everywhere: code 0.
template <int Count>
TL_INLINE void count_codes(const float* x, int64_t len, const float* mid, uint8_t* codes) {
  float m[Count];
  for (int k = 0; k < Count; ++k) m[k] = mid[k];
  for (int64_t i = 0; i < len; ++i) {
    int32_t c = 0;
    for (int k = 0; k < Count; ++k) c += m[k] < x[i];
    codes[i] = static_cast<uint8_t>(c);
  }
}

// Codes of x[0, len): the number of the 2^bits - 1 sorted midpoints below each value (by the
// AVX-512 search in registers where `search` is given; else from 5 bits on by the grid, up to 4 by
// AVX2's search in registers or by counting).
TL_TARGET_CLONES
void codes_span(const float* x, int64_t len, const MidGrid& grid, const SearchTables* search, int bits,
                uint8_t* codes) {
#ifdef TL_SEARCH_CODES
  if (search)
    return search->two_level ? search_codes_avx512<true>(x, len, *search, codes)
                             : search_codes_avx512<false>(x, len, *search, codes);
#endif
  if (bits > 4) {
#ifdef TL_GATHER_CODES
    if (__builtin_cpu_supports("avx2")) return grid_codes_avx2(x, len, grid, codes);
#endif
    for (int64_t i = 0; i < len; ++i) codes[i] = static_cast<uint8_t>(nearest_code(grid, x[i]));
    return;
  }
#ifdef TL_GATHER_CODES
  if (__builtin_cpu_supports("avx2") && quantile_avx2_allowed.load(std::memory_order_relaxed)) {
    switch (bits) {  // Note [small codebooks by a search in registers]
      case 1:
        return search_codes_avx2<1>(x, len, grid.mid, codes);
      case 2:
        return search_codes_avx2<2>(x, len, grid.mid, codes);
      case 3:
        return search_codes_avx2<3>(x, len, grid.mid, codes);
      default:
        return search_codes_avx2<4>(x, len, grid.mid, codes);
    }
  }
#endif
  switch (bits) {
    case 1:
      return count_codes<1>(x, len, grid.mid, codes);
    case 2:
      return count_codes<3>(x, len, grid.mid, codes);
    case 3:
      return count_codes<7>(x, len, grid.mid, codes);
    default:
      return count_codes<15>(x, len, grid.mid, codes);
  }
}

}  // namespace

bool set_quant_avx512(bool on) {
#ifdef TL_QUANT_AVX512
  return quant_avx512_allowed.exchange(on);
#else
  return on;
#endif
}

bool set_quant_avx2(bool on) {
#ifdef TL_QUANT_AVX2
  return quant_avx2_allowed.exchange(on);
#else
  return on;
#endif
}

bool set_quantile_avx512(bool on) {
#ifdef TL_SEARCH_CODES
  return search_allowed.exchange(on);
#else
  return on;
#endif
}

bool set_quantile_avx2(bool on) {
#ifdef TL_GATHER_CODES
  return quantile_avx2_allowed.exchange(on);
#else
  return on;
#endif
}

namespace {

// Codes of tiles [b0, b1) of x (n elements); with sums, each code's sum and count over them added
// to sums and counts. A function of its own (not a lambda's capture of the caller's variables):
// the count increments could alias a captured int64_t, which the compiler then reloaded at every
// element (quantile(8)'s encode ~10% slower).
void codes_of_tiles(const float* x, int64_t n, int64_t b0, int64_t b1, const MidGrid& grid,
                    const SearchTables* search, int bits, int64_t levels, uint8_t* codes, double* sums,
                    int64_t* counts) {
  // Four banks of sums and counts, element i in bank i % 4: consecutive elements of one code
  // do not wait on each other's update.
  constexpr int kBanks = 4;
  std::vector<double> ls(sums ? kBanks * levels : 0, 0.0);
  std::vector<int64_t> lc(sums ? kBanks * levels : 0, 0);
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t i0 = b * kTile, len = std::min(n, i0 + kTile) - i0;
    codes_span(x + i0, len, grid, search, bits, codes + i0);
    if (!sums) continue;
    const uint8_t* c = codes + i0;
    const float* v = x + i0;
    int64_t i = 0;
    for (; i + kBanks <= len; i += kBanks)
      for (int k = 0; k < kBanks; ++k) {
        ls[k * levels + c[i + k]] += v[i + k];
        ++lc[k * levels + c[i + k]];
      }
    for (; i < len; ++i) {
      ls[c[i]] += v[i];
      ++lc[c[i]];
    }
  }
  if (!sums) return;
  for (int64_t l = 0; l < levels; ++l)
    for (int k = 0; k < kBanks; ++k) {
      sums[l] += ls[k * levels + l];
      counts[l] += lc[k * levels + l];
    }
}

}  // namespace

void nearest_codes_cpu(const float* x, int64_t n, const float* mid, int bits, uint8_t* codes, double* sums,
                       int64_t* counts) {
  const int64_t levels = int64_t(1) << bits;
  if (sums) {
    std::fill(sums, sums + levels, 0.0);
    std::fill(counts, counts + levels, 0);
  }
  const MidGrid grid = make_grid(mid, levels - 1);
  [[maybe_unused]] SearchTables tables;
#ifdef TL_SEARCH_CODES
  const SearchTables* search = use_avx512() && make_search_tables(mid, levels - 1, tables) ? &tables : nullptr;
#else
  const SearchTables* search = nullptr;
#endif
  const int64_t tiles = (n + kTile - 1) / kTile;
  // A tile reads kTile floats and writes kTile codes.
  if (!sums) {
    parallel_for(0, tiles, kTile * int64_t(sizeof(float) + 1), [&](int64_t b0, int64_t b1) {
      codes_of_tiles(x, n, b0, b1, grid, search, bits, levels, codes, nullptr, nullptr);
    });
    return;
  }
  // Note [sums in fixed chunks]. Each code's sum must not depend on the threads (the codebook's
  // centres would then differ by the last bit of a double: Note [codec threads]). So the sums are
  // made per chunk of kSumChunkTiles tiles, whatever the threads, each chunk's on one thread, and
  // added in chunk order. A message of up to one chunk (2 MiB of floats) is one chunk, summed as
  // before chunks existed; larger ones take their codes and sums on every thread (quantile(8)
  // was serial there: the sums were most of its encode).
  constexpr int64_t kSumChunkTiles = 64;
  const int64_t chunks = (tiles + kSumChunkTiles - 1) / kSumChunkTiles;
  if (chunks <= 1) return codes_of_tiles(x, n, 0, tiles, grid, search, bits, levels, codes, sums, counts);
  std::vector<double> chunk_sums(chunks * levels, 0.0);
  std::vector<int64_t> chunk_counts(chunks * levels, 0);
  parallel_for(0, chunks, kSumChunkTiles * kTile * int64_t(sizeof(float) + 1), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      codes_of_tiles(x, n, c * kSumChunkTiles, std::min(tiles, (c + 1) * kSumChunkTiles), grid, search, bits, levels,
                     codes, chunk_sums.data() + c * levels, chunk_counts.data() + c * levels);
  });
  for (int64_t c = 0; c < chunks; ++c)
    for (int64_t l = 0; l < levels; ++l) {
      sums[l] += chunk_sums[c * levels + l];
      counts[l] += chunk_counts[c * levels + l];
    }
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
// 8 lookups per gather (the scalar loop is one load a code, bound by the loads' issue).
__attribute__((target("avx2"))) void lookup_avx2(const uint8_t* codes, int64_t n, const float* book, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i)));
    _mm256_storeu_ps(out + i, _mm256_i32gather_ps(book, idx, 4));
  }
  for (; i < n; ++i) out[i] = book[codes[i]];
}

// Note [small books in registers]. A book of up to 16 entries (codes of up to 4 bits) fits two
// AVX2 registers: each code's entry is a permute of each half by the code's low 3 bits, blended by
// its bit 3; no gather (on this machine's Zen 3 a gather of 8 is ~8 cycles, the two permutes and
// the blend ~1.5). 4-bit codes are unpacked on the way (two codes a byte, the low nibble first:
// pack_group's layout), so the decode reads the packed bytes once and writes no code bytes.
__attribute__((target("avx2"))) TL_INLINE __m256 lookup8_avx2(__m256i idx, __m256 lo, __m256 hi) {
  return _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, idx), _mm256_permutevar8x32_ps(hi, idx),
                          _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));  // bit 3 -> the sign bit
}

__attribute__((target("avx2"))) void lookup16_avx2(const uint8_t* codes, int64_t n, const float* book16, float* out) {
  const __m256 lo = _mm256_loadu_ps(book16), hi = _mm256_loadu_ps(book16 + 8);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i)));
    _mm256_storeu_ps(out + i, lookup8_avx2(idx, lo, hi));
  }
  for (; i < n; ++i) out[i] = book16[codes[i]];
}

// Codes [i0, i1) of packed 4-bit codes (i0 even) looked up in a 16-entry book.
__attribute__((target("avx2"))) void lookup_packed4_avx2(const uint8_t* packed, int64_t i0, int64_t i1,
                                                         const float* book16, float* out) {
  const __m256 lo = _mm256_loadu_ps(book16), hi = _mm256_loadu_ps(book16 + 8);
  const __m128i nibble = _mm_set1_epi8(0x0f);
  int64_t i = i0;
  for (; i + 16 <= i1; i += 16) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(packed + i / 2));  // 16 codes
    const __m128i c = _mm_unpacklo_epi8(_mm_and_si128(b, nibble), _mm_and_si128(_mm_srli_epi16(b, 4), nibble));
    _mm256_storeu_ps(out + i, lookup8_avx2(_mm256_cvtepu8_epi32(c), lo, hi));
    _mm256_storeu_ps(out + i + 8, lookup8_avx2(_mm256_cvtepu8_epi32(_mm_srli_si128(c, 8)), lo, hi));
  }
  for (; i < i1; ++i) out[i] = book16[(packed[i / 2] >> (4 * (i % 2))) & 15];
}
#endif

#ifdef TL_SEARCH_CODES
// 16 lookups from the 256-entry book in registers (Note [codes by a search in registers]'s tables:
// t[j] holds book[16j, 16j + 16)): a two-table permute per 32 entries picked by the code's bits 0-4,
// then blends on bits 5, 6 and 7; no gather.
__attribute__((target("avx512f"))) void lookup_avx512(const uint8_t* codes, int64_t n, const float* book256,
                                                      float* out) {
  __m512 t[16];
  for (int j = 0; j < 16; ++j) t[j] = _mm512_loadu_ps(book256 + 16 * j);
  const __m512i b5 = _mm512_set1_epi32(32), b6 = _mm512_set1_epi32(64), b7 = _mm512_set1_epi32(128);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i idx =  // zero-masked form: see lookup16
        _mm512_maskz_cvtepu8_epi32(__mmask16(0xffff), _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i)));
    const __mmask16 m5 = _mm512_test_epi32_mask(idx, b5), m6 = _mm512_test_epi32_mask(idx, b6),
                    m7 = _mm512_test_epi32_mask(idx, b7);
    __m512 p[8];
    for (int j = 0; j < 8; ++j) p[j] = _mm512_permutex2var_ps(t[2 * j], idx, t[2 * j + 1]);
    const __m512 q0 = _mm512_mask_blend_ps(m5, p[0], p[1]), q1 = _mm512_mask_blend_ps(m5, p[2], p[3]),
                 q2 = _mm512_mask_blend_ps(m5, p[4], p[5]), q3 = _mm512_mask_blend_ps(m5, p[6], p[7]);
    const __m512 r = _mm512_mask_blend_ps(m7, _mm512_mask_blend_ps(m6, q0, q1), _mm512_mask_blend_ps(m6, q2, q3));
    _mm512_storeu_ps(out + i, r);
  }
  for (; i < n; ++i) out[i] = book256[codes[i]];
}
#endif

void codebook_lookup_cpu(const uint8_t* codes, int64_t n, const float* book, int64_t size, float* out) {
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
#else
  [[maybe_unused]] constexpr bool avx2 = false;
#endif
#ifdef TL_SEARCH_CODES
  const bool avx512 = use_avx512();
  // The book as 256 entries (zeros past its size, which no code reaches).
  float book256[256];
  if (avx512) {
    std::memcpy(book256, book, std::min<int64_t>(size, 256) * sizeof(float));
    std::fill(book256 + std::min<int64_t>(size, 256), book256 + 256, 0.0f);
  }
#endif
  // The book as 16 entries where it has at most 16 (zeros past its size; no code reaches them).
  float book16[16] = {};
  const bool small = size <= 16;
  if (small) std::memcpy(book16, book, size * sizeof(float));
  parallel_for(0, n, 1 + sizeof(float), [&](int64_t i0, int64_t i1) {  // a code read, a float written
#ifdef TL_SEARCH_CODES
    if (avx512) return lookup_avx512(codes + i0, i1 - i0, book256, out + i0);
#endif
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
    if (avx2 && small) return lookup16_avx2(codes + i0, i1 - i0, book16, out + i0);
    if (avx2) return lookup_avx2(codes + i0, i1 - i0, book, out + i0);
#endif
    for (int64_t i = i0; i < i1; ++i) out[i] = book[codes[i]];
  });
}

bool packed4_lookup_cpu(const uint8_t* packed, int64_t n, const float* book16, float* out) {
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (!avx2) return false;
  // Pieces of an even number of codes, so that each starts at a byte.
  parallel_for(0, (n + 1) / 2, 1 + 2 * sizeof(float), [&](int64_t b0, int64_t b1) {  // a byte read, 2 floats written
    lookup_packed4_avx2(packed, 2 * b0, std::min(n, 2 * b1), book16, out);
  });
  return true;
#else
  return false;
#endif
}

namespace {

TL_INLINE uint32_t order_key(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (u >> 31) ? ~u : u | 0x80000000u;
}

TL_INLINE float key_value(uint32_t k) {
  const uint32_t u = (k >> 31) ? k & 0x7fffffffu : ~k;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The sample's elements copied to v, their min and max (by their order keys: integer min and max,
// which vectorise), and whether a NaN, a -0 and a +0 occur (flags: 1, 2, 4).
TL_TARGET_CLONES
int sample_span(const float* x, int64_t count, int64_t stride, float* v, float& lo, float& hi) {
  for (int64_t i = 0; i < count; ++i) v[i] = x[i * stride];
  uint32_t kmin = 0xffffffffu, kmax = 0, neg_zero = 0, pos_zero = 0;
  for (int64_t i = 0; i < count; ++i) {
    uint32_t u;
    std::memcpy(&u, v + i, 4);
    const uint32_t k = (u >> 31) ? ~u : u | 0x80000000u;
    kmin = k < kmin ? k : kmin;
    kmax = k > kmax ? k : kmax;
    neg_zero |= u == 0x80000000u;
    pos_zero |= u == 0;
  }
  // NaNs' keys lie beyond the infinities': below -inf's (negative NaNs) or above +inf's.
  const bool nan = kmin < order_key(-std::numeric_limits<float>::infinity()) ||
                   kmax > order_key(std::numeric_limits<float>::infinity());
  lo = key_value(kmin);
  hi = key_value(kmax);
  return (nan ? 1 : 0) | (neg_zero ? 2 : 0) | (pos_zero ? 4 : 0);
}

// The bucket of each element: trunc(clamp((v - lo) * inv, 0, last)), monotone in v.
TL_TARGET_CLONES
void bucket_span(const float* v, int64_t count, float lo, float inv, float last, int32_t* bucket) {
  for (int64_t i = 0; i < count; ++i) {
    float t = (v[i] - lo) * inv;
    t = t > 0.0f ? t : 0.0f;
    t = t < last ? t : last;
    bucket[i] = static_cast<int32_t>(t);
  }
}

// Note [ranks by buckets]. Sorting the whole sample is more than a codebook needs: its 2^(bits+1)
// positions lie in at most as many buckets of a uniform grid over [min, max] (count / 4 buckets,
// the bucket a monotone chain of rounded operations, as Note [grid codes]'s cells, so bucket order
// is sort order and equal values share a bucket). One pass counts each bucket's elements, the
// counts' prefix gives the bucket of each asked position, one pass copies the keys of the buckets
// asked for (a few percent of the sample) and each of those is sorted on its own. The keys and so
// the values are the full sort's. Where the asked buckets hold more than an eighth of the sample
// (heavy tails, infinities, a constant sample) the radix sort runs instead.
bool sorted_values_by_buckets(const float* v, int64_t count, float lo, float hi, const int64_t* ranks, int64_t nranks,
                              float* out) {
  const int64_t buckets = std::max<int64_t>(1, count / 4);
  const float inv = static_cast<float>(buckets) / (hi - lo);
  if (!(hi > lo) || !std::isfinite(inv) || !(inv > 0.0f)) return false;
  thread_local std::vector<int32_t> bucket, start, slot, fill, asked;  // reused across calls
  thread_local std::vector<uint32_t> keys;
  bucket.resize(count);
  bucket_span(v, count, lo, inv, static_cast<float>(buckets - 1), bucket.data());
  start.assign(buckets + 1, 0);
  for (int64_t i = 0; i < count; ++i) ++start[bucket[i] + 1];
  for (int64_t b = 0; b < buckets; ++b) start[b + 1] += start[b];  // start[b]: elements in buckets < b
  // The asked buckets, in order of first request: slot[b] = its first key's place in `keys`.
  slot.assign(buckets, -1);
  asked.resize(nranks);
  int64_t total = 0;
  for (int64_t r = 0; r < nranks; ++r) {
    const int32_t b = static_cast<int32_t>(std::upper_bound(start.begin(), start.end(), ranks[r]) - start.begin() - 1);
    asked[r] = b;
    if (slot[b] < 0) {
      slot[b] = static_cast<int32_t>(total);
      total += start[b + 1] - start[b];
    }
  }
  if (total > count / 8) return false;
  keys.resize(total);
  fill.assign(slot.begin(), slot.end());  // the next free place of each asked bucket
  for (int64_t i = 0; i < count; ++i) {
    const int32_t f = fill[bucket[i]];
    if (f >= 0) {
      keys[f] = order_key(v[i]);
      ++fill[bucket[i]];
    }
  }
  constexpr int32_t kSorted = -2;  // fill's mark of a bucket already sorted
  for (int64_t r = 0; r < nranks; ++r) {
    const int32_t b = asked[r];
    uint32_t* k = keys.data() + slot[b];
    if (fill[b] != kSorted) {
      std::sort(k, k + (start[b + 1] - start[b]));
      fill[b] = kSorted;
    }
    out[r] = key_value(k[ranks[r] - start[b]]);
  }
  return true;
}

}  // namespace

// Note [sorted by radix]. A codebook needs the sample's values at 2^bits pairs of sort positions;
// at::quantile finds them by sorting the whole sample (std::sort of 65536 floats: milliseconds,
// 100x the rest of a 1 MiB encode). Where Note [ranks by buckets] does not apply, an LSD radix sort
// of order-preserving keys (a float's bits u: ~u when negative, else u | 2^31) in three passes of
// 11, 11 and 10 bits, a pass skipped when every key has the same digit, and the keys turned back
// into floats at the positions asked for. Keys are equal exactly when the floats are bit for bit, so
// the sorted sequence is at::sort's except among -0 and +0, which compare equal: -0 comes first
// here (and in the buckets), while std::sort leaves equal elements in no defined order. A zero
// asked for where both occur, or a NaN (at::quantile then returns NaN throughout), is left to ATen.
bool sorted_values_cpu(const float* x, int64_t count, int64_t stride, const int64_t* ranks, int64_t nranks,
                       float* out) {
  thread_local std::vector<float> sample;
  if (static_cast<int64_t>(sample.size()) < count) sample.resize(count);
  float lo = 0.0f, hi = 0.0f;
  const int flags = sample_span(x, count, stride, sample.data(), lo, hi);
  if (flags & 1) return false;  // a NaN
  const bool both_zeros = (flags & 6) == 6;
  auto zero_unordered = [&] {
    for (int64_t r = 0; r < nranks; ++r)
      if (out[r] == 0.0f) return true;
    return false;
  };
  if (sorted_values_by_buckets(sample.data(), count, lo, hi, ranks, nranks, out))
    return !(both_zeros && zero_unordered());
  constexpr int kPasses = 3, kDigitBits = 11;
  thread_local std::vector<uint32_t> scratch;  // reused across calls: no page faults per call
  if (static_cast<int64_t>(scratch.size()) < 2 * count) scratch.resize(2 * count);
  uint32_t* keys = scratch.data();
  uint32_t* other = keys + count;
  std::vector<uint32_t> hist(kPasses << kDigitBits, 0);
  uint32_t nan = 0, neg_zero = 0, pos_zero = 0;
  for (int64_t i = 0; i < count; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i * stride, 4);
    nan |= (u & 0x7fffffffu) > 0x7f800000u;
    neg_zero |= u == 0x80000000u;
    pos_zero |= u == 0;
    const uint32_t k = (u >> 31) ? ~u : u | 0x80000000u;
    keys[i] = k;
    for (int p = 0; p < kPasses; ++p) ++hist[(p << kDigitBits) + ((k >> (kDigitBits * p)) & 2047u)];
  }
  if (nan) return false;
  for (int p = 0; p < kPasses; ++p) {
    uint32_t* h = hist.data() + (p << kDigitBits);
    const int shift = kDigitBits * p;
    if (h[(keys[0] >> shift) & 2047u] == static_cast<uint32_t>(count)) continue;  // one digit: nothing moves
    uint32_t sum = 0;
    for (int d = 0; d < (1 << kDigitBits); ++d) {
      const uint32_t c = h[d];
      h[d] = sum;
      sum += c;
    }
    for (int64_t i = 0; i < count; ++i) other[h[(keys[i] >> shift) & 2047u]++] = keys[i];
    std::swap(keys, other);
  }
  for (int64_t r = 0; r < nranks; ++r) {
    const uint32_t k = keys[ranks[r]];
    const uint32_t u = (k >> 31) ? k & 0x7fffffffu : ~k;
    std::memcpy(out + r, &u, 4);
    if (neg_zero && pos_zero && out[r] == 0.0f) return false;
  }
  return true;
}

void pack_codes_cpu(const uint8_t* codes, int64_t n, int bits, uint8_t* out) {
  const int64_t tiles = (n + kTile - 1) / kTile;
  parallel_for(0, tiles, kTile + kTile * bits / 8, [&](int64_t b0, int64_t b1) {
    const int64_t t0 = b0 * kTile;
    pack_tile(codes + t0, std::min(n, b1 * kTile) - t0, bits, out + t0 / 8 * bits);
  });
}

void unpack_codes_cpu(const uint8_t* in, int64_t n, int bits, uint8_t* codes) {
  const int64_t tiles = (n + kTile - 1) / kTile;
  parallel_for(0, tiles, kTile + kTile * bits / 8, [&](int64_t b0, int64_t b1) {
    const int64_t t0 = b0 * kTile;
    unpack_tile(in + t0 / 8 * bits, std::min(n, b1 * kTile) - t0, bits, codes + t0);
  });
}

}  // namespace tl::codec
