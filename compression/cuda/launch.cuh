#pragma once
// How the codec kernels are launched (included by the .cu files only): 256 threads a block,
// enough blocks to fill the device, each thread striding over the work items, on the current
// stream of the tensors' device (which need not be the current device: rank r uses device r).

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdint>

namespace tl::codec::gpu {

constexpr int kThreads = 256;

inline int grid_for(int64_t items) {
  const int64_t blocks = (items + kThreads - 1) / kThreads;
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(blocks, 1), 65535));
}

/// The first work item of this thread, and the stride to its next.
__device__ __forceinline__ int64_t first_item() { return blockIdx.x * int64_t(blockDim.x) + threadIdx.x; }
__device__ __forceinline__ int64_t item_stride() { return int64_t(gridDim.x) * blockDim.x; }

/// Blocks of kThreads that `kKernel` can keep resident on the device at once (its registers and
/// shared memory decide how many fit a multiprocessor), at most grid_for(items): one wave, so that
/// a per-block prologue or epilogue (quant_tensor_kernel reducing its partials, a shared histogram
/// flushed) runs once a block. Asked of CUDA once per kernel and device.
template <auto kKernel>
int resident_grid(int device, int64_t items) {
  static int blocks[64] = {};
  int& b = blocks[device & 63];
  if (b == 0) {
    int sms = 0, per_sm = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, kThreads, 0));
    b = sms * std::max(per_sm, 1);
  }
  return static_cast<int>(std::min<int64_t>(grid_for(items), b));
}

/// kernel<<<...>>>(args...) over `items` work items on `device`; nothing when there are none.
template <class... Params, class... Args>
void launch(int device, int64_t items, void (*kernel)(Params...), Args... args) {
  if (items == 0) return;
  const auto index = static_cast<c10::DeviceIndex>(device);
  const c10::cuda::CUDAGuard guard(index);
  kernel<<<grid_for(items), kThreads, 0, c10::cuda::getCurrentCUDAStream(index)>>>(args...);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace tl::codec::gpu
