#pragma once
// Note [codec threads]. The codecs' CPU loops run on ATen's OpenMP pool only where two threads
// win, and the rule for "win" is here, once: a task moves at least kTaskBytes (what it reads plus
// what it writes), so a loop over less than twice that runs on the calling thread.
//
// Why a floor at all: at::parallel_for enters ATen's OpenMP region as soon as the range exceeds
// one grain, and the region starts every thread of the pool (it cannot use a num_threads clause)
// and ends at its barrier. The executables' workers sleep while they wait (Note [waiting threads],
// autograd/passive_wait.cpp): on the loaded 2-core machine waking the second one, and waiting for
// it to be scheduled, cost more than its half of a 1 MiB message's loops (quant(8) at 1 MiB: 37 +
// 21 us on one thread, 57 + 31 us on two). The value of kTaskBytes was measured (docs/COMPRESSION.md
// 3.11, "Threads in the codecs"): from a few MiB a loop up, the second thread pays.
//
// Which holds only where the caller is compiled with OpenMP: at::parallel_for's parallel branch is
// `#ifdef _OPENMP` in ATen's headers (the template is instantiated in the caller's file). The files
// whose loops are worth it are compiled with -fopenmp (compression/CMakeLists.txt, Note [codecs
// with OpenMP]); elsewhere, and in the builds that leave OpenMP out (clang's fuzz build), these
// loops run their whole range on the calling thread, with the same results: every loop gives each
// task its own outputs, and its reductions give the same value whatever the split (tests compare 1
// and 2 threads, tests/compression/cpu_paths_test.cpp).

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

namespace tl::codec {

// Bytes a task reads and writes at least.
constexpr int64_t kTaskBytes = int64_t(2) << 20;

// The floor in force: kTaskBytes, unless set_task_bytes changed it (tests split small loops with a
// few bytes, to run every loop's parallel form on tensors of a few KiB). Returns the previous one.
int64_t task_bytes();
int64_t set_task_bytes(int64_t bytes);

// The threads a loop may use here: 1 inside a parallel region (at::parallel_for then runs inline).
inline int64_t threads() { return at::in_parallel_region() ? 1 : std::max<int64_t>(1, at::get_num_threads()); }

// How many tasks `bytes` of work make: at most `most` and the threads, at least 1, each task at
// least kTaskBytes.
inline int64_t task_count(int64_t bytes, int64_t most) {
  return std::max<int64_t>(1, std::min({most, threads(), bytes / task_bytes()}));
}

// f(i0, i1) over [begin, end), each item reading and writing about `item_bytes`: in tasks of at
// least kTaskBytes, on the calling thread when the range holds fewer than two.
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t item_bytes, const F& f) {
  const int64_t floor = task_bytes();
  const int64_t grain = std::max<int64_t>(1, (floor + item_bytes - 1) / std::max<int64_t>(item_bytes, 1));
  if (end - begin < 2 * grain) {
    if (begin < end) f(begin, end);
    return;
  }
  at::parallel_for(begin, end, grain, f);
}

}  // namespace tl::codec
