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

#include "compression/codecs/x86.h"

#include "compression/codecs/common.h"
#include "compression/codecs/inline_parallel.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TL_COMPACT_AVX2 1
#endif

namespace tl::codec {
namespace {

// Whether the AVX2 loops of Note [compaction by permutation] may run (checked once; clang builds
// lack those loops and leave it unused).
[[maybe_unused]] bool compact_with_avx2();
#ifdef TL_COMPACT_AVX2
bool compact_with_avx512();
void key_range_avx512(const void* words, int64_t count, int32_t& lo, int32_t& hi);
void histogram_avx512(const void* words, int64_t count, uint32_t lo, int shift, uint32_t* hist);
int64_t keys_in_range_avx2(const void* words, int64_t count, uint32_t edge, uint32_t width, uint32_t* out);
#endif

constexpr int64_t kMinChunk = 1 << 15;  // elements of a piece of a row at least (make_chunks)

// A candidate's key: magnitude_key of its float value, or the key itself.
inline uint32_t key_of(float v) { return magnitude_key(v); }
inline uint32_t key_of(uint32_t key) { return key; }

// The cut keeping the k largest keys of v[0, count) (0 < k <= count): one histogram of the keys'
// offsets from the smallest, in at most 2^12 bins (512 for a few thousand keys: clearing and
// walking the bins is then a small part), walked from the top to the bin that holds the k-th
// largest; the keys of that bin (a few, for keys spread over the range) are then selected by
// nth_element. It replaced a copy and nth_element of all the keys (~10 us for TopK's 900
// candidates of a row of 4096) and a three-level radix select (12 + 11 + 8 bits).
// With `floor`, also the lower edge of the highest bin at and above which at least `floor_rank`
// keys lie (a key that many reach), else a guess below the smallest key, 0 where there is none
// (Note [the previous row's floor]).
template <class T>
RowCut cut_keys(const T* v, int64_t count, int64_t k, std::vector<uint32_t>& tmp, int64_t floor_rank = 0,
                uint32_t* floor = nullptr) {
  if (floor) *floor = 0;
  // Keys are below 2^31: compared as int32, which the baseline (SSE2) build vectorises.
  int32_t lo_i = static_cast<int32_t>(key_of(v[0])), hi_i = lo_i;
#ifdef TL_COMPACT_AVX2
  const bool avx512 = compact_with_avx512();  // Note [the cut with AVX-512]
  if (avx512) key_range_avx512(v, count, lo_i, hi_i);
#else
  constexpr bool avx512 = false;
#endif
  for (int64_t i = 1; i < count && !avx512; ++i) {
    const int32_t key = static_cast<int32_t>(key_of(v[i]));
    lo_i = std::min(lo_i, key);
    hi_i = std::max(hi_i, key);
  }
  const uint32_t lo = static_cast<uint32_t>(lo_i), hi = static_cast<uint32_t>(hi_i);
  if (lo == hi) return {lo, k, count};  // all equal: k ties
  int bits = 9;
  while (bits < 12 && (int64_t(1) << (bits + 3)) < count) ++bits;  // ~8 keys a bin at most
  const int span_bits = 32 - __builtin_clz(hi - lo);
  const int shift = std::max(0, span_bits - bits);
  std::array<uint32_t, 4096> hist;
  const int64_t bins = ((hi - lo) >> shift) + 1;
  std::fill(hist.begin(), hist.begin() + bins, 0u);
#ifdef TL_COMPACT_AVX2
  if (avx512) histogram_avx512(v, count, lo, shift, hist.data());
#endif
  for (int64_t i = 0; i < count && !avx512; ++i) ++hist[(key_of(v[i]) - lo) >> shift];
  // The bin of the k-th largest, and `need`: its rank from the top within the bin. Walked from the
  // nearer end: TopK's candidates are mostly just above their floor, so the cut lies near the bottom.
  int64_t need, b;
  if (2 * k <= count) {
    need = k;
    for (b = bins - 1; b > 0 && hist[b] < need; --b) need -= hist[b];
  } else {
    int64_t from_bottom = count - k + 1;  // the cut's rank from the bottom
    for (b = 0; b < bins - 1 && hist[b] < from_bottom; ++b) from_bottom -= hist[b];
    need = hist[b] - from_bottom + 1;
  }
  if (floor && floor_rank <= count) {
    // The highest bin f with at least floor_rank keys in bins [f, bins): from the top, or the
    // highest f with at most count - floor_rank keys below it, from the bottom.
    int64_t f;
    if (2 * floor_rank <= count) {
      int64_t above = 0;
      for (f = bins - 1; (above += hist[f]) < floor_rank; --f) {
      }
    } else {
      int64_t below = 0;
      for (f = 0; f < bins - 1 && below + hist[f] <= count - floor_rank; ++f) below += hist[f];
    }
    *floor = lo + (static_cast<uint32_t>(f) << shift);
  } else if (floor && floor_rank < 2 * count) {
    // Fewer keys than floor_rank (they were gathered above a floor of about that rank): the
    // missing ones are assumed below the smallest as densely as the lowest keys lie above it.
    int64_t below = 0, f = 0;
    for (; f < bins - 1 && below < floor_rank - count; ++f) below += hist[f];
    const uint32_t span = static_cast<uint32_t>(f) << shift;
    *floor = lo > span ? lo - span : 0;
  }
  // The keys of bin b (compared with its edges, written unconditionally, kept by the count).
  tmp.resize(count);
  const uint32_t edge = lo + (static_cast<uint32_t>(b) << shift), width = uint32_t(1) << shift;
  int64_t m = -1;
#ifdef TL_COMPACT_AVX2
  if (compact_with_avx2()) {
    tmp.resize(count + 8);
    m = keys_in_range_avx2(v, count, edge, width, tmp.data());
  }
#endif
  if (m < 0) {
    m = 0;
    for (int64_t i = 0; i < count; ++i) {
      const uint32_t key = key_of(v[i]);
      tmp[m] = key;
      m += key - edge < width;
    }
  }
  std::nth_element(tmp.begin(), tmp.begin() + (need - 1), tmp.begin() + m, std::greater<uint32_t>());
  const uint32_t cut = tmp[need - 1];
  int64_t above = 0, equal = 0;  // in the bin, every key above the cut now lies before it
  for (int64_t i = 0; i < m; ++i) {
    above += i < need - 1 && tmp[i] > cut;
    equal += tmp[i] == cut;
  }
  return {cut, need - above, equal};
}

// Splits rows into pieces for TopK: whole rows when there are enough of them, else pieces.
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

// Cache lines sampled: kSampleLines, or one per 4096 elements of a longer row (at most 1/16 of the
// row). A long row (scope=global) then gets a tighter floor: at k = 10% of 4M elements, 16k keys
// put it ~8% below the k-th largest instead of ~23% with 2048, fewer candidates for the cut and
// the emission.
constexpr int64_t kSampleLines = 128, kLine = 16;  // floats per cache line

// The smallest key among the `rank + 1` largest of a sample of the row; 0 (everything) when the
// sample is too small to tell. `attempt` widens the margin.
// `keys`, `tmp`: scratch.
uint32_t sampled_floor(const float* x, int64_t D, int64_t k, int attempt, std::vector<uint32_t>& keys,
                       std::vector<uint32_t>& tmp) {
  const int64_t lines = std::min<int64_t>(std::max<int64_t>(kSampleLines, D / 4096), D / (16 * kLine));
  if (attempt >= 3 || lines < 8) return 0;
  keys.clear();
  for (int64_t l = 0; l < lines; ++l) {
    const int64_t b = l * (D / lines) / kLine * kLine;
    for (int64_t j = b; j < b + kLine; ++j) keys.push_back(magnitude_key(x[j]));
  }
  const int64_t m = static_cast<int64_t>(keys.size());
  const double expect = static_cast<double>(k) * m / D;
  // 3 standard deviations of the count (a retry widens it), and a few elements for tiny expects.
  const double margin = (3.0 + 3.0 * attempt) * std::sqrt(expect) + 4.0 * (1 << (2 * attempt));
  const int64_t rank = static_cast<int64_t>(expect + margin);
  if (rank >= m) return 0;
  return cut_keys(keys.data(), m, rank + 1, tmp).key;
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

// Elements of x[0, len) with key >= lo, or with mask[j] != 0 where there is a mask, appended at
// pp, vp (room for len + 8); returns how many. Every element is written, the position advances
// past kept ones only (no branch).
int64_t compact_scalar(const float* x, const uint8_t* mask, int32_t first, int64_t len, uint32_t lo, int32_t* pp,
                       float* vp) {
  int64_t o = 0;
  for (int64_t j = 0; j < len; ++j) {
    const float v = x[j];
    pp[o] = first + static_cast<int32_t>(j);
    vp[o] = v;
    o += mask ? mask[j] != 0 : magnitude_key(v) >= lo;
  }
  return o;
}

#ifdef TL_COMPACT_AVX2
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

__attribute__((target("avx2,popcnt"))) int64_t compact_avx2(const float* x, const uint8_t* mask, int32_t first,
                                                            int64_t len, uint32_t lo, int32_t* pp, float* vp) {
  const CompactTable& t = compact_table();
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  // Keys are compared as signed ints: both are <= 0x7fffffff (lo from magnitude_key).
  const __m256i threshold = _mm256_set1_epi32(static_cast<int32_t>(lo) - 1);
  const __m256i step = _mm256_set1_epi32(8);
  __m256i pos = _mm256_add_epi32(_mm256_set1_epi32(first), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  int64_t o = 0, j = 0;
  for (; j + 8 <= len; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j);
    __m256i keep;
    if (mask) {  // 8 mask bytes widened to 8 ints
      keep = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mask + j)));
      keep = _mm256_cmpgt_epi32(keep, _mm256_setzero_si256());
    } else {
      keep = _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_castps_si256(v), abs_mask), threshold);  // key >= lo
    }
    const int m = _mm256_movemask_ps(_mm256_castsi256_ps(keep));
    const __m256i perm = _mm256_load_si256(reinterpret_cast<const __m256i*>(t.perm[m]));
    _mm256_storeu_ps(vp + o, _mm256_permutevar8x32_ps(v, perm));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pp + o), _mm256_permutevar8x32_epi32(pos, perm));
    o += __builtin_popcount(m);
    pos = _mm256_add_epi32(pos, step);
  }
  return o +
         compact_scalar(x + j, mask ? mask + j : nullptr, first + static_cast<int32_t>(j), len - j, lo, pp + o, vp + o);
}

