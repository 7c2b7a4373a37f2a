#pragma once
// CRC-32C (Castagnoli) of message bodies (Note [body checksum] in transport.h): by carry-less
// multiplies on 512-bit registers where the CPU has AVX-512 and VPCLMULQDQ (Note [folding with
// carry-less multiplies] in checksum.cpp: about 2x the crc32 instruction's rate on AMD Zen, as fast
// as memory beyond the caches), else SSE4.2's crc32 instruction (three interleaved streams), else a
// table. The same value every way; crc32c("123456789") = 0xE3069283.

#include <cstddef>
#include <cstdint>

namespace tl::ranks {

/// CRC-32C of `n` bytes, continuing from `crc` (0 to start).
uint32_t crc32c(const uint8_t* data, size_t n, uint32_t crc = 0);
/// Copies `n` bytes to `dst` and returns their CRC-32C (continuing from `crc`), in one pass: each
/// 32 KiB is summed while it is still in the cache (a message's inlined body).
uint32_t crc32c_copy(uint8_t* dst, const uint8_t* src, size_t n, uint32_t crc = 0);
/// The crc32-instruction path alone (three streams; the table without SSE4.2): for benchmarks.
uint32_t crc32c_sse42_only(const uint8_t* data, size_t n, uint32_t crc = 0);
/// The table implementation (portable reference; what crc32c uses without SSE4.2).
uint32_t crc32c_portable(const uint8_t* data, size_t n, uint32_t crc = 0);

}  // namespace tl::ranks
