#pragma once
// Helpers shared by the codecs: value types on the wire, payload checks, number formatting and
// the switch between CPU fast paths and the portable ATen-op path.
//
// Note [two paths]. Every hot loop has two implementations: a tight C++ loop with
// at::parallel_for for CPU tensors, and a sequence of ATen ops that runs on any device (the path
// CUDA tensors take). Both produce the same payload bytes (stochastic rounding aside: each path
// has its own random stream). Tests switch the fast paths off with PortableKernelsGuard to run
// the portable path on CPU and compare, so the CUDA path is exercised on machines without a GPU.

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "compression/cuda/quant_cuda.h"
#include "compression/cuda/sparse_cuda.h"
#include "compression/payload.h"

namespace tl::codec {

/// The first parameter of a payload of the codecs with a shared backward mode (sparse, colsparse,
/// powersgd, compose): a plain payload, or a shared-mode one (decode_shared).
constexpr int64_t kPlain = 0, kShared = 1;

/// A payload's body, or an empty byte tensor where it has none (an index of no entries).
inline at::Tensor body_or_empty(const Payload& p) { return p.body.defined() ? p.body : at::empty({0}, at::kByte); }

/// Whether CPU tensors take the tight-loop fast paths (true unless a PortableKernelsGuard is alive
/// on this thread).
bool cpu_kernels_enabled();
/// Whether this CPU has AVX2 and F16C (checked once; false where the build has no x86 paths):
/// the condition of the vectorised fp16 section loops.
bool cpu_has_avx2_f16c();
/// Section `in` (n values of fp16 or bf16, any byte alignment) as float32 at out, threaded past
/// 2^18 values; false at a NaN (out then partly written). Note [casts back on the CPU], dense.cpp.
bool cast_back_cpu(const uint8_t* in, int64_t n, at::ScalarType wire, float* out);
/// Whether CPU tensors are treated as device tensors in every respect (see PortableKernelsGuard).
bool device_semantics_on_cpu();
/// Forces the portable ATen-op path on this thread for its lifetime (tests). With
/// `device_semantics`, CPU tensors are also treated exactly as device tensors are: checks that
/// would synchronise with a device are skipped for payloads made in this process (see Note [host
/// synchronisation] in compression/payload.cpp), so a test on the CPU runs the GPU's code path.
class PortableKernelsGuard {
 public:
  explicit PortableKernelsGuard(bool device_semantics = false);
  ~PortableKernelsGuard();
  PortableKernelsGuard(const PortableKernelsGuard&) = delete;
  PortableKernelsGuard& operator=(const PortableKernelsGuard&) = delete;

 private:
  bool prev_, prev_device_;
};
/// True when t is a CPU tensor and the fast paths are enabled.
inline bool use_cpu_kernel(const at::Tensor& t) { return t.device().is_cpu() && cpu_kernels_enabled(); }
/// True when t is a CUDA tensor, the build has the fused CUDA kernels, TAPELINE_CUDA_KERNELS is
/// not "0" and the fast paths are enabled (Note [CUDA kernels or ATen ops] in
/// compression/cuda/quant_cuda.h).
inline bool use_cuda_kernel(const at::Tensor& t) {
  return t.is_cuda() && cpu_kernels_enabled() && gpu::kernels_enabled();
}
/// use_cuda_kernel, or a CPU tensor under gpu::HostEmulationGuard: the kernels' logic run on the
/// host (tests).
inline bool use_fused_kernel(const at::Tensor& t) {
  return use_cuda_kernel(t) || (t.device().is_cpu() && gpu::host_emulation());
}
/// A value type as the kernels know it (float32, float16, bfloat16); error for others.
gpu::WireType kernel_wire_type(at::ScalarType t);
/// True when t lives on a device, or is treated as if it did (PortableKernelsGuard(true)): reading
/// one of its values on the host would then synchronise.
inline bool on_device(const at::Tensor& t) { return !t.device().is_cpu() || device_semantics_on_cpu(); }

/// Value types a codec may put on the wire: "fp32", "fp16", "bf16".
const std::vector<std::string>& wire_type_words();
at::ScalarType wire_type_from_word(const std::string& word);
std::string wire_type_word(at::ScalarType t);
/// A value type read back from payload params; error naming the codec if it is not one of the above.
at::ScalarType wire_type_from_param(int64_t code, const char* codec);
inline int64_t wire_type_param(at::ScalarType t) { return static_cast<int64_t>(t); }

/// Error unless `p` was packed by `codec` and carries exactly `nparams` params.
void check_payload(const Payload& p, const char* codec, size_t nparams);
/// Error unless x is a floating tensor a codec can pack (float32, float16, bfloat16, float64).
void check_input(const at::Tensor& x, const char* codec);

/// Shortest decimal text that reads back as exactly v; with `fraction`, always has a '.'.
std::string format_number(double v, bool fraction = false);

/// Product of a shape (checked: no negative extent, no overflow).
int64_t shape_numel(const std::vector<int64_t>& shape);

}  // namespace tl::codec
