// TopK's selection kernels: the radix select of the k-th largest key of each row, then the ordered
// compaction of the kept indices (Note [radix top-k on a device] in topk_logic.h). Built only
// where CMake found nvcc and a CUDA libtorch (compression/CMakeLists.txt).

#include "compression/cuda/launch.cuh"
#include "compression/cuda/topk_cuda.h"

namespace tl::codec::gpu {
namespace {

constexpr unsigned kFull = 0xffffffffu;

// The exclusive prefix sum of v over the block's threads in order, and (in *total) their sum.
// Every thread of the block must call it; it synchronises the block twice.
template <class T>
__device__ T block_exclusive_scan(T v, T* total) {
  __shared__ T warp_sums[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  T inclusive = v;
  for (int o = 1; o < 32; o *= 2) {
    const T n = __shfl_up_sync(kFull, inclusive, o);
    if (lane >= o) inclusive += n;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  T before = 0, all = 0;
  for (int w = 0; w < kThreads / 32; ++w) {
    if (w < warp) before += warp_sums[w];
    all += warp_sums[w];
  }
  __syncthreads();  // warp_sums is free for the next call
  *total = all;
  return before + inclusive - v;
}

// Adds the block's shared histogram to a row's in global memory, and clears it.
__device__ void flush_histogram(uint32_t* shared, int bins, uint32_t* global) {
  __syncthreads();
  for (int i = threadIdx.x; i < bins; i += kThreads)
    if (shared[i] != 0) atomicAdd(global + i, shared[i]), shared[i] = 0;
  __syncthreads();
}

constexpr int kRounds = kTopkTile / kThreads;  // 16 coalesced rounds a tile

// Loads tile t's keys, round j's at keys[j] (element j * kThreads + threadIdx.x); 0 past its end.
__device__ __forceinline__ void load_tile_keys(const float* x, const TopkShape& s, int64_t t, uint32_t (&keys)[kRounds],
                                               int& len) {
  len = static_cast<int>(tile_len(tile_begin(s, t), s.D));
  const float* xs = x + tile_offset(s, t);
  TL_UNROLL for (int j = 0; j < kRounds; ++j) {
    const int i = j * kThreads + threadIdx.x;
    keys[j] = i < len ? topk_key(xs[i]) : 0;
  }
}

// Pass 0 over x, or passes 1 and 2 over the candidates (kPass): each block takes a contiguous run
// of tiles (one or more), so it flushes its shared histogram only where the row changes.
template <int kPass>
__global__ void hist_kernel(const float* x, TopkShape s, TopkBuffers b) {
  constexpr int bins = kPass == 2 ? 512 : kRadixBins;
  __shared__ uint32_t hist[bins];
  for (int i = threadIdx.x; i < bins; i += kThreads) hist[i] = 0;
  __syncthreads();
  const int64_t tiles = topk_tiles(s), tpr = tiles_per_row(s);
  const int64_t t0 = tiles * blockIdx.x / gridDim.x, t1 = tiles * (blockIdx.x + 1) / gridDim.x;
  if (t0 >= t1) return;
  int64_t row = t0 / tpr;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t r = t / tpr;
    if (r != row) flush_histogram(hist, bins, b.hist + (kPass * s.rows + row) * kRadixBins), row = r;
    if (kPass == 0) {
      uint32_t keys[kRounds];
      int len;
      load_tile_keys(x, s, t, keys, len);
      TL_UNROLL for (int j = 0; j < kRounds; ++j) {
        if (j * kThreads + static_cast<int>(threadIdx.x) < len) atomicAdd(hist + radix_digit(keys[j], 0), 1u);
      }
    } else {
      const RadixRow rs = b.row[r];
      const uint32_t* cs = b.cand + tile_offset(s, t);
      for (int64_t i = threadIdx.x, n = b.cand_n[t]; i < n; i += kThreads)
        if (radix_matches(cs[i], rs)) atomicAdd(hist + radix_digit(cs[i], kPass), 1u);
    }
  }
  flush_histogram(hist, bins, b.hist + (kPass * s.rows + row) * kRadixBins);
}

// A block per row: thread j sums bins_per_thread bins from the top down, a block scan gives the
// keys above its bins, and the one thread whose bins hold the remaining-th largest walks them.
template <int kPass>
__global__ void find_kernel(TopkShape s, TopkBuffers b) {
  constexpr int bins = kPass == 2 ? 512 : kRadixBins, per = bins / kThreads;
  const int64_t r = blockIdx.x;
  const uint32_t* h = b.hist + (kPass * s.rows + r) * kRadixBins;
  const int top = bins - 1 - static_cast<int>(threadIdx.x) * per;
  // Read before the scan's barriers: the thread that finds the bin writes the row's state back.
  RadixRow row = b.row[r];
  if (kPass == 0) row.remaining = s.k;
  uint32_t sum = 0;
  TL_UNROLL for (int q = 0; q < per; ++q) sum += h[top - q];
  uint32_t total;
  const uint32_t before = block_exclusive_scan(sum, &total);
  if (before < row.remaining && row.remaining <= int64_t(before) + sum) {
    int64_t above = before;
    for (int q = 0; q < per; ++q) {
      const uint32_t c = h[top - q];
      if (above + c >= row.remaining) {
        radix_fix(row, kPass, static_cast<uint32_t>(top - q), above);
        break;
      }
      above += c;
    }
    b.row[r] = row;
  }
}

// A block per tile: the keys above bin b0 counted, those in it appended to the tile's candidates
// (a warp reserving its slots at once; their order does not matter).
__global__ void split_kernel(const float* x, TopkShape s, TopkBuffers b) {
  __shared__ uint32_t n_cand, n_above;
  const int64_t tiles = topk_tiles(s), tpr = tiles_per_row(s);
  const int lane = threadIdx.x % 32;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    uint32_t keys[kRounds];
    int len;
    load_tile_keys(x, s, t, keys, len);
    const uint32_t b0 = b.row[t / tpr].prefix >> radix_shift(0);
    if (threadIdx.x == 0) n_cand = 0, n_above = 0;
    __syncthreads();
    uint32_t* cs = b.cand + tile_offset(s, t);
    uint32_t above = 0;
    TL_UNROLL for (int j = 0; j < kRounds; ++j) {
      const bool in = j * kThreads + static_cast<int>(threadIdx.x) < len;
      const uint32_t d = radix_digit(keys[j], 0);
      above += in && d > b0;
      const unsigned ballot = __ballot_sync(kFull, in && d == b0);
      if (ballot == 0) continue;  // the same in every lane
      uint32_t at = 0;
      if (lane == 0) at = atomicAdd(&n_cand, static_cast<uint32_t>(__popc(ballot)));
      at = __shfl_sync(kFull, at, 0);
      if (ballot >> lane & 1) cs[at + __popc(ballot & ((1u << lane) - 1))] = keys[j];
    }
    for (int o = 16; o > 0; o /= 2) above += __shfl_xor_sync(kFull, above, o);
    if (lane == 0) atomicAdd(&n_above, above);
    __syncthreads();
    if (threadIdx.x == 0) b.cand_n[t] = n_cand, b.tile_above[t] = n_above;
  }
}

// A warp per tile: the keys > t (those above b0 and the candidates above t) and == t, packed.
__global__ void count_kernel(TopkShape s, TopkBuffers b) {
  const int64_t tiles = topk_tiles(s), tpr = tiles_per_row(s);
  const int lane = threadIdx.x % 32;
  for (int64_t t = first_item() / 32; t < tiles; t += item_stride() / 32) {
    const uint32_t th = b.row[t / tpr].prefix, n = b.cand_n[t];
    const uint32_t* cs = b.cand + tile_offset(s, t);
    uint32_t c = 0;
    for (uint32_t i = lane; i < n; i += 32) c += topk_flags(cs[i], th);
    for (int o = 16; o > 0; o /= 2) c += __shfl_xor_sync(kFull, c, o);
    if (lane == 0) b.tile_counts[t] = b.tile_above[t] + c;
  }
}

// A block per row: exclusive offsets of its tiles' counts, > t in the low 32 bits and == t in the
// high (each below 2^32: a row has fewer elements).
__global__ void scan_kernel(TopkShape s, TopkBuffers b) {
  const int64_t tpr = tiles_per_row(s), first = blockIdx.x * tpr;
  unsigned long long carry = 0;
  for (int64_t base = 0; base < tpr; base += kThreads) {
    const int64_t j = base + threadIdx.x;
    const uint32_t c = j < tpr ? b.tile_counts[first + j] : 0;
    unsigned long long total;
    const unsigned long long packed = (c & 0xffffull) | static_cast<unsigned long long>(c >> 16) << 32;
    const unsigned long long before = carry + block_exclusive_scan(packed, &total);
    if (j < tpr)
      b.tile_gt[first + j] = static_cast<uint32_t>(before), b.tile_eq[first + j] = static_cast<uint32_t>(before >> 32);
    carry += total;
  }
}

// A block per tile; warp w takes elements [512 w, 512 w + 512) in 16 rounds of 32 consecutive ones.
// The warps' counts first (ballots), a scan over the 8 warps, then the rounds again, each lane
// placing its element with the counts of the lanes and rounds before it (topk_emit's positions).
// The ballots stay in registers for the second loop (72 registers; taking them again in 56
// registers, four blocks a multiprocessor, took 66 us instead of 58 at 64 MiB on an H100).
__global__ void write_kernel(const float* x, TopkShape s, TopkBuffers b, int64_t* idx) {
  constexpr int kWarps = kThreads / 32, kSpan = kTopkTile / kWarps;  // 512 elements a warp
  __shared__ uint32_t warp_counts[kWarps];
  const int64_t tiles = topk_tiles(s), tpr = tiles_per_row(s);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned lower = (1u << lane) - 1;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t r = t / tpr, at = tile_offset(s, t);
    const int len = static_cast<int>(tile_len(tile_begin(s, t), s.D));
    const RadixRow row = b.row[r];
    const float* xs = x + at + warp * kSpan;
    uint32_t keys[kRounds], gts[kRounds], eqs[kRounds], c = 0;
    TL_UNROLL for (int j = 0; j < kRounds; ++j) {
      const int i = warp * kSpan + j * 32 + lane;
      keys[j] = i < len ? topk_key(xs[j * 32 + lane]) : 0;
      gts[j] = __ballot_sync(kFull, i < len && keys[j] > row.prefix);
      eqs[j] = __ballot_sync(kFull, i < len && keys[j] == row.prefix);
      c += __popc(gts[j]) | __popc(eqs[j]) << 16;
    }
    if (lane == 0) warp_counts[warp] = c;
    __syncthreads();
    uint32_t before = 0;
    for (int w = 0; w < warp; ++w) before += warp_counts[w];
    __syncthreads();  // warp_counts is free for the next tile
    int64_t gt = b.tile_gt[t] + (before & 0xffffu), eq = b.tile_eq[t] + (before >> 16);
    int64_t* out = idx + r * s.k;
    TL_UNROLL for (int j = 0; j < kRounds; ++j) {
      if (gts[j] >> lane & 1) {
        const int64_t e = eq + __popc(eqs[j] & lower);
        out[gt + __popc(gts[j] & lower) + (e < row.remaining ? e : row.remaining)] = at + warp * kSpan + j * 32 + lane;
      } else if (eqs[j] >> lane & 1) {
        const int64_t e = eq + __popc(eqs[j] & lower);
        if (e < row.remaining) out[gt + __popc(gts[j] & lower) + e] = at + warp * kSpan + j * 32 + lane;
      }
      gt += __popc(gts[j]), eq += __popc(eqs[j]);
    }
  }
}

constexpr int kMaxGrid = 1 << 20;

}  // namespace

