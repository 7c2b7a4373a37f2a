#include "compression/codecs/lowrank_kernels.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "compression/codecs/common.h"
#include "compression/codecs/inline_parallel.h"

namespace tl::codec {

// Note [thin products in tiles]. PowerSGD's products at rank r = 4 are thin: M Q and M^T P do
// 2r flops per element of M, P Q^T writes M's shape from two small factors. A BLAS call spends
// them in kernels made for square blocks (on (64, 262144) the two encode products took 200 ms on
// this machine, 30 passes' worth of memcpy). Here M is cut into tiles of up to kRowChunk rows and
// kColBlock columns; a tile reads its rows once from memory, and the factor's block it needs
// (transposed to (r, block): r rows of contiguous floats) from the L1 cache:
//   M Q:    each row of the tile dotted with the r rows of Q's block, 8 lanes per dot; the tile
//           writes its partial sums (one per column block) and the blocks are summed in order;
//   M^T P:  each row of the tile added, times P's r entries of that row, into r accumulator rows
//           (one per row chunk), then the chunks summed in order;
//   P Q^T:  each output row of the tile formed in the L1 cache from Q's block.
// Every sum runs in an order fixed by the shapes (lanes, blocks, chunks), not by the threads: the
// result is the same for any thread count, and for the vector widths of target_clones (multiply
// and add, no fused multiply-add). It differs from a BLAS product in the last bits.
namespace {

constexpr int64_t kColBlock = 1024;    // columns per tile: a factor block of r x 4 KiB
constexpr int64_t kRowChunk = 512;     // rows per tile

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define TL_THIN_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TL_THIN_CLONES
#endif

// Lane l of 8 accumulates x[j] y[j] over j = l mod 8; the lanes, then the tail, are added in order.
TL_THIN_CLONES float dot(const float* x, const float* y, int64_t n) {
  float acc[8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) acc[l] += x[j + l] * y[j + l];
  float s = 0;
  for (int l = 0; l < 8; ++l) s += acc[l];
  for (; j < n; ++j) s += x[j] * y[j];
  return s;
}

// dot() of x with the four rows y, y + ld, y + 2 ld, y + 3 ld (x read once).
TL_THIN_CLONES void dot4(const float* x, const float* y, int64_t ld, int64_t n, float* out) {
  float acc[4][8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int g = 0; g < 4; ++g)
      for (int l = 0; l < 8; ++l) acc[g][l] += x[j + l] * y[g * ld + j + l];
  for (int g = 0; g < 4; ++g) {
    float s = 0;
    for (int l = 0; l < 8; ++l) s += acc[g][l];
    for (int64_t t = j; t < n; ++t) s += x[t] * y[g * ld + t];
    out[g] = s;
  }
}

// a[0, n) += s x[0, n).
TL_THIN_CLONES void axpy(float* a, float s, const float* x, int64_t n) {
  for (int64_t j = 0; j < n; ++j) a[j] += s * x[j];
}

// a[0, n) = s x[0, n).
TL_THIN_CLONES void scale(float* a, float s, const float* x, int64_t n) {
  for (int64_t j = 0; j < n; ++j) a[j] = s * x[j];
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TL_THIN_AVX2 1
// Note [thin products in registers]. GCC's clones of the loops above kept dot4's 32 accumulators on
// the stack (a store and a reload per step) and gathered x one float at a time, and P Q^T and M^T P
// made a pass over their accumulator row for each of the r columns (P Q^T: 1 + 3 stores and 7 loads
// per 8 outputs at r = 4). These AVX2 forms do the same multiplications and additions, in the same
// order, with the accumulators in registers: dot4_avx2 with four vector chains; the output row of P
// Q^T formed 8 columns at a time across the r terms (s_0 q_0, then + s_c q_c); M^T P a column block
// of all the tile's rows at a time into r vector accumulators (row i's terms added before row i +
// 1's, as axpy did). Same bits (PowerSgd.ThinProductsInRegistersMatchTheLoops).
// On the calling thread (the switch is thread-local): with the fast paths off (PortableKernelsGuard,
// tests), the loops above.
bool thin_avx2() {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2 && cpu_kernels_enabled();
}

__attribute__((target("avx2"))) void dot4_avx2(const float* x, const float* y, int64_t ld, int64_t n, float* out) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j);
    a0 = _mm256_add_ps(a0, _mm256_mul_ps(v, _mm256_loadu_ps(y + j)));
    a1 = _mm256_add_ps(a1, _mm256_mul_ps(v, _mm256_loadu_ps(y + ld + j)));
    a2 = _mm256_add_ps(a2, _mm256_mul_ps(v, _mm256_loadu_ps(y + 2 * ld + j)));
    a3 = _mm256_add_ps(a3, _mm256_mul_ps(v, _mm256_loadu_ps(y + 3 * ld + j)));
  }
  alignas(32) float acc[4][8];
  _mm256_store_ps(acc[0], a0);
  _mm256_store_ps(acc[1], a1);
  _mm256_store_ps(acc[2], a2);
  _mm256_store_ps(acc[3], a3);
  for (int g = 0; g < 4; ++g) {
    float s = 0;
    for (int l = 0; l < 8; ++l) s += acc[g][l];
    for (int64_t t = j; t < n; ++t) s += x[t] * y[g * ld + t];
    out[g] = s;
  }
}

