#include "compression/codecs/sparse_index.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <vector>

#include "compression/codecs/x86.h"

#include "compression/codecs/common.h"
#include "compression/codecs/inline_parallel.h"
#include "compression/codecs/sparse_kernels.h"
#include "compression/payload.h"

namespace tl::codec {
namespace {

constexpr int64_t kInt32Universe = int64_t(1) << 31;

// Bytes of the varint of v: 7 bits per byte.
int varint_len(uint64_t v) { return (64 - __builtin_clzll(v | 1) + 6) / 7; }

// ---- CPU loops ----
// Note [delta index in parallel]. A varint stream is sequential by nature, but both directions
// split: encoding, chunks of indices count their bytes (the gap before a chunk's first index comes
// from its predecessor's last), then each writes at the prefix sum of the counts. Decoding, a chunk
// of bytes starts at the first varint that starts in it (the byte after one without the
// continuation bit); chunks count their varints (bytes without that bit), then decode into their
// place with positions relative to the chunk's start, then add the sum of the gaps before them.
// The bytes and indices are those of the one-pass loop, and corrupt streams are refused as there.
constexpr int64_t kDeltaChunk = int64_t(1) << 16;  // indices (encode) or bytes (decode) per work item

// Note [one-byte gaps]. At TopK's and threshold's densities (10%: gaps of ~9) nearly every gap
// fits in one varint byte, and a stream of one-byte varints is the gaps themselves. A chunk whose
// largest gap is below 128 is counted, written and read by plain loops that the compiler
// vectorises (the range of the gaps, the narrowing to bytes) or that carry one addition (the running
// index), instead of a varint length, a loop and a branch per gap. Same bytes and indices.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define TL_DELTA_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TL_DELTA_CLONES
#endif

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TL_DELTA_AVX512 1  // loops with AVX-512 where sparse_avx512() says so
#endif

#ifdef TL_DELTA_AVX512
// idx[i] = rel += 1 + in[i] for i in [0, n); the last rel. With AVX-512, 8 indices a step: the
// gaps widened to int64, their running sum within the vector by three shifted adds, plus the
// last index before them (the same integers as the scalar loop).
__attribute__((target("avx512f"))) int64_t running_sum_avx512(const uint8_t* in, int64_t n, int64_t rel, int64_t* idx) {
  const __m512i one = _mm512_set1_epi64(1), zero = _mm512_setzero_si512(), last = _mm512_set1_epi64(7);
  __m512i carry = _mm512_set1_epi64(rel);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m512i g = _mm512_add_epi64(_mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(in + i))), one);
    g = _mm512_add_epi64(g, _mm512_alignr_epi64(g, zero, 7));  // lane j += lane j - 1
    g = _mm512_add_epi64(g, _mm512_alignr_epi64(g, zero, 6));  // += lanes j - 2, j - 3
    g = _mm512_add_epi64(g, _mm512_alignr_epi64(g, zero, 4));  // += lanes j - 4 .. j - 7
    g = _mm512_add_epi64(g, carry);
    _mm512_storeu_si512(idx + i, g);
    carry = _mm512_permutexvar_epi64(last, g);
  }
  rel = i > 0 ? idx[i - 1] : rel;
  for (; i < n; ++i) idx[i] = rel += 1 + in[i];
  return rel;
}
#endif

// running_sum_avx512's result, on any CPU.
int64_t running_sum(const uint8_t* in, int64_t n, int64_t rel, int64_t* idx) {
#ifdef TL_DELTA_AVX512
  if (sparse_avx512()) return running_sum_avx512(in, n, rel, idx);
#endif
  for (int64_t i = 0; i < n; ++i) idx[i] = rel += 1 + in[i];
  return rel;
}

#ifdef TL_DELTA_AVX512
// steps_fit_a_byte and write_small_gaps 8 indices at a time with AVX-512 (int64 min and max, and
// the narrowing store of 8 gaps, which AVX2 lacks); the same answers and bytes.
__attribute__((target("avx512f"))) bool steps_fit_a_byte_avx512(const int64_t* idx, int64_t i0, int64_t i1) {
  __m512i lo = _mm512_set1_epi64(1), hi = lo;
  int64_t i = i0 + 1;
  for (; i + 8 <= i1; i += 8) {
    const __m512i step = _mm512_sub_epi64(_mm512_loadu_si512(idx + i), _mm512_loadu_si512(idx + i - 1));
    lo = _mm512_min_epi64(lo, step);
    hi = _mm512_max_epi64(hi, step);
  }
  int64_t l = _mm512_reduce_min_epi64(lo), h = _mm512_reduce_max_epi64(hi);
  for (; i < i1; ++i) {
    l = std::min(l, idx[i] - idx[i - 1]);
    h = std::max(h, idx[i] - idx[i - 1]);
  }
  return l >= 1 && h <= 128;
}

