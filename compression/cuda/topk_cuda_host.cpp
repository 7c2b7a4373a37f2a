// TopK's device selection: the plugin's launcher, and the host loops running its steps serially
// (Note [radix top-k on a device] in topk_logic.h), each step what the kernels' threads together do.
#include "compression/cuda/entries.h"
#include "compression/cuda/topk_cuda.h"

namespace tl::codec::gpu {
namespace {
thread_local int64_t t_topk_host_runs = 0;
}  // namespace

// The launcher lives in the plugin (Note [CUDA as a plugin], autograd/cuda_plugin.h).
void topk_select_cuda(int device, const float* x, const TopkShape& s, uint8_t* zeroed, uint8_t* rest, int64_t* idx) {
  TL_CUDA_CALL(tl_cuda_topk_select, "topk", device, x, s, zeroed, rest, idx);
}

void topk_select_host(const float* x, const TopkShape& s, uint8_t* zeroed, uint8_t* rest, int64_t* idx) {
  ++t_topk_host_runs;
  const TopkBuffers b = topk_buffers(s, zeroed, rest);
  const int64_t tiles = topk_tiles(s), tpr = tiles_per_row(s);
  auto hist = [&](int pass, int64_t r) { return b.hist + (pass * s.rows + r) * kRadixBins; };
  for (int64_t t = 0; t < tiles; ++t) {  // hist0_kernel
    const int64_t at = tile_offset(s, t), len = tile_len(tile_begin(s, t), s.D);
    for (int64_t i = 0; i < len; ++i) ++hist(0, t / tpr)[radix_digit(topk_key(x[at + i]), 0)];
  }
  for (int64_t r = 0; r < s.rows; ++r) {  // find_kernel<0>
    b.row[r].remaining = s.k;
    radix_find_serial(hist(0, r), 0, b.row[r]);
  }
  for (int64_t t = 0; t < tiles; ++t) {  // split_kernel
    const int64_t at = tile_offset(s, t), len = tile_len(tile_begin(s, t), s.D);
    const uint32_t b0 = b.row[t / tpr].prefix >> radix_shift(0);
    b.cand_n[t] = b.tile_above[t] = 0;
    for (int64_t i = 0; i < len; ++i) {
      const uint32_t key = topk_key(x[at + i]), d = radix_digit(key, 0);
      if (d > b0) ++b.tile_above[t];
      if (d == b0) b.cand[at + b.cand_n[t]++] = key;
    }
  }
  for (int pass = 1; pass < kRadixPasses; ++pass) {
    for (int64_t t = 0; t < tiles; ++t)  // cand_hist_kernel<pass>
      for (uint32_t i = 0; i < b.cand_n[t]; ++i) {
        const uint32_t key = b.cand[tile_offset(s, t) + i];
        if (radix_matches(key, b.row[t / tpr])) ++hist(pass, t / tpr)[radix_digit(key, pass)];
      }
    for (int64_t r = 0; r < s.rows; ++r) radix_find_serial(hist(pass, r), pass, b.row[r]);  // find_kernel<pass>
  }
  for (int64_t t = 0; t < tiles; ++t) {  // count_kernel
    uint32_t c = b.tile_above[t];
    for (uint32_t i = 0; i < b.cand_n[t]; ++i) c += topk_flags(b.cand[tile_offset(s, t) + i], b.row[t / tpr].prefix);
    b.tile_counts[t] = c;
  }
  for (int64_t r = 0; r < s.rows; ++r) {  // scan_kernel
    uint32_t gt = 0, eq = 0;
    for (int64_t t = r * tpr; t < (r + 1) * tpr; ++t) {
      b.tile_gt[t] = gt, b.tile_eq[t] = eq;
      gt += b.tile_counts[t] & 0xffffu, eq += b.tile_counts[t] >> 16;
    }
  }
  for (int64_t t = 0; t < tiles; ++t) {  // write_kernel
    const int64_t r = t / tpr, at = tile_offset(s, t), len = tile_len(tile_begin(s, t), s.D);
    int64_t gt = b.tile_gt[t], eq = b.tile_eq[t];
    for (int64_t i = 0; i < len; ++i)
      topk_emit(topk_key(x[at + i]), b.row[r].prefix, b.row[r].remaining, at + i, gt, eq, idx + r * s.k);
  }
}

int64_t topk_host_runs() { return t_topk_host_runs; }

}  // namespace tl::codec::gpu
