#include "compression/codecs/sparse_kernels.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

// The cut keeping the k largest of keys[0, count) (0 < k <= count): a radix select on the 31-bit
// keys in three levels (12 + 11 + 8 bits; level 1 histograms all keys, levels 2 and 3 only those
// of the boundary bin), or for few keys nth_element.
RowCut cut_keys(const uint32_t* keys, int64_t count, int64_t k) {
  if (count <= 8192) {  // few keys: a selection on a copy costs less than the histograms
    std::vector<uint32_t> c(keys, keys + count);
    std::nth_element(c.begin(), c.begin() + (k - 1), c.end(), std::greater<uint32_t>());
    const uint32_t cut = c[k - 1];
    int64_t above = 0;
    for (int64_t i = 0; i < count; ++i) above += keys[i] > cut;
    return {cut, k - above};
  }
  std::array<int64_t, 4096> h1{};
  for (int64_t i = 0; i < count; ++i) ++h1[keys[i] >> 19];
  int64_t need = k;
  const uint32_t b1 = walk(h1, need);
  std::vector<uint32_t> cand;
  for (int64_t i = 0; i < count; ++i)
    if ((keys[i] >> 19) == b1) cand.push_back(keys[i]);
  std::array<int64_t, 2048> h2{};
  for (uint32_t key : cand) ++h2[(key >> 8) & 0x7ff];
  const uint32_t b2 = walk(h2, need);
  std::array<int64_t, 256> h3{};
  const uint32_t prefix = (b1 << 11) | b2;
  for (uint32_t key : cand)
    if ((key >> 8) == prefix) ++h3[key & 0xff];
  const uint32_t b3 = walk(h3, need);
  return {(prefix << 8) | b3, need};
}

