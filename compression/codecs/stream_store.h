#pragma once
// Streaming (non-temporal) stores for outputs larger than the last-level cache.
//
// Note [streaming stores]. A decoder's output is written once and read later by someone else. An
// ordinary store first reads the cache line it writes into (a read for ownership), so writing
// 64 MiB moves 128 MiB through memory and evicts the cache for data nobody reads soon; a streaming
// store writes whole lines without reading them (what glibc's memcpy does past a size of the order
// of the cache, and so the reference the benchmarks compare with). Loops that make such an output
// produce it in a small buffer that stays in L1 and copy the buffer out with stream_copy; each
// thread calls stream_fence before it leaves its part of the work (streaming stores are weakly
// ordered: the fence orders them before the parallel region's join). Outputs smaller than
// kStreamBytes use ordinary stores: they stay in the cache for whoever reads them next.

#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace tl::codec {

/// Outputs of at least this many bytes are written with streaming stores (half the development
/// machine's 32 MiB last-level cache).
constexpr int64_t kStreamBytes = int64_t(16) << 20;

/// dst[0, n) = src[0, n), with streaming stores where the target supports them.
inline void stream_copy(float* dst, const float* src, int64_t n) {
#if defined(__SSE2__)
  int64_t j = 0;
  for (; j < n && (reinterpret_cast<uintptr_t>(dst + j) & 15) != 0; ++j) dst[j] = src[j];
  for (; j + 4 <= n; j += 4) _mm_stream_ps(dst + j, _mm_loadu_ps(src + j));
  for (; j < n; ++j) dst[j] = src[j];
#else
  if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
#endif
}

/// Orders this thread's streaming stores before its later stores (call once per thread, after
/// its last stream_copy of a parallel region).
inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace tl::codec
