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
  for (int64_t c = first_item(), e = bitmap_chunks(bytes); c < e; c += item_stride())
    counts[c] = bitmap_chunk_count(bitmap, bytes, c);
}

__global__ void unpack_entries_kernel(const uint8_t* body, SparseLayout s, float* out) {
  for (int64_t i = first_item(); i < s.n; i += item_stride()) unpack_entry(body, i, s, out);
}

// A warp a chunk of the bitmap, a lane a byte (Note [bitmap ranks by chunks]).
__global__ void unpack_bitmap_kernel(const uint8_t* body, const int64_t* ranks, SparseLayout s, float* out) {
  const int lane = threadIdx.x % 32;
  for (int64_t c = first_item() / 32, e = bitmap_chunks(s.index_bytes); c < e; c += item_stride() / 32) {
    const int64_t b = c * kBitmapChunk + lane;
    const int count = b < s.index_bytes ? popcount8(body[b]) : 0;
    int inclusive = count;
    for (int o = 1; o < 32; o *= 2) {
      const int n = __shfl_up_sync(0xffffffffu, inclusive, o);
      if (lane >= o) inclusive += n;
    }
    if (b < s.index_bytes) unpack_bitmap_byte(body, (c > 0 ? ranks[c - 1] : 0) + inclusive - count, b, s, out);
  }
}

}  // namespace

void sparse_pack_cuda(int device, const float* x, const int64_t* idx, const SparseLayout& s, uint8_t* body) {
  if (s.bitmap && s.index_bytes > 0) {  // the bytes no entry writes (Note [sparse packing, one writer per byte])
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    C10_CUDA_CHECK(cudaMemsetAsync(body, 0, s.index_bytes, c10::cuda::getCurrentCUDAStream(device)));
  }
  launch(device, pack_items(s), pack_kernel, x, idx, s, body);
}

void bitmap_counts_cuda(int device, const uint8_t* bitmap, int64_t bytes, int64_t* counts) {
  launch(device, bitmap_chunks(bytes), bitmap_counts_kernel, bitmap, bytes, counts);
}

void sparse_unpack_cuda(int device, const uint8_t* body, const int64_t* ranks, const SparseLayout& s, float* out) {
  if (s.bitmap)
    launch(device, bitmap_chunks(s.index_bytes) * 32, unpack_bitmap_kernel, body, ranks, s, out);
  else
    launch(device, s.n, unpack_entries_kernel, body, s, out);
}

}  // namespace tl::codec::gpu
