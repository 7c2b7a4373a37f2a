// Note [CUDA as a plugin] (autograd/cuda_plugin.h): executables link libtorch_cpu only, and
// libtl_cuda.so (the CUDA kernels, NCCL) is loaded where there is a GPU. On a CPU machine: it stays
// out, the kernels' entry points say why, and loading it on request finds every entry.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>

#include "autograd/cuda_plugin.h"
#include "compression/cuda/entries.h"
#include "tests/common/testing.h"
#include "tests/compression/codec_testing.h"

namespace tl {
namespace {

using codec::QuantGeometry;
using codec::QuantParams;

bool machine_has_gpu() { return access("/dev/nvidiactl", F_OK) == 0; }

TEST(CudaPlugin, StaysOutWithoutAGpuAndTheKernelsSayWhy) {
  if (!cuda_plugin_built()) GTEST_SKIP() << "built against a libtorch without CUDA: no plugin";
  if (machine_has_gpu()) GTEST_SKIP() << "this machine has an NVIDIA device: the plugin is loaded at start-up";
  if (std::getenv("TAPELINE_CUDA_PLUGIN") != nullptr) GTEST_SKIP() << "TAPELINE_CUDA_PLUGIN is set";
  ASSERT_FALSE(cuda_plugin_loaded()) << cuda_plugin_status();
  EXPECT_NE(cuda_plugin_status().find("no NVIDIA device"), std::string::npos) << cuda_plugin_status();
  EXPECT_FALSE(codec::gpu::kernels_enabled()) << "CUDA tensors would call kernels that are not loaded";
  const QuantGeometry g{};
  const QuantParams q{};
  EXPECT_ERROR_CONTAINS(codec::gpu::quantise_pack_cuda(0, nullptr, g, q, nullptr), "libtl_cuda.so");
}

TEST(CudaPlugin, LoadsOnRequestWithEveryEntry) {
  if (!cuda_plugin_built()) GTEST_SKIP() << "built against a libtorch without CUDA: no plugin";
  ASSERT_TRUE(load_cuda_plugin()) << cuda_plugin_status();
  EXPECT_TRUE(cuda_plugin_loaded());
  EXPECT_NE(cuda_plugin_status().find("loaded from"), std::string::npos) << cuda_plugin_status();
  for (const char* name :
       {"tl_cuda_quantise_pack", "tl_cuda_unpack_dequantise", "tl_cuda_quantise_pack_residual", "tl_cuda_quant_scales",
        "tl_cuda_quant_derive", "tl_cuda_quant_tensor", "tl_cuda_dequant_tensor", "tl_cuda_block_scales", "tl_cuda_channel_scales",
        "tl_cuda_sparse_pack", "tl_cuda_bitmap_counts", "tl_cuda_sparse_unpack", "tl_cuda_topk_select",
        "tl_cuda_aqsgd_delta", "tl_cuda_aqsgd_update", "tl_cuda_set_sync_debug_mode", "tl_cuda_make_nccl"})
    EXPECT_NE(cuda_plugin_symbol(name), nullptr) << name;
  EXPECT_EQ(cuda_plugin_symbol("tl_cuda_no_such_entry"), nullptr);
  // Loading brought libtorch_cuda into the process. (Whether ATen then has its CUDA backend depends
  // on whether anything asked ATen about CUDA before, Note [CUDA as a plugin]; with the whole binary
  // in one process, earlier tests have.)
  EXPECT_NE(dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_NOLOAD), nullptr) << "libtorch_cuda is not loaded";
  if (!at::hasCUDA()) {
    // Without a device, a kernel call reaches the plugin and fails in CUDA, not for want of it
    // (8 elements: an empty launch returns before asking for the device).
    const QuantGeometry g{8, 8, 1};
    const QuantParams q{};
    try {
      codec::gpu::quantise_pack_cuda(0, nullptr, g, q, nullptr);
      ADD_FAILURE() << "a kernel launch without a CUDA device succeeded";
    } catch (const c10::Error& e) {
      EXPECT_EQ(std::string(e.what()).find("libtl_cuda.so, which is"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace tl