// The candidates of c from i on with key >= cut at ip + o, vp + o, one at a time, until `count`
// are written: the tails of emit_avx2 and emit_avx512. Returns the count written.
int64_t emit_tail(const Candidates& c, uint32_t cut, int64_t count, int64_t i, int64_t o, int64_t* ip, float* vp) {
  for (; i < c.count && o < count; ++i) {
    ip[o] = c.base + c.pos[i];
    vp[o] = c.val[i];
    o += magnitude_key(c.val[i]) >= cut;
  }
  return o;
}

// The candidates of c with key >= cut, which are `count`, at ip (flat indices) and vp: compacted
// as above, the positions widened to int64. Stores of 8 stop short of the row's end (the next row
// may be another thread's); the last few go one at a time.
__attribute__((target("avx2,popcnt"))) int64_t emit_avx2(const Candidates& c, uint32_t cut, int64_t count, int64_t* ip,
                                                         float* vp) {
  const CompactTable& t = compact_table();
  const float* val = c.val.get();
  const int32_t* pos = c.pos.get();
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i threshold = _mm256_set1_epi32(static_cast<int32_t>(cut) - 1);  // as in compact_avx2
  const __m256i base = _mm256_set1_epi64x(c.base);
  int64_t o = 0, i = 0;
  for (; i + 8 <= c.count && o + 8 <= count; i += 8) {
    const __m256 v = _mm256_loadu_ps(val + i);
    const __m256i keep = _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_castps_si256(v), abs_mask), threshold);
    const int m = _mm256_movemask_ps(_mm256_castsi256_ps(keep));
    const __m256i perm = _mm256_load_si256(reinterpret_cast<const __m256i*>(t.perm[m]));
    const __m256i p = _mm256_permutevar8x32_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pos + i)), perm);
    _mm256_storeu_ps(vp + o, _mm256_permutevar8x32_ps(v, perm));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(ip + o),
                        _mm256_add_epi64(base, _mm256_cvtepi32_epi64(_mm256_castsi256_si128(p))));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(ip + o + 4),
                        _mm256_add_epi64(base, _mm256_cvtepi32_epi64(_mm256_extracti128_si256(p, 1))));
    o += __builtin_popcount(m);
  }
  return emit_tail(c, cut, count, i, o, ip, vp);
}

