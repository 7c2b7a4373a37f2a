// Linked into tapeline's executables (the CLI, the test binaries, the rank helpers): OpenMP worker
// threads that sleep instead of spin while they wait, unless the user chose (Note [waiting threads]).
#include <unistd.h>

#include <cstring>

namespace {

// Note [waiting threads]: PyTorch's wheels parallelise ATen's kernels with GNU OpenMP (libgomp),
// whose idle workers spin for 300,000 iterations before they sleep. One process alone barely
// notices. Two processes of two threads each on two cores (two `tapeline train` runs, `ctest -j2`)
// spin on each other's cores: a spinning waiter holds the core the thread it waits for needs.
// Trainer.ShortFashionMnistRunLearns beside other work took 173-212 s wall and 56-71 s of CPU
// with libgomp's default, 25-35 s wall and 9-10 s of CPU with OMP_WAIT_POLICY=PASSIVE
// (GOMP_SPINCOUNT=1000: 37 s, 20000: 110 s). libgomp reads its settings in its library
// constructor, before main(). Setting the variable in an entry of the executable's .preinit_array
// (which runs before every shared library's initialiser) is not enough: the wheel's libgomp then reports
// OMP_WAIT_POLICY = 'PASSIVE' and still spins (GOMP_SPINCOUNT = '300000' under
// OMP_DISPLAY_ENV=VERBOSE). So the preinit entry executes the program again, once, with the
// variable added, before any library has started a thread. A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT is left
// as it is (OMP_WAIT_POLICY=ACTIVE restores spinning). bench_side_by_side measures what it buys.
// On a quiet machine (load 1.7, one round of bench_side_by_side, a 5,120-image ResNet-8 epoch):
// each of two runs side by side got 0.65 of a lone run's throughput passive, 0.47 spinning; a lone
// run took 7.05 s passive and 6.01 s spinning (passive waiting costs a lone short run ~15%).
// GOMP_SPINCOUNT=10000 gave 5.96 s alone and 10.5 s for the pair, better than both here; it was not
// measured under heavy load, where 20000 was 3-4x slower than passive: left for a later change.
// Reads and extends the environment given to the program (`envp`), not libc's `environ`: at
// preinit time libc's own view of it is not set up yet (setenv and execv there lose the variable,
// and the program executes itself forever).
bool has_variable(char** envp, const char* prefix) {
  for (char** e = envp; e && *e; ++e)
    if (std::strncmp(*e, prefix, std::strlen(prefix)) == 0) return true;
  return false;
}

void prefer_passive_waiting(int, char** argv, char** envp) {
  if (!argv || !argv[0] || !envp) return;
  if (has_variable(envp, "OMP_WAIT_POLICY=") || has_variable(envp, "GOMP_SPINCOUNT=")) return;
  // No allocation here: this runs before the C++ runtime's initialisers.
  static char passive[] = "OMP_WAIT_POLICY=PASSIVE";
  static char* env[4096];
  size_t n = 0;
  while (envp[n] && n + 2 < sizeof(env) / sizeof(env[0])) env[n] = envp[n], ++n;
  if (envp[n]) return;  // an environment of thousands of variables: left as it is
  env[n] = passive, env[n + 1] = nullptr;
  execve("/proc/self/exe", argv, env);  // returns only on failure: the run goes on, spinning as before
}

__attribute__((section(".preinit_array"), used)) void (*const preinit_passive_waiting)(int, char**, char**) =
    prefer_passive_waiting;

}  // namespace
