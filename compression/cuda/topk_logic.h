#pragma once
// The logic of TopK's selection on a device (topk_cuda.cu), written once for nvcc and g++ (Note
// [one logic, two compilers] in quant_logic.h); topk_cuda_host.cpp runs the same steps serially
// for the CPU tests, which compare the selected indices with the CPU fast path's.
//
// Note [radix top-k on a device]. A row of D elements keeps its k largest magnitudes, ties at the
// k-th taken in index order (the CPU loop's rule, and the ATen path's). The k-th largest key
// (magnitude_key: the float's bits without the sign, so NaN ranks above inf) is found digit by
// digit, most significant first, over three digits of the 31-bit key (11, 11 and 9 bits). Rows
// are cut into tiles of kTopkTile elements (never straddling rows). x is read three times:
//   hist0   a histogram of digit 0 over the row; `find` picks the bin b0 holding the k-th largest,
//           fixes those bits of the key, and `remaining` becomes k minus the keys above b0;
//   split   per tile, the keys whose digit 0 is above b0 (all kept) are counted, and those in b0
//           (the candidates: a few percent of the row for real data, all of it when every value
//           is equal) are copied to the tile's stretch of a candidate buffer as large as x;
//   (the candidates only) a histogram of digit 1 and `find`, a histogram of digit 2 and `find`:
//           the key is then t, the k-th largest, and `remaining` is `need`, how many elements
//           equal to t the row keeps (>= 1: the first `need` of them in index order); then per
//           tile, the keys > t (those above b0 plus the candidates above t) and == t;
//   scan    a block per row turns the tiles' counts into exclusive offsets;
//   write   a warp per 512 elements of a tile, in rounds of 32 consecutive ones: ballots give
//           each lane the counts before it, and element i, when kept, goes to position
//             (keys > t before i) + min(keys == t before i, need)
//           of its row's k, as its flat index. Positions are unique and increasing: every byte of
//           the output has one writer, and nothing depends on the order warps run in.
// No step reads a value back to the host; scratch is sized from (rows, D) alone. The histograms
// are 8 KiB a row, so rows of fewer elements than bins go to the ATen path when there are many
// (topk_fits_radix); counts are 32-bit, so a row holds fewer than 2^32 elements.

#include <cstdint>
#include <cstring>

#include "compression/cuda/hd.h"

namespace tl::codec::gpu {

constexpr int kRadixPasses = 3;
constexpr int kRadixBins = 2048;  // the widest digit
constexpr int kTopkTile = 4096;   // elements a tile: 8 warps x 16 rounds x 32 lanes

/// The shape of a selection: `rows` rows of D elements, k kept in each (1 <= k <= D).
struct TopkShape {
  int64_t rows, D, k;
};

/// A row's progress through the passes: the key's bits found so far (`prefix` under `mask`) and
/// how many of the row's kept elements are still to find below them.
struct RadixRow {
  uint32_t prefix, mask;
  int64_t remaining;
};

/// Whether a selection of this shape takes the radix path: its histograms (8 KiB a row) at most
/// the size of x or 1 MiB, and counts that fit 32 bits.
TL_HD bool topk_fits_radix(const TopkShape& s) {
  const int64_t n = s.rows * s.D;
  return s.k >= 1 && s.D < (int64_t(1) << 32) && s.rows * kRadixBins <= (n > 262144 ? n : 262144);
}

TL_HD uint32_t topk_key(float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof(u));
  return u & 0x7fffffffu;
}

TL_HD int radix_shift(int pass) { return pass == 0 ? 20 : pass == 1 ? 9 : 0; }
TL_HD int radix_bins(int pass) { return pass == 2 ? 512 : kRadixBins; }
TL_HD uint32_t radix_digit(uint32_t key, int pass) {
  return key >> radix_shift(pass) & static_cast<uint32_t>(radix_bins(pass) - 1);
}
TL_HD bool radix_matches(uint32_t key, const RadixRow& r) { return (key & r.mask) == r.prefix; }

TL_HD int64_t tiles_per_row(const TopkShape& s) { return (s.D + kTopkTile - 1) / kTopkTile; }
/// Tile t covers elements [begin, begin + len) of row t / tiles_per_row.
TL_HD int64_t tile_begin(const TopkShape& s, int64_t t) { return t % tiles_per_row(s) * kTopkTile; }
TL_HD int64_t tile_len(int64_t begin, int64_t end) {
  return end - begin < kTopkTile ? (end - begin > 0 ? end - begin : 0) : kTopkTile;
}