__attribute__((target("avx512f"))) void write_small_gaps_avx512(const int64_t* idx, int64_t i0, int64_t i1,
                                                                uint8_t* out) {
  const __m512i one = _mm512_set1_epi64(1);
  int64_t i = i0 + 1;
  for (; i + 8 <= i1; i += 8) {
    const __m512i gap =
        _mm512_sub_epi64(_mm512_sub_epi64(_mm512_loadu_si512(idx + i), _mm512_loadu_si512(idx + i - 1)), one);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + (i - i0)), _mm512_cvtepi64_epi8(gap));
  }
  for (; i < i1; ++i) out[i - i0] = static_cast<uint8_t>(idx[i] - idx[i - 1] - 1);
}
#endif

// Whether every idx[i] - idx[i - 1], i in [i0 + 1, i1), lies in [1, 128] (the gap below it in
// [0, 127]): two reductions, without a branch.
TL_DELTA_CLONES bool steps_fit_a_byte_loop(const int64_t* idx, int64_t i0, int64_t i1) {
  int64_t lo = 1, hi = 1;
  for (int64_t i = i0 + 1; i < i1; ++i) {
    const int64_t step = idx[i] - idx[i - 1];
    lo = std::min(lo, step);
    hi = std::max(hi, step);
  }
  return lo >= 1 && hi <= 128;
}

// out[i - i0] = idx[i] - idx[i - 1] - 1 for i in [i0 + 1, i1): gaps known to be below 128.
TL_DELTA_CLONES void write_small_gaps_loop(const int64_t* idx, int64_t i0, int64_t i1, uint8_t* out) {
  for (int64_t i = i0 + 1; i < i1; ++i) out[i - i0] = static_cast<uint8_t>(idx[i] - idx[i - 1] - 1);
}

bool steps_fit_a_byte(const int64_t* idx, int64_t i0, int64_t i1) {
#ifdef TL_DELTA_AVX512
  if (sparse_avx512()) return steps_fit_a_byte_avx512(idx, i0, i1);
#endif
  return steps_fit_a_byte_loop(idx, i0, i1);
}

void write_small_gaps(const int64_t* idx, int64_t i0, int64_t i1, uint8_t* out) {
#ifdef TL_DELTA_AVX512
  if (sparse_avx512()) return write_small_gaps_avx512(idx, i0, i1, out);
#endif
  write_small_gaps_loop(idx, i0, i1, out);
}

// Whether every gap of idx[i0, i1) (the first from idx[i0 - 1], or from -1) is below 128.
bool small_gaps(const int64_t* idx, int64_t i0, int64_t i1) {
  if (i0 >= i1) return true;
  const int64_t first = idx[i0] - (i0 == 0 ? -1 : idx[i0 - 1]) - 1;
  return first >= 0 && first < 128 && steps_fit_a_byte(idx, i0, i1);
}

// Varint bytes of the gaps of idx[i0, i1) (the first gap from idx[i0 - 1], or from -1).
int64_t delta_bytes_range(const int64_t* idx, int64_t i0, int64_t i1) {
  if (small_gaps(idx, i0, i1)) return i1 - i0;  // Note [one-byte gaps]
  int64_t total = 0, prev = i0 == 0 ? -1 : idx[i0 - 1];
  for (int64_t i = i0; i < i1; ++i) {
    total += varint_len(static_cast<uint64_t>(idx[i] - prev - 1));
    prev = idx[i];
  }
  return total;
}

// Bytes of each chunk of kDeltaChunk indices.
std::vector<int64_t> delta_chunk_bytes(const int64_t* idx, int64_t n) {
  const int64_t chunks = (n + kDeltaChunk - 1) / kDeltaChunk;
  std::vector<int64_t> bytes(chunks, 0);
  parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      bytes[c] = delta_bytes_range(idx, c * kDeltaChunk, std::min(n, (c + 1) * kDeltaChunk));
  });
  return bytes;
}

