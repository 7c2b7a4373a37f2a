#include "compression/codecs/hadamard.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cmath>
#include <limits>

#include "compression/codecs/x86.h"

#include "compression/codecs/common.h"
#include "compression/codecs/inline_parallel.h"

namespace tl {
namespace {

constexpr const char* kHadquantName = "hadquant";
constexpr int64_t kMaxTile = int64_t(1) << 16;

bool power_of_two(int64_t v) { return v >= 1 && (v & (v - 1)) == 0; }

// The quantiser of the rotated tiles: max-abs, one scale per tile, nearest rounding.
std::shared_ptr<Quantize> tile_quantiser(int64_t bits, int64_t tile, at::ScalarType scale_type) {
  QuantOptions q;
  q.bits = bits;
  q.scale = QuantOptions::Scale::kBlock;
  q.block = tile;
  q.scale_type = scale_type;
  return std::make_shared<Quantize>(q);
}

// Where a tensor of `shape` lies as rotated tiles (Note [hadamard tiles]).
struct Tiling {
  int64_t rows, D, t, padded;  // (rows, D) view, tile used, D' = ceil(D / t) * t
};
Tiling tiling(const std::vector<int64_t>& shape, int64_t tile) {
  Tiling g;
  const int64_t n = codec::shape_numel(shape);
  g.D = shape.empty() ? 1 : shape.back();
  g.rows = g.D > 0 ? n / g.D : 0;
  g.t = codec::hadamard_tile(tile, g.D);
  g.padded = (g.D + g.t - 1) / g.t * g.t;
  return g;
}

// Note [fast Walsh-Hadamard transform]. H_t = H_2 (x) H_2 (x) ... (x) H_2 acts on each bit of the
// index once, in any order. Each stage here combines the top bit, reading the two contiguous
// halves a = x[:, :t/2] and b = x[:, t/2:] of every row, and writes a + b and a - b with that bit
// moved to the bottom: y[2r] = a[r] + b[r], y[2r + 1] = a[r] - b[r]. After log2(t) stages every
// bit was combined once and the index bits have rotated back into place (Stockham's ordering),
// so the result is H x in natural order. Two ATen ops a stage into preallocated ping-pong
// buffers: no per-stage allocation and no short strided runs (stage h of the textbook ordering
// pairs elements h apart, h = 1, 2, ... being slow for ATen's loops).
at::Tensor fwht(const at::Tensor& x) {  // x (M, t) -> H x per row, unnormalised
  const int64_t M = x.size(0), t = x.size(1), half = t / 2;
  at::Tensor src = x.contiguous();  // read only: the stages write into the two buffers
  if (t == 1) return src.clone();
  at::Tensor buffers[2] = {at::empty_like(src), t > 2 ? at::empty_like(src) : at::Tensor()};
  for (int64_t stage = 0; (int64_t(1) << stage) < t; ++stage) {
    at::Tensor dst = buffers[stage % 2];
    at::Tensor a = src.narrow(1, 0, half), b = src.narrow(1, half, half);  // (M, t/2) each
    at::Tensor out = dst.view({M, half, 2});                               // (M, t/2, 2)
    at::Tensor sum = out.select(2, 0), diff = out.select(2, 1);
    at::add_out(sum, a, b);
    at::sub_out(diff, a, b);
    src = dst;
  }
  return src;
}

// The CPU fast path of the rotation (Note [two paths]): each tile of t floats is scaled (before
// the transform when rotating, after it when unrotating) and transformed in place in the cache,
// one threaded pass over memory instead of 2 log2(t) + 1. In-place stages combine the bits from
// the top down (h = t/2, ..., 1): the same additions and subtractions, on the same operands in the
// same order, as fwht's Stockham stages, only stored elsewhere in between, so the results are
// equal bit for bit (HadQuant.CpuAndPortablePathsGiveIdenticalPayloads).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define TL_HAD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TL_HAD_CLONES
#endif

// The stages h = 4, 2, 1 on one block of 8, in registers (the same operations as the loop).
inline void butterfly8(float* v) {
  float a[8];
  for (int i = 0; i < 4; ++i) {
    a[i] = v[i] + v[i + 4];
    a[i + 4] = v[i] - v[i + 4];
  }
  float b[8];
  for (int q = 0; q < 8; q += 4)
    for (int i = q; i < q + 2; ++i) {
      b[i] = a[i] + a[i + 2];
      b[i + 2] = a[i] - a[i + 2];
    }
  for (int i = 0; i < 8; i += 2) {
    v[i] = b[i] + b[i + 1];
    v[i + 1] = b[i] - b[i + 1];
  }
}

template <bool ScaleFirst>
inline void rotate_tiles_impl(const float* x, const float* scale, int64_t t, int64_t m0, int64_t m1, float* y) {
  for (int64_t m = m0; m < m1; ++m) {
    const float* in = x + m * t;
    float* v = y + m * t;
    for (int64_t i = 0; i < t; ++i) v[i] = ScaleFirst ? in[i] * scale[i] : in[i];
    const int64_t low = t >= 8 ? 8 : 1;  // stages below h = low/2 run in butterfly8
    for (int64_t h = t / 2; h >= low; h /= 2)
      for (int64_t b = 0; b < t; b += 2 * h)
        for (int64_t i = b; i < b + h; ++i) {
          const float a = v[i], c = v[i + h];
          v[i] = a + c;
          v[i + h] = a - c;
        }
    if (t >= 8)
      for (int64_t b = 0; b < t; b += 8) butterfly8(v + b);
    if (!ScaleFirst)
      for (int64_t i = 0; i < t; ++i) v[i] *= scale[i];
  }
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TL_HAD_AVX2 1
// Note [butterflies in registers]. rotate_tiles_impl with AVX2 intrinsics for t >= 8: the stages
// h >= 8 pair whole vectors (the same a + c and a - c), and the stages 4, 2, 1 of each block of 8
// (butterfly8) run in one register: p = the register with the partners swapped in (halves,
// then pairs, then neighbours), the lanes that keep a + c from v + p and those that keep a - c
// from p - v, each with a (the lower index) as the first operand, as in the scalar code, so every
// rounding, signed zero and NaN is the same (HadQuant.RotationMatchesThePortableStages). The
// compiler's form of the scalar loop spent about half of a 1 MiB encode in the butterflies.
__attribute__((target("avx2"))) inline __m256 butterfly8_avx2(__m256 v) {
  __m256 p = _mm256_permute2f128_ps(v, v, 0x01);                           // halves swapped
  v = _mm256_blend_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), 0xF0);     // h = 4
  p = _mm256_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2));                       // pairs swapped
  v = _mm256_blend_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), 0xCC);     // h = 2
  p = _mm256_permute_ps(v, _MM_SHUFFLE(2, 3, 0, 1));                       // neighbours swapped
  return _mm256_blend_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), 0xAA);  // h = 1
}

