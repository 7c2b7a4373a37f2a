#pragma once
// Fused CUDA kernels of uniform quantisation (one kernel: quantise and bit-pack; one: unpack and
// dequantise), and the same per-group logic (quant_logic.h) run serially on the host for the CPU
// tests. Scales are computed with ATen reductions before the kernel (quant.cpp); the kernel writes
// the packed codes straight into the payload body.
//
// Which path a CUDA tensor takes (Note [CUDA kernels or ATen ops]): the fused kernels when the
// build has them (TAPELINE_CUDA_KERNELS compiled in: a CUDA libtorch and nvcc were found) and the
// environment variable TAPELINE_CUDA_KERNELS is not "0"; otherwise the portable ATen-op path of
// Note [two paths] (compression/codecs/common.h), which stays the fallback and the reference.

#include <cstdint>

#include "compression/codecs/quant_kernels.h"
#include "compression/cuda/sparse_cuda.h"  // WireType

namespace tl::codec::gpu {

/// How a quant payload's scales are stored and used (Note [fused scales] in quant_logic.h).
struct ScaleParams {
  int bits;
  bool minmax;
  WireType wire;   // the scales' wire type
  int64_t groups;  // scale groups: max-abs stores `groups` scales, min-max `groups` lows then highs
};

/// Whether this build contains the CUDA kernels.
bool kernels_built();
/// Whether CUDA tensors take the kernels: built, and TAPELINE_CUDA_KERNELS != "0" (read once).
/// Codecs ask codec::use_cuda_kernel (common.h), which also honours PortableKernelsGuard.
bool kernels_enabled();

/// The error of a kernel entry point in a build without the kernels, naming the codec.
[[noreturn]] void no_cuda_kernels(const char* codec);

/// Pointers into the memory of CUDA device `device`; runs on that device's current stream (no
/// host synchronisation). Error in a build without the kernels.
void quantise_pack_cuda(int device, const float* x, const QuantGeometry& g, const QuantParams& q, uint8_t* out);
void unpack_dequantise_cuda(int device, const uint8_t* in, const QuantGeometry& g, const DequantParams& q, float* out);

/// quantise_pack_cuda, and also residual = x - dequantised codes (error feedback), in one kernel.
void quantise_pack_residual_cuda(int device, const float* x, const QuantGeometry& g, const QuantParams& q,
                                 const DequantParams& d, uint8_t* out, float* residual);

/// Per scale group, one thread: the wire scales written to `wire` from v = max(-min, max) (max-abs)
/// or from v = min and mx (min-max), and a, b, step, lo (float, `groups` each) derived from them.
void quant_scales_cuda(int device, const float* v, const float* mx, const ScaleParams& p, uint8_t* wire, float* a,
                       float* b, float* step, float* lo);
/// step and lo (min-max) derived from the wire scales of a received payload.
void quant_derive_cuda(int device, const uint8_t* wire, const ScaleParams& p, float* step, float* lo);

/// Scratch floats quant_tensor_cuda needs for its partial minima and maxima (2 per CUDA block).
constexpr int64_t kQuantPartialFloats = 4096;

/// A per-tensor scale (p.groups == 1), Note [scales in the kernels] in quant_logic.h: the wire
/// scale written to body[0, wire_bytes(p)) and the packed codes after it, from x alone, in two
/// kernels; q's a and b are not read. `partials`: kQuantPartialFloats floats on the device.
/// residual (or null): x - the decoded codes, as quantise_pack_residual_cuda.
void quant_tensor_cuda(int device, const float* x, const QuantGeometry& g, const QuantParams& q, const ScaleParams& p,
                       float* partials, uint8_t* body, float* residual);
/// Its inverse in one kernel: step (and lo) derived from the wire scale at body[0, ...), then the
/// codes after it unpacked and dequantised into out.
void dequant_tensor_cuda(int device, const uint8_t* body, const QuantGeometry& g, const ScaleParams& p, float* out);
/// Per block of `block` elements of x (n of them; p.groups blocks, the last may be short): its min
/// and max, then its wire scales, a, b, step, lo as quant_scales_cuda writes them. Short blocks: a
/// warp reduces 32 blocks, one after another, and its lanes make their 32 scales at once; long ones
/// (Note [scales in the kernels]): CUDA blocks reduce slices into `partials` (kQuantPartialFloats
/// floats on the device), then a thread a block makes its scale.
void block_scales_cuda(int device, const float* x, int64_t n, int64_t block, const ScaleParams& p, float* partials,
                       uint8_t* wire, float* a, float* b, float* step, float* lo);
/// Per channel of x viewed as (outer, p.groups, inner): its min and max, then its wire scales, a, b,
/// step, lo as quant_scales_cuda writes them, in one pass over x.
void channel_scales_cuda(int device, const float* x, int64_t outer, int64_t inner, const ScaleParams& p, uint8_t* wire,
                         float* a, float* b, float* step, float* lo);

/// The kernels' logic on host pointers, one group of 8 elements after another (what each CUDA
/// thread does, in sequence). Same bytes and values as the kernels.
void quantise_pack_host(const float* x, const QuantGeometry& g, const QuantParams& q, uint8_t* out);
void unpack_dequantise_host(const uint8_t* in, const QuantGeometry& g, const DequantParams& q, float* out);
void quantise_pack_residual_host(const float* x, const QuantGeometry& g, const QuantParams& q, const DequantParams& d,
                                 uint8_t* out, float* residual);
void quant_scales_host(const float* v, const float* mx, const ScaleParams& p, uint8_t* wire, float* a, float* b,
                       float* step, float* lo);
void quant_derive_host(const uint8_t* wire, const ScaleParams& p, float* step, float* lo);
void quant_tensor_host(const float* x, const QuantGeometry& g, const QuantParams& q, const ScaleParams& p,
                       uint8_t* body, float* residual);
void dequant_tensor_host(const uint8_t* body, const QuantGeometry& g, const ScaleParams& p, float* out);
void channel_scales_host(const float* x, int64_t outer, int64_t inner, const ScaleParams& p, uint8_t* wire, float* a,
                         float* b, float* step, float* lo);
void block_scales_host(const float* x, int64_t n, int64_t block, const ScaleParams& p, uint8_t* wire, float* a,
                       float* b, float* step, float* lo);

/// Forces CPU tensors through quantise_pack_host/unpack_dequantise_host on this thread for its
/// lifetime (tests: the GPU kernels' logic against the CPU fast path and the ATen path).
class HostEmulationGuard {
 public:
  HostEmulationGuard();
  ~HostEmulationGuard();
  HostEmulationGuard(const HostEmulationGuard&) = delete;
  HostEmulationGuard& operator=(const HostEmulationGuard&) = delete;

 private:
  bool prev_;
};
/// Whether a HostEmulationGuard is alive on this thread.
bool host_emulation();

}  // namespace tl::codec::gpu