void topk_select_cuda(int device, const float* x, const TopkShape& s, uint8_t* zeroed, uint8_t* rest, int64_t* idx) {
  const int64_t tiles = topk_tiles(s);
  if (tiles == 0) return;
  const auto index = static_cast<c10::DeviceIndex>(device);
  const c10::cuda::CUDAGuard guard(index);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(index);
  const TopkBuffers b = topk_buffers(s, zeroed, rest);
  const int rows = static_cast<int>(s.rows);  // topk_fits_radix: rows * 2048 <= max(N, 2^18)
  const int per_tile = static_cast<int>(std::min<int64_t>(tiles, kMaxGrid));
  // The histograms: one wave of blocks, each a run of tiles (grid_for counts threads). (A block a
  // tile took the candidates' passes from 13 and 12 us to 23 and 19 on an H100, 64 MiB.)
  const int64_t items = tiles * kThreads;
  const int g0 = resident_grid<hist_kernel<0>>(device, items), g1 = resident_grid<hist_kernel<1>>(device, items),
            g2 = resident_grid<hist_kernel<2>>(device, items);
  hist_kernel<0><<<g0, kThreads, 0, stream>>>(x, s, b);
  find_kernel<0><<<rows, kThreads, 0, stream>>>(s, b);
  split_kernel<<<per_tile, kThreads, 0, stream>>>(x, s, b);
  hist_kernel<1><<<g1, kThreads, 0, stream>>>(x, s, b);
  find_kernel<1><<<rows, kThreads, 0, stream>>>(s, b);
  hist_kernel<2><<<g2, kThreads, 0, stream>>>(x, s, b);
  find_kernel<2><<<rows, kThreads, 0, stream>>>(s, b);
  count_kernel<<<grid_for(tiles * 32), kThreads, 0, stream>>>(s, b);
  scan_kernel<<<rows, kThreads, 0, stream>>>(s, b);
  write_kernel<<<per_tile, kThreads, 0, stream>>>(x, s, b, idx);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace tl::codec::gpu