// The keys of words[0, count) (floats or keys: 32-bit words whose key is the low 31 bits) in
// [edge, edge + width), in order, at out (room for count + 8); how many.
__attribute__((target("avx2,popcnt"))) int64_t keys_in_range_avx2(const void* words, int64_t count, uint32_t edge,
                                                                  uint32_t width, uint32_t* out) {
  const CompactTable& t = compact_table();
  const uint8_t* in = static_cast<const uint8_t*>(words);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  // key - edge as int32 (both keys below 2^31) lies in [0, width): above -1 and below width.
  const __m256i e = _mm256_set1_epi32(static_cast<int32_t>(edge)), below = _mm256_set1_epi32(-1);
  const __m256i w = _mm256_set1_epi32(static_cast<int32_t>(width));
  int64_t o = 0, i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256i key = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 4 * i)), abs_mask);
    const __m256i d = _mm256_sub_epi32(key, e);
    const __m256i inside = _mm256_and_si256(_mm256_cmpgt_epi32(d, below), _mm256_cmpgt_epi32(w, d));
    const int m = _mm256_movemask_ps(_mm256_castsi256_ps(inside));
    const __m256i perm = _mm256_load_si256(reinterpret_cast<const __m256i*>(t.perm[m]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + o), _mm256_permutevar8x32_epi32(key, perm));
    o += __builtin_popcount(m);
  }
  for (; i < count; ++i) {
    uint32_t key;
    std::memcpy(&key, in + 4 * i, sizeof(key));
    key &= 0x7fffffffu;
    out[o] = key;
    o += key - edge < width;
  }
  return o;
}
#endif

bool compact_with_avx2() {
#ifdef TL_COMPACT_AVX2
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
  return avx2;
#else
  return false;
#endif
}

#ifdef TL_COMPACT_AVX2
// Note [compaction by compression]. With AVX-512, 16 keys are compared into a mask register and
// vcompressps moves the kept lanes to the front of a register, then one store of 16 as above: no
// table, twice the width. The same output as compact_avx2 and compact_scalar;
// `set_sparse_avx512(false)` keeps the AVX2 loops (the tests compare both with the ATen path).
// 1 MiB topk(0.1), one thread (perf): the gathering pass ~48 -> ~37 us, bound by the two
// compressions of each step (values and positions), ~8 cycles a step of 16 on this Zen 4.
std::atomic<bool> avx512_allowed{true};

bool compact_with_avx512() {
  static const bool has = compact_with_avx2() && __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return has && avx512_allowed.load(std::memory_order_relaxed);
}

#define TL_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,popcnt")))

TL_AVX512 int64_t compact_avx512(const float* x, const uint8_t* mask, int32_t first, int64_t len, uint32_t lo,
                                 int32_t* pp, float* vp) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i threshold = _mm512_set1_epi32(static_cast<int32_t>(lo) - 1);  // as in compact_avx2
  const __m512i step = _mm512_set1_epi32(16);
  __m512i pos = _mm512_add_epi32(_mm512_set1_epi32(first),
                                 _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  int64_t o = 0, j = 0;
  for (; j + 16 <= len; j += 16) {
    const __m512 v = _mm512_loadu_ps(x + j);
    const __mmask16 m =
        mask ? _mm_test_epi8_mask(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mask + j)), _mm_set1_epi8(-1))
             : _mm512_cmpgt_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v), abs_mask), threshold);
    _mm512_storeu_ps(vp + o, _mm512_maskz_compress_ps(m, v));
    _mm512_storeu_si512(pp + o, _mm512_maskz_compress_epi32(m, pos));
    o += __builtin_popcount(m);
    pos = _mm512_add_epi32(pos, step);
  }
  return o +
         compact_scalar(x + j, mask ? mask + j : nullptr, first + static_cast<int32_t>(j), len - j, lo, pp + o, vp + o);
}