// *mn and *mx: the least of lo's lanes and the greatest of hi's, as the selections r < a ? r : a
// and r > b ? r : b taken in lane order from +inf and -inf. The lanes hold no NaN (minps and maxps
// never select one into them), so lanes of the same value have the same bits except +0 and -0,
// whose order decides the sign kept: the value comes from a tree of min and max (minps and maxps
// are those selections), and a zero result is taken again in lane order. (The lane-order chain
// was ~a third of a 1 MiB hadquant(4) encode's rotation.)
__attribute__((target("avx2"))) inline float lanes_min(__m256 v) {
  __m128 m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_min_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_min_ss(m, _mm_shuffle_ps(m, m, 1)));
}
__attribute__((target("avx2"))) inline float lanes_max(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}
__attribute__((target("avx2"))) inline void lanes_min_max(__m256 lo, __m256 hi, float* mn, float* mx) {
  float a = lanes_min(lo), b = lanes_max(hi);
  if (a == 0.0f || b == 0.0f) {  // +0 or -0: the first in lane order
    alignas(32) float l[8], h[8];
    _mm256_store_ps(l, lo);
    _mm256_store_ps(h, hi);
    a = std::numeric_limits<float>::infinity();
    b = -a;
    for (int k = 0; k < 8; ++k) {
      a = l[k] < a ? l[k] : a;
      b = h[k] > b ? h[k] : b;
    }
  }
  *mn = a;
  *mx = b;
}

