#pragma once
// The one file that knows which libtorch tapeline is built against (docs/ARCHITECTURE.md: build against
// Debian's libtorch-dev 1.13 on CPU and PyTorch 2.x with CUDA).
//
// Note [c10d across libtorch versions].
//   1.13 (Debian's libtorch-dev): ProcessGroupGloo derives from c10d::ProcessGroup, and the
//        process group object is what one calls send/recv/allreduce on.
//   2.x: ProcessGroupGloo and ProcessGroupNCCL derive from c10d::Backend; Python wraps a backend
//        in a ProcessGroup (setBackend(kCPU, GLOO, backend)) to dispatch by device. tapeline talks
//        to the backend directly: Backend has the same virtual send/recv/allreduce/broadcast/
//        barrier with the same signatures, and skipping the wrapper avoids the ProcessGroup
//        constructor, whose signature changed between 2.x releases.
// So `CommBackend` is ProcessGroup on 1.13 and Backend on 2.x, and everything else (TCPStore,
// PrefixStore, Work, the option structs) is spelled the same in both.
// Backends: Gloo's header is guarded by USE_C10D_GLOO (TorchConfig does not define it;
// parallel/CMakeLists.txt does when it finds gloo's headers), NCCL's by USE_C10D_NCCL (defined only
// for a libtorch built with CUDA and NCCL; Debian's has no NCCL symbols).
//
// Note [gloo headers for libtorch 2.x]. PyTorch's wheels ship ProcessGroupGloo.hpp but not the
// headers of gloo, which they link statically into libtorch_cpu; ProcessGroupGloo.hpp includes
// five of them. A 2.x build uses Debian's libgloo-dev headers (gloo of May 2022, older than the
// gloo inside libtorch 2.15) for declarations only, and never links Debian's libgloo (two gloo's in
// one process). That is ABI-safe for what tapeline touches, and only that:
//   - every gloo type in ProcessGroupGloo.hpp sits behind std::shared_ptr / std::unique_ptr
//     (devices, contexts, store, buffers), so the layouts of ProcessGroupGloo and its Options do
//     not depend on gloo's structs;
//   - make_gloo calls only exported libtorch functions (Options::create and its constructor,
//     createDeviceFor{Interface,Hostname}, createDefaultDevice, the ProcessGroupGloo constructor)
//     and moves the shared_ptrs they return into Options::devices; it never calls a gloo virtual,
//     reads a gloo object or constructs a gloo type, so gloo's vtables and layouts never cross;
//   - the gloo symbols tapeline's objects reference resolve in libtorch_cpu (checked with
//     `nm -C -u` on the objects: only c10d:: symbols, no gloo:: one).
// Anything more (a custom gloo device, reading a gloo context) would need the gloo headers of the
// libtorch's own commit. Where no gloo headers are found, the 2.x build has no Gloo transport and
// says so (Transport::connect).
//
// Include this header only where c10d is needed (transport.cpp, benchmarks): it pulls in c10d and
// gloo headers. The rest of tapeline uses transport.h, which has no c10d types.

#include <torch/version.h>  // TORCH_VERSION_MAJOR

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

#include <chrono>
#include <string>

namespace tl::ranks::compat {

#if TORCH_VERSION_MAJOR >= 2
using CommBackend = c10d::Backend;
#else
using CommBackend = c10d::ProcessGroup;
#endif
using BackendPtr = c10::intrusive_ptr<CommBackend>;
using StorePtr = c10::intrusive_ptr<c10d::Store>;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;

/// Whether this build has the backend (compiled in and linked).
bool has_gloo();
bool has_nccl();
/// "1.13.0" etc.
std::string torch_version();

/// A TCPStore client (is_server false) or server on host:port. A client retries connecting for
/// `timeout`; neither waits for the others (the process group's creation does).
StorePtr make_tcp_store(const std::string& host, int port, bool is_server, int world_size,
                        std::chrono::milliseconds timeout);
/// A TCPStore server on `port` of every interface (0: a free port chosen by the kernel), for a
/// launcher that hosts the store for its ranks as torchrun's agent does. `bound_port` receives the
/// port.
StorePtr make_tcp_server(int port, std::chrono::milliseconds timeout, int* bound_port);
/// Keys of `store` under `prefix`.
StorePtr make_prefix_store(const std::string& prefix, StorePtr store);

/// ProcessGroupGloo over `store`, its operations timing out after `timeout`. The network device:
/// GLOO_SOCKET_IFNAME's interface if set, else loopback when `master_addr` is a loopback address
/// (all ranks on this machine), else gloo's default (this host's name's address).
BackendPtr make_gloo(const StorePtr& store, int rank, int size, std::chrono::milliseconds timeout,
                     const std::string& master_addr);
/// ProcessGroupNCCL (CUDA tensors on this rank's device). Error where the build has no NCCL.
BackendPtr make_nccl(const StorePtr& store, int rank, int size, std::chrono::milliseconds timeout);

/// Waits for `work`; throws what the backend reports, or a timeout after `timeout`.
void wait(const WorkPtr& work, std::chrono::milliseconds timeout);

}  // namespace tl::ranks::compat
