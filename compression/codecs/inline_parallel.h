#pragma once
// Note [one task inline]. at::parallel_for runs on the calling thread only when the range is
// shorter than one grain; a range of exactly one grain (one chunk, one task) enters ATen's OpenMP
// region, which starts every thread of the pool (it cannot use a num_threads clause), and ends at
// its barrier: on the loaded 2-core machine a sleeping second thread is woken for no work and the
// call waits until it has been scheduled. The codecs' loops (one delta chunk of a 1 MiB TopK, one
// task of rows) call this form, which runs a range of at most one grain inline.
//
// Which holds only where the caller is compiled with OpenMP: at::parallel_for's parallel branch is
// `#ifdef _OPENMP` in ATen's headers, and tapeline's sources (one precompiled header) are compiled
// without -fopenmp, so today every at::parallel_for in them runs its whole range on the calling
// thread; only ATen's own kernels use the pool (docs/COMPRESSION.md 3.11, "at::parallel_for is
// serial in tapeline", with what building the codecs with OpenMP measured).

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