// A tile of V vectors (t = 8 V <= 128) held in registers from load to store: the stages h >= 8
// pair r[i] with r[i + h / 8] (the loops are unrolled, V being a constant). Wider tiles go through
// memory stage by stage (rotate_tiles_avx2), where the stores were the bound. With mn and mx
// (Note [min and max while rotating]) each tile's min and max are written too.
template <int V, bool ScaleFirst>
__attribute__((target("avx2"))) void rotate_tiles_regs(const float* x, const float* scale, int64_t m0, int64_t m1,
                                                       float* y, float* mn, float* mx) {
  for (int64_t m = m0; m < m1; ++m) {
    const float* in = x + m * 8 * V;
    float* out = y + m * 8 * V;
    __m256 r[V];
#pragma GCC unroll 16
    for (int i = 0; i < V; ++i) {
      r[i] = _mm256_loadu_ps(in + 8 * i);
      if (ScaleFirst) r[i] = _mm256_mul_ps(r[i], _mm256_loadu_ps(scale + 8 * i));
    }
#pragma GCC unroll 4
    for (int h = V / 2; h >= 1; h /= 2)
#pragma GCC unroll 16
      for (int i = 0; i < V; ++i)
        if ((i & h) == 0) {
          const __m256 a = r[i], c = r[i + h];
          r[i] = _mm256_add_ps(a, c);
          r[i + h] = _mm256_sub_ps(a, c);
        }
#pragma GCC unroll 16
    for (int i = 0; i < V; ++i) {
      r[i] = butterfly8_avx2(r[i]);
      if (!ScaleFirst) r[i] = _mm256_mul_ps(r[i], _mm256_loadu_ps(scale + 8 * i));
      _mm256_storeu_ps(out + 8 * i, r[i]);
    }
    if (mn) {
      __m256 lo = _mm256_set1_ps(std::numeric_limits<float>::infinity()), hi = _mm256_sub_ps(_mm256_setzero_ps(), lo);
#pragma GCC unroll 16
      for (int i = 0; i < V; ++i) {
        lo = _mm256_min_ps(r[i], lo);  // r[i] < lo ? r[i] : lo
        hi = _mm256_max_ps(r[i], hi);  // r[i] > hi ? r[i] : hi
      }
      lanes_min_max(lo, hi, mn + m, mx + m);
    }
  }
}

// Note [butterflies in AVX-512 registers]. Where the CPU has AVX-512, tiles of 16 to 128 floats are
// held in W = t/16 registers of 16: the stages h >= 16 pair whole registers, and h = 8, 4, 2, 1 run
// in each register as in butterfly8_avx2 (p = the partners swapped in), except that the lanes
// keeping a - c are written by one masked subtraction p - v over v + p: the same operations on the
// same operands as the blend of the two (and as the scalar stages), one instruction fewer a stage
// and half as many instructions per element. The min and max go through the 8-lane halves in
// the order of rotate_tiles_regs (register 2j is the lower half of register j here), so a zero's
// sign and a NaN are handled as there. `codec::set_hadamard_avx512(false)` keeps the AVX2 form.
// 1 MiB hadquant(4), one thread: the two rotations ~87 + ~68 us -> ~67 + ~44 us (perf).
std::atomic<bool> had_avx512_allowed{true};

bool rotation_avx512(int64_t t) {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
  return has && t >= 16 && t <= 128 && had_avx512_allowed.load(std::memory_order_relaxed);
}

__attribute__((target("avx512f"))) inline __m512 butterfly16_avx512(__m512 v) {
  __m512 p = _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2));  // 256-bit halves swapped
  v = _mm512_mask_sub_ps(_mm512_add_ps(v, p), 0xFF00, p, v);       // h = 8
  p = _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1));         // 128-bit quarters swapped
  v = _mm512_mask_sub_ps(_mm512_add_ps(v, p), 0xF0F0, p, v);       // h = 4
  p = _mm512_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2));               // pairs swapped
  v = _mm512_mask_sub_ps(_mm512_add_ps(v, p), 0xCCCC, p, v);       // h = 2
  p = _mm512_permute_ps(v, _MM_SHUFFLE(2, 3, 0, 1));               // neighbours swapped
  return _mm512_mask_sub_ps(_mm512_add_ps(v, p), 0xAAAA, p, v);    // h = 1
}