int64_t delta_bytes_cpu(const int64_t* idx, int64_t n) {
  int64_t total = 0;
  for (int64_t b : delta_chunk_bytes(idx, n)) total += b;
  return total;
}

// `bytes`: delta_chunk_bytes(idx, n).
void delta_encode_cpu(const int64_t* idx, int64_t n, const std::vector<int64_t>& bytes, uint8_t* out) {
  std::vector<int64_t> offset(bytes.size() + 1, 0);
  for (size_t c = 0; c < bytes.size(); ++c) offset[c + 1] = offset[c] + bytes[c];
  parallel_for(0, static_cast<int64_t>(bytes.size()), 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t i0 = c * kDeltaChunk, i1 = std::min(n, i0 + kDeltaChunk);
      uint8_t* o = out + offset[c];
      int64_t prev = i0 == 0 ? -1 : idx[i0 - 1];
      if (bytes[c] == i1 - i0) {  // one byte a gap (Note [one-byte gaps])
        if (i0 < i1) o[0] = static_cast<uint8_t>(idx[i0] - prev - 1);
        write_small_gaps(idx, i0, i1, o);
        continue;
      }
      for (int64_t i = i0; i < i1; ++i) {
        uint64_t g = static_cast<uint64_t>(idx[i] - prev - 1);
        prev = idx[i];
        while (g >= 0x80) {
          *o++ = static_cast<uint8_t>(g | 0x80);
          g >>= 7;
        }
        *o++ = static_cast<uint8_t>(g);
      }
    }
  });
}

void delta_decode_cpu(const uint8_t* in, int64_t size, int64_t n, int64_t universe, int64_t* idx, const char* codec) {
  if (n == 0) {
    TORCH_CHECK(size == 0, codec, ": corrupt delta index: ", size, " bytes left after 0 indices");
    return;
  }
  TORCH_CHECK(size > 0 && !(in[size - 1] & 0x80), codec, ": corrupt delta index: the varints end after fewer than ", n,
              " indices");
  // Chunk c covers the varints that start in [c * kDeltaChunk, (c + 1) * kDeltaChunk).
  const int64_t chunks = (size + kDeltaChunk - 1) / kDeltaChunk;
  std::vector<int64_t> begin(chunks + 1, size), count(chunks + 1, 0), span(chunks, 0);
  parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      int64_t b = c * kDeltaChunk;
      while (b > 0 && b < size && (in[b - 1] & 0x80)) ++b;  // the first varint starting here
      begin[c] = b;
      int64_t ends = 0;
      for (int64_t j = c * kDeltaChunk, e = std::min(size, (c + 1) * kDeltaChunk); j < e; ++j) ends += !(in[j] & 0x80);
      count[c + 1] = ends;  // the varints ending in the chunk's bytes
    }
  });
  // Ends counted per byte range; a varint belongs to the chunk where it starts, and one that
  // crosses into chunk c + 1 ends there: move it back (begin[c + 1] > its byte range's start).
  std::vector<int64_t> first(chunks + 1, 0);
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t crossing = c + 1 < chunks && begin[c + 1] > (c + 1) * kDeltaChunk ? 1 : 0;
    const int64_t mine = count[c + 1] + crossing - (c > 0 && begin[c] > c * kDeltaChunk ? 1 : 0);
    first[c + 1] = first[c] + mine;
  }
  TORCH_CHECK(first[chunks] == n, codec, ": corrupt delta index: ", first[chunks], " varints, the header announces ",
              n);
  std::atomic<bool> long_varint{false}, past{false};
  parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      int64_t pos = begin[c], rel = -1;  // positions relative to the chunk's start, -1 before it
      const int64_t e = begin[c + 1];
      if (e - pos == first[c + 1] - first[c]) {  // one byte a varint (Note [one-byte gaps])
        rel = running_sum(in + pos, first[c + 1] - first[c], rel, idx + first[c]);
        if (rel >= universe) {
          past = true;
          return;
        }
        span[c] = rel + 1;
        continue;
      }
      for (int64_t i = first[c]; i < first[c + 1]; ++i) {
        uint64_t g = 0;
        int shift = 0;
        while (true) {
          const uint8_t b = in[pos++];
          if (shift >= 63) {
            long_varint = true;
            return;
          }
          g |= static_cast<uint64_t>(b & 0x7f) << shift;
          shift += 7;
          if (!(b & 0x80)) break;
        }
        if (g >= static_cast<uint64_t>(universe) || rel + 1 + static_cast<int64_t>(g) >= universe) {
          past = true;
          return;
        }
        rel += 1 + static_cast<int64_t>(g);
        idx[i] = rel;
      }
      TORCH_CHECK(pos == e, "delta index: internal error: chunk decoded ", pos - begin[c], " bytes of ", e - begin[c]);
      span[c] = rel + 1;  // the gaps of the chunk, its varints included
    }
  });
  TORCH_CHECK(!long_varint, codec, ": corrupt delta index: a varint is longer than 9 bytes");
  TORCH_CHECK(!past, codec, ": corrupt delta index: an index lies past the ", universe, " elements of the tensor");
  std::vector<int64_t> base(chunks, -1);
  for (int64_t c = 0, b = 0; c < chunks; ++c) {
    base[c] = b;
    b += span[c];
    TORCH_CHECK(b <= universe, codec, ": corrupt delta index: indices run past the ", universe,
                " elements of the tensor");
  }
  parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      if (base[c] != 0)
        for (int64_t i = first[c]; i < first[c + 1]; ++i) idx[i] += base[c];
  });
}

