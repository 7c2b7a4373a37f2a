#pragma once
// CRC-32C (Castagnoli) of message bodies (Note [body checksum] in transport.h): with SSE4.2's
// crc32 instruction where the CPU has it (three interleaved streams, ~3 bytes per cycle), else
// a table. The same value either way; crc32c("123456789") = 0xE3069283.

#include <cstddef>
#include <cstdint>

namespace tl::ranks {

/// CRC-32C of `n` bytes, continuing from `crc` (0 to start).
uint32_t crc32c(const uint8_t* data, size_t n, uint32_t crc = 0);
/// The table implementation (portable reference; what crc32c uses without SSE4.2).
uint32_t crc32c_portable(const uint8_t* data, size_t n, uint32_t crc = 0);

}  // namespace tl::ranks