// o[0, n) = p[0] qt[0, n) + p[1] qt[n, 2n) + ... (r terms, added left to right), qt (r, n). R: r
// as a constant (the broadcasts and accumulators then stay in registers), or 0: r at run time.
template <int R>
__attribute__((target("avx2"))) void combine_row_avx2(const float* p, const float* qt, int64_t r, int64_t n, float* o) {
  if (R > 0) r = R;
  __m256 s[kMaxThinRank];
  for (int64_t c = 0; c < r; ++c) s[c] = _mm256_set1_ps(p[c]);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 v = _mm256_mul_ps(s[0], _mm256_loadu_ps(qt + j));
    for (int64_t c = 1; c < r; ++c) v = _mm256_add_ps(v, _mm256_mul_ps(s[c], _mm256_loadu_ps(qt + c * n + j)));
    _mm256_storeu_ps(o + j, v);
  }
  for (; j < n; ++j) {
    float v = p[0] * qt[j];
    for (int64_t c = 1; c < r; ++c) v += p[c] * qt[c * n + j];
    o[j] = v;
  }
}

// acc (r, n) += the rows [0, rows) of x (row stride ld) times their p (rows, r) entries, row by
// row; r <= kMaxThinRank (R as above).
template <int R>
__attribute__((target("avx2"))) void accumulate_rows_avx2(const float* x, int64_t ld, int64_t rows, const float* p,
                                                          int64_t r, int64_t n, float* acc) {
  if (R > 0) r = R;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 a[kMaxThinRank];
    for (int64_t c = 0; c < r; ++c) a[c] = _mm256_loadu_ps(acc + c * n + j);
    for (int64_t i = 0; i < rows; ++i) {
      const __m256 v = _mm256_loadu_ps(x + i * ld + j);
      for (int64_t c = 0; c < r; ++c) a[c] = _mm256_add_ps(a[c], _mm256_mul_ps(_mm256_set1_ps(p[i * r + c]), v));
    }
    for (int64_t c = 0; c < r; ++c) _mm256_storeu_ps(acc + c * n + j, a[c]);
  }
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < r; ++c)
      for (int64_t t = j; t < n; ++t) acc[c * n + t] += p[i * r + c] * x[i * ld + t];
}

// F<R>(args...) with R = r for the ranks given a constant form (1, 2, 4, 8), else F<0>.
// clang-format off
#define TL_BY_RANK(F, r, ...)                     \
  switch (r) {                                    \
    case 1: F<1>(__VA_ARGS__); break;             \
    case 2: F<2>(__VA_ARGS__); break;             \
    case 4: F<4>(__VA_ARGS__); break;             \
    case 8: F<8>(__VA_ARGS__); break;             \
    default: F<0>(__VA_ARGS__);                   \
  }
// clang-format on
#endif

struct Tile {
  int64_t i0, i1, j0, j1, chunk, block;
};

