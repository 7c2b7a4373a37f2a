#include "compression/codecs/quant_kernels.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

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

// Round half to even for |v| < 2^22 (the values here are clamped to [-128, 255] first).
TL_INLINE float round_even(float v) {
  const float m = 12582912.0f;  // 1.5 * 2^23
  return (v + m) - m;
}

TL_INLINE float uniform01(uint64_t seed, uint64_t i) {  // splitmix64 of (seed, i), top 24 bits
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

// Codes of x[0, len): one scale (a, b) for all (Row = false) or one per element (Row = true).
template <bool Row, bool MinMax, bool Stochastic>
TL_INLINE void quantise_span(const float* x, int64_t len, const float* a, const float* b, float p, float hi,
                             uint64_t seed, int64_t i0, uint8_t* codes) {
  const float lo = MinMax ? 0.0f : -p;
  const float off = MinMax ? 0.0f : p;
  for (int64_t j = 0; j < len; ++j) {
    const float aj = Row ? a[j] : a[0];
    float v = MinMax ? (x[j] - aj) * (Row ? b[j] : b[0]) : x[j] / aj * p;
    float r;
    if (Stochastic) {
      v = std::min(std::max(v + uniform01(seed, static_cast<uint64_t>(i0 + j)), lo), hi);
      r = round_even(v);
      r -= r > v ? 1.0f : 0.0f;  // floor
    } else {
      v = std::min(std::max(v, lo), hi);
      r = round_even(v);
    }
    codes[j] = static_cast<uint8_t>(static_cast<int32_t>(r + off));
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

TL_INLINE void pack(const uint8_t* codes, int64_t n, int bits, uint8_t* out) {
  if (bits == 8) {
    std::memcpy(out, codes, n);
    return;
  }
  const uint64_t mask = (1u << bits) - 1;
  const int64_t groups = n / 8;
  for (int64_t g = 0; g < groups; ++g) {
    uint64_t w;
    std::memcpy(&w, codes + 8 * g, 8);
    uint64_t acc = 0;
    for (int j = 0; j < 8; ++j) acc |= ((w >> (8 * j)) & mask) << (j * bits);
    std::memcpy(out + g * bits, &acc, bits);
  }
  const int64_t rest = n - 8 * groups;
  if (rest > 0) {
    uint64_t acc = 0;
    for (int64_t j = 0; j < rest; ++j) acc |= (codes[8 * groups + j] & mask) << (j * bits);
    std::memcpy(out + groups * bits, &acc, (rest * bits + 7) / 8);
  }
}

TL_INLINE void unpack(const uint8_t* in, int64_t n, int bits, uint8_t* codes) {
  if (bits == 8) {
    std::memcpy(codes, in, n);
    return;
  }
  const uint64_t mask = (1u << bits) - 1;
  const int64_t groups = n / 8;
  for (int64_t g = 0; g < groups; ++g) {
    uint64_t acc = 0;
    std::memcpy(&acc, in + g * bits, bits);
    uint64_t w = 0;
    for (int j = 0; j < 8; ++j) w |= ((acc >> (j * bits)) & mask) << (8 * j);
    std::memcpy(codes + 8 * g, &w, 8);
  }
  const int64_t rest = n - 8 * groups;
  if (rest > 0) {
    uint64_t acc = 0;
    std::memcpy(&acc, in + groups * bits, (rest * bits + 7) / 8);
    for (int64_t j = 0; j < rest; ++j) codes[8 * groups + j] = static_cast<uint8_t>((acc >> (j * bits)) & mask);
  }
}

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

template <bool MinMax, bool Stochastic>
TL_INLINE void quantise_tile_impl(const float* x, int64_t t0, int64_t t1, const QuantGeometry& g, const QuantParams& q,
                                  uint8_t* codes) {
  const float p = static_cast<float>(1 << (q.bits - 1));
  const float hi = MinMax ? static_cast<float>((1 << q.bits) - 1) : p - 1;
  for_spans(g, t0, t1, [&](int64_t i, int64_t len, int64_t s, bool row) __attribute__((always_inline)) {
    if (row)
      quantise_span<true, MinMax, Stochastic>(x + i, len, q.a + s, MinMax ? q.b + s : q.a + s, p, hi, q.seed, i,
                                              codes + (i - t0));
    else
      quantise_span<false, MinMax, Stochastic>(x + i, len, q.a + s, MinMax ? q.b + s : q.a + s, p, hi, q.seed, i,
                                               codes + (i - t0));
  });
}

TL_TARGET_CLONES
void quantise_tile(const float* x, int64_t t0, int64_t t1, const QuantGeometry& g, const QuantParams& q, uint8_t* out) {
  uint8_t codes[kTile];
  if (q.minmax) {
    if (q.stochastic)
      quantise_tile_impl<true, true>(x, t0, t1, g, q, codes);
    else
      quantise_tile_impl<true, false>(x, t0, t1, g, q, codes);
  } else {
    if (q.stochastic)
      quantise_tile_impl<false, true>(x, t0, t1, g, q, codes);
    else
      quantise_tile_impl<false, false>(x, t0, t1, g, q, codes);
  }
  pack(codes, t1 - t0, q.bits, out + t0 / 8 * q.bits);
}

TL_TARGET_CLONES
void dequantise_tile(const uint8_t* in, int64_t t0, int64_t t1, const QuantGeometry& g, const DequantParams& q,
                     float* out) {
  uint8_t codes[kTile];
  unpack(in + t0 / 8 * q.bits, t1 - t0, q.bits, codes);
  const float p = static_cast<float>(1 << (q.bits - 1));
  for_spans(g, t0, t1, [&](int64_t i, int64_t len, int64_t s, bool row) __attribute__((always_inline)) {
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

TL_TARGET_CLONES
void minmax_span(const float* x, int64_t len, float& mn, float& mx) {
  float a = mn, b = mx;
  for (int64_t j = 0; j < len; ++j) {
    a = x[j] < a ? x[j] : a;
    b = x[j] > b ? x[j] : b;
  }
  mn = a;
  mx = b;
}

TL_TARGET_CLONES
void minmax_row(const float* x, int64_t len, float* mn, float* mx) {
  for (int64_t j = 0; j < len; ++j) {
    mn[j] = x[j] < mn[j] ? x[j] : mn[j];
    mx[j] = x[j] > mx[j] ? x[j] : mx[j];
  }
}

}  // namespace

void group_minmax_cpu(const float* x, const QuantGeometry& g, float* mn, float* mx) {
  const float inf = std::numeric_limits<float>::infinity();
  std::fill(mn, mn + g.groups, inf);
  std::fill(mx, mx + g.groups, -inf);
  std::mutex merge;
  const int64_t tiles = (g.n + kTile - 1) / kTile;
  at::parallel_for(0, tiles, 16, [&](int64_t b0, int64_t b1) {
    std::vector<float> lmn(g.groups, inf), lmx(g.groups, -inf);
    for_spans(g, b0 * kTile, std::min(g.n, b1 * kTile), [&](int64_t i, int64_t len, int64_t s, bool row) {
      if (row)
        minmax_row(x + i, len, lmn.data() + s, lmx.data() + s);
      else
        minmax_span(x + i, len, lmn[s], lmx[s]);
    });
    std::lock_guard<std::mutex> lock(merge);
    for (int64_t s = 0; s < g.groups; ++s) {
      mn[s] = std::min(mn[s], lmn[s]);
      mx[s] = std::max(mx[s], lmx[s]);
    }
  });
}

void quantise_pack_cpu(const float* x, const QuantGeometry& g, const QuantParams& q, uint8_t* out) {
  const int64_t tiles = (g.n + kTile - 1) / kTile;
  at::parallel_for(0, tiles, 4, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) quantise_tile(x, b * kTile, std::min(g.n, (b + 1) * kTile), g, q, out);
  });
}

void unpack_dequantise_cpu(const uint8_t* in, const QuantGeometry& g, const DequantParams& q, float* out) {
  const int64_t tiles = (g.n + kTile - 1) / kTile;
  at::parallel_for(0, tiles, 4, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) dequantise_tile(in, b * kTile, std::min(g.n, (b + 1) * kTile), g, q, out);
  });
}

}  // namespace tl::codec