// The same stages where the tile holds no NaN: the kept lane of each pair is v * s + p by one fused
// multiply-add, s = +1 where it keeps a + c (v = a, p = c) and -1 where it keeps a - c (v = c, p =
// a). v * s is exact, so it is one rounding of a + c or of (-c) + a, which IEEE defines as a - c
// (zeros' signs and infinities included); a NaN made here (inf - inf) is the CPU's default NaN,
// the same bits whichever operand order made it. Tiles that hold a NaN take butterfly16_avx512,
// where an operand's NaN propagates as in the scalar stages.
__attribute__((target("avx512f,fma"))) inline __m512 butterfly16_fma(__m512 v, const __m512* sign) {
  v = _mm512_fmadd_ps(v, sign[0], _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));  // h = 8
  v = _mm512_fmadd_ps(v, sign[1], _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));  // h = 4
  v = _mm512_fmadd_ps(v, sign[2], _mm512_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2)));        // h = 2
  return _mm512_fmadd_ps(v, sign[3], _mm512_permute_ps(v, _MM_SHUFFLE(2, 3, 0, 1)));     // h = 1
}

template <int W, bool ScaleFirst>
__attribute__((target("avx512f,fma"))) void rotate_tiles_regs512(const float* x, const float* scale, int64_t m0,
                                                                 int64_t m1, float* y, float* mn, float* mx) {
  const __m512 one = _mm512_set1_ps(1.0f), minus = _mm512_set1_ps(-1.0f);
  const __m512 sign[4] = {_mm512_mask_blend_ps(0xFF00, one, minus), _mm512_mask_blend_ps(0xF0F0, one, minus),
                          _mm512_mask_blend_ps(0xCCCC, one, minus), _mm512_mask_blend_ps(0xAAAA, one, minus)};
  for (int64_t m = m0; m < m1; ++m) {
    const float* in = x + m * 16 * W;
    float* out = y + m * 16 * W;
    __m512 r[W];
    __mmask16 nan = 0;
#pragma GCC unroll 8
    for (int i = 0; i < W; ++i) {
      r[i] = _mm512_loadu_ps(in + 16 * i);
      if (ScaleFirst) r[i] = _mm512_mul_ps(r[i], _mm512_loadu_ps(scale + 16 * i));
      nan |= _mm512_cmp_ps_mask(r[i], r[i], _CMP_UNORD_Q);
    }
#pragma GCC unroll 4
    for (int h = W / 2; h >= 1; h /= 2)
#pragma GCC unroll 8
      for (int i = 0; i < W; ++i)
        if ((i & h) == 0) {
          const __m512 a = r[i], c = r[i + h];
          r[i] = _mm512_add_ps(a, c);
          r[i + h] = _mm512_sub_ps(a, c);
        }
#pragma GCC unroll 8
    for (int i = 0; i < W; ++i) {
      r[i] = nan ? butterfly16_avx512(r[i]) : butterfly16_fma(r[i], sign);
      if (!ScaleFirst) r[i] = _mm512_mul_ps(r[i], _mm512_loadu_ps(scale + 16 * i));
      _mm512_storeu_ps(out + 16 * i, r[i]);
    }
    if (mn) {  // as rotate_tiles_regs: the 8-lane halves in element order
      __m256 lo = _mm256_set1_ps(std::numeric_limits<float>::infinity()), hi = _mm256_sub_ps(_mm256_setzero_ps(), lo);
#pragma GCC unroll 8
      for (int i = 0; i < W; ++i) {
        const __m256 a = _mm512_castps512_ps256(r[i]);
        const __m256 b = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(r[i]), 1));
        lo = _mm256_min_ps(a, lo);
        hi = _mm256_max_ps(a, hi);
        lo = _mm256_min_ps(b, lo);
        hi = _mm256_max_ps(b, hi);
      }
      lanes_min_max(lo, hi, mn + m, mx + m);
    }
  }
}

