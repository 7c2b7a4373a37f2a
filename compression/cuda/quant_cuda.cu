// The fused quantisation kernels: one CUDA thread per group of 8 elements runs the logic of
// quant_logic.h (Note [one logic, two compilers]). Built only where CMake found nvcc and a CUDA
// libtorch (compression/CMakeLists.txt), for the architectures in TAPELINE_CUDA_ARCHITECTURES.

#include "compression/cuda/launch.cuh"
#include "compression/cuda/quant_cuda.h"
#include "compression/cuda/quant_logic.h"

namespace tl::codec::gpu {
namespace {

__global__ void quantise_pack_kernel(const float* x, QuantGeometry g, QuantParams q, uint8_t* out) {
  const int64_t groups = pack_groups(g.n);
  for (int64_t grp = first_item(); grp < groups; grp += item_stride()) quantise_pack_group(x, grp, g, q, out);
}

__global__ void quantise_pack_residual_kernel(const float* x, QuantGeometry g, QuantParams q, DequantParams d,
                                              uint8_t* out, float* residual) {
  const int64_t groups = pack_groups(g.n);
  for (int64_t grp = first_item(); grp < groups; grp += item_stride())
    quantise_pack_residual_group(x, grp, g, q, d, out, residual);
}

__global__ void unpack_dequantise_kernel(const uint8_t* in, QuantGeometry g, DequantParams q, float* out) {
  const int64_t groups = pack_groups(g.n);
  for (int64_t grp = first_item(); grp < groups; grp += item_stride()) unpack_dequantise_group(in, grp, g, q, out);
}

__global__ void scales_kernel(const float* v, const float* mx, ScaleParams p, uint8_t* wire, float* a, float* b,
                              float* step, float* lo) {
  for (int64_t s = first_item(); s < p.groups; s += item_stride()) scales_group(s, v, mx, p, wire, a, b, step, lo);
}

__global__ void derive_kernel(const uint8_t* wire, ScaleParams p, float* step, float* lo) {
  for (int64_t s = first_item(); s < p.groups; s += item_stride()) derive_group(s, wire, p, nullptr, nullptr, step, lo);
}

// Elements a CUDA block of the long-block path reduces at least (Note [scales in the kernels]).
constexpr int64_t kLongSlice = 2048;

// NaN-propagating min and max over a warp's lanes, the result in every lane (a butterfly; Note
// [scales in the kernels] in quant_logic.h: neither depends on the order values meet in).
__device__ __forceinline__ void warp_minmax(float& mn, float& mx) {
  for (int o = 16; o > 0; o /= 2) {
    mn = min_nan(mn, __shfl_xor_sync(0xffffffffu, mn, o));
    mx = max_nan(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  }
}

// Block-wide NaN-propagating min and max: the result in thread 0. blockDim.x == kThreads.
__device__ void block_minmax(float& mn, float& mx) {
  warp_minmax(mn, mx);
  __shared__ float smn[kThreads / 32], smx[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) smn[warp] = mn, smx[warp] = mx;
  __syncthreads();
  if (warp == 0) {
    mn = lane < kThreads / 32 ? smn[lane] : smn[0];
    mx = lane < kThreads / 32 ? smx[lane] : smx[0];
    warp_minmax(mn, mx);
  }
}

// One (min, max) per CUDA block into partials[2 * block], [2 * block + 1].
__global__ void minmax_partials_kernel(const float* x, int64_t n, float* partials) {
  float mn = __int_as_float(0x7f800000), mx = -mn;  // +inf, -inf
  const int64_t first = first_item(), stride = item_stride();
  int64_t tail = 0;
  if ((reinterpret_cast<uintptr_t>(x) & 15) == 0) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (int64_t i = first; i < n / 4; i += stride) {
      const float4 v = x4[i];
      mn = min_nan(min_nan(mn, v.x), min_nan(v.y, min_nan(v.z, v.w)));
      mx = max_nan(max_nan(mx, v.x), max_nan(v.y, max_nan(v.z, v.w)));
    }
    tail = n / 4 * 4;
  }
  for (int64_t i = tail + first; i < n; i += stride) mn = min_nan(mn, x[i]), mx = max_nan(mx, x[i]);
  block_minmax(mn, mx);
  if (threadIdx.x == 0) partials[2 * blockIdx.x] = mn, partials[2 * blockIdx.x + 1] = mx;
}

// Every CUDA block reduces the `parts` partials and derives the tensor's scale; block 0 writes it
// to the wire; then the blocks quantise and pack (and write the residual) with it.
template <bool kResidual>
__global__ void quant_tensor_kernel(const float* x, QuantGeometry g, QuantParams q, ScaleParams p,
                                    const float* partials, int parts, uint8_t* body, float* residual) {
  float mn = __int_as_float(0x7f800000), mx = -mn;
  for (int i = threadIdx.x; i < parts; i += blockDim.x)
    mn = min_nan(mn, partials[2 * i]), mx = max_nan(mx, partials[2 * i + 1]);
  block_minmax(mn, mx);
  __shared__ float s_a, s_b, s_step, s_lo;
  __shared__ uint8_t s_wire[8];
  if (threadIdx.x == 0) {
    tensor_scales(mn, mx, p, s_wire, &s_a, &s_b, &s_step, &s_lo);
    if (blockIdx.x == 0)
      for (int k = 0; k < wire_bytes(p); ++k) body[k] = s_wire[k];
  }
  __syncthreads();
  const QuantParams tq = tensor_quant_params(q, &s_a, &s_b);
  uint8_t* codes = body + wire_bytes(p);
  const int64_t groups = pack_groups(g.n);
  if (kResidual) {
    const DequantParams d = tensor_dequant_params(q, &s_step, &s_lo);
    for (int64_t grp = first_item(); grp < groups; grp += item_stride())
      quantise_pack_residual_group(x, grp, g, tq, d, codes, residual);
  } else {
    for (int64_t grp = first_item(); grp < groups; grp += item_stride()) quantise_pack_group(x, grp, g, tq, codes);
  }
}

__global__ void dequant_tensor_kernel(const uint8_t* body, QuantGeometry g, ScaleParams p, float* out) {
  __shared__ float s_step, s_lo;
  if (threadIdx.x == 0) derive_group(0, body, p, nullptr, nullptr, &s_step, &s_lo);
  __syncthreads();
  const QuantParams q{p.bits, p.minmax, false, 0, nullptr, nullptr};
  const DequantParams d = tensor_dequant_params(q, &s_step, &s_lo);
  const uint8_t* codes = body + wire_bytes(p);
  const int64_t groups = pack_groups(g.n);
  for (int64_t grp = first_item(); grp < groups; grp += item_stride()) unpack_dequantise_group(codes, grp, g, d, out);
}

// Blocks on warps: each warp takes `per_warp` (1 or 32) consecutive scale blocks; for each, its
// lanes read the block (coalesced) and reduce by butterfly, and lane j keeps block j's min and max;
// then lanes 0..per_warp-1 make their blocks' scales at once. Short blocks take 32 a warp: the
// scale arithmetic, one lane at a time, made quant(4, scale=block, block=128) twice as slow.
__global__ void block_scales_kernel(const float* x, int64_t n, int64_t block, int per_warp, ScaleParams p,
                                    uint8_t* wire, float* a, float* b, float* step, float* lo) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = item_stride() / 32;
  for (int64_t base = first_item() / 32 * per_warp; base < p.groups; base += warps * per_warp) {
    const int count = p.groups - base < per_warp ? static_cast<int>(p.groups - base) : per_warp;
    float my_mn = __int_as_float(0x7f800000), my_mx = -my_mn;
    for (int j = 0; j < count; ++j) {
      const int64_t begin = (base + j) * block, end = begin + block < n ? begin + block : n;
      float mn = __int_as_float(0x7f800000), mx = -mn;
      for (int64_t i = begin + lane; i < end; i += 32) mn = min_nan(mn, x[i]), mx = max_nan(mx, x[i]);
      warp_minmax(mn, mx);
      if (lane == j) my_mn = mn, my_mx = mx;
    }
    if (lane < count) scales_group_of(base + lane, scale_value(my_mn, my_mx, p.minmax), my_mx, p, wire, a, b, step, lo);
  }
}

// Long blocks, first stage: CUDA block (k, s) reduces slice k of scale block s into partial
// s * gridDim.x + k.
__global__ void segment_partials_kernel(const float* x, int64_t n, int64_t block, float* partials) {
  const int64_t s = blockIdx.y, begin = s * block, end = begin + block < n ? begin + block : n;
  float mn = __int_as_float(0x7f800000), mx = -mn;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = begin + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < end; i += stride)
    mn = min_nan(mn, x[i]), mx = max_nan(mx, x[i]);
  block_minmax(mn, mx);
  const int64_t at = s * gridDim.x + blockIdx.x;
  if (threadIdx.x == 0) partials[2 * at] = mn, partials[2 * at + 1] = mx;
}

