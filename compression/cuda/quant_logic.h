#pragma once
// The per-element and per-block logic of the fused CUDA quantisation kernels (quant_cuda.cu),
// written once for both compilers: nvcc builds it into the kernels, g++ into the host loops that
// the CPU tests run (quant_cuda_host.cpp), so the logic a GPU runs is checked on machines without
// one.
//
// Note [one logic, two compilers]. Payload bytes must not depend on where they were made: the
// kernels reproduce the CPU fast path (compression/codecs/quant_kernels.cpp) and the portable ATen
// path (quant.cpp) bit for bit. Three things make that hold:
//   - the same float operations in the same order: x / a * p (max-abs), (x - lo) * b (min-max),
//     round half to even as (v + 1.5 * 2^23) - 1.5 * 2^23, clamps written as the ternaries that
//     std::min/std::max are;
//   - no contraction into fused multiply-adds: nvcc contracts a * b + c by default, the CPU paths
//     never do (Note [target clones]). On the device every multiply and add goes through
//     __fmul_rn/__fadd_rn, which nvcc never contracts (and quant_cuda.cu is built with
//     -fmad=false as well); on the host they are plain operators;
//   - the same random stream for stochastic rounding: the counter hash of (seed, element index)
//     that the CPU fast path uses (the ATen path draws from at::rand instead, as before).
// Layout (pack_bits in payload.h): codes are packed LSB first, so each group of 8 elements fills
// exactly `bits` bytes and element i's group starts at byte (i / 8) * bits. One CUDA thread owns
// one group: no two threads write the same byte.

#include <cstdint>

#include "compression/codecs/quant_kernels.h"  // QuantGeometry, QuantParams, DequantParams
#include "compression/cuda/hd.h"               // TL_HD

