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
#include "compression/cuda/quant_cuda.h"       // ScaleParams
#include "compression/cuda/sparse_logic.h"     // the fp16/bf16 casts (ATen's, bit for bit)

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

/// The scale groups of consecutive elements from i0 on: one division for the first, then a step per
/// element (Note [no division per element]).
struct GroupCursor {
  int64_t s = 0, r = 0;  // the scale group, and the position in its run of `g.run` elements
  TL_HD GroupCursor(const QuantGeometry& g, int64_t i0) {
    if (g.groups == 1) return;  // one scale: group 0 throughout
    if (i0 <= 0xffffffffLL && g.run <= 0xffffffffLL && g.groups <= 0xffffffffLL) {
      const uint32_t i = static_cast<uint32_t>(i0), run = static_cast<uint32_t>(g.run);
      const uint32_t q = run == 1 ? i : i / run;
      s = q % static_cast<uint32_t>(g.groups);
      r = i - q * run;  // i % run
      return;
    }
    s = scale_group(g, i0);
    r = i0 % g.run;
  }
  TL_HD void next(const QuantGeometry& g) {
    if (g.groups == 1) return;
    if (++r == g.run) {
      r = 0;
      if (++s == g.groups) s = 0;
    }
  }
};

// Note [no division per element]. scale_group divides 64-bit integers, which a GPU does in
// software (dozens of instructions). Per element, it made the first quantisation kernels
// compute-bound: 0.12 of a device-to-device copy on an H200. A cursor per group of 8 divides
// once and steps; it names the same groups, so the payload bytes do not change. A per-tensor scale
// now divides nothing, and below 2^32 elements the cursor's divisions are 32-bit (on an H100 this
// changed nothing measurable at 64 MiB: the stack was the bound, Note [groups in registers]).
//
// Loads and stores of a group's 8 floats are two 16-byte accesses on the device when the group is
// whole and aligned (a 16-byte-aligned x, as ATen allocates, and i0 a multiple of 8); otherwise,
// and on the host, one float at a time.
//
// Note [groups in registers]. A group's 8 values live in an array; indexed by a loop variable
// that runs to `count` (known at run time), nvcc put the array on the stack (32 bytes of local
// memory a thread, written and read back for every group: `ptxas -v` said "32 bytes stack frame"
// for every kernel). Every loop over a group's elements runs 0..7 under TL_UNROLL with `j < count`
// as a condition, so the indices are constants and the arrays stay in registers (0 bytes of
// stack); the host does the same steps. On an H100, 64 MiB quant(4): encode 0.114 -> 0.087 ms,
// decode 0.069 -> 0.047 ms.
TL_HD void load_group(const float* x, int64_t i0, int count, float* v) {
#if defined(__CUDA_ARCH__)
  if (count == 8 && (reinterpret_cast<uintptr_t>(x + i0) & 15) == 0) {
    const float4 a = reinterpret_cast<const float4*>(x + i0)[0], b = reinterpret_cast<const float4*>(x + i0)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    return;
  }
#endif
  TL_UNROLL
  for (int j = 0; j < 8; ++j) v[j] = j < count ? x[i0 + j] : 0.0f;
}

TL_HD void store_group(float* out, int64_t i0, int count, const float* v) {
#if defined(__CUDA_ARCH__)
  if (count == 8 && (reinterpret_cast<uintptr_t>(out + i0) & 15) == 0) {
    reinterpret_cast<float4*>(out + i0)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(out + i0)[1] = make_float4(v[4], v[5], v[6], v[7]);
    return;
  }
#endif
  TL_UNROLL
  for (int j = 0; j < 8; ++j)
    if (j < count) out[i0 + j] = v[j];
}

