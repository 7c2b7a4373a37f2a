#pragma once
// Helpers for the stateless codec tests: round trips, the header size formula of payload.h
// computed independently, and byte-for-byte payload comparison.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "compression/codecs/common.h"
#include "compression/spec.h"

namespace tl::testing {

/// |x - y| / |x| (Frobenius norms), computed in double.
inline double rel_error(const at::Tensor& x, const at::Tensor& y) {
  return ((x.to(at::kDouble) - y.to(at::kDouble)).norm() / x.to(at::kDouble).norm()).item<double>();
}

inline at::Tensor round_trip(const CompressorPtr& c, const at::Tensor& x) {
  CodecContext ctx;
  return c->decode(c->encode(x, ctx), ctx);
}

/// payload.h: 8 fixed bytes + 8 per dim + 8 per param + 8 for the body length.
inline int64_t header_formula(int64_t ndim, int64_t nparams) { return 16 + 8 * (ndim + nparams); }

/// Same codec, dtype, shape, params and body bytes.
inline ::testing::AssertionResult same_payload(const Payload& a, const Payload& b) {
  if (a.codec != b.codec || a.dtype != b.dtype || a.shape != b.shape || a.params != b.params)
    return ::testing::AssertionFailure() << "headers differ: codec " << a.codec << "/" << b.codec << ", params "
                                         << c10::IntArrayRef(a.params) << " / " << c10::IntArrayRef(b.params);
  const auto sa = a.serialize(), sb = b.serialize();
  if (sa != sb) {
    size_t i = 0;
    while (i < std::min(sa.size(), sb.size()) && sa[i] == sb[i]) ++i;
    return ::testing::AssertionFailure() << "bodies differ: " << sa.size() << " vs " << sb.size()
                                         << " bytes, first difference at byte " << i;
  }
  return ::testing::AssertionSuccess();
}

/// Whether a GPU test of the fused CUDA kernels must skip (no device, a build without the kernels,
/// TAPELINE_CUDA_KERNELS=0), and why.
inline bool skip_without_cuda_kernels(std::string* why) {
  if (!at::hasCUDA()) {
    *why = "no CUDA device";
    return true;
  }
  if (!codec::gpu::kernels_built()) {
    *why = "this build has no CUDA kernels (configure against a CUDA libtorch with nvcc, docs/GPU.md)";
    return true;
  }
  if (!codec::gpu::kernels_enabled()) {
    *why = "TAPELINE_CUDA_KERNELS=0 selects the ATen path";
    return true;
  }
  return false;
}

/// On a CUDA device: the payload of x.cuda() (the fused kernels) is x's CPU payload, byte for byte,
/// and decodes to the same values; so is the ATen path's payload on the device. Three codecs of
/// one spec, for codecs that draw from their own state (RandK), or one thrice.
inline void expect_cuda_payload_is_cpus(const CompressorPtr& cpu_c, const CompressorPtr& gpu_c,
                                        const CompressorPtr& aten_c, const at::Tensor& x, const std::string& where) {
  CodecContext ctx;
  Payload cpu = cpu_c->encode(x, ctx);
  Payload gpu = gpu_c->encode(x.cuda(), ctx);
  EXPECT_TRUE(!gpu.body.defined() || gpu.body.numel() == 0 || gpu.body.is_cuda()) << where;
  EXPECT_TRUE(same_payload(gpu, cpu)) << where;
  at::Tensor y = gpu_c->decode(gpu, ctx);
  EXPECT_TRUE(y.is_cuda()) << where;
  EXPECT_TRUE(at::equal(y.cpu(), cpu_c->decode(cpu, ctx))) << where;
  codec::PortableKernelsGuard guard;  // the ATen path on the device
  EXPECT_TRUE(same_payload(aten_c->encode(x.cuda(), ctx), cpu)) << where << ": ATen path on the GPU";
}

/// The error message of f(), or "" if it did not throw.
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

#define EXPECT_ERROR_CONTAINS(stmt, text)                                           \
  do {                                                                              \
    const std::string msg_ = ::tl::testing::error_of([&] { stmt; });                \
    EXPECT_NE(msg_.find(text), std::string::npos) << "error was: '" << msg_ << "'"; \
  } while (0)

}  // namespace tl::testing
