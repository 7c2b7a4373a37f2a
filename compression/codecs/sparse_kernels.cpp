#include "compression/codecs/sparse_kernels.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <mutex>

namespace tl::codec {
namespace {

constexpr int64_t kMinChunk = 1 << 15;

int64_t threads() { return at::in_parallel_region() ? 1 : std::max<int64_t>(1, at::get_num_threads()); }

// Bin holding the need-th largest element of a histogram; `need` becomes its rank within the bin.
template <size_t N>
uint32_t walk(const std::array<int64_t, N>& hist, int64_t& need) {
  for (int64_t b = N - 1; b >= 0; --b) {
    if (hist[b] >= need) return static_cast<uint32_t>(b);
    need -= hist[b];
  }
  TORCH_CHECK(false, "topk: internal error: histogram holds fewer elements than k");
}

// Radix select on the 31-bit keys in three levels (12 + 11 + 8 bits). Level 1 scans the row;
// the elements of the boundary bin are gathered and levels 2 and 3 run on them only.
RowCut cut_segment(const float* x, int64_t D, int64_t k) {
  if (k <= 0) return {0xffffffffu, 0};
  if (k >= D) return {0, D};
  const int64_t chunks = std::max<int64_t>(1, std::min(threads(), D / kMinChunk));
  const int64_t len = (D + chunks - 1) / chunks;
  std::vector<std::array<int64_t, 4096>> h1(chunks);
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      auto& h = h1[c];
      h.fill(0);
      for (int64_t j = c * len, e = std::min(D, j + len); j < e; ++j) ++h[magnitude_key(x[j]) >> 19];
    }
  });
  for (int64_t c = 1; c < chunks; ++c)
    for (int b = 0; b < 4096; ++b) h1[0][b] += h1[c][b];
  int64_t need = k;
  const uint32_t b1 = walk(h1[0], need);

  std::vector<std::vector<uint32_t>> cand(chunks);
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t j = c * len, e = std::min(D, j + len); j < e; ++j) {
        const uint32_t key = magnitude_key(x[j]);
        if ((key >> 19) == b1) cand[c].push_back(key);
      }
  });
  std::array<int64_t, 2048> h2{};
  for (const auto& v : cand)
    for (uint32_t key : v) ++h2[(key >> 8) & 0x7ff];
  const uint32_t b2 = walk(h2, need);
  std::array<int64_t, 256> h3{};
  const uint32_t prefix = (b1 << 11) | b2;
  for (const auto& v : cand)
    for (uint32_t key : v)
      if ((key >> 8) == prefix) ++h3[key & 0xff];
  const uint32_t b3 = walk(h3, need);
  return {(prefix << 8) | b3, need};
}

// Splits rows into chunks for emission: whole rows when there are enough of them, else pieces.
struct Chunk {
  int64_t row, begin, end;
};
std::vector<Chunk> make_chunks(int64_t rows, int64_t D) {
  const int64_t t = threads();
  const int64_t pieces = rows >= 2 * t ? 1 : std::max<int64_t>(1, std::min((2 * t + rows - 1) / rows, D / kMinChunk));
  const int64_t len = (D + pieces - 1) / pieces;
  std::vector<Chunk> chunks;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < D; b += len) chunks.push_back({r, b, std::min(D, b + len)});
  return chunks;
}