/// The first `bytes` (<= 8) bytes of a group's codes written from acc, LSB first.
TL_HD void store_code_bytes(uint8_t* dst, int bytes, uint64_t acc) {
  TL_UNROLL
  for (int k = 0; k < 8; ++k)
    if (k < bytes) dst[k] = static_cast<uint8_t>(acc >> (8 * k));
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

// Note [fused scales]. Between the reductions (per-group min and max) and the packing kernel, the
// ATen path turns G values into wire scales and per-group quantities with some twenty tiny ops:
// round_outward (a cast, a comparison, integer steps, a where), the cast to the wire type and
// back, and derive. On an H200 each costs a launch and a few microseconds of host time, which was
// most of quant's encode time on 64 MiB. One thread per scale group does the same arithmetic,
// op for op (the casts are sparse_logic.h's, checked against ATen's bit for bit), so the payload
// bytes do not change: QuantKernelLogic.* compare them with the CPU fast path.

/// v rounded to the wire type outward: up (>= v) or down (<= v), as round_outward in quant.cpp: a
/// cast to nearest even, then one step in the type's bit pattern if it went the wrong way. The
/// wire value's bits (fp32: v's own); a zero of either sign is +0 (Note [zero scales]).
TL_HD uint32_t round_outward_bits(float v, WireType w, bool up) {
  if (v == 0.0f) v = 0.0f;  // -0 -> +0
  if (w == WireType::kF32) return float_bits(v);
  const bool bf16 = w == WireType::kBF16;
  uint16_t r = bf16 ? bf16_bits(v) : half_bits(v);
  const float rf = bf16 ? bf16_to_float(r) : half_to_float(r);
  if (up ? rf < v : rf > v) {
    const int32_t bits = static_cast<int16_t>(r);
    const int32_t step = up ? (bits < 0 ? -1 : 1) : (bits < 0 ? 1 : -1);
    r = static_cast<uint16_t>(static_cast<int16_t>(bits + step));
  }
  return r;
}

// Note [zero scales]. A group whose values are all zeros has a wire scale of zero (max-abs
// max(-min, max); min-max both ends), and which zero a path finds depends on the order its
// reductions and maximum compare -0 with +0: ATen's CPU maximum keeps its second operand in
// vectorised lanes and its first in the scalar tail, std::max its first, the CPU minmax loop the
// first element seen, a GPU reduction whatever order its threads meet. So every path writes a
// zero scale as +0 (round_outward_bits, round_outward in quant.cpp): a max-abs scale is max|x|,
// never negative, and a min-max end's sign of zero changes no code and no decoded value. A block of
// +0 or -0 then has the wire scale +0, codes 2^(bits-1) (max-abs) or 0 (min-max), and decodes to
// +0 on every path.

/// The per-group quantities of scale group s from the wire scales (derive in quant.cpp, op for
/// op): max-abs a = w + 1e-6, step = w / 2^(bits-1); min-max (lo at s, hi at groups + s) a = lo,
/// b = range > 0 ? levels / range : 0, step = range / levels, with range = hi - lo. a and b may be
/// null (decoding needs step and lo only); lo is written for min-max only.
TL_HD void derive_group(int64_t s, const uint8_t* wire, const ScaleParams& p, float* a, float* b, float* step,
                        float* lo) {
  const int size = wire_size(p.wire);
  const float w = load_wire(wire + s * size, p.wire);
  if (!p.minmax) {
    if (a) a[s] = add_rn(w, 1e-6f);
    step[s] = div_rn(w, static_cast<float>(1 << (p.bits - 1)));
    return;
  }
  const float hi = load_wire(wire + (p.groups + s) * size, p.wire);
  const float levels = static_cast<float>((1 << p.bits) - 1);
  const float range = sub_rn(hi, w);
  if (a) a[s] = w;
  if (b) b[s] = range > 0 ? div_rn(levels, range) : 0.0f;
  step[s] = div_rn(range, levels);
  lo[s] = w;
}

/// Scale group s from its values: wire scales written (max-abs: outward-up of v = max(-min, max)
/// at s; min-max: outward-down of v = min at s and outward-up of mx at groups + s), then
/// derive_group.
TL_HD void scales_group_of(int64_t s, float v, float mx, const ScaleParams& p, uint8_t* wire, float* a, float* b,
                           float* step, float* lo) {
  const int size = wire_size(p.wire);
  if (p.minmax) {
    store_le(wire + s * size, round_outward_bits(v, p.wire, /*up=*/false), size);
    store_le(wire + (p.groups + s) * size, round_outward_bits(mx, p.wire, /*up=*/true), size);
  } else {
    store_le(wire + s * size, round_outward_bits(v, p.wire, /*up=*/true), size);
  }
  derive_group(s, wire, p, a, b, step, lo);
}

/// scales_group_of with v[s] and mx[s].
TL_HD void scales_group(int64_t s, const float* v, const float* mx, const ScaleParams& p, uint8_t* wire, float* a,
                        float* b, float* step, float* lo) {
  scales_group_of(s, v[s], mx[s], p, wire, a, b, step, lo);
}

// Note [scales in the kernels]. Per-tensor and per-block scales no longer go through ATen's
// reductions on the device (quant.cpp, quant_cuda.cu):
//   - per tensor: a first kernel writes one (min, max) per CUDA block; the packing kernel's blocks
//     each reduce those partials, one thread turns them into the scale (scales_group_of), block 0
//     writes it to the wire, and every block quantises with it. Two launches and two reads of x,
//     where aminmax, a negation, a maximum, the scales kernel and the packing kernel took five.
//   - per block of `block` elements: one warp a block computes its min and max and writes its
//     scales, in one pass; before, the last block was padded by a copy of the whole tensor (cat),
//     then amin and amax read it twice.
//   - per channel: one thread a channel (a warp where the channel's runs are longer than one
//     element) reads its elements once and writes its scales; before, amin and amax read x twice,
//     then a negation, a maximum and the scales kernel.
//   - decoding a per-tensor payload: each CUDA block derives step and lo from the wire itself.
// Min and max are exact whatever the order of the reduction, so the scales are those of aminmax;
// NaN propagates as in aminmax and amin/amax (min_nan, max_nan), and zeros of either sign give the
// wire scale +0 (Note [zero scales]). QuantKernelLogic.* run the same functions on the host
// (quant_tensor_host, channel_scales_host, block_scales_host) against the CPU fast path, bit for
// bit.

/// min and max that keep a NaN once one is seen (as at::aminmax, amin and amax).
TL_HD float min_nan(float m, float v) { return m != m ? m : (v != v || v < m ? v : m); }
TL_HD float max_nan(float m, float v) { return m != m ? m : (v != v || v > m ? v : m); }

/// The value a scale is made from: min-max the minimum, max-abs max(-min, max).
TL_HD float scale_value(float mn, float mx, bool minmax) { return minmax ? mn : max_nan(-mn, mx); }

/// The number of 8-element groups of n elements (the last may be partial).
TL_HD int64_t pack_groups(int64_t n) { return (n + 7) / 8; }

/// Group `grp` of x: its (up to 8) codes packed into its `bits` bytes at out + grp * bits (fewer
/// for a partial last group: ceil(count * bits / 8)).
TL_HD void quantise_pack_group(const float* x, int64_t grp, const QuantGeometry& g, const QuantParams& q,
                               uint8_t* out) {
  const int64_t i0 = grp * 8;
  const int count = g.n - i0 < 8 ? static_cast<int>(g.n - i0) : 8;
  const uint64_t mask = (uint64_t(1) << q.bits) - 1;
  float v[8];
  load_group(x, i0, count, v);
  GroupCursor c(g, i0);
  uint64_t acc = 0;
  TL_UNROLL
  for (int j = 0; j < 8; ++j, c.next(g))
    if (j < count) acc |= (static_cast<uint64_t>(quant_code(v[j], i0 + j, c.s, q)) & mask) << (j * q.bits);
  store_code_bytes(out + grp * q.bits, (count * q.bits + 7) / 8, acc);
}

/// quantise_pack_group, and also residual[i] = x[i] - (the value code i decodes to), for error
/// feedback: encode, decode and the residual update in one pass over x.
TL_HD void quantise_pack_residual_group(const float* x, int64_t grp, const QuantGeometry& g, const QuantParams& q,
                                        const DequantParams& d, uint8_t* out, float* residual) {
  const int64_t i0 = grp * 8;
  const int count = g.n - i0 < 8 ? static_cast<int>(g.n - i0) : 8;
  const uint64_t mask = (uint64_t(1) << q.bits) - 1;
  float v[8], r[8];
  load_group(x, i0, count, v);
  GroupCursor c(g, i0);
  uint64_t acc = 0;
  TL_UNROLL
  for (int j = 0; j < 8; ++j, c.next(g)) {
    r[j] = 0.0f;
    if (j < count) {
      const uint8_t code = quant_code(v[j], i0 + j, c.s, q);
      acc |= (static_cast<uint64_t>(code) & mask) << (j * q.bits);
      r[j] = sub_rn(v[j], dequant_value(code, c.s, d));
    }
  }
  store_group(residual, i0, count, r);
  store_code_bytes(out + grp * q.bits, (count * q.bits + 7) / 8, acc);
}

/// The inverse: group `grp`'s codes read from in + grp * bits, dequantised into out.
TL_HD void unpack_dequantise_group(const uint8_t* in, int64_t grp, const QuantGeometry& g, const DequantParams& q,
                                   float* out) {
  const int64_t i0 = grp * 8;
  const int count = g.n - i0 < 8 ? static_cast<int>(g.n - i0) : 8;
  const int bytes = (count * q.bits + 7) / 8;
  const uint8_t* src = in + grp * q.bits;
  uint64_t acc = 0;
  TL_UNROLL
  for (int k = 0; k < 8; ++k)
    if (k < bytes) acc |= static_cast<uint64_t>(src[k]) << (8 * k);
  const uint64_t mask = (uint64_t(1) << q.bits) - 1;
  float v[8];
  GroupCursor c(g, i0);
  TL_UNROLL
  for (int j = 0; j < 8; ++j, c.next(g))
    v[j] = j < count ? dequant_value(static_cast<uint8_t>((acc >> (j * q.bits)) & mask), c.s, q) : 0.0f;
  store_group(out, i0, count, v);
}

/// The bytes of a payload's wire scales: `groups` scales (max-abs) or lows then highs (min-max).
TL_HD int64_t wire_bytes(const ScaleParams& p) { return (p.minmax ? 2 : 1) * p.groups * wire_size(p.wire); }

/// Min and max of x[begin, end), folded into mn and mx (NaN propagates).
TL_HD void fold_minmax(const float* x, int64_t begin, int64_t end, float& mn, float& mx) {
  for (int64_t i = begin; i < end; ++i) mn = min_nan(mn, x[i]), mx = max_nan(mx, x[i]);
}

/// One scale for the whole tensor from its min and max (p.groups == 1): the wire scale written to
/// `wire`, a, b, step and lo (single floats; b and lo only for min-max) derived from it.
TL_HD void tensor_scales(float mn, float mx, const ScaleParams& p, uint8_t* wire, float* a, float* b, float* step,
                         float* lo) {
  scales_group_of(0, scale_value(mn, mx, p.minmax), mx, p, wire, a, p.minmax ? b : nullptr, step,
                  p.minmax ? lo : nullptr);
}

/// The quantisation and dequantisation parameters of one per-tensor scale held in a, b, step, lo.
TL_HD QuantParams tensor_quant_params(const QuantParams& q, const float* a, const float* b) {
  return QuantParams{q.bits, q.minmax, q.stochastic, q.seed, a, q.minmax ? b : a};
}
TL_HD DequantParams tensor_dequant_params(const QuantParams& q, const float* step, const float* lo) {
  return DequantParams{q.bits, q.minmax, step, q.minmax ? lo : step};
}

}  // namespace tl::codec::gpu
