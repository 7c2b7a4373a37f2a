#include "parallel/ranks/c10d_compat.h"

#include <c10/util/Exception.h>

#include <cstdlib>

#include "autograd/cuda_plugin.h"
#include "parallel/ranks/nccl_backend.h"
#include "parallel/ranks/rendezvous.h"

#ifdef USE_C10D_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

namespace tl::ranks::compat {

bool has_gloo() {
#ifdef USE_C10D_GLOO
  return true;
#else
  return false;
#endif
}

bool has_nccl() {
#ifdef USE_C10D_NCCL
  return true;
#else
  return false;
#endif
}

std::string torch_version() { return TORCH_VERSION; }

StorePtr make_tcp_store(const std::string& host, int port, bool is_server, int world_size,
                        std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(port);
  opts.isServer = is_server;
  opts.numWorkers = static_cast<std::size_t>(world_size);
  // Nobody waits here: creating the process group is the rendezvous (with the timeout), and its
  // failure says who is missing. (1.13's server-side wait gives up silently at the timeout.)
  opts.waitWorkers = false;
  opts.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(host, opts);
}

StorePtr make_tcp_server(int port, std::chrono::milliseconds timeout, int* bound_port) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(port);
  opts.isServer = true;
  opts.waitWorkers = false;
  opts.timeout = timeout;
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", opts);
  if (bound_port) *bound_port = store->getPort();
  return store;
}

StorePtr make_prefix_store(const std::string& prefix, StorePtr store) {
  return c10::make_intrusive<c10d::PrefixStore>(prefix, std::move(store));
}

BackendPtr make_gloo(const StorePtr& store, int rank, int size, std::chrono::milliseconds timeout,
                     const std::string& master_addr) {
#ifdef USE_C10D_GLOO
  using c10d::ProcessGroupGloo;
  auto opts = ProcessGroupGloo::Options::create(timeout);
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname != nullptr && *ifname != '\0') {
    std::string first = ifname;
    first = first.substr(0, first.find(','));
    opts->devices.push_back(ProcessGroupGloo::createDeviceForInterface(first));
  } else if (is_loopback_address(master_addr)) {
    opts->devices.push_back(ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  } else {
    opts->devices.push_back(ProcessGroupGloo::createDefaultDevice());
  }
  // Collectives run on these threads; p2p send/recv run on the caller's thread.
  opts->threads = 2;
  return c10::make_intrusive<ProcessGroupGloo>(store, rank, size, opts);
#else
  TORCH_CHECK(false,
              "tapeline was built without c10d's Gloo backend: gloo's headers/library were not found when "
              "configuring (Debian: apt-get install libgloo-dev, then re-run cmake)");
#endif
}

// Note [nccl.h must match libtorch's NCCL]. ProcessGroupNCCL::Options holds an ncclConfig_t by
// value and Options::create is inline: nccl_backend.cpp (in libtl_cuda.so) allocates sizeof(Options) from the nccl.h it was
// compiled with, and libtorch's out-of-line constructor fills in its own, compiled against the NCCL
// libtorch was built with. NCCL grows ncclConfig_t between minor versions (2.28 -> 2.30 added four
// ints), so a different nccl.h (the CUDA toolkit's, say) writes past the object. CMake takes the
// nccl.h of the libtorch's NCCL (parallel/CMakeLists.txt); here the NCCL actually loaded must be
// that major.minor too, or there is no process group.
BackendPtr make_nccl(const StorePtr& store, int rank, int size, std::chrono::milliseconds timeout) {
#ifdef USE_C10D_NCCL
  // ProcessGroupNCCL is made in libtl_cuda.so (Note [CUDA as a plugin], autograd/cuda_plugin.h).
  auto* make = cuda_plugin_function<decltype(tl_cuda_make_nccl)>("tl_cuda_make_nccl");
  TORCH_CHECK(make != nullptr, "rank ", rank, ": the NCCL backend is in libtl_cuda.so, which is ",
              cuda_plugin_status());
  BackendPtr backend;
  make(store, rank, size, static_cast<int64_t>(timeout.count()), &backend);
  return backend;
#else
  TORCH_CHECK(false, "tapeline was built without c10d's NCCL backend (libtorch ", TORCH_VERSION,
              " without CUDA/NCCL, or nccl.h not found when configuring); use backend gloo");
#endif
}

void wait(const WorkPtr& work, std::chrono::milliseconds timeout) { work->wait(timeout); }

}  // namespace tl::ranks::compat
