// Host synchronisation on the codecs' device paths (Note [host synchronisation] in
// compression/payload.cpp).
//
// On a GPU, CudaEncodeDecodeNeverSynchronises switches CUDA's sync debug mode to "error" (any
// cudaStreamSynchronize / synchronous copy behind .item(), nonzero, .cpu(), ... throws) around
// encode and decode. Without a GPU the same code path runs on CPU tensors under
// PortableKernelsGuard(/*device_semantics=*/true), and every ATen call that would synchronise on a
// device (the ones listed in kSyncOps) is counted with RecordFunction. The remaining, documented
// synchronisations are checked to be exactly where the note says:
//   threshold(t)      one nonzero per encode (how many entries pass is data-dependent)
//   index=delta       one .item() per encode (the varint stream's length is data-dependent)
// Not visible to the CPU count (and covered by the CUDA test): device-to-host copies (.cpu()).
#include <ATen/record_function.h>

#include <functional>
#include <map>
#include <set>
#include <string>


#include "autograd/cuda_plugin.h"
#include "compression/codecs/common.h"
#include "compression/cuda/entries.h"
#include "compression/codecs/sparse_index.h"
#include "compression/spec.h"
#include "tests/common/testing.h"
#include "tests/compression/codec_testing.h"

namespace tl {
namespace {
using testing::all_close;

// ATen operators that read device data on the host (so wait for the device) whatever their inputs.
const std::set<std::string> kSyncOps = {"aten::_local_scalar_dense",
                                        "aten::nonzero",
                                        "aten::masked_select",
                                        "aten::bincount",
                                        "aten::unique_dim",
                                        "aten::_unique2",
                                        "aten::is_nonzero",
                                        "aten::equal",
                                        "aten::allclose",
                                        "aten::nonzero_numpy",
                                        "aten::argwhere"};

thread_local std::map<std::string, int64_t>* g_sync_calls = nullptr;

// Counts, by name, the calls of kSyncOps that fn makes on this thread.
std::map<std::string, int64_t> sync_calls(const std::function<void()>& fn) {
  std::map<std::string, int64_t> calls;
  g_sync_calls = &calls;
  auto handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction& f) -> std::unique_ptr<at::ObserverContext> {
        if (kSyncOps.count(f.name())) ++(*g_sync_calls)[f.name()];
        return nullptr;
      }).scopes({at::RecordScope::FUNCTION}));
  try {
    fn();
  } catch (...) {
    at::removeCallback(handle);
    g_sync_calls = nullptr;
    throw;
  }
  at::removeCallback(handle);
  g_sync_calls = nullptr;
  return calls;
}

std::string describe(const std::map<std::string, int64_t>& calls) {
  std::string s;
  for (const auto& [n, c] : calls) s += " " + n + " x" + std::to_string(c);
  return s.empty() ? " none" : s;
}

// Stateless and stateful-free codecs whose device path must not synchronise at all.
const char* const kNoSyncSpecs[] = {"identity",
                                    "fp16",
                                    "bf16",
                                    "topk(0.1)",
                                    "topk(0.3, scope=global, index=int32)",
                                    "topk(0.25, index=bitmap, values=bf16)",
                                    "randk(0.1, seed=3)",
                                    "randk(0.02, scope=global, rescale=true)",
                                    "quant(4)",
                                    "quant(8, scale=channel, scales=fp32)",
                                    "quant(3, mode=minmax)",
                                    "quant(2, mode=minmax, round=stochastic, scales=fp32, seed=4)",
                                    "powersgd(2)",
                                    "topk(0.1) | quant(4)",
                                    "powersgd(3) | fp16",
                                    "hadquant(4, tile=16)",
                                    "hadquant(2, scales=fp32)",
                                    "colsparse(0.1, block=2)",
                                    "colsparse(0.25, index=bitmap) | quant(4)"};

TEST(HostSync, DevicePathsOfTheCodecsReadNothingBack) {
  at::manual_seed(2);
  const at::Tensor x = at::randn({6, 3, 40});
  const at::Tensor g = at::randn({6, 3, 40});
  CodecContext ctx;
  ASSERT_EQ(sync_calls([] { (void)at::ones({2}).sum().item<float>(); }).size(), 1u) << "the counter sees .item()";
  for (const char* spec : kNoSyncSpecs) {
    at::Tensor y_fast = testing::round_trip(parse_compressor(spec), x);
    codec::PortableKernelsGuard device_path(/*device_semantics=*/true);
    auto c = parse_compressor(spec);
    Payload p;
    at::Tensor y;
    auto calls = sync_calls([&] {
      p = c->encode(x, ctx);
      y = c->decode(p, ctx);
    });
    EXPECT_TRUE(calls.empty()) << spec << ": encode + decode on the device path synchronised:" << describe(calls);
    if (std::string(spec).find("stochastic") == std::string::npos) {  // each path has its own random stream
      EXPECT_TRUE(all_close(y, y_fast, std::string(spec) + ": device path vs fast path", 1e-5, 1e-5));
    }
    if (c->supports_shared()) {
      calls = sync_calls([&] { c->decode_shared(c->encode_shared(g, p, ctx), p, ctx); });
      EXPECT_TRUE(calls.empty()) << spec << ": shared mode synchronised:" << describe(calls);
    }
  }
}

