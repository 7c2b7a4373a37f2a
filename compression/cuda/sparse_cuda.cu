// The fused sparse packing kernels: one CUDA thread per work item of sparse_logic.h (an entry, a
// bitmap byte: Note [sparse packing, one writer per byte]). Built only where CMake found nvcc and a
// CUDA libtorch (compression/CMakeLists.txt).

#include "compression/cuda/launch.cuh"
#include "compression/cuda/sparse_cuda.h"
#include "compression/cuda/sparse_logic.h"

namespace tl::codec::gpu {
namespace {

__global__ void pack_kernel(const float* x, const int64_t* idx, SparseLayout s, uint8_t* body) {
  for (int64_t t = first_item(), e = pack_items(s); t < e; t += item_stride()) pack_item(x, idx, t, s, body);
}

__global__ void bitmap_counts_kernel(const uint8_t* bitmap, int64_t bytes, int64_t* counts) {
  for (int64_t b = first_item(); b < bytes; b += item_stride()) counts[b] = popcount8(bitmap[b]);
}

__global__ void unpack_kernel(const uint8_t* body, const int64_t* ranks, SparseLayout s, float* out) {
  for (int64_t t = first_item(), e = unpack_items(s); t < e; t += item_stride()) unpack_item(body, ranks, t, s, out);
}

}  // namespace

void sparse_pack_cuda(int device, const float* x, const int64_t* idx, const SparseLayout& s, uint8_t* body) {
  launch(device, pack_items(s), pack_kernel, x, idx, s, body);
}

void bitmap_counts_cuda(int device, const uint8_t* bitmap, int64_t bytes, int64_t* counts) {
  launch(device, bytes, bitmap_counts_kernel, bitmap, bytes, counts);
}

void sparse_unpack_cuda(int device, const uint8_t* body, const int64_t* ranks, const SparseLayout& s, float* out) {
  launch(device, unpack_items(s), unpack_kernel, body, ranks, s, out);
}

}  // namespace tl::codec::gpu
