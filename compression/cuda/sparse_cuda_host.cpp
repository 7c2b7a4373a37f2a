#include <cstring>

#include "compression/cuda/entries.h"
#include "compression/cuda/quant_cuda.h"  // no_cuda_kernels
#include "compression/cuda/sparse_cuda.h"
#include "compression/cuda/sparse_logic.h"

namespace tl::codec::gpu {
namespace {
thread_local int64_t t_sparse_host_runs = 0;
}  // namespace

// The launchers live in the plugin (Note [CUDA as a plugin], autograd/cuda_plugin.h).
void sparse_pack_cuda(int device, const float* x, const int64_t* idx, const SparseLayout& s, uint8_t* body) {
  TL_CUDA_CALL(tl_cuda_sparse_pack, "sparse", device, x, idx, s, body);
}
void bitmap_counts_cuda(int device, const uint8_t* bitmap, int64_t bytes, int64_t* counts) {
  TL_CUDA_CALL(tl_cuda_bitmap_counts, "sparse", device, bitmap, bytes, counts);
}
void sparse_unpack_cuda(int device, const uint8_t* body, const int64_t* ranks, const SparseLayout& s, float* out) {
  TL_CUDA_CALL(tl_cuda_sparse_unpack, "sparse", device, body, ranks, s, out);
}

void sparse_pack_host(const float* x, const int64_t* idx, const SparseLayout& s, uint8_t* body) {
  ++t_sparse_host_runs;
  if (s.bitmap) std::memset(body, 0, s.index_bytes);
  for (int64_t t = 0, e = pack_items(s); t < e; ++t) pack_item(x, idx, t, s, body);
}

void bitmap_counts_host(const uint8_t* bitmap, int64_t bytes, int64_t* counts) {
  for (int64_t c = 0, e = bitmap_chunks(bytes); c < e; ++c) counts[c] = bitmap_chunk_count(bitmap, bytes, c);
}

void sparse_unpack_host(const uint8_t* body, const int64_t* ranks, const SparseLayout& s, float* out) {
  ++t_sparse_host_runs;
  if (!s.bitmap) {
    for (int64_t i = 0; i < s.n; ++i) unpack_entry(body, i, s, out);
    return;
  }
  // A chunk's bytes in order: its first byte's rank from the chunk before, then the bytes' counts.
  for (int64_t c = 0, e = bitmap_chunks(s.index_bytes); c < e; ++c) {
    int64_t before = c > 0 ? ranks[c - 1] : 0;
    for (int64_t b = c * kBitmapChunk; b < s.index_bytes && b < (c + 1) * kBitmapChunk; ++b) {
      unpack_bitmap_byte(body, before, b, s, out);
      before += popcount8(body[b]);
    }
  }
}

int64_t sparse_host_runs() { return t_sparse_host_runs; }

}  // namespace tl::codec::gpu