// Splits rows into chunks for emission: whole rows when there are enough of them, else pieces.
struct Chunk {
  int64_t row, begin, end;
};
// `max_len`: the longest piece allowed.
std::vector<Chunk> make_chunks(int64_t rows, int64_t D, int64_t max_len = std::numeric_limits<int64_t>::max()) {
  const int64_t t = threads();
  int64_t pieces = rows >= 2 * t ? 1 : std::max<int64_t>(1, std::min((2 * t + rows - 1) / rows, D / kMinChunk));
  if (D > max_len) pieces = std::max(pieces, D / max_len + 1);
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

// Note [top-k by a sampled threshold]. The k largest |x| of a row, exactly, in about one pass
// over it. A sample of the row's keys (whole cache lines spread over the row) gives a magnitude
// `lo` that some margin more than k elements reach; one pass keeps every element with key >= lo
// (the candidates, in index order: a superset of the selection, ~1.2 k of them); a radix select
// over the candidates' keys finds the cut, and a last pass over the candidates keeps key > cut
// plus the first `ties` with key == cut. Whatever the sample, the result is the exact selection:
// every element at or above the cut is a candidate, so the cut and the tie order (index order)
// are those of the whole row; when fewer than k elements reach `lo` (the sample misled), the row
// is gathered again with a lower `lo`, down to 0 (every element). Rows are split into pieces
// when there are fewer rows than threads x 2 (scope=global: one row), each piece gathering its
// candidates in parallel.
namespace {

constexpr int64_t kSampleLines = 128, kLine = 16;  // floats per cache line

// The smallest key among the `rank + 1` largest of a sample of the row; 0 (everything) when the
// sample is too small to tell. `attempt` widens the margin.
uint32_t sampled_floor(const float* x, int64_t D, int64_t k, int attempt) {
  const int64_t lines = std::min<int64_t>(kSampleLines, D / (16 * kLine));  // at most 1/16 of the row
  if (attempt >= 3 || lines < 8) return 0;
  std::vector<uint32_t> keys;
  keys.reserve(lines * kLine);
  for (int64_t l = 0; l < lines; ++l) {
    const int64_t b = l * (D / lines) / kLine * kLine;
    for (int64_t j = b; j < b + kLine; ++j) keys.push_back(magnitude_key(x[j]));
  }
  const int64_t m = static_cast<int64_t>(keys.size());
  const double expect = static_cast<double>(k) * m / D;
  const double margin = (3.0 + 3.0 * attempt) * std::sqrt(expect) + 16.0 * (1 << (2 * attempt));
  const int64_t rank = static_cast<int64_t>(expect + margin);
  if (rank >= m) return 0;
  std::nth_element(keys.begin(), keys.begin() + rank, keys.end(), std::greater<uint32_t>());
  return keys[rank];
}

// Candidates of one piece: flat indices (base + pos) and values, in index order (buffers grown,
// never zero-filled: only [0, count) is read). Pieces are shorter than 2^31 (kMaxPiece).
constexpr int64_t kMaxPiece = int64_t(1) << 30;
struct Candidates {
  int64_t base = 0;
  std::unique_ptr<int32_t[]> pos;
  std::unique_ptr<float[]> val;
  int64_t capacity = 0, count = 0;

  void reserve(int64_t want) {
    if (want <= capacity) return;
    std::unique_ptr<int32_t[]> p(new int32_t[want]);
    std::unique_ptr<float[]> v(new float[want]);
    if (count > 0) {
      std::memcpy(p.get(), pos.get(), count * sizeof(int32_t));
      std::memcpy(v.get(), val.get(), count * sizeof(float));
    }
    pos = std::move(p);
    val = std::move(v);
    capacity = want;
  }
};

// Elements of x[0, len) with key >= lo, appended at pp, vp (room for len + 8); returns how many.
// Every element is written, the position advances past kept ones only (no branch).
int64_t compact_scalar(const float* x, int32_t first, int64_t len, uint32_t lo, int32_t* pp, float* vp) {
  int64_t o = 0;
  for (int64_t j = 0; j < len; ++j) {
    const float v = x[j];
    pp[o] = first + static_cast<int32_t>(j);
    vp[o] = v;
    o += magnitude_key(v) >= lo;
  }
  return o;
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TL_COMPACT_AVX2 1
// Note [compaction by permutation]. The scalar loop costs ~6 instructions an element. With AVX2,
// 8 keys are compared at once; the 8-bit mask of kept lanes picks a permutation (a table of 256)
// that moves the kept values and their positions to the front of the vectors, stored whole (the
// lanes past the kept ones are overwritten by the next store). Same output as compact_scalar.
struct CompactTable {
  alignas(32) int32_t perm[256][8];
  CompactTable() {
    for (int m = 0; m < 256; ++m) {
      int o = 0;
      for (int k = 0; k < 8; ++k)
        if (m >> k & 1) perm[m][o++] = k;
      for (; o < 8; ++o) perm[m][o] = 0;
    }
  }
};
const CompactTable& compact_table() {
  static const CompactTable t;
  return t;
}

__attribute__((target("avx2,popcnt"))) int64_t compact_avx2(const float* x, int32_t first, int64_t len, uint32_t lo,
                                                            int32_t* pp, float* vp) {
  const CompactTable& t = compact_table();
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  // Keys are compared as signed ints: both are <= 0x7fffffff (lo from magnitude_key).
  const __m256i threshold = _mm256_set1_epi32(static_cast<int32_t>(lo) - 1);
  const __m256i step = _mm256_set1_epi32(8);
  __m256i pos = _mm256_add_epi32(_mm256_set1_epi32(first), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  int64_t o = 0, j = 0;
  for (; j + 8 <= len; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j);
    const __m256i key = _mm256_and_si256(_mm256_castps_si256(v), abs_mask);
    const int m = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(key, threshold)));  // key >= lo
    const __m256i perm = _mm256_load_si256(reinterpret_cast<const __m256i*>(t.perm[m]));
    _mm256_storeu_ps(vp + o, _mm256_permutevar8x32_ps(v, perm));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pp + o), _mm256_permutevar8x32_epi32(pos, perm));
    o += __builtin_popcount(m);
    pos = _mm256_add_epi32(pos, step);
  }
  return o + compact_scalar(x + j, first + static_cast<int32_t>(j), len - j, lo, pp + o, vp + o);
}
#endif

constexpr int64_t kGatherBlock = 256;  // elements compacted between checks of the room left
// Room for the candidates of a piece expected to hold `expect` of them.
int64_t candidate_room(int64_t expect) { return expect + kGatherBlock + 8; }

// Elements of x[b, e) with key >= lo, in index order: positions relative to b, flat index base + b + pos.
void gather_candidates(const float* x, int64_t base, int64_t b, int64_t e, uint32_t lo, int64_t expect, Candidates& c) {
  constexpr int64_t kBlock = kGatherBlock;
  c.base = base + b;
  c.count = 0;
  c.reserve(candidate_room(expect));
#ifdef TL_COMPACT_AVX2
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
#else
  constexpr bool avx2 = false;
#endif
  int64_t o = 0;
  for (int64_t j0 = b; j0 < e; j0 += kBlock) {
    if (o + kBlock + 8 > c.capacity) {
      c.count = o;
      c.reserve(2 * c.capacity);
    }
    const int64_t len = std::min(e, j0 + kBlock) - j0;
    const int32_t first = static_cast<int32_t>(j0 - b);
#ifdef TL_COMPACT_AVX2
    if (avx2) {
      o += compact_avx2(x + j0, first, len, lo, c.pos.get() + o, c.val.get() + o);
      continue;
    }
#endif
    o += compact_scalar(x + j0, first, len, lo, c.pos.get() + o, c.val.get() + o);
  }
  c.count = o;
}

}  // namespace

