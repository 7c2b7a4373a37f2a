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

}  // namespace

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