// emit_avx2 16 at a time, by compression.
TL_AVX512 int64_t emit_avx512(const Candidates& c, uint32_t cut, int64_t count, int64_t* ip, float* vp) {
  const float* val = c.val.get();
  const int32_t* pos = c.pos.get();
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i threshold = _mm512_set1_epi32(static_cast<int32_t>(cut) - 1);
  const __m512i base = _mm512_set1_epi64(c.base);
  int64_t o = 0, i = 0;
  for (; i + 16 <= c.count && o + 16 <= count; i += 16) {
    const __m512 v = _mm512_loadu_ps(val + i);
    const __mmask16 m = _mm512_cmpgt_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v), abs_mask), threshold);
    const __m512i p = _mm512_maskz_compress_epi32(m, _mm512_loadu_si512(pos + i));
    _mm512_storeu_ps(vp + o, _mm512_maskz_compress_ps(m, v));
    _mm512_storeu_si512(ip + o, _mm512_add_epi64(base, _mm512_cvtepi32_epi64(_mm512_castsi512_si256(p))));
    _mm512_storeu_si512(ip + o + 8, _mm512_add_epi64(base, _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(p, 1))));
    o += __builtin_popcount(m);
  }
  return emit_tail(c, cut, count, i, o, ip, vp);
}
// Note [the cut with AVX-512]. cut_keys' two passes over a row's candidates (~490 at (64, 4096),
// k = 410) with AVX-512: the keys' min and max 16 at a time (the baseline build's loop ran 4 at a
// time), and the histogram's bins computed 16 at a time into a small buffer, the increments then
// one load and one store each (the scalar loop's key, subtraction and shift went with each
// increment). The same bins and counts. 1 MiB topk(0.1), one thread: the cut ~28 -> ~19 us.
TL_AVX512 void key_range_avx512(const void* words, int64_t count, int32_t& lo, int32_t& hi) {
  const int32_t* w = static_cast<const int32_t*>(words);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  __m512i mn = _mm512_set1_epi32(lo), mx = mn;
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m512i key = _mm512_and_si512(_mm512_loadu_si512(w + i), abs_mask);
    mn = _mm512_min_epi32(mn, key);
    mx = _mm512_max_epi32(mx, key);
  }
  lo = _mm512_reduce_min_epi32(mn);
  hi = _mm512_reduce_max_epi32(mx);
  for (; i < count; ++i) {
    const int32_t key = w[i] & 0x7fffffff;
    lo = std::min(lo, key);
    hi = std::max(hi, key);
  }
}

TL_AVX512 void histogram_avx512(const void* words, int64_t count, uint32_t lo, int shift, uint32_t* hist) {
  const int32_t* w = static_cast<const int32_t*>(words);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), base = _mm512_set1_epi32(static_cast<int32_t>(lo));
  const __m128i sh = _mm_cvtsi32_si128(shift);
  alignas(64) uint32_t bin[256];
  for (int64_t i0 = 0; i0 < count; i0 += 256) {
    const int64_t n = std::min<int64_t>(256, count - i0);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m512i key = _mm512_and_si512(_mm512_loadu_si512(w + i0 + i), abs_mask);
      _mm512_store_si512(bin + i, _mm512_srl_epi32(_mm512_sub_epi32(key, base), sh));
    }
    for (; i < n; ++i) bin[i] = ((static_cast<uint32_t>(w[i0 + i]) & 0x7fffffffu) - lo) >> shift;
    for (i = 0; i < n; ++i) ++hist[bin[i]];
  }
}
#undef TL_AVX512
#endif

// The candidates with key > cut and the first `ties` with key == cut, at most `count`, at ip, vp
// (flat indices); returns how many. Every candidate is written, the position advances past kept
// ones only (about half of the candidates are kept: a branch on it mispredicts).
int64_t keep_candidates(const Candidates& c, uint32_t cut, int64_t ties, int64_t count, int64_t* ip, float* vp) {
  int64_t o = 0, t = ties;
  for (int64_t i = 0; i < c.count && o < count; ++i) {
    const uint32_t key = magnitude_key(c.val[i]);
    const bool tie = key == cut && t > 0;
    t -= tie;
    ip[o] = c.base + c.pos[i];
    vp[o] = c.val[i];
    o += (key > cut) | tie;
  }
  return o;
}

// The `count` candidates of c that `cut` keeps, `ties` of those equal to it (in index order), at ip
// and vp: 8 at a time where the cut keeps every key equal to it (cut.ties == cut.equal).
int64_t emit_kept(const Candidates& c, const RowCut& cut, int64_t ties, int64_t count, int64_t* ip, float* vp) {
#ifdef TL_COMPACT_AVX2
  if (cut.ties == cut.equal && compact_with_avx512()) return emit_avx512(c, cut.key, count, ip, vp);
  if (cut.ties == cut.equal && compact_with_avx2()) return emit_avx2(c, cut.key, count, ip, vp);
#endif
  return keep_candidates(c, cut.key, ties, count, ip, vp);
}