void topk_select_cpu(const float* x, int64_t rows, int64_t D, int64_t k, at::Tensor& idx_out, at::Tensor& vals_out) {
  const int64_t n = rows * k;
  at::Tensor idx = at::empty({n}, at::kLong), vals = at::empty({n}, at::kFloat);
  idx_out = idx;
  vals_out = vals;
  if (n == 0) return;
  int64_t* ip = idx.data_ptr<int64_t>();
  float* vp = vals.data_ptr<float>();
  if (k >= D) {
    at::parallel_for(0, n, kMinChunk, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) ip[i] = i;
      std::memcpy(vp + i0, x + i0, (i1 - i0) * sizeof(float));
    });
    return;
  }
  const std::vector<Chunk> pieces = make_chunks(rows, D, kMaxPiece);
  const int64_t np = static_cast<int64_t>(pieces.size());
  std::vector<int64_t> first(rows + 1, np);  // pieces of row r: [first[r], first[r + 1])
  for (int64_t p = np - 1; p >= 0; --p) first[pieces[p].row] = p;
  std::vector<Candidates> cand(np);
  std::vector<uint32_t> lo(rows);
  std::vector<int> attempt(rows, 0);
  std::vector<int64_t> todo(rows);
  for (int64_t r = 0; r < rows; ++r) todo[r] = r;
  // Gather; rows whose candidates fall short of k are gathered again with a wider margin.
  while (!todo.empty()) {
    for (int64_t r : todo) lo[r] = sampled_floor(x + r * D, D, k, attempt[r]);
    std::vector<int64_t> work, expect(np, 0);
    for (int64_t r : todo)
      for (int64_t p = first[r]; p < first[r + 1]; ++p) {
        work.push_back(p);
        const int64_t len = pieces[p].end - pieces[p].begin;
        expect[p] = lo[r] == 0 ? len : (k * len / D) * 5 / 4 + 1024;
        // Reserved here, on the calling thread: what a worker allocates comes from its own malloc
        // arena, which glibc returns to the kernel when it empties (fresh pages, each a fault, on
        // every call: 3.3k a call of topk(0.1) on 64 MiB).
        cand[p].reserve(candidate_room(expect[p]));
      }
    at::parallel_for(0, static_cast<int64_t>(work.size()), 1, [&](int64_t w0, int64_t w1) {
      for (int64_t w = w0; w < w1; ++w) {
        const Chunk& ch = pieces[work[w]];
        gather_candidates(x + ch.row * D, ch.row * D, ch.begin, ch.end, lo[ch.row], expect[work[w]], cand[work[w]]);
      }
    });
    std::vector<int64_t> again;
    for (int64_t r : todo) {
      int64_t total = 0;
      for (int64_t p = first[r]; p < first[r + 1]; ++p) total += cand[p].count;
      if (total < k) {
        TORCH_CHECK(lo[r] != 0, "topk: internal error: a row of ", D, " elements gathered ", total, " < k = ", k);
        ++attempt[r];
        again.push_back(r);
      }
    }
    todo.swap(again);
  }
  // The cut of each row over its candidates, then each piece's share of the row's k.
  std::vector<RowCut> cuts(rows);
  std::vector<int64_t> offset(np + 1, n), ties(np, 0);  // offset[np] = n: the end of the last piece
  at::parallel_for(0, rows, 1, [&](int64_t r0, int64_t r1) {
    std::vector<uint32_t> keys;
    for (int64_t r = r0; r < r1; ++r) {
      keys.clear();
      for (int64_t p = first[r]; p < first[r + 1]; ++p)
        for (int64_t i = 0; i < cand[p].count; ++i) keys.push_back(magnitude_key(cand[p].val[i]));
      cuts[r] = cut_keys(keys.data(), static_cast<int64_t>(keys.size()), k);
      int64_t budget = cuts[r].ties, o = r * k;
      for (int64_t p = first[r]; p < first[r + 1]; ++p) {
        int64_t gt = 0, eq = 0;
        for (int64_t i = 0; i < cand[p].count; ++i) {
          const uint32_t key = magnitude_key(cand[p].val[i]);
          gt += key > cuts[r].key;
          eq += key == cuts[r].key;
        }
        ties[p] = std::min(eq, budget);
        budget -= ties[p];
        offset[p] = o;
        o += gt + ties[p];
      }
      TORCH_CHECK(o == (r + 1) * k, "topk: internal error: row ", r, " kept ", o - r * k, " elements, expected ", k);
    }
  });
  at::parallel_for(0, np, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const Candidates& c = cand[p];
      const uint32_t cut = cuts[pieces[p].row].key;
      // Every candidate is written, the position advances past kept ones only (about half of the
      // candidates are kept: a branch on it mispredicts), and the loop ends with the piece's share.
      int64_t o = offset[p], t = ties[p];
      const int64_t end = offset[p + 1];
      for (int64_t i = 0; i < c.count && o < end; ++i) {
        const uint32_t key = magnitude_key(c.val[i]);
        const bool tie = key == cut && t > 0;
        t -= tie;
        ip[o] = c.base + c.pos[i];
        vp[o] = c.val[i];
        o += (key > cut) | tie;
      }
    }
  });
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

