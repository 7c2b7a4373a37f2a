#include "compression/codecs/common.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "compression/codecs/inline_parallel.h"

namespace tl::codec {
namespace {
thread_local bool g_cpu_kernels = true;
thread_local bool g_device_semantics = false;
}  // namespace

bool cpu_kernels_enabled() { return g_cpu_kernels; }

namespace {
std::atomic<int64_t> g_task_bytes{kTaskBytes};
}  // namespace
int64_t task_bytes() { return g_task_bytes.load(std::memory_order_relaxed); }
int64_t set_task_bytes(int64_t bytes) { return g_task_bytes.exchange(std::max<int64_t>(1, bytes)); }

bool cpu_has_avx2_f16c() {
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return has;
#else
  return false;
#endif
}

gpu::WireType kernel_wire_type(at::ScalarType t) {
  switch (t) {
    case at::kHalf:
      return gpu::WireType::kF16;
    case at::kBFloat16:
      return gpu::WireType::kBF16;
    default:
      TORCH_CHECK(t == at::kFloat, "the CUDA kernels know float32, float16 and bfloat16, not ", t);
      return gpu::WireType::kF32;
  }
}
bool device_semantics_on_cpu() { return g_device_semantics; }
PortableKernelsGuard::PortableKernelsGuard(bool device_semantics)
    : prev_(g_cpu_kernels), prev_device_(g_device_semantics) {
  g_cpu_kernels = false;
  g_device_semantics = device_semantics;
}
PortableKernelsGuard::~PortableKernelsGuard() {
  g_cpu_kernels = prev_;
  g_device_semantics = prev_device_;
}

const std::vector<std::string>& wire_type_words() {
  static const std::vector<std::string> words{"fp32", "fp16", "bf16"};
  return words;
}

at::ScalarType wire_type_from_word(const std::string& word) {
  if (word == "fp32") return at::kFloat;
  if (word == "fp16") return at::kHalf;
  if (word == "bf16") return at::kBFloat16;
  TORCH_CHECK(false, "unknown value type '", word, "'; accepted: fp32, fp16, bf16");
}

std::string wire_type_word(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "fp32";
    case at::kHalf:
      return "fp16";
    case at::kBFloat16:
      return "bf16";
    default:
      TORCH_CHECK(false, "no wire name for value type ", t, "; accepted: fp32, fp16, bf16");
  }
}

at::ScalarType wire_type_from_param(int64_t code, const char* codec) {
  for (at::ScalarType t : {at::kFloat, at::kHalf, at::kBFloat16})
    if (code == static_cast<int64_t>(t)) return t;
  TORCH_CHECK(false, codec, ": corrupt payload: value type code ", code, " is not one of fp32 (",
              static_cast<int>(at::kFloat), "), fp16 (", static_cast<int>(at::kHalf), "), bf16 (",
              static_cast<int>(at::kBFloat16), ")");
}

void check_payload(const Payload& p, const char* codec, size_t nparams) {
  const uint16_t mine = codec_id(codec);
  TORCH_CHECK(p.codec == mine, codec, ": cannot decode a payload packed by '", codec_name(p.codec), "' (codec id ",
              p.codec, ", expected ", mine, ")");
  TORCH_CHECK(p.params.size() == nparams, codec, ": corrupt payload: ", p.params.size(), " params, expected ", nparams);
  TORCH_CHECK(!p.body.defined() || (p.body.scalar_type() == at::kByte && p.body.dim() == 1), codec,
              ": payload body must be a 1-D uint8 tensor");
}

void check_input(const at::Tensor& x, const char* codec) {
  TORCH_CHECK(x.defined(), codec, ": input tensor is undefined");
  const auto t = x.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble, codec,
              ": cannot compress a tensor of type ", t, "; accepted: float32, float16, bfloat16, float64");
}

std::string format_number(double v, bool fraction) {
  char buf[64];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof(buf), "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s(buf);
  if (fraction && s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

int64_t shape_numel(const std::vector<int64_t>& shape) {
  // The product of the non-zero extents must fit too: decoders form partial products (rows,
  // channels, runs), and an empty shape such as (0, 2^40, 2^40) would overflow them.
  int64_t nonzero = 1;
  bool empty = false;
  for (int64_t d : shape) {
    TORCH_CHECK(d >= 0, "negative extent ", d, " in shape ", c10::IntArrayRef(shape));
    if (d == 0) {
      empty = true;
      continue;
    }
    TORCH_CHECK(nonzero <= std::numeric_limits<int64_t>::max() / d, "shape ", c10::IntArrayRef(shape),
                " overflows int64");
    nonzero *= d;
  }
  return empty ? 0 : nonzero;
}

}  // namespace tl::codec