namespace tl::codec {
namespace {

template <int Bits>
TL_INLINE void nearest_span(const float* x, int64_t len, const float* mid, uint8_t* codes) {
  for (int64_t j = 0; j < len; ++j) {
    const float v = x[j];
    int32_t c = 0;
    for (int32_t step = 1 << (Bits - 1); step >= 1; step >>= 1) c += mid[c + step - 1] < v ? step : 0;
    codes[j] = static_cast<uint8_t>(c);
  }
}

TL_TARGET_CLONES
void nearest_tile(const float* x, int64_t len, const float* mid, int bits, uint8_t* codes) {
  switch (bits) {
    case 1: nearest_span<1>(x, len, mid, codes); break;
    case 2: nearest_span<2>(x, len, mid, codes); break;
    case 3: nearest_span<3>(x, len, mid, codes); break;
    case 4: nearest_span<4>(x, len, mid, codes); break;
    case 5: nearest_span<5>(x, len, mid, codes); break;
    case 6: nearest_span<6>(x, len, mid, codes); break;
    case 7: nearest_span<7>(x, len, mid, codes); break;
    default: nearest_span<8>(x, len, mid, codes); break;
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
  std::mutex merge;
  const int64_t tiles = (n + kTile - 1) / kTile;
  at::parallel_for(0, tiles, 4, [&](int64_t b0, int64_t b1) {
    std::vector<double> ls(sums ? levels : 0, 0.0);
    std::vector<int64_t> lc(sums ? levels : 0, 0);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t t0 = b * kTile, len = std::min(n, t0 + kTile) - t0;
      nearest_tile(x + t0, len, mid, bits, codes + t0);
      if (sums)
        for (int64_t j = 0; j < len; ++j) {
          ls[codes[t0 + j]] += x[t0 + j];
          ++lc[codes[t0 + j]];
        }
    }
    if (sums) {
      std::lock_guard<std::mutex> lock(merge);
      for (int64_t l = 0; l < levels; ++l) {
        sums[l] += ls[l];
        counts[l] += lc[l];
      }
    }
  });
}

}  // namespace tl::codec
