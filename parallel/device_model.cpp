#include "parallel/device_model.h"

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>

namespace tl {
namespace {
// Note [the host's floor]: this engine's host time per counted kernel, the middle of 20 to 41 us
// measured on the hosts of three H200 machines (bench_pipeline --calibrate --device cuda,
// docs/TIME.md). A property of the engine and the host's CPU, not of the GPU, so both GPU presets
// carry it.
constexpr double kHostPerKernel = 30e-6;
}  // namespace

double DeviceModel::seconds(const OpCost& c) const {
  if (measured()) return 0.0;
  const double compute = c.flops / (peak_flops * flop_efficiency);
  const double memory = c.bytes * bytes_scale / (memory_bytes_per_s * memory_efficiency);
  const double kernels = static_cast<double>(c.kernels);
  return std::max(std::max(compute, memory) + kernels * launch_s, kernels * host_s);  // Note [the host's floor]
}

void wait_for_device(const c10::Device& device) {
  if (device.is_cpu() || device.is_meta()) return;
  c10::impl::VirtualGuardImpl impl(device.type());
  impl.getStream(device).synchronize();
}

const std::vector<std::string>& device_model_names() {
  static const std::vector<std::string> names = {"measured", "h100", "a100", "cpu"};
  return names;
}

DeviceModel device_model(const std::string& name) {
  DeviceModel m;
  m.name = name;
  if (name == "measured") return m;
  if (name == "h100") {
    m.peak_flops = 989e12, m.memory_bytes_per_s = 3.35e12;
    m.host_s = kHostPerKernel;
  } else if (name == "a100") {
    m.peak_flops = 312e12, m.memory_bytes_per_s = 2.04e12;
    m.host_s = kHostPerKernel;
  } else if (name == "cpu") {
    // bench_pipeline --calibrate on the 2-core machines, 1 thread (docs/TIME.md): float32 GEMMs
    // and elementwise passes as ATen runs them there, and ~5 us of dispatch per op.
    m.peak_flops = 94e9, m.memory_bytes_per_s = 5.7e9;  // 512^3 sgemm; a 16 MB add (read 2, write 1)
    m.flop_efficiency = 0.85, m.memory_efficiency = 1.0, m.launch_s = 5e-6, m.bytes_scale = 1.0;
  } else {
    TORCH_CHECK(false, "timeline.device = '", name, "': unknown device; known: measured, h100, a100, cpu");
  }
  return m;
}

}  // namespace tl
