#pragma once
// Fused CUDA kernels of the sparse codecs' packing (TopK, RandK, threshold): after the selection
// (ATen ops on a device: Note [fused sparse packing] in compression/codecs/sparse.cpp), one kernel
// gathers the kept values, casts them to the wire type and writes them with their index into the
// payload body; the inverse scatters the values of a body into a dense tensor. The same per-entry
// and per-byte logic (sparse_logic.h) runs serially on the host for the CPU tests
// (HostEmulationGuard in quant_cuda.h). Which path a CUDA tensor takes: Note [CUDA kernels or ATen
// ops] in quant_cuda.h.

#include <cstdint>

#include "compression/cuda/hd.h"

namespace tl::codec::gpu {

/// Value types on the wire, as the kernels know them.
enum class WireType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };
TL_HD int wire_size(WireType w) { return w == WireType::kF32 ? 4 : 2; }

/// The layout of a plain sparse payload body: [index bytes][n values], with the index either
/// n little-endian integers of `index_width` bytes (IndexFormat::kInt) or a bitmap of
/// ceil(universe / 8) bytes, LSB first (IndexFormat::kBitmap). Delta varints are not packed here.
struct SparseLayout {
  int64_t n;            // kept entries (rows * k)
  int64_t universe;     // elements of the tensor
  bool bitmap;          // else int
  int index_width;      // int: 4 or 8 bytes an index
  int64_t index_bytes;  // n * index_width, or ceil(universe / 8)
  WireType wire;
};

/// Pointers into the memory of CUDA device `device`, on its current stream (no host
/// synchronisation). x: (universe) float32; idx: (n) int64, strictly increasing; body: index_bytes
/// + n * wire_size bytes, every one written. Error in a build without the kernels.
void sparse_pack_cuda(int device, const float* x, const int64_t* idx, const SparseLayout& s, uint8_t* body);
/// Bitmap bytes a chunk of the decode's ranks (a warp's lanes), and the chunks of `bytes` bytes.
constexpr int64_t kBitmapChunk = 32;
TL_HD int64_t bitmap_chunks(int64_t bytes) { return (bytes + kBitmapChunk - 1) / kBitmapChunk; }
/// counts[c] = set bits of chunk c of the bitmap (bitmap_chunks(bytes) of them: Note [bitmap ranks
/// by chunks] in sparse_logic.h); their inclusive prefix sums are the `ranks` sparse_unpack_cuda
/// takes for a bitmap index (unused for an int index).
void bitmap_counts_cuda(int device, const uint8_t* bitmap, int64_t bytes, int64_t* counts);
/// out: (universe) float32, 16-byte aligned. Int index: out must be zeros, the kept entries are
/// written. Bitmap: every element is written (zero where the bit is clear).
void sparse_unpack_cuda(int device, const uint8_t* body, const int64_t* ranks, const SparseLayout& s, float* out);

/// The same logic on host pointers, one work item after another (what each CUDA thread does).
void sparse_pack_host(const float* x, const int64_t* idx, const SparseLayout& s, uint8_t* body);
void bitmap_counts_host(const uint8_t* bitmap, int64_t bytes, int64_t* counts);
void sparse_unpack_host(const uint8_t* body, const int64_t* ranks, const SparseLayout& s, float* out);
/// How many times sparse_pack_host and sparse_unpack_host ran on this thread (tests: that a codec
/// took the kernels' logic under HostEmulationGuard, not its own path).
int64_t sparse_host_runs();

}  // namespace tl::codec::gpu