void bitmap_encode_cpu(const int64_t* idx, int64_t n, uint8_t* out) {
  for (int64_t i = 0; i < n; ++i) out[idx[i] >> 3] |= static_cast<uint8_t>(1u << (idx[i] & 7));
}

// Set bits of a bitmap, in order. Chunks of bytes count their bits first, then write in parallel.
void bitmap_decode_cpu(const uint8_t* in, int64_t size, int64_t universe, int64_t n, int64_t* idx, const char* codec) {
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = (size + kChunk - 1) / kChunk;
  std::vector<int64_t> count(chunks + 1, 0);
  parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      int64_t s = 0;
      for (int64_t b = c * kChunk, e = std::min(size, b + kChunk); b < e; ++b) s += __builtin_popcount(in[b]);
      count[c + 1] = s;
    }
  });
  for (int64_t c = 0; c < chunks; ++c) count[c + 1] += count[c];
  TORCH_CHECK(count[chunks] == n, codec, ": corrupt bitmap index: ", count[chunks], " bits set, the header announces ",
              n);
  if (size > 0 && universe % 8 != 0)
    TORCH_CHECK((in[size - 1] >> (universe % 8)) == 0, codec, ": corrupt bitmap index: bits set past the ", universe,
                " elements of the tensor");
  parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      int64_t o = count[c];
      for (int64_t b = c * kChunk, e = std::min(size, b + kChunk); b < e; ++b) {
        unsigned v = in[b];
        while (v) {
          idx[o++] = 8 * b + __builtin_ctz(v);
          v &= v - 1;
        }
      }
    }
  });
}

// ---- portable (ATen ops) ----
// Every op here stays on the tensors' device; sizes come from the host (n, universe), never from
// the data, except where noted. See Note [host synchronisation] in compression/payload.cpp.
at::Tensor varint_lengths(const at::Tensor& gaps) {
  at::Tensor len = at::ones_like(gaps);
  for (int s = 7; s < 63; s += 7) len += (gaps >= (int64_t(1) << s)).to(at::kLong);
  return len;
}

at::Tensor gaps_of(const at::Tensor& idx) {
  at::Tensor prev =
      at::cat({at::full({1}, -1, idx.options()), idx.narrow(0, 0, std::max<int64_t>(idx.numel() - 1, 0))});
  return idx.numel() == 0 ? idx.clone() : idx - prev - 1;
}

at::Tensor delta_encode_portable(const at::Tensor& idx, int64_t universe) {
  at::Tensor gaps = gaps_of(idx);
  at::Tensor len = varint_lengths(gaps);
  at::Tensor ends = len.cumsum(0);
  // The one data-dependent size of the codecs' encode paths: the varint stream's length.
  const int64_t total = idx.numel() == 0 ? 0 : ends[-1].item<int64_t>();
  if (total == 0) return at::empty({0}, idx.options().dtype(at::kByte));
  // Byte b of every varint at once; varints shorter than b + 1 bytes write to a spare last slot.
  at::Tensor out = at::empty({total + 1}, idx.options().dtype(at::kByte));
  at::Tensor start = ends - len;
  const int longest = varint_len(static_cast<uint64_t>(std::max<int64_t>(universe - 1, 0)));  // gaps < universe
  for (int64_t b = 0; b < longest; ++b) {
    at::Tensor sel = len > b;
    at::Tensor byte = at::bitwise_and(at::bitwise_right_shift(gaps, 7 * b), 0x7f) + (len > b + 1).to(at::kLong) * 0x80;
    out.scatter_(0, at::where(sel, start + b, at::full_like(start, total)), byte.to(at::kByte));
  }
  return out.narrow(0, 0, total);
}

