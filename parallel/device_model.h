#pragma once
// A device model for the pipeline's timeline: the seconds a stage's compute would take on a
// device this machine does not have, from the FLOPs and bytes the engine counts per op
// (Note [op costs] in autograd/cost.h).
//
// Note [device model]
// Each op (each kernel the engine would launch) takes
//     max(FLOPs / (peak FLOP/s x flop_efficiency), bytes x bytes_scale / (memory B/s x memory_efficiency))
//       + kernels x launch_s,   and at least kernels x host_s
// a roofline with an efficiency factor per roof and a launch cost, so that a model of a few
// thousand small kernels is not modelled as free. bytes_scale converts what the engine counts
// (this CPU run's float32 tensors) to the training dtype of the device (bf16 on GPUs: 0.5).
// The presets (docs/TIME.md says where each constant comes from):
//     h100  989 TFLOP/s bf16 dense, 3.35 TB/s HBM3 (H100 SXM5 datasheet)
//     a100  312 TFLOP/s bf16 dense, 2.04 TB/s HBM2e (A100 SXM4 80 GB datasheet)
//     cpu   this project's 2-core machines in float32, calibrated with bench_pipeline
// with flop_efficiency 0.5 (what large transformer GEMMs reach on these GPUs), memory_efficiency
// 0.8 and launch_s 4 us on the GPUs. What it leaves out: overlap of kernels, fusion (every op is
// its own kernel, as in this engine), caches, clocks under power limits, and the optimizer step.
// "measured" is no model: the timeline advances by the measured duration of the work here.
//
// Note [the host's floor]
// An engine that issues its ops one by one from the host cannot finish an op on the device
// sooner than the host takes to issue it: this engine's autograd bookkeeping, ATen's dispatch and
// the launches. On three H200 machines (bench_pipeline --calibrate --device cuda --dtype bf16,
// docs/TIME.md) that was 20 to 41 us per counted kernel for GPT-2 and ResNet-8 stages whose kernels
// are small, so those stages ran 2.2 to 9 times slower than the roofline with a 4 us launch said;
// stages whose kernels are large ran within 3 to 21% of it. The presets take 30 us. host_s is that floor: an op takes
// max(roofline + launches, kernels x host_s). Per op, so a stage of large GEMMs and small
// elementwise ops is charged the GEMMs' time and the small ops' host time. The host's lead over
// the device (it issues op i + 1 while op i runs) is left out: an op is charged one or the other.

#include <c10/core/Device.h>

#include <string>
#include <vector>

#include "autograd/cost.h"

namespace tl {

struct DeviceModel {
  std::string name = "measured";
  double peak_flops = 0;            // FLOP/s, dense, in the training dtype
  double memory_bytes_per_s = 0;    // B/s
  double flop_efficiency = 0.5;     // fraction of peak_flops an op reaches
  double memory_efficiency = 0.8;   // fraction of memory_bytes_per_s an op reaches
  double launch_s = 4e-6;           // per kernel, on the device
  double host_s = 0;                // per kernel, the host's floor (Note [the host's floor]); 0: none
  double bytes_scale = 0.5;         // training dtype's bytes per element / 4

  bool measured() const { return name == "measured"; }
  /// Seconds of `c` on this device (Note [device model]); 0 for "measured".
  double seconds(const OpCost& c) const;
};

/// Waits until `device`'s current stream has run what was queued on it (nothing on the CPU or the
/// meta device): a measured time on a GPU ends when its kernels do (Note [timing actions on a GPU]).
void wait_for_device(const c10::Device& device);

/// The names device_model() accepts: measured, h100, a100, cpu.
const std::vector<std::string>& device_model_names();
/// The preset `name`; an error names it and lists the accepted ones.
DeviceModel device_model(const std::string& name);

}  // namespace tl