TEST(HostSync, TheDocumentedSynchronisationsAndNoMore) {
  at::manual_seed(3);
  const at::Tensor x = at::randn({4, 64});
  CodecContext ctx;
  codec::PortableKernelsGuard device_path(/*device_semantics=*/true);
  auto threshold = parse_compressor("threshold(1.0)");
  Payload p;
  auto calls = sync_calls([&] { p = threshold->encode(x, ctx); });
  EXPECT_EQ(calls, (std::map<std::string, int64_t>{{"aten::nonzero", 1}})) << describe(calls);
  calls = sync_calls([&] { threshold->decode(p, ctx); });
  EXPECT_TRUE(calls.empty()) << describe(calls);

  auto delta = parse_compressor("topk(5, index=delta)");
  calls = sync_calls([&] { p = delta->encode(x, ctx); });
  EXPECT_EQ(calls, (std::map<std::string, int64_t>{{"aten::_local_scalar_dense", 1}})) << describe(calls);
  calls = sync_calls([&] { delta->decode(p, ctx); });
  EXPECT_TRUE(calls.empty()) << describe(calls);
  // index=auto never picks delta on a device (its size would have to be read back).
  Payload a = parse_compressor("topk(5)")->encode(x, ctx);
  EXPECT_NE(a.params[5], static_cast<int64_t>(codec::IndexFormat::kDelta));
}

TEST(HostSync, PayloadsFromTheWireAreCheckedOnTheHostAndLocalOnesAreTrusted) {
  // A received payload is validated at the receiver; a payload of this process's encoder is not
  // re-validated on a device. Both decode to the same values.
  at::manual_seed(4);
  const at::Tensor x = at::randn({3, 50});
  CodecContext ctx;
  for (const char* spec :
       {"topk(0.2, index=int32)", "topk(0.2, index=delta)", "topk(0.2, index=bitmap)", "topk(0.2) | quant(8)"}) {
    auto c = parse_compressor(spec);
    Payload p = c->encode(x, ctx);
    const std::vector<uint8_t> bytes = p.serialize();
    Payload wire = Payload::deserialize(bytes.data(), bytes.size());
    EXPECT_TRUE(wire.from_wire);
    EXPECT_FALSE(p.from_wire);
    codec::PortableKernelsGuard device_path(/*device_semantics=*/true);
    EXPECT_TRUE(all_close(c->decode(wire, ctx), c->decode(p, ctx), std::string(spec) + ": wire vs local", 0, 0));
  }
  // A corrupt index in a received payload is an error, also on the device path.
  auto c = parse_compressor("topk(0.2, index=int32)");
  Payload p = c->encode(x, ctx);
  std::vector<uint8_t> bytes = p.serialize();
  const size_t index_at = p.header_bytes();                            // the int32 index comes first in the body
  bytes[index_at] = bytes[index_at + 1] = bytes[index_at + 2] = 0xff;  // index 0: a huge value
  Payload wire = Payload::deserialize(bytes.data(), bytes.size());
  codec::PortableKernelsGuard device_path(/*device_semantics=*/true);
  EXPECT_ERROR_CONTAINS(c->decode(wire, ctx), "corrupt int index");
}

TEST(HostSync, NestedPayloadsTravelWithTheirParentInProcess) {
  CodecContext ctx;
  auto c = parse_compressor("topk(0.2) | quant(4)");
  Payload p = c->encode(at::randn({4, 30}), ctx);
  ASSERT_TRUE(p.nested);
  EXPECT_EQ(p.nested->size(), 2u);  // topk's rest (its index) and the quantised values
  int64_t total = 0;
  for (const auto& n : *p.nested) total += static_cast<int64_t>(n.nbytes());
  EXPECT_EQ(total, static_cast<int64_t>(p.body_bytes())) << "the nested payloads are exactly the body";
}

TEST(HostSync, CudaEncodeDecodeNeverSynchronises) {
  if (!cuda_plugin_built()) GTEST_SKIP() << "built against a libtorch without CUDA";
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  // c10_cuda's switch, through libtl_cuda.so (Note [CUDA as a plugin]): the test links libtorch_cpu.
  auto* set_sync_debug_mode = cuda_plugin_function<decltype(tl_cuda_set_sync_debug_mode)>("tl_cuda_set_sync_debug_mode");
  ASSERT_NE(set_sync_debug_mode, nullptr) << cuda_plugin_status();
  at::manual_seed(5);
  const at::Tensor x = at::randn({6, 3, 40}, at::kCUDA), g = at::randn({6, 3, 40}, at::kCUDA);
  CodecContext ctx;
  for (const char* spec : kNoSyncSpecs) {
    auto c = parse_compressor(spec);
    c->to(at::kCUDA);
    c->decode(c->encode(x, ctx), ctx);  // first call: lazily created state may synchronise
    set_sync_debug_mode(2);  // every host synchronisation throws
    try {
      Payload p = c->encode(x, ctx);
      c->decode(p, ctx);
      if (c->supports_shared()) c->decode_shared(c->encode_shared(g, p, ctx), p, ctx);
    } catch (const c10::Error& e) {
      ADD_FAILURE() << spec << ": synchronised with the device: " << e.what_without_backtrace();
    }
    set_sync_debug_mode(0);
  }
}

}  // namespace
}  // namespace tl
