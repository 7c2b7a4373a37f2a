#pragma once
// Which arithmetic scaled_dot_product_attention (autograd/ops.h) runs: its own explicit products
// and softmax, or libtorch's fused attention (Note [fused attention] in autograd/ops/attention.cpp).

#include <cstdint>

namespace tl {

enum class AttentionPath {
  kAuto,      // fused on CUDA tensors where libtorch has it (2.x) and there is no dropout; else explicit
  kExplicit,  // the explicit products and softmax, on every device (bit for bit the CPU's arithmetic)
  kFused,     // fused wherever libtorch has it, the CPU included (tests); dropout still explicit
};

/// The process-wide choice; the default is kAuto, or what TAPELINE_ATTENTION says (auto, explicit,
/// fused; read once, at the first attention op). An unknown value is an error naming it.
void set_attention_path(AttentionPath path);
AttentionPath attention_path();
/// Whether this build's libtorch has fused attention (libtorch 2.x).
bool fused_attention_available();
/// How many attention ops took the fused path in this process (tests and benchmarks).
int64_t fused_attention_calls();

}  // namespace tl
