#pragma once
// Note [one task inline]. at::parallel_for runs on the calling thread only when the range is
// shorter than one grain; a range of exactly one grain (one chunk, one task) enters ATen's OpenMP
// region, which starts every thread of the pool (it cannot use a num_threads clause), and ends at
// its barrier. On the loaded 2-core machine a sleeping second thread is woken for nothing and the
// call waits until it is scheduled: TopK's decode of 1 MiB (one delta chunk) took 0.6-0.7 ms on two
// threads and 0.1 ms on one. The codecs' loops call this form, which runs a range of at most one
// grain inline.

#include <ATen/Parallel.h>

#include <cstdint>

namespace tl::codec {

template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (end - begin <= grain) {
    if (begin < end) f(begin, end);
    return;
  }
  at::parallel_for(begin, end, grain, f);
}

}  // namespace tl::codec