constexpr int64_t kGatherBlock = 256;  // elements compacted between checks of the room left
// Room for the candidates of a piece expected to hold `expect` of them.
int64_t candidate_room(int64_t expect) { return expect + kGatherBlock + 8; }

// Elements of x[b, e) with key >= lo (or mask set, where there is a mask: indexed as x), in
// index order: positions relative to b, flat index base + b + pos.
void gather_candidates(const float* x, const uint8_t* mask, int64_t base, int64_t b, int64_t e, uint32_t lo,
                       int64_t expect, Candidates& c) {
  constexpr int64_t kBlock = kGatherBlock;
  c.base = base + b;
  c.count = 0;
  c.reserve(candidate_room(expect));
#ifdef TL_COMPACT_AVX2
  const bool avx2 = compact_with_avx2(), avx512 = compact_with_avx512();
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
    if (avx512) {
      o += compact_avx512(x + j0, mask ? mask + j0 : nullptr, first, len, lo, c.pos.get() + o, c.val.get() + o);
      continue;
    }
    if (avx2) {
      o += compact_avx2(x + j0, mask ? mask + j0 : nullptr, first, len, lo, c.pos.get() + o, c.val.get() + o);
      continue;
    }
#endif
    o += compact_scalar(x + j0, mask ? mask + j0 : nullptr, first, len, lo, c.pos.get() + o, c.val.get() + o);
  }
  c.count = o;
}

// Note [top-k row by row]. With at least two rows per thread (scope=sample on a micro-batch),
// rows are not split: one parallel region hands each task a run of whole rows, and a task takes
// each row from its floor to the emitted selection (floor, gather, cut, emit: the floor from the
// sample, or from the row before, Note [the previous row's floor]) with its own scratch, reused
// across calls. The selection of each row is the one of Note [top-k by a sampled
// threshold]; what it saves is the three parallel regions and the per-row allocations (at (64,
// 4096), 64 rows of 410 kept, ~0.8 ms a call on one thread, most of it per-call and per-row cost).
// A task reads at least kTaskBytes of x (Note [codec threads]).

struct RowScratch {
  Candidates cand;
  std::vector<uint32_t> keys, tmp;
};

// Note [the previous row's floor]. Rows of one message tend to have alike magnitudes (a layer's
// activations or gradients, sample after sample), so the row before gives the next one's floor
// for free: its histogram of candidates (cut_keys) tells a key that k + margin of its elements
// reach, and the next row is gathered with it, without sampling, and with fewer candidates than
// the sample's wider margin leaves (at (64, 4096) and k = 410 about 490 against 720, normal data).
// The selection is exact whatever the floor: a row where fewer than k elements reach it, or so
// many that the cut would cost more than sampling again, is gathered from its sample as before.
// Each task starts its first row from the sample; the margin, 3 sqrt(k) + 16, is some 4 standard
// deviations of the count above a fixed key in rows of iid elements.
int64_t floor_margin(int64_t k) { return 3 * static_cast<int64_t>(std::sqrt(static_cast<double>(k))) + 16; }

// Row xr (D floats, flat index of its first element `base`): its k largest |x|, ties in index
// order, written at ip, vp in index order. `floor`: the previous row's (0: none), replaced by
// this row's for the next.
// True when more elements equal the cut than were kept (the index order broke a tie), if `ties`.
bool select_row(const float* xr, int64_t base, int64_t D, int64_t k, RowScratch& s, uint32_t& floor, int64_t* ip,
                float* vp, bool ties) {
  Candidates& c = s.cand;
  const int64_t margin = floor_margin(k);
  bool gathered = false;
  if (floor != 0) {  // Note [the previous row's floor]
    gather_candidates(xr, nullptr, base, 0, D, floor, k + margin, c);
    gathered = c.count >= k && c.count <= 2 * (k + margin) + kGatherBlock;
  }
  for (int attempt = 0; !gathered; ++attempt) {
    const uint32_t lo = sampled_floor(xr, D, k, attempt, s.keys, s.tmp);
    gather_candidates(xr, nullptr, base, 0, D, lo, lo == 0 ? D : k * 5 / 4 + 1024, c);
    gathered = c.count >= k;
    TORCH_CHECK(gathered || lo != 0, "topk: internal error: a row of ", D, " elements gathered ", c.count,
                " < k = ", k);
  }
  const RowCut cut = cut_keys(c.val.get(), c.count, k, s.tmp, k + margin, &floor);
  const int64_t o = emit_kept(c, cut, cut.ties, k, ip, vp);
  TORCH_CHECK(o == k, "topk: internal error: a row kept ", o, " elements, expected ", k);
  return ties && cut.equal > cut.ties;
}

// Note [top-k row by row]: rows [0, rows) of x in tasks of whole rows.
void select_rows(const float* x, int64_t rows, int64_t D, int64_t k, int64_t* ip, float* vp, bool* ambiguous) {
  const int64_t tasks = task_count(rows * D * int64_t(sizeof(float)), rows);
  // Reserved on the calling thread (see topk_select_cpu) and kept for the next call.
  static thread_local std::vector<RowScratch> scratch;
  if (static_cast<int64_t>(scratch.size()) < tasks) scratch.resize(tasks);
  for (int64_t t = 0; t < tasks; ++t) {
    scratch[t].cand.reserve(candidate_room(k * 5 / 4 + 1024));
    scratch[t].keys.reserve(scratch[t].cand.capacity);
  }
  std::vector<RowScratch>& s = scratch;
  std::atomic<bool> tie{false};
  parallel_for(0, tasks, rows * D * int64_t(sizeof(float)) / tasks, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      uint32_t floor = 0;  // the first row of a task is sampled
      for (int64_t r = t * rows / tasks; r < (t + 1) * rows / tasks; ++r)
        if (select_row(x + r * D, r * D, D, k, s[t], floor, ip + r * k, vp + r * k, ambiguous != nullptr)) tie = true;
    }
  });
  if (ambiguous) *ambiguous = tie;
}

}  // namespace

