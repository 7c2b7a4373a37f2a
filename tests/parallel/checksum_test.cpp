// CRC-32C of message bodies (Note [body checksum] in parallel/ranks/transport.h).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "parallel/ranks/checksum.h"

namespace {
using tl::ranks::crc32c;
using tl::ranks::crc32c_portable;

TEST(Checksum, Crc32cMatchesTheStandardCheckValue) {
  const uint8_t s[] = {'1', '2', '3', '4', '5', '6', '7', '8', '9'};
  EXPECT_EQ(crc32c(s, 9), 0xE3069283u);  // the CRC-32C check value (RFC 3720, iSCSI)
  EXPECT_EQ(crc32c_portable(s, 9), 0xE3069283u);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
}

// The fast paths (folding 256-byte blocks from 512 bytes on; three interleaved streams of 8 KiB,
// combined; the crc32-instruction path alone, as CPUs without AVX-512 take it) against the
// table, at lengths around the block and stream boundaries, continued from a partial CRC and from
// an odd start.
TEST(Checksum, FastPathEqualsTheTableAtEveryLength) {
  std::mt19937 gen(5);
  for (size_t n : {1, 7, 8, 9, 63, 255, 256, 511, 512, 513, 767, 768, 769, 1024 + 255, 4096, 24575, 24576, 24577,
                   49152 + 13, 300001, (1 << 20) + 3}) {
    std::vector<uint8_t> v(n);
    for (auto& b : v) b = static_cast<uint8_t>(gen());
    const uint32_t want = crc32c_portable(v.data(), n);
    EXPECT_EQ(crc32c(v.data(), n), want) << n;
    EXPECT_EQ(crc32c(v.data() + n / 3, n - n / 3, crc32c(v.data(), n / 3)), want) << n;
    EXPECT_EQ(tl::ranks::crc32c_sse42_only(v.data(), n), want) << n;  // CPUs without AVX-512 and VPCLMULQDQ
    EXPECT_EQ(crc32c(v.data() + 1, n - 1, crc32c(v.data(), 1)), want) << n;  // unaligned blocks
    std::vector<uint8_t> copy(n);
    EXPECT_EQ(tl::ranks::crc32c_copy(copy.data(), v.data(), n), want) << n;
    EXPECT_EQ(copy, v) << n;
    v[n / 2] ^= 1;  // one flipped bit changes it
    EXPECT_NE(crc32c(v.data(), n), want) << n;
  }
}

}  // namespace