template <int W>
void rotate_regs512(bool scale_first, const float* x, const float* scale, int64_t m0, int64_t m1, float* y, float* mn,
                    float* mx) {
  if (scale_first)
    rotate_tiles_regs512<W, true>(x, scale, m0, m1, y, mn, mx);
  else
    rotate_tiles_regs512<W, false>(x, scale, m0, m1, y, mn, mx);
}

template <int V>
void rotate_regs(bool scale_first, const float* x, const float* scale, int64_t m0, int64_t m1, float* y, float* mn,
                 float* mx) {
  if (scale_first)
    rotate_tiles_regs<V, true>(x, scale, m0, m1, y, mn, mx);
  else
    rotate_tiles_regs<V, false>(x, scale, m0, m1, y, mn, mx);
}

template <bool ScaleFirst>
__attribute__((target("avx2"))) void rotate_tiles_avx2(const float* x, const float* scale, int64_t t, int64_t m0,
                                                       int64_t m1, float* y) {
  for (int64_t m = m0; m < m1; ++m) {
    const float* in = x + m * t;
    float* v = y + m * t;
    for (int64_t i = 0; i < t; i += 8) {
      const __m256 a = _mm256_loadu_ps(in + i);
      _mm256_storeu_ps(v + i, ScaleFirst ? _mm256_mul_ps(a, _mm256_loadu_ps(scale + i)) : a);
    }
    for (int64_t h = t / 2; h >= 8; h /= 2)
      for (int64_t b = 0; b < t; b += 2 * h)
        for (int64_t i = b; i < b + h; i += 8) {
          const __m256 a = _mm256_loadu_ps(v + i), c = _mm256_loadu_ps(v + i + h);
          _mm256_storeu_ps(v + i, _mm256_add_ps(a, c));
          _mm256_storeu_ps(v + i + h, _mm256_sub_ps(a, c));
        }
    for (int64_t i = 0; i < t; i += 8) {
      const __m256 r = butterfly8_avx2(_mm256_loadu_ps(v + i));
      _mm256_storeu_ps(v + i, ScaleFirst ? r : _mm256_mul_ps(r, _mm256_loadu_ps(scale + i)));
    }
  }
}
#endif

TL_HAD_CLONES
void rotate_tiles_scalar(const float* x, const float* scale, int64_t t, bool scale_first, int64_t m0, int64_t m1,
                         float* y) {
  if (scale_first)
    rotate_tiles_impl<true>(x, scale, t, m0, m1, y);
  else
    rotate_tiles_impl<false>(x, scale, t, m0, m1, y);
}

bool rotation_in_registers(int64_t t) {
#ifdef TL_HAD_AVX2
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2 && t >= 8 && t <= 128;
#else
  return false;
#endif
}

// mn and mx (per tile) only where rotation_in_registers(t).
void rotate_tiles(const float* x, const float* scale, int64_t t, bool scale_first, int64_t m0, int64_t m1, float* y,
                  float* mn, float* mx) {
#ifdef TL_HAD_AVX2
  if (rotation_avx512(t)) {  // Note [butterflies in AVX-512 registers]
    switch (t) {
      case 16:
        return rotate_regs512<1>(scale_first, x, scale, m0, m1, y, mn, mx);
      case 32:
        return rotate_regs512<2>(scale_first, x, scale, m0, m1, y, mn, mx);
      case 64:
        return rotate_regs512<4>(scale_first, x, scale, m0, m1, y, mn, mx);
      default:
        return rotate_regs512<8>(scale_first, x, scale, m0, m1, y, mn, mx);
    }
  }
  if (rotation_in_registers(t)) {
    switch (t) {
      case 8:
        return rotate_regs<1>(scale_first, x, scale, m0, m1, y, mn, mx);
      case 16:
        return rotate_regs<2>(scale_first, x, scale, m0, m1, y, mn, mx);
      case 32:
        return rotate_regs<4>(scale_first, x, scale, m0, m1, y, mn, mx);
      case 64:
        return rotate_regs<8>(scale_first, x, scale, m0, m1, y, mn, mx);
      default:
        return rotate_regs<16>(scale_first, x, scale, m0, m1, y, mn, mx);
    }
  }
  TORCH_INTERNAL_ASSERT(!mn, "hadquant: min and max while rotating need tiles of 8 to 128 and AVX2");
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2 && t >= 8)
    return scale_first ? rotate_tiles_avx2<true>(x, scale, t, m0, m1, y)
                       : rotate_tiles_avx2<false>(x, scale, t, m0, m1, y);