// f(tile) over the tiles of a (rows, cols) matrix, in parallel; each task reads or writes at least
// kTaskBytes of the matrix (Note [codec threads]).
template <class F>
void for_tiles(int64_t rows, int64_t cols, F f) {
  const int64_t chunks = (rows + kRowChunk - 1) / kRowChunk, blocks = (cols + kColBlock - 1) / kColBlock;
  const int64_t tile = std::min(rows, kRowChunk) * std::min(cols, kColBlock);
  parallel_for(0, chunks * blocks, tile * int64_t(sizeof(float)), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t c = t / blocks, b = t % blocks;
      f(Tile{c * kRowChunk, std::min(rows, (c + 1) * kRowChunk), b * kColBlock, std::min(cols, (b + 1) * kColBlock), c,
             b});
    }
  });
}

// qt (r, j1 - j0) = q (cols, r) rows [j0, j1), transposed.
void transpose_block(const float* q, int64_t r, int64_t j0, int64_t j1, float* qt) {
  const int64_t n = j1 - j0;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t c = 0; c < r; ++c) qt[c * n + j] = q[(j0 + j) * r + c];
}

// out[e] = sum over p of parts[p * size + e], p in order; parts == out when there is one part.
void sum_parts(const float* parts, int64_t count, int64_t size, float* out) {
  if (count == 1) return;
  parallel_for(0, size, (count + 1) * int64_t(sizeof(float)), [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e) {
      float s = parts[e];
      for (int64_t p = 1; p < count; ++p) s += parts[p * size + e];
      out[e] = s;
    }
  });
}

// fill(parts) writes `count` partial results of `size` floats each (count > 1: into a buffer;
// one: into out directly); they are then summed in order into out. No parts: out is zero.
template <class F>
void reduce_parts(int64_t count, int64_t size, float* out, F fill) {
  if (size == 0) return;
  if (count == 0) {
    std::fill(out, out + size, 0.0f);
    return;
  }
  std::vector<float> buf(count > 1 ? count * size : 0);
  float* parts = count > 1 ? buf.data() : out;
  fill(parts);
  sum_parts(parts, count, size, out);
}

}  // namespace

void thin_mq_cpu(const float* m, int64_t rows, int64_t cols, const float* q, int64_t r, float* p) {
#ifdef TL_THIN_AVX2
  const bool vec = thin_avx2();
#endif
  // Partial sums per column block, (blocks, rows, r).
  reduce_parts((cols + kColBlock - 1) / kColBlock, rows * r, p, [&](float* parts) {
    for_tiles(rows, cols, [&](const Tile& t) {
      const int64_t n = t.j1 - t.j0;
      std::vector<float> qt(r * n);  // (r, n)
      transpose_block(q, r, t.j0, t.j1, qt.data());
      for (int64_t i = t.i0; i < t.i1; ++i) {
        const float* x = m + i * cols + t.j0;
        float* o = parts + (t.block * rows + i) * r;
        int64_t c = 0;
        for (; c + 4 <= r; c += 4) {
#ifdef TL_THIN_AVX2
          if (vec) {
            dot4_avx2(x, qt.data() + c * n, n, n, o + c);
            continue;
          }
#endif
          dot4(x, qt.data() + c * n, n, n, o + c);
        }
        for (; c < r; ++c) o[c] = dot(x, qt.data() + c * n, n);
      }
    });
  });
}

void thin_mtp_cpu(const float* m, int64_t rows, int64_t cols, const float* p, int64_t r, float* q) {
#ifdef TL_THIN_AVX2
  const bool vec = thin_avx2();
#endif
  // Partial sums per row chunk, (chunks, cols, r).
  reduce_parts((rows + kRowChunk - 1) / kRowChunk, cols * r, q, [&](float* parts) {
    for_tiles(rows, cols, [&](const Tile& t) {
      const int64_t n = t.j1 - t.j0;
      std::vector<float> acc(r * n, 0.0f);  // (r, n)
#ifdef TL_THIN_AVX2
      if (vec)
        TL_BY_RANK(accumulate_rows_avx2, r, m + t.i0 * cols + t.j0, cols, t.i1 - t.i0, p + t.i0 * r, r, n, acc.data())
      else
#endif
        for (int64_t i = t.i0; i < t.i1; ++i) {
          const float* x = m + i * cols + t.j0;
          for (int64_t c = 0; c < r; ++c) axpy(acc.data() + c * n, p[i * r + c], x, n);
        }
      float* o = parts + (t.chunk * cols + t.j0) * r;
      for (int64_t j = 0; j < n; ++j)
        for (int64_t c = 0; c < r; ++c) o[j * r + c] = acc[c * n + j];
    });
  });
}