namespace {
// Entries [i0, i1) of idx (first output j, stretch end e) write out[j, e): zeros, and each entry's
// value at its index. Blocks of 1024 outputs are zeroed with one memset, then their entries are
// written (a memset per gap between entries cost more than the gaps). False at an index that is not
// increasing or not below e.
template <class T>
bool write_stretch(const int64_t* idx, const T* v, int64_t i0, int64_t i1, int64_t j, int64_t e, float* out) {
  constexpr int64_t kBlock = 1024;
  int64_t i = i0, last = j - 1;
  for (int64_t b = j; b < e; b += kBlock) {
    const int64_t be = std::min(e, b + kBlock);
    std::memset(out + b, 0, (be - b) * sizeof(float));
    for (; i < i1 && idx[i] < be; ++i) {
      const int64_t t = idx[i];
      if (t <= last) return false;
      out[t] = static_cast<float>(v[i]);
      last = t;
    }
  }
  return i == i1;
}

// Each range of entries writes its stretch of out; the last one runs to the end.
template <class T>
bool scatter_sorted(const int64_t* idx, const T* v, int64_t n, int64_t numel, float* out) {
  if (n == 0) {
    at::parallel_for(0, numel, kMinChunk, [&](int64_t e0, int64_t e1) { std::fill(out + e0, out + e1, 0.0f); });
    return true;
  }
  std::atomic<bool> ok{true};
  // Grain: entries covering about kMinChunk outputs on average.
  const int64_t grain = std::max<int64_t>(1, kMinChunk * n / std::max<int64_t>(numel, 1));
  at::parallel_for(0, n, grain, [&](int64_t i0, int64_t i1) {
    const int64_t j = i0 == 0 ? 0 : idx[i0 - 1] + 1;
    const int64_t e = i1 == n ? numel : idx[i1 - 1] + 1;
    if (!write_stretch(idx, v, i0, i1, j, e, out)) ok = false;
  });
  return ok;
}

// Row r of out (rows, D): the values of row r at its channels (ascending), zeros elsewhere.
template <class T>
bool scatter_rows(const int64_t* channels, const T* v, int64_t rows, int64_t D, int64_t k, float* out) {
  std::atomic<bool> ok{true};
  at::parallel_for(0, rows, std::max<int64_t>(1, kMinChunk / std::max<int64_t>(D, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      if (!write_stretch(channels + r * k, v + r * k, 0, k, 0, D, out + r * D)) ok = false;
  });
  return ok;
}

template <class F>
bool dispatch_values(const at::Tensor& values, F f) {
  switch (values.scalar_type()) {
    case at::kFloat:
      return f(values.data_ptr<float>());
    case at::kHalf:
      return f(values.data_ptr<at::Half>());
    case at::kBFloat16:
      return f(values.data_ptr<at::BFloat16>());
    default:
      TORCH_CHECK(false, "sparse: values of type ", values.scalar_type(), "; accepted: float32, float16, bfloat16");
  }
}
}  // namespace

bool scatter_sorted_cpu(const int64_t* idx, const at::Tensor& values, int64_t numel, float* out) {
  return dispatch_values(values, [&](auto* v) { return scatter_sorted(idx, v, values.numel(), numel, out); });
}

bool scatter_rows_cpu(const int64_t* channels, const at::Tensor& values, int64_t rows, int64_t D, float* out) {
  const int64_t k = rows > 0 ? values.numel() / rows : 0;
  return dispatch_values(values, [&](auto* v) { return scatter_rows(channels, v, rows, D, k, out); });
}

void gather_rows_cpu(const float* x, int64_t rows, int64_t D, const int64_t* channels, int64_t k, float* out) {
  at::parallel_for(0, rows, std::max<int64_t>(1, kMinChunk / std::max<int64_t>(k, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < k; ++c) out[r * k + c] = x[r * D + channels[r * k + c]];
  });
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