namespace tl::codec::gpu {

TL_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

TL_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

TL_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

TL_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

/// Round half to even, exact for |v| < 2^22 (values are clamped to [-128, 255] first).
TL_HD float round_half_even(float v) {
  const float m = 12582912.0f;  // 1.5 * 2^23
  return sub_rn(add_rn(v, m), m);
}

/// U[0, 1) with 24 bits from a 32-bit integer hash of (seed, i) (Wellons' lowbias32), the stream of
/// stochastic rounding on the CPU fast path and in the kernels: plain 32-bit multiplies and shifts,
/// so CPU loops vectorise (the signed conversion too). The index wraps after 2^32 elements.
TL_HD float uniform01(uint64_t seed, uint64_t i) {
  uint32_t z = static_cast<uint32_t>(i) * 0x9E3779B9u + static_cast<uint32_t>(seed) + static_cast<uint32_t>(seed >> 32);
  z ^= z >> 16;
  z *= 0x7feb352du;
  z ^= z >> 15;
  z *= 0x846ca68bu;
  z ^= z >> 16;
  return static_cast<float>(static_cast<int32_t>(z >> 8)) * (1.0f / 16777216.0f);
}

/// The scale group of element i (see QuantGeometry).
TL_HD int64_t scale_group(const QuantGeometry& g, int64_t i) {
  return g.run == 1 ? i % g.groups : (i / g.run) % g.groups;
}

TL_HD float clamp_like_std(float v, float lo, float hi) {
  v = v < lo ? lo : v;     // std::max(v, lo)
  return hi < v ? hi : v;  // std::min(v, hi)
}

/// The code of element i (value x, scale group s):
///   max-abs: clip(round(x / a * 2^(bits-1)), -2^(bits-1), 2^(bits-1) - 1) + 2^(bits-1)
///   min-max: clip(round((x - lo) * b), 0, 2^bits - 1)
/// with round = half to even, or floor(v + u) for stochastic rounding.
TL_HD uint8_t quant_code(float x, int64_t i, int64_t s, const QuantParams& q) {
  const float p = static_cast<float>(1 << (q.bits - 1));
  const float lo = q.minmax ? 0.0f : -p;
  const float hi = q.minmax ? static_cast<float>((1 << q.bits) - 1) : p - 1;
  const float off = q.minmax ? 0.0f : p;
  float v = q.minmax ? mul_rn(sub_rn(x, q.a[s]), q.b[s]) : mul_rn(div_rn(x, q.a[s]), p);
  if (q.stochastic) {
    v = clamp_like_std(add_rn(v, uniform01(q.seed, static_cast<uint64_t>(i))), lo, hi);
    return static_cast<uint8_t>(static_cast<int32_t>(add_rn(v, off)));
  }
  v = clamp_like_std(v, lo, hi);
  return static_cast<uint8_t>(static_cast<int32_t>(add_rn(round_half_even(v), off)));
}

/// The value of code c in scale group s: max-abs (c - 2^(bits-1)) * step, min-max c * step + lo.
TL_HD float dequant_value(uint8_t c, int64_t s, const DequantParams& q) {
  const float cf = static_cast<float>(c);
  if (q.minmax) return add_rn(mul_rn(cf, q.step[s]), q.lo[s]);
  return mul_rn(sub_rn(cf, static_cast<float>(1 << (q.bits - 1))), q.step[s]);
}

/// The number of 8-element groups of n elements (the last may be partial).
TL_HD int64_t pack_groups(int64_t n) { return (n + 7) / 8; }

/// Group `grp` of x: its (up to 8) codes packed into its `bits` bytes at out + grp * bits (fewer
/// for a partial last group: ceil(count * bits / 8)).
TL_HD void quantise_pack_group(const float* x, int64_t grp, const QuantGeometry& g, const QuantParams& q,
                               uint8_t* out) {
  const int64_t i0 = grp * 8;
  const int count = g.n - i0 < 8 ? static_cast<int>(g.n - i0) : 8;
  const uint64_t mask = (uint64_t(1) << q.bits) - 1;
  uint64_t acc = 0;
  for (int j = 0; j < count; ++j) {
    const int64_t i = i0 + j;
    acc |= (static_cast<uint64_t>(quant_code(x[i], i, scale_group(g, i), q)) & mask) << (j * q.bits);
  }
  const int bytes = (count * q.bits + 7) / 8;
  uint8_t* dst = out + grp * q.bits;
  for (int k = 0; k < bytes; ++k) dst[k] = static_cast<uint8_t>(acc >> (8 * k));
}

/// quantise_pack_group, and also residual[i] = x[i] - (the value code i decodes to), for error
/// feedback: encode, decode and the residual update in one pass over x.
TL_HD void quantise_pack_residual_group(const float* x, int64_t grp, const QuantGeometry& g, const QuantParams& q,
                                        const DequantParams& d, uint8_t* out, float* residual) {
  const int64_t i0 = grp * 8;
  const int count = g.n - i0 < 8 ? static_cast<int>(g.n - i0) : 8;
  const uint64_t mask = (uint64_t(1) << q.bits) - 1;
  uint64_t acc = 0;
  for (int j = 0; j < count; ++j) {
    const int64_t i = i0 + j, s = scale_group(g, i);
    const uint8_t code = quant_code(x[i], i, s, q);
    acc |= (static_cast<uint64_t>(code) & mask) << (j * q.bits);
    residual[i] = sub_rn(x[i], dequant_value(code, s, d));
  }
  const int bytes = (count * q.bits + 7) / 8;
  uint8_t* dst = out + grp * q.bits;
  for (int k = 0; k < bytes; ++k) dst[k] = static_cast<uint8_t>(acc >> (8 * k));
}

/// The inverse: group `grp`'s codes read from in + grp * bits, dequantised into out.
TL_HD void unpack_dequantise_group(const uint8_t* in, int64_t grp, const QuantGeometry& g, const DequantParams& q,
                                   float* out) {
  const int64_t i0 = grp * 8;
  const int count = g.n - i0 < 8 ? static_cast<int>(g.n - i0) : 8;
  const int bytes = (count * q.bits + 7) / 8;
  const uint8_t* src = in + grp * q.bits;
  uint64_t acc = 0;
  for (int k = 0; k < bytes; ++k) acc |= static_cast<uint64_t>(src[k]) << (8 * k);
  const uint64_t mask = (uint64_t(1) << q.bits) - 1;
  for (int j = 0; j < count; ++j) {
    const int64_t i = i0 + j;
    out[i] = dequant_value(static_cast<uint8_t>((acc >> (j * q.bits)) & mask), scale_group(g, i), q);
  }
}

}  // namespace tl::codec::gpu