// Note [QR of the thin factor]. at::linalg_qr of P (rows, r) is a LAPACK call that may enter the
// BLAS library's thread pool: on the loaded 2-core machine, the first parallel region after the
// pool has gone to sleep waited for a woken thread (a 1 MiB encode took 0.3 ms on one thread and
// 10-20 ms on two, in the QR). The factor is small (rows x r, r <= 16): this is LAPACK's algorithm
// (reflector H = I - tau v v^T with v[0] = 1 and beta = -sign(alpha) |x|, as slarfg; Q formed
// backwards, as sorg2r), so P has LAPACK's signs; the last bits differ (double here).
void thin_qr_cpu(float* a_out, int64_t rows, int64_t r) {
  std::vector<double> a(a_out, a_out + rows * r), tau(r, 0.0);  // (rows, r)
  auto at = [&](int64_t i, int64_t j) -> double& { return a[i * r + j]; };
  for (int64_t i = 0; i < r; ++i) {
    double xnorm = 0;
    for (int64_t k = i + 1; k < rows; ++k) xnorm += at(k, i) * at(k, i);
    xnorm = std::sqrt(xnorm);
    if (xnorm == 0) continue;  // H = I (tau = 0)
    const double alpha = at(i, i), beta = -std::copysign(std::hypot(alpha, xnorm), alpha);
    tau[i] = (beta - alpha) / beta;
    const double s = 1.0 / (alpha - beta);
    for (int64_t k = i + 1; k < rows; ++k) at(k, i) *= s;
    at(i, i) = beta;
    for (int64_t j = i + 1; j < r; ++j) {  // H applied to the columns on the right
      double w = at(i, j);
      for (int64_t k = i + 1; k < rows; ++k) w += at(k, i) * at(k, j);
      w *= tau[i];
      at(i, j) -= w;
      for (int64_t k = i + 1; k < rows; ++k) at(k, j) -= w * at(k, i);
    }
  }
  for (int64_t i = r - 1; i >= 0; --i) {  // Q = H_0 ... H_{r-1} I, column i from H_i
    at(i, i) = 1.0;
    for (int64_t j = i + 1; j < r; ++j) {
      double w = 0;
      for (int64_t k = i; k < rows; ++k) w += at(k, i) * at(k, j);
      w *= tau[i];
      for (int64_t k = i; k < rows; ++k) at(k, j) -= w * at(k, i);
    }
    for (int64_t k = i + 1; k < rows; ++k) at(k, i) *= -tau[i];
    at(i, i) = 1.0 - tau[i];
    for (int64_t k = 0; k < i; ++k) at(k, i) = 0.0;
  }
  for (int64_t e = 0; e < rows * r; ++e) a_out[e] = static_cast<float>(a[e]);
}

void thin_pqt_cpu(const float* p, int64_t rows, const float* q, int64_t cols, int64_t r, float* out) {
#ifdef TL_THIN_AVX2
  const bool vec = thin_avx2();
#endif
  if (rows * cols == 0) return;
  if (r == 0) {
    parallel_for(0, rows * cols, sizeof(float), [&](int64_t e0, int64_t e1) { std::fill(out + e0, out + e1, 0.0f); });
    return;
  }
  for_tiles(rows, cols, [&](const Tile& t) {
    const int64_t n = t.j1 - t.j0;
    std::vector<float> qt(r * n);  // (r, n)
    transpose_block(q, r, t.j0, t.j1, qt.data());
    for (int64_t i = t.i0; i < t.i1; ++i) {
      float* o = out + i * cols + t.j0;
#ifdef TL_THIN_AVX2
      if (vec) {
        TL_BY_RANK(combine_row_avx2, r, p + i * r, qt.data(), r, n, o)
        continue;
      }
#endif
      scale(o, p[i * r], qt.data(), n);
      for (int64_t c = 1; c < r; ++c) axpy(o, p[i * r + c], qt.data() + c * n, n);
    }
  });
}

}  // namespace tl::codec