// Generic emission. classify(row, j) -> 0 drop, 1 keep, 2 tie (kept while the row's tie budget
// lasts, in index order). Rows with several chunks are counted first to place each chunk's output.
template <class Classify>
void emit(const float* x, int64_t rows, int64_t D, const std::vector<int64_t>& row_ties, int64_t row_count,
          Classify classify, at::Tensor& idx_out, at::Tensor& vals_out) {
  std::vector<Chunk> chunks = make_chunks(rows, D);
  const int64_t nc = static_cast<int64_t>(chunks.size());
  std::vector<int64_t> offset(nc + 1, 0), ties(nc, 0);
  if (row_count >= 0 && nc == rows) {
    for (int64_t c = 0; c < nc; ++c) {
      offset[c + 1] = (c + 1) * row_count;
      ties[c] = row_ties[c];
    }
  } else {
    std::vector<int64_t> keep(nc, 0), tie(nc, 0);
    at::parallel_for(0, nc, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        int64_t k1 = 0, k2 = 0;
        for (int64_t j = chunks[c].begin; j < chunks[c].end; ++j) {
          const int v = classify(chunks[c].row, j);
          k1 += v == 1;
          k2 += v == 2;
        }
        keep[c] = k1;
        tie[c] = k2;
      }
    });
    std::vector<int64_t> budget(row_ties);
    for (int64_t c = 0; c < nc; ++c) {
      ties[c] = std::min(tie[c], budget[chunks[c].row]);
      budget[chunks[c].row] -= ties[c];
      offset[c + 1] = offset[c] + keep[c] + ties[c];
    }
  }
  const int64_t n = offset[nc];
  // One spare slot: the loop below writes every element and advances only past kept ones.
  at::Tensor idx = at::empty({n + 1}, at::kLong), vals = at::empty({n + 1}, at::kFloat);
  int64_t* ip = idx.data_ptr<int64_t>();
  float* vp = vals.data_ptr<float>();
  at::parallel_for(0, nc, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const Chunk ch = chunks[c];
      const float* xr = x + ch.row * D;
      int64_t o = offset[c], t = ties[c];
      const int64_t base = ch.row * D;
      for (int64_t j = ch.begin; j < ch.end; ++j) {
        int v = classify(ch.row, j);
        if (C10_UNLIKELY(v == 2)) v = t-- > 0;
        ip[o] = base + j;
        vp[o] = xr[j];
        o += v != 0;
      }
      TORCH_CHECK(o == offset[c + 1], "sparse: internal error: chunk emitted ", o - offset[c], " elements, expected ",
                  offset[c + 1] - offset[c]);
    }
  });
  idx_out = idx.narrow(0, 0, n);
  vals_out = vals.narrow(0, 0, n);
}

}  // namespace

std::vector<RowCut> topk_cuts_cpu(const float* x, int64_t rows, int64_t D, int64_t k) {
  std::vector<RowCut> cuts(rows);
  if (rows >= threads()) {
    at::parallel_for(0, rows, 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) cuts[r] = cut_segment(x + r * D, D, k);
    });
  } else {
    for (int64_t r = 0; r < rows; ++r) cuts[r] = cut_segment(x + r * D, D, k);  // parallel inside
  }
  return cuts;
}

void emit_cuts_cpu(const float* x, int64_t rows, int64_t D, const std::vector<RowCut>& cuts, int64_t row_count,
                   at::Tensor& idx, at::Tensor& vals) {
  std::vector<int64_t> ties(rows);
  for (int64_t r = 0; r < rows; ++r) ties[r] = cuts[r].ties;
  emit(
      x, rows, D, ties, row_count,
      [&](int64_t r, int64_t j) {
        const uint32_t key = magnitude_key(x[r * D + j]), cut = cuts[r].key;
        return key > cut ? 1 : key == cut ? 2 : 0;
      },
      idx, vals);
}

void emit_mask_cpu(const float* x, const uint8_t* mask, int64_t rows, int64_t D, int64_t row_count, at::Tensor& idx,
                   at::Tensor& vals) {
  std::vector<int64_t> ties(rows, 0);
  emit(
      x, rows, D, ties, row_count, [&](int64_t r, int64_t j) { return mask[r * D + j] ? 1 : 0; }, idx, vals);
}

void randk_mask_cpu(at::CPUGeneratorImpl* gen, int64_t rows, int64_t D, int64_t k, uint8_t* mask) {
  if (rows * D == 0) return;  // an empty tensor's mask pointer is null, and memset(null, ...) is undefined
  std::memset(mask, 0, static_cast<size_t>(rows * D));
  std::lock_guard<std::mutex> lock(gen->mutex_);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* m = mask + r * D;
    for (int64_t j = D - k; j < D; ++j) {
      // Uniform in [0, j]; the modulo bias is below (j + 1) / 2^64.
      const int64_t t = static_cast<int64_t>(gen->random64() % static_cast<uint64_t>(j + 1));
      if (m[t])
        m[j] = 1;
      else
        m[t] = 1;
    }
  }
}

}  // namespace tl::codec