void topk_select_cpu(const float* x, int64_t rows, int64_t D, int64_t k, at::Tensor& idx_out, at::Tensor& vals_out,
                     bool* ambiguous) {
  if (ambiguous) *ambiguous = false;
  const int64_t n = rows * k;
  at::Tensor idx = at::empty({n}, at::kLong), vals = at::empty({n}, at::kFloat);
  idx_out = idx;
  vals_out = vals;
  if (n == 0) return;
  int64_t* ip = idx.data_ptr<int64_t>();
  float* vp = vals.data_ptr<float>();
  if (k >= D) {
    parallel_for(0, n, 2 * sizeof(float) + sizeof(int64_t), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) ip[i] = i;
      std::memcpy(vp + i0, x + i0, (i1 - i0) * sizeof(float));
    });
    return;
  }
  if (rows >= 2 * threads() && D <= kMaxPiece) {  // Note [top-k row by row]
    select_rows(x, rows, D, k, ip, vp, ambiguous);
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
    std::vector<uint32_t> sample, tmp;
    for (int64_t r : todo) lo[r] = sampled_floor(x + r * D, D, k, attempt[r], sample, tmp);
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
    // Bytes of a work item: its piece of x (the pieces of a row are alike).
    const int64_t piece_bytes = (pieces[0].end - pieces[0].begin) * int64_t(sizeof(float));
    parallel_for(0, static_cast<int64_t>(work.size()), piece_bytes, [&](int64_t w0, int64_t w1) {
      for (int64_t w = w0; w < w1; ++w) {
        const Chunk& ch = pieces[work[w]];
        gather_candidates(x + ch.row * D, nullptr, ch.row * D, ch.begin, ch.end, lo[ch.row], expect[work[w]],
                          cand[work[w]]);
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
  std::atomic<bool> tie{false};
  // A row reads its candidates (~1.25 k values) three times.
  parallel_for(0, rows, 15 * k, [&](int64_t r0, int64_t r1) {
    std::vector<uint32_t> keys, tmp;
    for (int64_t r = r0; r < r1; ++r) {
      int64_t total = 0;
      for (int64_t p = first[r]; p < first[r + 1]; ++p) total += cand[p].count;
      keys.resize(total);
      for (int64_t p = first[r], o = 0; p < first[r + 1]; o += cand[p].count, ++p)
        for (int64_t i = 0; i < cand[p].count; ++i) keys[o + i] = magnitude_key(cand[p].val[i]);
      cuts[r] = cut_keys(keys.data(), total, k, tmp);
      int64_t budget = cuts[r].ties, o = r * k, equal = 0;
      const int32_t cut = static_cast<int32_t>(cuts[r].key);  // keys below 2^31: int32 compares vectorise
      for (int64_t p = first[r]; p < first[r + 1]; ++p) {
        int64_t gt = 0, eq = 0;
        for (int64_t i = 0; i < cand[p].count; ++i) {
          const int32_t key = static_cast<int32_t>(magnitude_key(cand[p].val[i]));
          gt += key > cut;
          eq += key == cut;
        }
        equal += eq;
        ties[p] = std::min(eq, budget);
        budget -= ties[p];
        offset[p] = o;
        o += gt + ties[p];
      }
      TORCH_CHECK(o == (r + 1) * k, "topk: internal error: row ", r, " kept ", o - r * k, " elements, expected ", k);
      if (equal > cuts[r].ties) tie = true;
    }
  });
  if (ambiguous) *ambiguous = tie;
  // A piece reads its candidates and writes its share of the k (int64 and float each).
  parallel_for(0, np, 20 * n / np, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t o = offset[p];
      emit_kept(cand[p], cuts[pieces[p].row], ties[p], offset[p + 1] - o, ip + o, vp + o);
    }
  });
}

namespace {
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define TL_WIDEN_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TL_WIDEN_CLONES
#endif
// out[i] = base + pos[i], i in [0, n): a loop the compiler vectorises (the baseline build did two
// int64 lanes at a time: ~10 us of a 1 MiB randk(0.1) encode).
TL_WIDEN_CLONES void widen_positions(const int32_t* pos, int64_t n, int64_t base, int64_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = base + pos[i];
}

// Note [selection by compaction]. Threshold and RandK keep, in index order, the elements of the
// flattened tensor that pass a test of their own (|x| > t, the mask): pieces of the tensor gather
// them as TopK gathers its candidates (Note [compaction by permutation]), then are copied out at
// the prefix sums of their counts: a pass over x and one over the n kept. (It was a scalar loop
// over x that counted, then another that emitted.) Pieces of at least kTaskBytes of x; the
// scratch is reserved on the calling thread and kept for the next call.
void select_flat(const float* x, const uint8_t* mask, int64_t N, uint32_t lo, int64_t expect, at::Tensor& idx_out,
                 at::Tensor& vals_out) {
  const int64_t np = std::max<int64_t>(
      {1, std::min<int64_t>(2 * threads(), N * int64_t(sizeof(float)) / kTaskBytes), N / kMaxPiece + 1});
  const int64_t len = (N + np - 1) / np, piece_expect = expect / np + 1;
  static thread_local std::vector<Candidates> scratch;
  if (static_cast<int64_t>(scratch.size()) < np) scratch.resize(np);
  for (int64_t p = 0; p < np; ++p) scratch[p].reserve(candidate_room(piece_expect));
  std::vector<Candidates>& cand = scratch;
  parallel_for(0, np, len * int64_t(sizeof(float) + (mask ? 1 : 0)), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t b = std::min(N, p * len), e = std::min(N, b + len);
      gather_candidates(x, mask, 0, b, e, lo, piece_expect, cand[p]);
    }
  });
  std::vector<int64_t> offset(np + 1, 0);
  for (int64_t p = 0; p < np; ++p) offset[p + 1] = offset[p] + cand[p].count;
  at::Tensor idx = at::empty({offset[np]}, at::kLong), vals = at::empty({offset[np]}, at::kFloat);
  int64_t* ip = idx.data_ptr<int64_t>();
  float* vp = vals.data_ptr<float>();
  // A piece reads its kept (int32 and float) and writes them (int64 and float).
  parallel_for(0, np, 20 * offset[np] / np, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const Candidates& c = cand[p];
      widen_positions(c.pos.get(), c.count, c.base, ip + offset[p]);
      if (c.count > 0) std::memcpy(vp + offset[p], c.val.get(), c.count * sizeof(float));
    }
  });
  idx_out = idx;
  vals_out = vals;
}
}  // namespace

