#pragma once
// The threads a process computes with.

namespace tl {

/// Sets the threads ATen's kernels use (at::set_num_threads) and, where the process has OpenBLAS,
/// OpenBLAS's own pool (Note [OpenBLAS threads]). Returns OpenBLAS's thread count after the call,
/// 0 where the process has no OpenBLAS.
int set_compute_threads(int threads);

}  // namespace tl
