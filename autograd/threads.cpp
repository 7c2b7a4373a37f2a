#include "autograd/threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

namespace tl {

// Note [OpenBLAS threads]: Debian's libtorch 1.13 multiplies matrices in OpenBLAS (its pthreads
// build), whose worker pool at::set_num_threads does not reach: with run.threads = 1 a MiniLM
// fine-tuning run still multiplied on both cores of a 2-core machine (37.7 s of CPU for 25 s of
// wall, 9.5 s of it in the kernel, workers spinning), and two such runs side by side (two labs,
// as scripts/test runs them) took 42.1 s each; with OpenBLAS told too, 34.3 s each, with 1 s of
// kernel time. OpenBLAS's own setter is called where the process has one (PyTorch's wheels use
// MKL or their own OpenMP, which at::set_num_threads does reach).
int set_compute_threads(int threads) {
  at::set_num_threads(threads);
  using Set = void (*)(int);
  using Get = int (*)();
  if (auto set = reinterpret_cast<Set>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) set(threads);
  auto get = reinterpret_cast<Get>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return get ? get() : 0;
}

}  // namespace tl
