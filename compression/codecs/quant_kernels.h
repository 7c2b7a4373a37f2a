#pragma once
// CPU loops of uniform quantisation (the fast path of Note [two paths] in common.h). Element i
// uses scale group (i / run) % groups: per tensor run = n, groups = 1; per channel run = the
// extent after the channel dim, groups = channels; per block run = block, groups = #blocks.
// Each loop is compiled for AVX2 and for the baseline ISA and picks one at run time.

#include <cstdint>

namespace tl::codec {

namespace gpu {
struct ScaleParams;  // compression/cuda/quant_cuda.h
}

struct QuantGeometry {
  int64_t n;       // elements
  int64_t run;     // consecutive elements sharing a scale group
  int64_t groups;  // scale groups
};

/// Per-group min and max of x. One group (the whole tensor): NaN propagates, as at::aminmax;
/// several: NaN is skipped.
void group_minmax_cpu(const float* x, const QuantGeometry& g, float* mn, float* mx);

struct QuantParams {
  int bits;
  bool minmax;      // false: max-abs (AQ-SGD), true: min-max
  bool stochastic;  // floor(v + u), u ~ U[0, 1) from a counter hash of (seed, i)
  uint64_t seed;
  const float* a;  // per group: max-abs: s + 1e-6 (the divisor); min-max: lo
  const float* b;  // per group: min-max: (2^bits - 1) / (hi - lo) or 0; unused for max-abs
};
/// Codes of x packed as pack_bits does: ceil(n * bits / 8) bytes.
///   max-abs: q = clip(round(x / a * 2^(bits-1)), -2^(bits-1), 2^(bits-1) - 1) + 2^(bits-1)
///   min-max: q = clip(round((x - lo) * b), 0, 2^bits - 1)
void quantise_pack_cpu(const float* x, const QuantGeometry& g, const QuantParams& q, uint8_t* out);

struct DequantParams {
  int bits;
  bool minmax;
  const float* step;  // per group: max-abs: s / 2^(bits-1); min-max: (hi - lo) / (2^bits - 1)
  const float* lo;    // per group: min-max only
};
///   max-abs: x^ = (q - 2^(bits-1)) * step;   min-max: x^ = q * step + lo
void unpack_dequantise_cpu(const uint8_t* in, const QuantGeometry& g, const DequantParams& q, float* out);

/// Whether the loops above (and unpack_dequantise_cpu) may use AVX-512 where the CPU has it (Note
/// [quant by AVX-512] in quant_kernels.cpp; on by default); off, they take the AVX2 or baseline
/// loops, as on CPUs without it (the tests check both). Returns the previous setting.
bool set_quant_avx512(bool on);
/// Whether they may use the AVX2 loops (Note [quant by AVX2]) where the CPU has AVX2 and FMA and
/// the AVX-512 loops are not taken (on by default); off, the compiler's loops. Returns the previous
/// setting.
bool set_quant_avx2(bool on);

/// The wire scales and per-group quantities from the per-group min and max (G = p.groups each),
/// threaded over the groups: the arithmetic of quant_logic.h's scales_group, which writes the
/// ATen path's bytes (Note [fused scales]). max-abs scales max(-mn, mx) (NaN propagates), min-max
/// mn then mx. False when a wire scale is not finite.
bool quant_scales_cpu(const float* mn, const float* mx, const gpu::ScaleParams& p, uint8_t* wire, float* a, float* b,
                      float* step, float* lo);
/// Scales and codes at once where every run of g is a scale group of its own (blocks; channels of
/// dim 0), by tiles of whole blocks (Note [block scales in one pass] in quant_kernels.cpp): the
/// bytes of group_minmax_cpu, quant_scales_cpu (into wire, a, b, step, lo; for max-abs b may alias
/// a and lo step, as there) and quantise_pack_cpu (codes into out; q.a and q.b null: the scales
/// are made here). False when a wire scale is not finite.
bool block_quantise_cpu(const float* x, const QuantGeometry& g, const gpu::ScaleParams& sp, const QuantParams& q,
                        uint8_t* wire, float* a, float* b, float* step, float* lo, uint8_t* out);
/// step and lo (min-max only) of every group from the wire scales, as quant_logic.h's derive_group.
void quant_derive_cpu(const uint8_t* wire, const gpu::ScaleParams& p, float* step, float* lo);

}  // namespace tl::codec

namespace tl::codec {

/// Quantile codebooks: for each x, the index of the nearest of 2^bits sorted codewords given
/// their 2^bits - 1 midpoints, i.e. the number of midpoints < x (as at::bucketize). With `sums`
/// and `counts` (2^bits each), also the per-code sum (double) and count of the x assigned.
void nearest_codes_cpu(const float* x, int64_t n, const float* mid, int bits, uint8_t* codes, double* sums,
                       int64_t* counts);

/// Whether nearest_codes_cpu and codebook_lookup_cpu may use AVX-512 where the CPU has it (Note
/// [codes by a search in registers]; on by default); off, they take the AVX2 or scalar loops, as
/// on CPUs without it (the tests check both). Returns the previous setting.
bool set_quantile_avx512(bool on);
/// Whether nearest_codes_cpu may search up to 4 bits' midpoints with AVX2 (Note [small codebooks
/// by a search in registers]; on by default); off, it counts comparisons. Returns the previous
/// setting.
bool set_quantile_avx2(bool on);

/// out[i] = book[codes[i]] for i < n (book: `size` entries, more than the largest code).
void codebook_lookup_cpu(const uint8_t* codes, int64_t n, const float* book, int64_t size, float* out);
/// The same for n 4-bit codes packed two a byte (pack_bits' layout) and a 16-entry book, without
/// unpacking them first (Note [small books in registers]). False, doing nothing, where the CPU has
/// no AVX2 (then unpack and call codebook_lookup_cpu).
bool packed4_lookup_cpu(const uint8_t* packed, int64_t n, const float* book16, float* out);

/// The values at ascending sort positions `ranks[0, nranks)` (each < count) of the `count` elements
/// x[0], x[stride], x[2 * stride], ... (count >= 1; the buckets that hold them sorted, Note [ranks
/// by buckets], else a radix sort of all, Note [sorted by radix]). False
/// (out then unspecified) where the answer could differ from at::sort's: an element is NaN, or
/// both -0 and +0 occur and a requested position holds a zero (at::sort leaves equal elements in
/// no defined order).
bool sorted_values_cpu(const float* x, int64_t count, int64_t stride, const int64_t* ranks, int64_t nranks, float* out);

}  // namespace tl::codec

namespace tl::codec {

/// pack_bits / unpack_bits on the CPU (bits in 1..8, layout as documented in payload.h).
void pack_codes_cpu(const uint8_t* codes, int64_t n, int bits, uint8_t* out);
void unpack_codes_cpu(const uint8_t* in, int64_t n, int bits, uint8_t* codes);

}  // namespace tl::codec