// Second stage: a thread per scale block folds its `slices` partials and makes its scales.
__global__ void segment_scales_kernel(const float* partials, int slices, ScaleParams p, uint8_t* wire, float* a,
                                      float* b, float* step, float* lo) {
  for (int64_t s = first_item(); s < p.groups; s += item_stride()) {
    float mn = __int_as_float(0x7f800000), mx = -mn;
    for (int k = 0; k < slices; ++k)
      mn = min_nan(mn, partials[2 * (s * slices + k)]), mx = max_nan(mx, partials[2 * (s * slices + k) + 1]);
    scales_group_of(s, scale_value(mn, mx, p.minmax), mx, p, wire, a, b, step, lo);
  }
}

// Per channel s of the (outer, groups, inner) view: its min and max, then its scales. inner == 1:
// a thread a channel, so each row is read by consecutive threads; otherwise a warp a channel.
__global__ void channel_scales_kernel(const float* x, int64_t outer, int64_t inner, ScaleParams p, uint8_t* wire,
                                      float* a, float* b, float* step, float* lo) {
  if (inner == 1) {
    for (int64_t s = first_item(); s < p.groups; s += item_stride()) {
      float mn = __int_as_float(0x7f800000), mx = -mn;
      for (int64_t o = 0; o < outer; ++o) mn = min_nan(mn, x[o * p.groups + s]), mx = max_nan(mx, x[o * p.groups + s]);
      scales_group_of(s, scale_value(mn, mx, p.minmax), mx, p, wire, a, b, step, lo);
    }
    return;
  }
  const int lane = threadIdx.x % 32;
  const int64_t warps = item_stride() / 32;
  for (int64_t s = first_item() / 32; s < p.groups; s += warps) {
    float mn = __int_as_float(0x7f800000), mx = -mn;
    for (int64_t o = 0; o < outer; ++o) {
      const float* row = x + (o * p.groups + s) * inner;
      for (int64_t i = lane; i < inner; i += 32) mn = min_nan(mn, row[i]), mx = max_nan(mx, row[i]);
    }
    warp_minmax(mn, mx);
    if (lane == 0) scales_group_of(s, scale_value(mn, mx, p.minmax), mx, p, wire, a, b, step, lo);
  }
}

}  // namespace

