#include "compression/cuda/quant_cuda.h"  // no_cuda_kernels
#include "compression/cuda/sparse_cuda.h"
#include "compression/cuda/sparse_logic.h"

namespace tl::codec::gpu {
namespace {
thread_local int64_t t_host_runs = 0;
}  // namespace

#ifndef TAPELINE_CUDA_KERNELS
void sparse_pack_cuda(int, const float*, const int64_t*, const SparseLayout&, uint8_t*) { no_cuda_kernels("sparse"); }
void bitmap_counts_cuda(int, const uint8_t*, int64_t, int64_t*) { no_cuda_kernels("sparse"); }
void sparse_unpack_cuda(int, const uint8_t*, const int64_t*, const SparseLayout&, float*) { no_cuda_kernels("sparse"); }
#endif

void sparse_pack_host(const float* x, const int64_t* idx, const SparseLayout& s, uint8_t* body) {
  ++t_host_runs;
  for (int64_t t = 0, e = pack_items(s); t < e; ++t) pack_item(x, idx, t, s, body);
}

void bitmap_counts_host(const uint8_t* bitmap, int64_t bytes, int64_t* counts) {
  for (int64_t b = 0; b < bytes; ++b) counts[b] = popcount8(bitmap[b]);
}

void sparse_unpack_host(const uint8_t* body, const int64_t* ranks, const SparseLayout& s, float* out) {
  ++t_host_runs;
  for (int64_t t = 0, e = unpack_items(s); t < e; ++t) unpack_item(body, ranks, t, s, out);
}

int64_t sparse_host_runs() { return t_host_runs; }

}  // namespace tl::codec::gpu
