#pragma once
// CPU loops of the sparse codecs (the fast path of Note [two paths] in common.h): exact
// top-k selection (a sampled threshold, then radix select on magnitude bits), emission of the
// kept elements in index order, and RandK's sampling without replacement.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace tl::codec {

/// Orders |v| like its float value (NaN above inf): the float's bits without the sign.
inline uint32_t magnitude_key(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return u & 0x7fffffffu;
}

/// A row keeps the elements whose key is > `key`, plus the first `ties` (in index order) whose key
/// equals it, of the `equal` there are (ties <= equal). {0xffffffff, 0, 0} keeps nothing.
struct RowCut {
  uint32_t key;
  int64_t ties, equal;
};

/// The k largest |x| of each of `rows` rows of D contiguous floats, ties at the k-th taken in
/// index order: flat indices (rows * k) int64 and values (rows * k) float, each row's in index
/// order (Note [top-k by a sampled threshold] in sparse_kernels.cpp). With `ambiguous`, it says
/// whether some row had more elements equal to its k-th largest than it kept (a tie broken by
/// the index order).
void topk_select_cpu(const float* x, int64_t rows, int64_t D, int64_t k, at::Tensor& idx, at::Tensor& vals,
                     bool* ambiguous = nullptr);

/// The elements of x[0, N) with magnitude_key > cut, in index order: flat indices (n) int64 and
/// values (n) float.
void threshold_select_cpu(const float* x, int64_t N, uint32_t cut, at::Tensor& idx, at::Tensor& vals);
/// The elements of x[0, N) where mask is set, in index order: flat indices (n) int64 and values
/// (n) float; `expect`: about how many.
void mask_select_cpu(const float* x, const uint8_t* mask, int64_t N, int64_t expect, at::Tensor& idx, at::Tensor& vals);

/// Whether the AVX-512 compaction (Note [compaction by compression] in sparse_kernels.cpp) may run
/// where the CPU has it (default true); the AVX2 loops otherwise. Returns the previous setting
/// (for tests of both).
bool set_sparse_avx512(bool on);
/// Whether the CPU has the AVX-512 subsets those loops use and set_sparse_avx512 allows them.
bool sparse_avx512();

/// out[0, numel) = 0 except out[idx[i]] = values[i], in one threaded pass over out. values: (n)
/// float32, float16 or bfloat16. False, with out partly written, unless idx is strictly
/// increasing and below numel.
bool scatter_sorted_cpu(const int64_t* idx, const at::Tensor& values, int64_t numel, float* out);
/// Per row r of out (rows, D): zeros except out[r, channels[r / block, c]] = values[r, c], for
/// channels (ceil(rows / block), k) strictly increasing along each row; values (rows, k) as
/// above. False, with out partly written, unless every row's channels are strictly increasing and
/// below D.
bool scatter_rows_cpu(const int64_t* channels, const at::Tensor& values, int64_t rows, int64_t D, float* out,
                      int64_t block = 1);
/// out (rows, k) = x (rows, D) at channels (ceil(rows / block), k) (row r: channels row r / block),
/// in range.
void gather_rows_cpu(const float* x, int64_t rows, int64_t D, const int64_t* channels, int64_t k, float* out,
                     int64_t block = 1);

// Note [remainder by multiplication]. Floyd's draw t = u % (j + 1) was a 64-bit division for each
// kept element. The divisors are the same k for every row (j + 1 = D - k + 1, ..., D), so each gets
// Lemire's constant M = ceil(2^128 / d) once per call, and u % d = ((M u mod 2^128) d) >> 128:
// exact for every 64-bit u and d (Lemire, Kaser and Kurz, "Faster remainder by direct computation",
// 2019: 128 bits >= 64 + log2 d), so the positions are the division's
// (RandK.MaskFromTheEngineMatchesRandom64, RandK.RemainderByMultiplication).
/// u % d by a multiplication (Note [remainder by multiplication]).
#ifdef __SIZEOF_INT128__
struct Remainder {
  __uint128_t m;
  uint64_t d;
  explicit Remainder(uint64_t div) : m(~__uint128_t(0) / div + 1), d(div) {}
  uint64_t of(uint64_t u) const {
    const __uint128_t low = m * u;
    const __uint128_t bottom = (low & ~uint64_t(0)) * __uint128_t(d) >> 64;
    return static_cast<uint64_t>((bottom + (low >> 64) * __uint128_t(d)) >> 64);
  }
};
#else
struct Remainder {
  uint64_t d;
  explicit Remainder(uint64_t div) : d(div) {}
  uint64_t of(uint64_t u) const { return u % d; }
};
#endif

/// count draws of `engine` into out, as count calls of engine() would give them, and the engine
/// advanced past them (Note [draws from a copy of the engine]).
void mt19937_draws(at::mt19937& engine, uint32_t* out, int64_t count);

/// k distinct positions per row, uniform over the k-subsets (Floyd's algorithm, k draws per row
/// from `gen`), as a (rows * D) 0/1 mask.
void randk_mask_cpu(at::CPUGeneratorImpl* gen, int64_t rows, int64_t D, int64_t k, uint8_t* mask);

}  // namespace tl::codec