#endif
  rotate_tiles_scalar(x, scale, t, scale_first, m0, m1, y);
}

// rows (M, t) float32 on the CPU -> the rotated (or unrotated) rows, or undefined when the fast
// path does not apply.
at::Tensor rotate_cpu(const at::Tensor& x, const at::Tensor& scale, bool scale_first, float* mn = nullptr,
                      float* mx = nullptr) {
  if (!codec::use_cpu_kernel(x) || x.scalar_type() != at::kFloat || scale.scalar_type() != at::kFloat)
    return at::Tensor();
  const at::Tensor in = x.contiguous(), s = scale.contiguous();
  at::Tensor out = at::empty_like(in);  // (M, t)
  const int64_t M = in.size(0), t = in.size(1);
  const float* xp = in.data_ptr<float>();
  const float* sp = s.data_ptr<float>();
  float* yp = out.data_ptr<float>();
  // A tile of t floats read and t written.
  codec::parallel_for(0, M, 2 * t * int64_t(sizeof(float)),
                      [&](int64_t m0, int64_t m1) { rotate_tiles(xp, sp, t, scale_first, m0, m1, yp, mn, mx); });
  return out;
}

// diag(s) / sqrt(t) as one (t) vector: one pass over x besides the stages.
at::Tensor rotation_scale(const at::Tensor& signs) {
  return signs * (1.0 / std::sqrt(static_cast<double>(signs.numel())));
}

void check_rows(const at::Tensor& x, const at::Tensor& signs, const char* what) {
  TORCH_CHECK(x.dim() == 2 && signs.dim() == 1 && x.size(1) == signs.numel() && power_of_two(signs.numel()), what,
              ": expected rows (M, t) and t signs with t a power of two, got ", x.sizes(), " and ", signs.sizes());
}

}  // namespace

namespace codec {

bool set_hadamard_avx512(bool on) {
#ifdef TL_HAD_AVX2
  return had_avx512_allowed.exchange(on);
#else
  return on;
#endif
}

int64_t hadamard_tile(int64_t tile, int64_t D) {
  int64_t t = 1;
  while (t < D && t < tile) t *= 2;
  return t;
}

// Note [hadamard signs]. s_i is bit 0 of a 32-bit integer hash of i and the seed (Mueller's
// mixer, two rounds, after a host splitmix64 of the seed), computed with int64 ATen ops on the
// tensor's own device: every device gets the same signs, nothing is copied from the host (a
// pageable host-to-device copy would synchronise, Note [host synchronisation] in payload.cpp),
// and no product exceeds 2^59, so nothing overflows.
at::Tensor hadamard_signs(int64_t t, uint64_t seed, const at::TensorOptions& options) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  constexpr int64_t kLow32 = 0xffffffffll, kMix = 0x45d9f3bll;
  const int64_t base = static_cast<int64_t>(z & 0xffffffffull);
  if (options.device().is_cpu() && cpu_kernels_enabled() && options.dtype() == at::kFloat) {
    // The same integer steps in a loop (about 20 ATen ops on t elements otherwise, for each message).
    at::Tensor s = at::empty({t}, options);  // (t)
    float* out = s.data_ptr<float>();
    for (int64_t i = 0; i < t; ++i) {
      int64_t h = i ^ base;
      for (int round = 0; round < 2; ++round) h = ((h ^ (h >> 16)) * kMix) & kLow32;
      h ^= h >> 16;
      out[i] = (h & 1) ? 1.0f : -1.0f;
    }
    return s;
  }
  at::Tensor h = at::bitwise_xor(at::arange(t, options.dtype(at::kLong)), base);  // (t), below 2^32
  for (int round = 0; round < 2; ++round)
    h = at::bitwise_and(at::bitwise_xor(h, at::bitwise_right_shift(h, 16)) * kMix, kLow32);
  h = at::bitwise_xor(h, at::bitwise_right_shift(h, 16));
  return (at::bitwise_and(h, 1) * 2 - 1).to(options.dtype());
}