void threshold_select_cpu(const float* x, int64_t N, uint32_t cut, at::Tensor& idx, at::Tensor& vals) {
  select_flat(x, nullptr, N, cut + 1, N / 8, idx, vals);  // key >= cut + 1; cut <= 0x7fffffff
}

void mask_select_cpu(const float* x, const uint8_t* mask, int64_t N, int64_t expect, at::Tensor& idx,
                     at::Tensor& vals) {
  select_flat(x, mask, N, 0, expect, idx, vals);
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
    parallel_for(0, numel, sizeof(float), [&](int64_t e0, int64_t e1) { std::fill(out + e0, out + e1, 0.0f); });
    return true;
  }
  std::atomic<bool> ok{true};
  // An entry reads its index and value and writes its share of the outputs (on average).
  const int64_t entry_bytes = (numel * int64_t(sizeof(float)) + n * int64_t(8 + sizeof(T))) / n;
  parallel_for(0, n, entry_bytes, [&](int64_t i0, int64_t i1) {
    const int64_t j = i0 == 0 ? 0 : idx[i0 - 1] + 1;
    const int64_t e = i1 == n ? numel : idx[i1 - 1] + 1;
    if (!write_stretch(idx, v, i0, i1, j, e, out)) ok = false;
  });
  return ok;
}

