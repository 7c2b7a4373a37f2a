#pragma once
// c10d's NCCL process group, made inside libtl_cuda.so (Note [CUDA as a plugin] in
// autograd/cuda_plugin.h): ProcessGroupNCCL lives in libtorch_cuda, which the executables do not
// link. compat::make_nccl finds this entry and calls it.

#include <cstdint>

#include "parallel/ranks/c10d_compat.h"

extern "C" {
/// *out = ProcessGroupNCCL over `store`; its operations time out after timeout_ms. Throws
/// c10::Error (the NCCL loaded is not the nccl.h's: Note [nccl.h must match libtorch's NCCL]).
void tl_cuda_make_nccl(const tl::ranks::compat::StorePtr& store, int rank, int size, int64_t timeout_ms,
                       tl::ranks::compat::BackendPtr* out);
}