at::Tensor hadamard_rotate(const at::Tensor& x, const at::Tensor& signs) {
  check_rows(x, signs, "hadamard_rotate");
  const at::Tensor scale = rotation_scale(signs);
  at::Tensor fast = rotate_cpu(x, scale, /*scale_first=*/true);
  return fast.defined() ? fast : fwht(x * scale);
}

at::Tensor hadamard_unrotate(const at::Tensor& y, const at::Tensor& signs) {
  check_rows(y, signs, "hadamard_unrotate");
  const at::Tensor scale = rotation_scale(signs);
  at::Tensor fast = rotate_cpu(y, scale, /*scale_first=*/false);
  return fast.defined() ? fast : fwht(y) * scale;
}

}  // namespace codec

HadamardQuant::HadamardQuant(HadamardQuantOptions o) : Compressor("HadamardQuant"), o_(std::move(o)) {
  TORCH_CHECK(o_.bits >= 1 && o_.bits <= 8, kHadquantName, ": bits=", o_.bits, " is not accepted; accepted: 1..8");
  TORCH_CHECK(power_of_two(o_.tile) && o_.tile >= 2 && o_.tile <= kMaxTile, kHadquantName, ": tile=", o_.tile,
              " is not accepted; accepted: a power of two in 2..", kMaxTile);
  quant_ = tile_quantiser(o_.bits, o_.tile, o_.scale_type);
}

CompressorPtr HadamardQuant::from_spec(SpecArgs& args) {
  constexpr size_t kNamed = SpecArgs::kNamedOnly;
  HadamardQuantOptions o;
  o.bits = args.integer(0, "bits", 4);
  if (o.bits < 1 || o.bits > 8) args.fail(0, "bits", "an integer in 1..8");
  o.tile = args.integer(kNamed, "tile", 128);
  if (!power_of_two(o.tile) || o.tile < 2 || o.tile > kMaxTile)
    args.fail(kNamed, "tile", "a power of two in 2.." + std::to_string(kMaxTile) + " (64, 128, 256, ...)");
  const int64_t seed = args.integer(kNamed, "seed", 0);
  if (seed < 0) args.fail(kNamed, "seed", "an integer >= 0");
  o.seed = static_cast<uint64_t>(seed);
  o.scale_type = codec::wire_type_from_word(args.word(kNamed, "scales", codec::wire_type_words(), std::string("fp16")));
  return std::make_shared<HadamardQuant>(o);
}

std::string HadamardQuant::spec() const {
  return std::string(kHadquantName) + "(" + std::to_string(o_.bits) + ", tile=" + std::to_string(o_.tile) +
         ", seed=" + std::to_string(o_.seed) + ", scales=" + codec::wire_type_word(o_.scale_type) + ")";
}