// Row r of out (rows, D): the values of row r at the channels of its block (ascending), zeros
// elsewhere.
template <class T>
bool scatter_rows(const int64_t* channels, const T* v, int64_t rows, int64_t D, int64_t k, int64_t block, float* out) {
  std::atomic<bool> ok{true};
  parallel_for(0, rows, D * int64_t(sizeof(float)) + k * int64_t(sizeof(T)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      if (!write_stretch(channels + r / block * k, v + r * k, 0, k, 0, D, out + r * D)) ok = false;
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

bool sparse_avx512() {
#ifdef TL_COMPACT_AVX2
  return compact_with_avx512();
#else
  return false;
#endif
}

bool set_sparse_avx512(bool on) {
#ifdef TL_COMPACT_AVX2
  return avx512_allowed.exchange(on);
#else
  return on;
#endif
}

bool scatter_sorted_cpu(const int64_t* idx, const at::Tensor& values, int64_t numel, float* out) {
  // fp16 and bf16 values are made float32 first, by the vectorised casts (each value on its own
  // was c10::Half's software conversion, about half of a 1 MiB TopK scatter); NaN as before.
  const at::ScalarType vt = values.scalar_type();
  if (vt == at::kHalf || vt == at::kBFloat16) {
    static thread_local std::vector<float> wide;  // kept for the next call
    const int64_t n = values.numel();
    wide.resize(n);
    if (cast_back_cpu(static_cast<const uint8_t*>(values.data_ptr()), n, vt, wide.data()))
      return scatter_sorted(idx, wide.data(), n, numel, out);
  }
  return dispatch_values(values, [&](auto* v) { return scatter_sorted(idx, v, values.numel(), numel, out); });
}

bool scatter_rows_cpu(const int64_t* channels, const at::Tensor& values, int64_t rows, int64_t D, float* out,
                      int64_t block) {
  const int64_t k = rows > 0 ? values.numel() / rows : 0;
  return dispatch_values(values, [&](auto* v) { return scatter_rows(channels, v, rows, D, k, block, out); });
}

void gather_rows_cpu(const float* x, int64_t rows, int64_t D, const int64_t* channels, int64_t k, float* out,
                     int64_t block) {
  // A row's gather touches most of its cache lines, and writes k.
  parallel_for(0, rows, (D + k) * int64_t(sizeof(float)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t* ch = channels + r / block * k;
      const float* xr = x + r * D;
      float* o = out + r * k;
      for (int64_t c = 0; c < k; ++c) o[c] = xr[ch[c]];
    }
  });
}

namespace {

// Note [draws from a copy of the engine]. CPUGeneratorImpl::random64() is two draws of its mt19937,
// the first the high half, behind a call into libtorch for every kept element (RandK's Floyd's
// algorithm draws one a position), and at::mt19937's own draw, inline, still has a branch, the
// state's counters in memory and a scalar twist every 624 draws. Here a copy of the engine's state
// makes the draws a block at a time (mt19937_draws: the twist and the tempering as loops over the
// state, vectorised), and the state, advanced by as many draws, is put back: the generator ends
// where random64() would have left it, and the positions are the same. Whether the linked libtorch
// forms random64() that way is asked once, on a generator of our own; where it does not, random64()
// is called as before.
bool random64_from_engine() {
  static const bool same = [] {
    at::CPUGeneratorImpl probe(20260127);
    at::mt19937 e = probe.engine();
    uint32_t d[128];
    mt19937_draws(e, d, 128);
    for (int i = 0; i < 64; ++i)
      if (probe.random64() != (uint64_t(d[2 * i]) << 32 | d[2 * i + 1])) return false;
    return true;
  }();
  return same;
}

constexpr int kMtN = 624, kMtM = 397;

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define TL_MT_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TL_MT_CLONES
#endif

inline uint32_t mt_twist(uint32_t u, uint32_t v) {
  return (((u & 0x80000000u) | (v & 0x7fffffffu)) >> 1) ^ ((0u - (v & 1u)) & 0x9908b0dfu);
}

// at::mt19937's next_state, as three loops over the indices (the first two vectorise: the reads
// of a vector are of old values in the first, of values written at least 227 places earlier in
// the second).
TL_MT_CLONES void mt_next_state(uint32_t* p) {
  for (int i = 0; i < kMtN - kMtM; ++i) p[i] = p[i + kMtM] ^ mt_twist(p[i], p[i + 1]);
  for (int i = kMtN - kMtM; i < kMtN - 1; ++i) p[i] = p[i + kMtM - kMtN] ^ mt_twist(p[i], p[i + 1]);
  p[kMtN - 1] = p[kMtM - 1] ^ mt_twist(p[kMtN - 1], p[0]);
}

TL_MT_CLONES void mt_temper(const uint32_t* state, int64_t count, uint32_t* out) {
  for (int64_t i = 0; i < count; ++i) {
    uint32_t y = state[i];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    out[i] = y;
  }
}

template <typename Draw>
void floyd_row(Draw&& draw, int64_t D, int64_t k, const Remainder* rem, uint8_t* m) {
  for (int64_t j = D - k; j < D; ++j) {
    // Uniform in [0, j]; the modulo bias is below (j + 1) / 2^64.
    const int64_t t = static_cast<int64_t>(rem[j - (D - k)].of(draw(j - (D - k))));
    if (m[t])
      m[j] = 1;
    else
      m[t] = 1;
  }
}

}  // namespace

void mt19937_draws(at::mt19937& engine, uint32_t* out, int64_t count) {
  at::mt19937_data_pod s = engine.data();
  // A draw decrements left_, twists when it reaches 0 (left_ = 624, next_ = 0), then returns
  // state[next_++] tempered: left_ - 1 draws come before the next twist. A state outside that
  // pattern (not one an engine reaches) is drawn from one by one.
  if (!(s.left_ >= 1 && s.left_ <= kMtN && int64_t(s.next_) + s.left_ - 1 <= kMtN)) {
    for (int64_t i = 0; i < count; ++i) out[i] = engine();
    return;
  }
  for (int64_t done = 0; done < count;) {
    if (s.left_ == 1) {
      mt_next_state(s.state_.data());
      s.left_ = kMtN + 1;
      s.next_ = 0;
    }
    const int64_t take = std::min<int64_t>(s.left_ - 1, count - done);
    mt_temper(s.state_.data() + s.next_, take, out + done);
    s.next_ += static_cast<uint32_t>(take);
    s.left_ -= static_cast<int>(take);
    done += take;
  }
  engine.set_data(s);
}

void randk_mask_cpu(at::CPUGeneratorImpl* gen, int64_t rows, int64_t D, int64_t k, uint8_t* mask) {
  if (rows * D == 0) return;  // an empty tensor's mask pointer is null, and memset(null, ...) is undefined
  std::memset(mask, 0, static_cast<size_t>(rows * D));
  std::vector<Remainder> rem;  // rem[j - (D - k)]: the remainder by j + 1, the same for every row
  rem.reserve(k);
  for (int64_t j = D - k; j < D; ++j) rem.emplace_back(static_cast<uint64_t>(j + 1));
  std::lock_guard<std::mutex> lock(gen->mutex_);
  if (random64_from_engine()) {  // Note [draws from a copy of the engine]
    at::mt19937 engine = gen->engine();
    std::vector<uint32_t> draws(2 * k);  // one row's: (high, low) pairs
    for (int64_t r = 0; r < rows; ++r) {
      mt19937_draws(engine, draws.data(), 2 * k);
      const uint32_t* d = draws.data();
      floyd_row([d](int64_t i) { return uint64_t(d[2 * i]) << 32 | d[2 * i + 1]; }, D, k, rem.data(), mask + r * D);
    }
    gen->set_engine(engine);
    return;
  }
  for (int64_t r = 0; r < rows; ++r)
    floyd_row([gen](int64_t) { return gen->random64(); }, D, k, rem.data(), mask + r * D);
}

}  // namespace tl::codec
