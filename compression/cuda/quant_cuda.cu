// The fused quantisation kernels: one CUDA thread per group of 8 elements runs the logic of
// quant_logic.h (Note [one logic, two compilers]). Built only where CMake found nvcc and a CUDA
// libtorch (compression/CMakeLists.txt), for the architectures in TAPELINE_CUDA_ARCHITECTURES.

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>

#include "compression/cuda/quant_cuda.h"
#include "compression/cuda/quant_logic.h"

namespace tl::codec::gpu {
namespace {

constexpr int kThreads = 256;

// Enough blocks to fill the device; each thread strides over the groups.
int grid_for(int64_t groups) {
  const int64_t blocks = (groups + kThreads - 1) / kThreads;
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(blocks, 1), 65535));
}

__global__ void quantise_pack_kernel(const float* x, QuantGeometry g, QuantParams q, uint8_t* out) {
  const int64_t groups = pack_groups(g.n);
  for (int64_t grp = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; grp < groups;
       grp += int64_t(gridDim.x) * blockDim.x)
    quantise_pack_group(x, grp, g, q, out);
}

__global__ void quantise_pack_residual_kernel(const float* x, QuantGeometry g, QuantParams q, DequantParams d,
                                              uint8_t* out, float* residual) {
  const int64_t groups = pack_groups(g.n);
  for (int64_t grp = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; grp < groups;
       grp += int64_t(gridDim.x) * blockDim.x)
    quantise_pack_residual_group(x, grp, g, q, d, out, residual);
}

__global__ void unpack_dequantise_kernel(const uint8_t* in, QuantGeometry g, DequantParams q, float* out) {
  const int64_t groups = pack_groups(g.n);
  for (int64_t grp = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; grp < groups;
       grp += int64_t(gridDim.x) * blockDim.x)
    unpack_dequantise_group(in, grp, g, q, out);
}

}  // namespace

// The tensors' device, which need not be the current one (rank r of a run uses device r).
void quantise_pack_cuda(int device, const float* x, const QuantGeometry& g, const QuantParams& q, uint8_t* out) {
  if (g.n == 0) return;
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
  quantise_pack_kernel<<<grid_for(pack_groups(g.n)), kThreads, 0, stream>>>(x, g, q, out);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void quantise_pack_residual_cuda(int device, const float* x, const QuantGeometry& g, const QuantParams& q,
                                 const DequantParams& d, uint8_t* out, float* residual) {
  if (g.n == 0) return;
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
  quantise_pack_residual_kernel<<<grid_for(pack_groups(g.n)), kThreads, 0, stream>>>(x, g, q, d, out, residual);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void unpack_dequantise_cuda(int device, const uint8_t* in, const QuantGeometry& g, const DequantParams& q, float* out) {
  if (g.n == 0) return;
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
  unpack_dequantise_kernel<<<grid_for(pack_groups(g.n)), kThreads, 0, stream>>>(in, g, q, out);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace tl::codec::gpu