// Positions of the set entries of a 1-D bool mask known to hold exactly n of them, in order,
// without nonzero (whose output size would have to reach the host first).
at::Tensor compact_positions(const at::Tensor& mask, int64_t n) {
  const int64_t size = mask.numel();
  at::Tensor m = mask.to(at::kLong);
  at::Tensor rank = m.cumsum(0) - m;                                             // set entries: their order
  at::Tensor dest = at::where(mask, rank.clamp_max(n), at::full_like(rank, n));  // others: spare slot n
  at::Tensor out = at::empty({n + 1}, m.options());
  out.scatter_(0, dest, at::arange(size, m.options()));
  return out.narrow(0, 0, n);
}

// `check`: also validate the bytes (each check reads a value back: a device synchronisation).
at::Tensor delta_decode_portable(const at::Tensor& bytes, int64_t n, int64_t universe, const char* codec, bool check) {
  const int64_t size = bytes.numel();
  if (n == 0) {
    TORCH_CHECK(size == 0, codec, ": corrupt delta index: ", size, " bytes for 0 indices");
    return at::empty({0}, bytes.options().dtype(at::kLong));
  }
  at::Tensor b = bytes.to(at::kLong);
  at::Tensor last = at::bitwise_and(b, 0x80) == 0;  // (T) bool: a varint ends here
  if (check) {
    const int64_t ends = last.sum().item<int64_t>();
    TORCH_CHECK(ends == n && last[-1].item<bool>(), codec, ": corrupt delta index: ", ends,
                " complete varints, the header announces ", n);
  }
  at::Tensor last_l = last.to(at::kLong);
  at::Tensor id = (last_l.cumsum(0) - last_l).clamp_max(n - 1);  // (T) which varint each byte belongs to
  at::Tensor end_pos = compact_positions(last, n);               // (n) last byte of each varint
  at::Tensor starts = at::cat({at::zeros({1}, b.options()), end_pos.narrow(0, 0, n - 1) + 1});
  at::Tensor pos = at::arange(size, b.options()) - starts.index_select(0, id);  // byte position within its varint
  if (check) {
    TORCH_CHECK(pos.max().item<int64_t>() < 9, codec, ": corrupt delta index: a varint is longer than 9 bytes");
  }
  at::Tensor gaps = at::zeros({n}, b.options())
                        .index_add_(0, id, at::bitwise_left_shift(at::bitwise_and(b, 0x7f), 7 * pos.clamp(0, 8)));
  if (check) {
    TORCH_CHECK(gaps.max().item<int64_t>() < universe, codec, ": corrupt delta index: a gap exceeds the ", universe,
                " elements of the tensor");
  }
  at::Tensor idx = (gaps + 1).cumsum(0) - 1;
  if (check) {
    TORCH_CHECK(idx[-1].item<int64_t>() < universe &&
                    (n < 2 || (idx.narrow(0, 1, n - 1) > idx.narrow(0, 0, n - 1)).all().item<bool>()),
                codec, ": corrupt delta index: indices run past the ", universe, " elements of the tensor");
  }
  return idx;
}

}  // namespace

std::optional<IndexFormat> index_format_from_word(const std::string& word) {
  if (word == "auto") return std::nullopt;
  if (word == "int32") return IndexFormat::kInt;
  if (word == "delta") return IndexFormat::kDelta;
  if (word == "bitmap") return IndexFormat::kBitmap;
  TORCH_CHECK(false, "unknown index format '", word, "'; accepted: auto, int32, delta, bitmap");
}

std::string index_format_word(std::optional<IndexFormat> f) {
  if (!f) return "auto";
  switch (*f) {
    case IndexFormat::kInt:
      return "int32";
    case IndexFormat::kDelta:
      return "delta";
    case IndexFormat::kBitmap:
      return "bitmap";
  }
  return "?";
}

