#pragma once
// The per-element logic of AQ-SGD's cache kernels (aqsgd_cuda.cu), for nvcc and g++ alike (Note
// [one logic, two compilers] in quant_logic.h). The ATen path (aqsgd.cpp) computes, in float32:
//   sender:   m = float(cache[ids]); send C(x - m); cache[ids] = dtype(m + decode(C(x - m)))
//   receiver: cache[ids] = dtype(float(cache[ids]) + decode(payload)); output float(cache[ids])
// Element (b, j) here does the same float operations (one subtraction or one addition, rounded
// to nearest, never contracted) and the same rounding to the cache's type as ATen's casts
// (half_bits without a clamp: an overflow is inf, as in at::Tensor::to; bf16_bits), so caches
// and outputs are the ATen path's bit for bit.

#include "compression/cuda/aqsgd_cuda.h"
#include "compression/cuda/quant_logic.h"   // add_rn, sub_rn
#include "compression/cuda/sparse_logic.h"  // half_bits, bf16_bits and their inverses

namespace tl::codec::gpu {

TL_HD float cache_load(const CacheRows& m, int64_t b, int64_t j) {
  const int64_t at = m.ids[b] * m.d + j;
  if (m.dtype == WireType::kF32) return static_cast<const float*>(m.rows)[at];
  const uint16_t h = static_cast<const uint16_t*>(m.rows)[at];
  return m.dtype == WireType::kBF16 ? bf16_to_float(h) : half_to_float(h);
}

/// Stores v rounded to the cache's type; returns the stored value as float.
TL_HD float cache_store(const CacheRows& m, int64_t b, int64_t j, float v) {
  const int64_t at = m.ids[b] * m.d + j;
  if (m.dtype == WireType::kF32) {
    static_cast<float*>(m.rows)[at] = v;
    return v;
  }
  const uint16_t h = m.dtype == WireType::kBF16 ? bf16_bits(v) : half_bits(v);
  static_cast<uint16_t*>(m.rows)[at] = h;
  return m.dtype == WireType::kBF16 ? bf16_to_float(h) : half_to_float(h);
}

TL_HD int64_t cache_items(const CacheRows& m) { return m.batch * m.d; }

/// Element i = b * D + j of the sender's delta.
TL_HD void aqsgd_delta_item(const float* x, const CacheRows& m, int64_t i, float* delta) {
  delta[i] = sub_rn(x[i], cache_load(m, i / m.d, i % m.d));
}

/// Element i of the update, and of the receiver's output when `out` is given.
TL_HD void aqsgd_update_item(const float* c, const CacheRows& m, int64_t i, float* out) {
  const int64_t b = i / m.d, j = i % m.d;
  const float v = cache_store(m, b, j, add_rn(cache_load(m, b, j), c[i]));
  if (out) out[i] = v;
}

}  // namespace tl::codec::gpu
