#pragma once
// Note [CUDA as a plugin]. With a CUDA libtorch, every tapeline executable used to link
// libtorch_cuda, and so loaded it and the CUDA libraries behind it (cuBLAS, cuFFT, cuSPARSE, NCCL:
// about 2 GB of shared objects) at every start, GPU or not: 0.55 s of a core against 0.29 s for
// libtorch_cpu alone. A test suite and its rank processes start about two thousand processes, and a
// CPU machine never runs a CUDA kernel. So the executables link only libtorch_cpu, and everything
// that needs libtorch_cuda lives in one shared object, libtl_cuda.so (compression/cuda's kernels,
// parallel/ranks/nccl_backend.cpp's NCCL process group): loaded at start-up where the machine has
// an NVIDIA device, and on request elsewhere. Loading it loads libtorch_cuda, whose static
// initialisers register the CUDA backend with ATen, exactly as a link would.
//
// TAPELINE_CUDA_PLUGIN chooses: "auto" (default: load when /dev/nvidiactl exists), "1" (always:
// a CPU machine's tests of this mechanism), "0" (never), or the plugin's path. Without a path, the
// plugin is looked for beside the executable (or the Python extension) that contains this code, and
// up to three folders above it: build/, where CMake puts it, from build/tests/parallel/.
//
// The code that calls into the plugin looks its functions up by name (extern "C" entries,
// cuda_plugin_function); a build without CUDA has no plugin, and the callers' errors say so.

#include <string>

namespace tl {

/// Whether this build made libtl_cuda.so (a CUDA libtorch and nvcc were found).
bool cuda_plugin_built();
/// Loads the plugin now if it is not loaded (what start-up does where a GPU is); true when loaded.
/// Thread-safe; a failure is remembered and reported by cuda_plugin_status().
bool load_cuda_plugin();
/// Whether the plugin is loaded in this process.
bool cuda_plugin_loaded();
/// One line: loaded (from where), or why not (not built, no GPU, TAPELINE_CUDA_PLUGIN=0, dlopen's error).
std::string cuda_plugin_status();
/// The address of the plugin's extern "C" function `name`, nullptr when the plugin is not loaded.
void* cuda_plugin_symbol(const char* name);

/// The plugin's function `name` with signature F, or nullptr when the plugin is not loaded.
template <class F>
F* cuda_plugin_function(const char* name) {
  return reinterpret_cast<F*>(cuda_plugin_symbol(name));
}

}  // namespace tl