Payload HadamardQuant::encode(const at::Tensor& x, const CodecContext& ctx) {
  codec::check_input(x, kHadquantName);
  const std::vector<int64_t> shape = x.sizes().vec();
  const Tiling g = tiling(shape, o_.tile);
  at::Tensor rows = x.to(at::kFloat).reshape({g.rows, g.D});  // (rows, D)
  if (g.padded != g.D) rows = at::constant_pad_nd(rows, {0, g.padded - g.D}, 0);
  at::Tensor tiles = rows.contiguous().view({-1, g.t});  // (rows * D' / t, t)
  const at::Tensor signs = codec::hadamard_signs(g.t, o_.seed, tiles.options());
  // One scale per tile: the quantiser's blocks are the tiles (D' is a multiple of t).
  auto quant = g.t == o_.tile ? quant_ : tile_quantiser(o_.bits, g.t, o_.scale_type);
  Payload q;
  const int64_t M = tiles.size(0);
  if (M > 1 && codec::use_cpu_kernel(tiles) && rotation_in_registers(g.t)) {
    // Note [min and max while rotating]. The quantiser's first pass is the per-tile min and max
    // (quant_kernels.cpp's minmax_span_t over a block: 8 lanes, r < lane ? r : lane in element
    // order from +-inf, then the lanes in order; NaN skipped). The rotation has each tile in
    // registers: the same comparisons there (minps/maxps are exactly those selections, signed
    // zeros included) save that pass over the rotated tensor (HadQuant.RotationMatchesThePortableStages
    // compares the payloads).
    std::vector<float> mn(M), mx(M);
    const at::Tensor rotated = rotate_cpu(tiles, rotation_scale(signs), /*scale_first=*/true, mn.data(), mx.data());
    q = quant->encode_with_minmax(rotated.reshape({-1}), mn.data(), mx.data(), ctx);
  } else {
    q = quant->encode(codec::hadamard_rotate(tiles, signs).reshape({-1}), ctx);
  }

  Payload p;
  p.codec = codec_id(kHadquantName);
  p.dtype = x.scalar_type();
  p.shape = shape;
  p.params = {o_.bits, o_.tile, static_cast<int64_t>(o_.seed), codec::wire_type_param(o_.scale_type)};
  p.body = q.body;
  return p;
}

at::Tensor HadamardQuant::decode(const Payload& p, const CodecContext& ctx) {
  codec::check_payload(p, kHadquantName, 4);
  const int64_t bits = p.params[0], tile = p.params[1], seed = p.params[2];
  TORCH_CHECK(bits >= 1 && bits <= 8, kHadquantName, ": corrupt payload: bits=", bits);
  TORCH_CHECK(power_of_two(tile) && tile >= 2 && tile <= kMaxTile, kHadquantName, ": corrupt payload: tile=", tile);
  TORCH_CHECK(seed >= 0, kHadquantName, ": corrupt payload: seed=", seed);
  const at::ScalarType scale_type = codec::wire_type_from_param(p.params[3], kHadquantName);
  const Tiling g = tiling(p.shape, tile);

  // The body is quant's block payload of the rotated tiles, flattened.
  Payload q;
  q.codec = codec_id("quant");
  q.dtype = at::kFloat;
  q.shape = {g.rows * g.padded};
  q.params = {bits,
              static_cast<int64_t>(QuantOptions::Scale::kBlock),
              static_cast<int64_t>(QuantOptions::Mode::kMaxAbs),
              0,
              -1,
              g.t,
              codec::wire_type_param(scale_type)};
  q.body = p.body;
  q.from_wire = p.from_wire;
  q.host_body = p.host_body;
  at::Tensor rotated = quant_->decode(q, ctx).view({-1, g.t});  // (rows * D' / t, t)
  at::Tensor tiles =
      codec::hadamard_unrotate(rotated, codec::hadamard_signs(g.t, static_cast<uint64_t>(seed), rotated.options()));
  at::Tensor rows = tiles.reshape({g.rows, g.padded});
  if (g.padded != g.D) rows = rows.narrow(1, 0, g.D);
  return rows.to(p.dtype).reshape(p.shape);
}

// ---- sizing (Note [sizing a payload] in compressor.h) ------------------------------------------

PayloadSize HadamardQuant::payload_size(const std::vector<int64_t>& shape, at::ScalarType dtype) const {
  const Tiling g = tiling(shape, o_.tile);
  const int64_t n = g.rows * g.padded;
  const int64_t groups = std::max<int64_t>((n + g.t - 1) / g.t, 1);
  const int64_t codes = n > 0 ? (n * o_.bits + 7) / 8 : 0;
  return {payload_header_bytes(static_cast<int64_t>(shape.size()), 4) +
              groups * static_cast<int64_t>(c10::elementSize(o_.scale_type)) + codes,
          PayloadSize::Kind::Exact};
}

}  // namespace tl
