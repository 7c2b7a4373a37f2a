// Part of libtl_cuda.so only (parallel/ranks/nccl_backend.h).
#include "parallel/ranks/nccl_backend.h"

#include <c10/util/Exception.h>

#include <string>

#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

extern "C" void tl_cuda_make_nccl(const tl::ranks::compat::StorePtr& store, int rank, int size, int64_t timeout_ms,
                                  tl::ranks::compat::BackendPtr* out) {
#ifdef USE_C10D_NCCL
  // Note [nccl.h must match libtorch's NCCL] (parallel/ranks/c10d_compat.cpp).
  const std::string loaded = c10d::getNcclVersion();  // "2.30.7"
  const std::string built = std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + ".";
  TORCH_CHECK(loaded.rfind(built, 0) == 0, "rank ", rank, ": tapeline was compiled against nccl.h ", NCCL_MAJOR, ".",
              NCCL_MINOR, " but the NCCL loaded is ", loaded,
              " (Note [nccl.h must match libtorch's NCCL] in parallel/ranks/c10d_compat.cpp); rebuild with NCCL_HOME "
              "pointing at the NCCL this libtorch was built with");
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = std::chrono::milliseconds(timeout_ms);
  *out = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
#else
  TORCH_CHECK(false, "libtl_cuda.so was built without c10d's NCCL backend (nccl.h not found when configuring)");
#endif
}
