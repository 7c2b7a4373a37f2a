#include "autograd/cuda_plugin.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <system_error>
#include <vector>

namespace tl {
namespace {

namespace fs = std::filesystem;
constexpr const char* kPluginFile = "libtl_cuda.so";

struct PluginState {
  std::mutex mutex;
  void* handle = nullptr;
  std::string status = "not loaded";
};

PluginState& plugin_state() {
  static PluginState* s = new PluginState();  // never destroyed: used from other static destructors
  return *s;
}

// Folders to look in: the one holding the object this code is in (an executable, or the Python
// extension) and the running program's, each with up to three parents.
std::vector<fs::path> search_dirs() {
  std::vector<fs::path> starts;
  Dl_info info{};
  std::error_code ec;
  if (dladdr(reinterpret_cast<void*>(&search_dirs), &info) != 0 && info.dli_fname != nullptr) {
    fs::path self = fs::weakly_canonical(info.dli_fname, ec);
    if (!ec && fs::is_regular_file(self, ec)) starts.push_back(self.parent_path());
  }
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) starts.push_back(exe.parent_path());
  std::vector<fs::path> dirs;
  for (fs::path d : starts)
    for (int up = 0; up <= 3 && !d.empty(); ++up, d = d.parent_path()) {
      dirs.push_back(d);
      if (d == d.root_path()) break;
    }
  return dirs;
}

// An explicit path, or the first libtl_cuda.so found in search_dirs(); empty when none.
std::string find_plugin(const char* setting, std::string* why) {
  if (setting != nullptr && std::strchr(setting, '/') != nullptr) return setting;
  std::error_code ec;
  for (const fs::path& d : search_dirs()) {
    const fs::path p = d / kPluginFile;
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  *why = std::string(kPluginFile) + " not found beside the program or up to three folders above it "
         "(set TAPELINE_CUDA_PLUGIN to its path)";
  return "";
}

// Start-up: load where the machine has an NVIDIA device, or where TAPELINE_CUDA_PLUGIN asks.
bool wanted_at_start() {
  if (!cuda_plugin_built()) return false;
  const char* v = std::getenv("TAPELINE_CUDA_PLUGIN");
  if (v == nullptr || std::strcmp(v, "auto") == 0 || *v == '\0') {
    if (access("/dev/nvidiactl", F_OK) == 0) return true;
    plugin_state().status = "not loaded: no NVIDIA device (/dev/nvidiactl); TAPELINE_CUDA_PLUGIN=1 loads it anyway";
    return false;
  }
  if (std::strcmp(v, "0") == 0) {
    plugin_state().status = "not loaded: TAPELINE_CUDA_PLUGIN=0";
    return false;
  }
  return true;  // "1" or a path
}

}  // namespace

bool cuda_plugin_built() {
#ifdef TL_CUDA_PLUGIN_BUILT
  return true;
#else
  return false;
#endif
}

bool load_cuda_plugin() {
  PluginState& s = plugin_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.handle != nullptr) return true;
  if (!cuda_plugin_built()) {
    s.status = "not built: this build of tapeline has no CUDA (configure against a CUDA libtorch with nvcc, docs/GPU.md)";
    return false;
  }
  const char* setting = std::getenv("TAPELINE_CUDA_PLUGIN");
  std::string why;
  const std::string path = find_plugin(setting, &why);
  if (path.empty()) {
    s.status = "not loaded: " + why;
    return false;
  }
  // RTLD_GLOBAL: libtorch_cuda and the CUDA libraries join the process as if they had been linked.
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (h == nullptr) {
    const char* err = dlerror();
    s.status = "not loaded: " + path + ": " + (err ? err : "dlopen failed");
    return false;
  }
  s.handle = h;
  s.status = "loaded from " + path;
  return true;
}

bool cuda_plugin_loaded() {
  PluginState& s = plugin_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.handle != nullptr;
}

std::string cuda_plugin_status() {
  PluginState& s = plugin_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.status;
}

void* cuda_plugin_symbol(const char* name) {
  PluginState& s = plugin_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.handle != nullptr ? dlsym(s.handle, name) : nullptr;
}

}  // namespace tl

// The anchor that every link of tl_autograd asks for (-u, autograd/CMakeLists.txt), so that this
// object and its start-up loading are in every executable, not only in those that call into it.
extern "C" {
int tl_cuda_plugin_anchor = 0;
}

// Before the program's other static initialisers (priority 101 runs before the unprioritised ones
// of the same executable): ATen decides once, at the first CUDA query, whether it has a CUDA
// backend (getCUDAHooks), so a query in some global's initialiser must find libtorch_cuda loaded.
__attribute__((constructor(101))) static void tl_load_cuda_plugin_at_start() {
  if (tl::wanted_at_start()) tl::load_cuda_plugin();
}
