#pragma once
// Note [codec threads]. The codecs' CPU loops use ATen's OpenMP pool only where two threads win,
// and the rule for that is here, once: a task reads and writes at least kTaskBytes (4 MiB), so a
// loop that moves less than twice that runs on the calling thread, as does a range of one task.
// Each call site says what one item of its range moves (a tile: its floats in, its codes out); the
// loops that size their own tasks (TopK's rows and pieces) ask task_count.
//
// Why a floor: at::parallel_for enters ATen's OpenMP region as soon as the range exceeds one grain,
// and the region starts every thread of the pool (it cannot use a num_threads clause) and ends at
// its barrier. The executables' workers sleep while they wait (Note [waiting threads],
// autograd/passive_wait.cpp): on the loaded 2-core machine, waking the second one and waiting for
// it to be scheduled cost more than its half of a 1 MiB message (quant(8) at 1 MiB on two threads,
// 37 + 21 -> 57 + 31 us). Measured (docs/COMPRESSION.md 3.11, "Threads in the codecs"): tasks of
// 1 MiB lost at 2 MiB messages; tasks of 2 MiB won at 4 MiB under a load of ~1.5-2 and lost under
// ~3 (then the second core is mostly taken); from 8 MiB up two threads won under both.
//
// The parallel branch exists only where the caller is compiled with OpenMP: at::parallel_for is a
// header template, instantiated in the caller's file, whose branch is `#ifdef _OPENMP`. The codec
// kernels are compiled with -fopenmp where the build can (compression/CMakeLists.txt, Note [codecs
// with OpenMP]); elsewhere (clang's fuzz build) these loops run their whole range on the calling
// thread. Results do not depend on the threads: every task writes outputs of its own (tiles that
// pack to whole bytes, rows, pieces at offsets computed before the loop), flags are atomics, and
// the two reductions are split-proof or kept whole: min/max partials are merged in task order
// (Note [minima merged in task order]; only which of -0 and +0 a group of zeros keeps could follow
// the split), and quantile's per-code sums (doubles, whose last bits follow the order of
// additions) stay on one task. Tests: Threads.SmallTasksMatchOneThread and the 1-vs-2-thread tests
// of tests/compression/cpu_paths_test.cpp.
//
// Note [tasks taken in turn]. ATen's region hands each thread one half of the range; on the loaded
// machine the second thread is often scheduled late (its core busy with another process), and
// the call then waits for its half. Here a range of T tasks is cut into T pieces of at least
// kTaskBytes, which the threads take from a shared counter: a late thread finds fewer left, and the
// call waits only for the piece it runs, plus its wake-up. Results are the same, as every piece
// writes outputs of its own.

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace tl::codec {

// Note [ATen's ops on the calling thread]. Loops of ATen inside a codec (reductions, casts) take
// ATen's pool on their own whenever the range exceeds ATen's grain (32768 elements), however small
// the message: each such op wakes the sleeping workers and waits for them. Where a codec's ATen
// ops cost more in wake-ups than they gain (colsparse's block norms at 1 MiB on two threads: the
// encode took 0.24 ms, against 0.09 ms on one), a SerialScope keeps them on the calling thread
// for messages below the floor of our own loops (2 tasks). It changes only the calling thread's
// OpenMP thread count, for its lifetime (inline_parallel.cpp); the results are those of one
// thread, which the tests compare with two.
class SerialScope {
 public:
  explicit SerialScope(bool on);
  ~SerialScope();
  /// Whether this scope changed the thread count (on, more than one thread, outside a parallel
  /// region, and the codec kernels built with OpenMP).
  bool active() const { return previous_ > 0; }
  SerialScope(const SerialScope&) = delete;
  SerialScope& operator=(const SerialScope&) = delete;

 private:
  int previous_ = 0;  // the thread count to restore; 0: nothing was changed
};

// Bytes a task reads and writes at least.
constexpr int64_t kTaskBytes = int64_t(4) << 20;

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
// least kTaskBytes, on the calling thread when the range holds fewer than two. The threads take
// the tasks in turn from a counter (Note [tasks taken in turn]).
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t item_bytes, const F& f) {
  const int64_t floor = task_bytes();
  const int64_t grain = std::max<int64_t>(1, (floor + item_bytes - 1) / std::max<int64_t>(item_bytes, 1));
  const int64_t n = end - begin, tasks = n / grain;
  if (tasks < 2 || threads() < 2) {
    if (begin < end) f(begin, end);
    return;
  }
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min(tasks, threads()), 1, [&](int64_t, int64_t) {
    for (int64_t t; (t = next.fetch_add(1, std::memory_order_relaxed)) < tasks;)
      f(begin + t * n / tasks, begin + (t + 1) * n / tasks);
  });
}

}  // namespace tl::codec