IndexFormat index_format_from_param(int64_t v, const char* codec) {
  TORCH_CHECK(v >= 0 && v <= 2, codec, ": corrupt payload: index format ", v,
              " is not 0 (int), 1 (delta) or 2 (bitmap)");
  return static_cast<IndexFormat>(v);
}

int64_t index_int_width(int64_t universe) { return universe <= kInt32Universe ? 4 : 8; }
int64_t index_int_bytes(int64_t n, int64_t universe) { return n * index_int_width(universe); }
int64_t index_bitmap_bytes(int64_t universe) { return (universe + 7) / 8; }

at::Tensor positions_of(const at::Tensor& mask, int64_t n) { return compact_positions(mask.reshape({-1}), n); }

int64_t index_delta_bytes(const at::Tensor& idx) {
  if (use_cpu_kernel(idx)) {
    at::Tensor c = idx.contiguous();
    return delta_bytes_cpu(c.data_ptr<int64_t>(), c.numel());
  }
  return idx.numel() == 0 ? 0 : varint_lengths(gaps_of(idx)).sum().item<int64_t>();
}

namespace {
// pick_index_format, also returning the delta size per chunk where it was computed on the CPU
// (else empty).
IndexFormat pick_format(const at::Tensor& idx, int64_t universe, std::optional<IndexFormat> forced,
                        std::vector<int64_t>& delta_chunks) {
  delta_chunks.clear();
  if (forced) return *forced;
  // Varints take at least one byte per index, so the delta size is only computed when it can win.
  // Off the CPU it is not computed at all: its size depends on the data, and knowing it would
  // synchronise with the device (Note [host synchronisation], payload.cpp).
  const int64_t n = idx.numel();
  const int64_t plain = index_int_bytes(n, universe), bitmap = index_bitmap_bytes(universe);
  const int64_t best = std::min(plain, bitmap);
  if (!on_device(idx) && n < best) {
    int64_t delta_bytes = 0;
    if (use_cpu_kernel(idx)) {
      delta_chunks = delta_chunk_bytes(idx.data_ptr<int64_t>(), n);
      for (int64_t b : delta_chunks) delta_bytes += b;
    } else {
      delta_bytes = index_delta_bytes(idx);
    }
    if (delta_bytes < best) return IndexFormat::kDelta;
  }
  return bitmap < plain ? IndexFormat::kBitmap : IndexFormat::kInt;
}
}  // namespace

IndexFormat pick_index_format(const at::Tensor& idx, int64_t universe, std::optional<IndexFormat> forced) {
  std::vector<int64_t> delta_chunks;
  return pick_format(idx.contiguous(), universe, forced, delta_chunks);
}

EncodedIndex encode_index(const at::Tensor& idx_in, int64_t universe, std::optional<IndexFormat> forced) {
  TORCH_CHECK(idx_in.scalar_type() == at::kLong && idx_in.dim() == 1, "encode_index: expected (n) int64 indices");
  at::Tensor idx = idx_in.contiguous();
  const int64_t n = idx.numel();
  std::vector<int64_t> delta_chunks;
  const IndexFormat f = pick_format(idx, universe, forced, delta_chunks);
  const bool cpu = use_cpu_kernel(idx);
  at::Tensor bytes;
  switch (f) {
    case IndexFormat::kInt:
      bytes = idx.to(index_int_width(universe) == 4 ? at::kInt : at::kLong).view(at::kByte);
      break;
    case IndexFormat::kDelta:
      if (cpu) {
        if (delta_chunks.empty()) delta_chunks = delta_chunk_bytes(idx.data_ptr<int64_t>(), n);
        int64_t total = 0;
        for (int64_t b : delta_chunks) total += b;
        bytes = at::empty({total}, idx.options().dtype(at::kByte));
        delta_encode_cpu(idx.data_ptr<int64_t>(), n, delta_chunks, bytes.data_ptr<uint8_t>());
      } else {
        bytes = delta_encode_portable(idx, universe);
      }
      break;
    case IndexFormat::kBitmap:
      if (cpu) {
        bytes = at::zeros({index_bitmap_bytes(universe)}, idx.options().dtype(at::kByte));
        bitmap_encode_cpu(idx.data_ptr<int64_t>(), n, bytes.data_ptr<uint8_t>());
      } else {
        at::Tensor mask = at::zeros({universe}, idx.options().dtype(at::kByte)).index_fill_(0, idx, 1);
        bytes = pack_bits(mask, 1);
      }
      break;
  }
  return {f, bytes};
}