void quant_tensor_cuda(int device, const float* x, const QuantGeometry& g, const QuantParams& q, const ScaleParams& p,
                       float* partials, uint8_t* body, float* residual) {
  if (g.n == 0) return;
  const auto index = static_cast<c10::DeviceIndex>(device);
  const c10::cuda::CUDAGuard guard(index);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(index);
  const int parts =
      std::min<int>(resident_grid<minmax_partials_kernel>(device, (g.n + 3) / 4), kQuantPartialFloats / 2);
  minmax_partials_kernel<<<parts, kThreads, 0, stream>>>(x, g.n, partials);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (residual) {
    const int grid = resident_grid<quant_tensor_kernel<true>>(device, pack_groups(g.n));
    quant_tensor_kernel<true><<<grid, kThreads, 0, stream>>>(x, g, q, p, partials, parts, body, residual);
  } else {
    const int grid = resident_grid<quant_tensor_kernel<false>>(device, pack_groups(g.n));
    quant_tensor_kernel<false><<<grid, kThreads, 0, stream>>>(x, g, q, p, partials, parts, body, residual);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void dequant_tensor_cuda(int device, const uint8_t* body, const QuantGeometry& g, const ScaleParams& p, float* out) {
  launch(device, pack_groups(g.n), dequant_tensor_kernel, body, g, p, out);
}

void block_scales_cuda(int device, const float* x, int64_t n, int64_t block, const ScaleParams& p, float* partials,
                       uint8_t* wire, float* a, float* b, float* step, float* lo) {
  // Few long blocks: a warp each would leave the device mostly idle (64 blocks of 256K elements: 64
  // warps), so CUDA blocks reduce slices of kLongSlice elements or more, as many as the scratch holds.
  const int64_t max_partials = kQuantPartialFloats / 2;
  if (block >= 2 * kLongSlice && p.groups <= max_partials / 2) {
    const int slices = static_cast<int>(std::min<int64_t>(block / kLongSlice, max_partials / p.groups));
    const auto index = static_cast<c10::DeviceIndex>(device);
    const c10::cuda::CUDAGuard guard(index);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(index);
    segment_partials_kernel<<<dim3(slices, static_cast<unsigned>(p.groups)), kThreads, 0, stream>>>(x, n, block,
                                                                                                    partials);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    launch(device, p.groups, segment_scales_kernel, static_cast<const float*>(partials), slices, p, wire, a, b, step,
           lo);
    return;
  }
  // Blocks of 1K elements or more are long enough for a warp each; shorter ones go 32 to a warp.
  const int per_warp = block >= 1024 ? 1 : 32;
  launch(device, (p.groups + per_warp - 1) / per_warp * 32, block_scales_kernel, x, n, block, per_warp, p, wire, a, b,
         step, lo);
}

void channel_scales_cuda(int device, const float* x, int64_t outer, int64_t inner, const ScaleParams& p, uint8_t* wire,
                         float* a, float* b, float* step, float* lo) {
  launch(device, inner == 1 ? p.groups : p.groups * 32, channel_scales_kernel, x, outer, inner, p, wire, a, b, step,
         lo);
}

void quant_scales_cuda(int device, const float* v, const float* mx, const ScaleParams& p, uint8_t* wire, float* a,
                       float* b, float* step, float* lo) {
  launch(device, p.groups, scales_kernel, v, mx, p, wire, a, b, step, lo);
}

void quant_derive_cuda(int device, const uint8_t* wire, const ScaleParams& p, float* step, float* lo) {
  launch(device, p.groups, derive_kernel, wire, p, step, lo);
}

void quantise_pack_cuda(int device, const float* x, const QuantGeometry& g, const QuantParams& q, uint8_t* out) {
  launch(device, pack_groups(g.n), quantise_pack_kernel, x, g, q, out);
}

void quantise_pack_residual_cuda(int device, const float* x, const QuantGeometry& g, const QuantParams& q,
                                 const DequantParams& d, uint8_t* out, float* residual) {
  launch(device, pack_groups(g.n), quantise_pack_residual_kernel, x, g, q, d, out, residual);
}

void unpack_dequantise_cuda(int device, const uint8_t* in, const QuantGeometry& g, const DequantParams& q, float* out) {
  launch(device, pack_groups(g.n), unpack_dequantise_kernel, in, g, q, out);
}

}  // namespace tl::codec::gpu
