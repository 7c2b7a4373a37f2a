#include "compression/codecs/inline_parallel.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace tl::codec {

// Note [ATen's ops on the calling thread]: omp_set_num_threads sets the calling thread's own
// nthreads-var (OpenMP's ICVs belong to the task, here the thread's implicit one), which
// at::get_num_threads reads and a parallel region of this thread starts with; other threads keep
// theirs. Without OpenMP (the clang fuzz build) nothing changes.
SerialScope::SerialScope(bool on) {
#ifdef _OPENMP
  if (on && !at::in_parallel_region()) {
    previous_ = at::get_num_threads();  // first: ATen's lazy start of this thread's count, which would undo ours
    if (previous_ > 1)
      omp_set_num_threads(1);
    else
      previous_ = 0;
  }
#else
  (void)on;
#endif
}

SerialScope::~SerialScope() {
#ifdef _OPENMP
  if (previous_ > 0) omp_set_num_threads(previous_);
#endif
}

}  // namespace tl::codec