void check_index_bytes(IndexFormat format, int64_t bytes, int64_t n, int64_t universe, const char* codec) {
  bool ok = true;
  switch (format) {
    case IndexFormat::kInt:
      ok = bytes == index_int_bytes(n, universe);
      break;
    case IndexFormat::kBitmap:
      ok = bytes == index_bitmap_bytes(universe);
      break;
    case IndexFormat::kDelta:
      ok = bytes >= n && bytes <= 9 * n;
      break;
  }
  TORCH_CHECK(ok, codec, ": corrupt payload: ", bytes, " index bytes cannot hold ", n, " indices in ",
              index_format_word(format), " form");
}

at::Tensor decode_index(IndexFormat format, const at::Tensor& bytes_in, int64_t n, int64_t universe, const char* codec,
                        const IndexSource& source) {
  TORCH_CHECK(n >= 0 && n <= universe, codec, ": corrupt payload: ", n, " indices into ", universe, " elements");
  if (!bytes_in.device().is_cpu() && source.host_bytes.defined() && source.host_bytes.numel() == bytes_in.numel()) {
    // A received payload with its bytes still on the host: check and decode there, then upload
    // the indices (no device synchronisation).
    at::Tensor idx = decode_index(format, source.host_bytes, n, universe, codec, IndexSource{{}, true});
    return idx.to(bytes_in.device(), /*non_blocking=*/true);
  }
  // Device bytes are checked only when they came from another process without a host copy; an
  // encoder of this process made the others (Note [host synchronisation], payload.cpp).
  const bool check = !on_device(bytes_in) || source.from_wire;
  at::Tensor bytes = bytes_in.contiguous();
  const int64_t size = bytes.numel();
  const bool cpu = use_cpu_kernel(bytes);
  switch (format) {
    case IndexFormat::kInt: {
      const int64_t w = index_int_width(universe);
      TORCH_CHECK(size == n * w, codec, ": corrupt int index: ", size, " bytes for ", n, " indices of ", w, " bytes");
      at::Tensor aligned = reinterpret_cast<uintptr_t>(bytes.data_ptr()) % w == 0 ? bytes : bytes.clone();
      at::Tensor idx = aligned.view(w == 4 ? at::kInt : at::kLong).to(at::kLong);
      if (n > 0 && check) {
        auto [lo, hi] = at::aminmax(idx);
        TORCH_CHECK(lo.item<int64_t>() >= 0 && hi.item<int64_t>() < universe, codec,
                    ": corrupt int index: indices outside [0, ", universe, ")");
      }
      return idx;
    }
    case IndexFormat::kDelta: {
      if (!cpu) return delta_decode_portable(bytes, n, universe, codec, check);
      at::Tensor idx = at::empty({n}, bytes.options().dtype(at::kLong));
      delta_decode_cpu(bytes.data_ptr<uint8_t>(), size, n, universe, idx.data_ptr<int64_t>(), codec);
      return idx;
    }
    case IndexFormat::kBitmap: {
      TORCH_CHECK(size == index_bitmap_bytes(universe), codec, ": corrupt bitmap index: ", size, " bytes for ",
                  universe, " elements (expected ", index_bitmap_bytes(universe), ")");
      if (cpu) {
        at::Tensor idx = at::empty({n}, bytes.options().dtype(at::kLong));
        bitmap_decode_cpu(bytes.data_ptr<uint8_t>(), size, universe, n, idx.data_ptr<int64_t>(), codec);
        return idx;
      }
      // Unpack the padded length so that stray bits past the tensor are seen and rejected.
      at::Tensor mask = unpack_bits(bytes, 1, size * 8);
      if (check) {
        const int64_t set = mask.sum().item<int64_t>();
        TORCH_CHECK(set == n, codec, ": corrupt bitmap index: ", set, " bits set, the header announces ", n);
        TORCH_CHECK(size * 8 == universe || !mask.narrow(0, universe, size * 8 - universe).any().item<bool>(), codec,
                    ": corrupt bitmap index: bits set past the ", universe, " elements of the tensor");
      }
      return compact_positions(mask.to(at::kBool), n);
    }
  }
  TORCH_CHECK(false, codec, ": unknown index format");
}

}  // namespace tl::codec
