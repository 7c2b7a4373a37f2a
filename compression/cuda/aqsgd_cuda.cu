// AQ-SGD's cache kernels: one CUDA thread per element of the micro-batch runs the logic of
// aqsgd_logic.h. Built only where CMake found nvcc and a CUDA libtorch (compression/CMakeLists.txt).

#include "compression/cuda/aqsgd_cuda.h"
#include "compression/cuda/aqsgd_logic.h"
#include "compression/cuda/launch.cuh"

namespace tl::codec::gpu {
namespace {

__global__ void delta_kernel(const float* x, CacheRows m, float* delta) {
  for (int64_t i = first_item(), e = cache_items(m); i < e; i += item_stride()) aqsgd_delta_item(x, m, i, delta);
}

__global__ void update_kernel(const float* c, CacheRows m, float* out) {
  for (int64_t i = first_item(), e = cache_items(m); i < e; i += item_stride()) aqsgd_update_item(c, m, i, out);
}

}  // namespace

void aqsgd_delta_cuda(int device, const float* x, const CacheRows& m, float* delta) {
  launch(device, cache_items(m), delta_kernel, x, m, delta);
}

void aqsgd_update_cuda(int device, const float* c, const CacheRows& m, float* out) {
  launch(device, cache_items(m), update_kernel, c, m, out);
}

}  // namespace tl::codec::gpu