/// Fixes pass `pass`'s digit of row r from its histogram: the bin holding the `remaining`-th
/// largest of the matching keys, given `above`, the keys in bins above it.
TL_HD void radix_fix(RadixRow& r, int pass, uint32_t bin, int64_t above) {
  r.prefix |= bin << radix_shift(pass);
  r.mask |= static_cast<uint32_t>(radix_bins(pass) - 1) << radix_shift(pass);
  r.remaining -= above;
}

/// The serial `find` (the kernel does it with a block scan): walk the bins from the top.
TL_HD void radix_find_serial(const uint32_t* hist, int pass, RadixRow& r) {
  int64_t above = 0;
  for (int b = radix_bins(pass) - 1; b >= 0; --b) {
    if (above + hist[b] >= r.remaining || b == 0) return radix_fix(r, pass, static_cast<uint32_t>(b), above);
    above += hist[b];
  }
}

/// A tile's counts packed in 32 bits: keys > t in the low half, keys == t in the high half (a
/// tile holds at most kTopkTile, so each fits 16 bits and sums of packed counts never carry).
TL_HD uint32_t topk_flags(uint32_t key, uint32_t t) { return key > t ? 1u : key == t ? 0x10000u : 0u; }

/// Element `flat` (key `key`), with `gt` keys > t and `eq` keys == t before it in its row, whose
/// kept elements start at out: writes it when kept and advances the counts.
TL_HD void topk_emit(uint32_t key, uint32_t t, int64_t need, int64_t flat, int64_t& gt, int64_t& eq, int64_t* out) {
  if (key > t) {
    out[gt + (eq < need ? eq : need)] = flat;
    ++gt;
  } else if (key == t) {
    if (eq < need) out[gt + eq] = flat;
    ++eq;
  }
}

/// Where a selection's scratch lives (topk_buffers): `zeroed` bytes that must start as zeros, and
/// `rest` bytes that need not. Pointers into device memory for the kernels, host memory for the
/// host loops.
struct TopkBuffers {
  RadixRow* row;          // (rows), zeroed
  uint32_t* hist;         // (passes, rows, kRadixBins), zeroed
  uint32_t* cand;         // (rows * D): tile t's candidate keys from its first element's position
  uint32_t* cand_n;       // (tiles): how many
  uint32_t* tile_above;   // (tiles): keys whose digit 0 is above b0
  uint32_t* tile_counts;  // (tiles): topk_flags summed over a tile
  uint32_t* tile_gt;      // (tiles): keys > t in the row's tiles before this one
  uint32_t* tile_eq;      // (tiles): keys == t likewise
};

TL_HD int64_t topk_tiles(const TopkShape& s) { return s.rows * tiles_per_row(s); }
TL_HD int64_t topk_zeroed_bytes(const TopkShape& s) {
  return s.rows * int64_t(sizeof(RadixRow) + kRadixPasses * kRadixBins * 4);
}
TL_HD int64_t topk_rest_bytes(const TopkShape& s) { return 4 * (s.rows * s.D + 5 * topk_tiles(s)); }
inline TopkBuffers topk_buffers(const TopkShape& s, uint8_t* zeroed, uint8_t* rest) {
  const int64_t tiles = topk_tiles(s);
  TopkBuffers b;
  b.row = reinterpret_cast<RadixRow*>(zeroed);
  b.hist = reinterpret_cast<uint32_t*>(b.row + s.rows);
  b.cand = reinterpret_cast<uint32_t*>(rest);
  b.cand_n = b.cand + s.rows * s.D;
  b.tile_above = b.cand_n + tiles;
  b.tile_counts = b.tile_above + tiles;
  b.tile_gt = b.tile_counts + tiles;
  b.tile_eq = b.tile_gt + tiles;
  return b;
}

/// Where tile t's elements (and its candidates) start in x (and in cand): row-major positions.
TL_HD int64_t tile_offset(const TopkShape& s, int64_t t) { return t / tiles_per_row(s) * s.D + tile_begin(s, t); }

}  // namespace tl::codec::gpu
