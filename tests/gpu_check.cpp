// tl_gpu_check: built only where CMake enabled CUDA (a CUDA libtorch and nvcc), from the CUDA-only
// sources and nothing else: the NCCL and Gloo paths of c10d_compat, the fused codec kernels and
// their host logic. CI builds it against PyTorch 2.x's CUDA libtorch (scripts/build-gpu --check):
// compiling those sources and resolving every symbol they use is the check. On a machine with a
// GPU it also runs the quantisation, sparse packing and AQ-SGD kernels on one tensor and compares their bytes and
// values with the host logic (docs/GPU.md); the full comparison with the codecs is `ctest -L gpu`.
#include <ATen/ATen.h>

#include <cstdio>
#include <cstring>

#include "compression/cuda/aqsgd_cuda.h"
#include "compression/cuda/quant_cuda.h"
#include "compression/cuda/sparse_cuda.h"
#include "parallel/ranks/c10d_compat.h"

using namespace tl;

int main() {
  std::printf("libtorch %s: gloo %d, nccl %d, CUDA kernels %d (enabled %d)\n", ranks::compat::torch_version().c_str(),
              int(ranks::compat::has_gloo()), int(ranks::compat::has_nccl()), int(codec::gpu::kernels_built()),
              int(codec::gpu::kernels_enabled()));
  // Referenced so that the link resolves them (ProcessGroupNCCL's and ProcessGroupGloo's symbols).
  volatile auto nccl = &ranks::compat::make_nccl;
  volatile auto gloo = &ranks::compat::make_gloo;
  (void)nccl;
  (void)gloo;
  if (!at::hasCUDA()) {
    std::printf("no CUDA device: compiled and linked only\n");
    return 0;
  }
  // 20011 elements (a partial last group of 8) in 21 scale groups of 1000, every bit width.
  const int64_t n = 20011, run = 1000, groups = 21;
  at::Tensor x = at::randn({n});                      // (n)
  at::Tensor a = at::rand({groups}) * 2 + 0.5;        // (G) max-abs divisors
  at::Tensor step = at::rand({groups}) * 0.1 + 0.01;  // (G)
  at::Tensor xd = x.cuda(), ad = a.cuda(), sd = step.cuda();
  int failures = 0;
  for (int bits = 1; bits <= 8; ++bits) {
    const codec::QuantGeometry g{n, run, groups};
    const int64_t bytes = (n * bits + 7) / 8;
    for (bool stochastic : {false, true}) {
      at::Tensor host = at::empty({bytes}, at::kByte), dev = at::empty({bytes}, xd.options().dtype(at::kByte));
      codec::gpu::quantise_pack_host(x.data_ptr<float>(), g,
                                     {bits, false, stochastic, 42, a.data_ptr<float>(), a.data_ptr<float>()},
                                     host.data_ptr<uint8_t>());
      codec::gpu::quantise_pack_cuda(0, xd.data_ptr<float>(), g,
                                     {bits, false, stochastic, 42, ad.data_ptr<float>(), ad.data_ptr<float>()},
                                     dev.data_ptr<uint8_t>());
      if (!at::equal(host, dev.cpu())) {
        std::printf("FAIL quantise_pack bits=%d stochastic=%d: bytes differ\n", bits, int(stochastic));
        ++failures;
      }
      at::Tensor yh = at::empty({n}), yd = at::empty({n}, xd.options());
      codec::gpu::unpack_dequantise_host(
          host.data_ptr<uint8_t>(), g, {bits, true, step.data_ptr<float>(), a.data_ptr<float>()}, yh.data_ptr<float>());
      codec::gpu::unpack_dequantise_cuda(0, dev.data_ptr<uint8_t>(), g,
                                         {bits, true, sd.data_ptr<float>(), ad.data_ptr<float>()},
                                         yd.data_ptr<float>());
      if (!at::equal(yh, yd.cpu())) {
        std::printf("FAIL unpack_dequantise bits=%d: values differ\n", bits);
        ++failures;
      }
    }
  }
  // Sparse packing: every 7th of 20011 elements (int index) and a bitmap, each wire type.
  at::Tensor idx = at::arange(0, n, 7, at::kLong), idxd = idx.cuda();  // (k)
  const int64_t k = idx.numel();
  for (bool bitmap : {false, true}) {
    for (auto w : {codec::gpu::WireType::kF32, codec::gpu::WireType::kF16, codec::gpu::WireType::kBF16}) {
      const codec::gpu::SparseLayout s{k, n, bitmap, 4, bitmap ? (n + 7) / 8 : 4 * k, w};
      const int64_t bytes = s.index_bytes + k * codec::gpu::wire_size(w);
      at::Tensor host = at::empty({bytes}, at::kByte), dev = at::empty({bytes}, xd.options().dtype(at::kByte));
      codec::gpu::sparse_pack_host(x.data_ptr<float>(), idx.data_ptr<int64_t>(), s, host.data_ptr<uint8_t>());
      codec::gpu::sparse_pack_cuda(0, xd.data_ptr<float>(), idxd.data_ptr<int64_t>(), s, dev.data_ptr<uint8_t>());
      if (!at::equal(host, dev.cpu())) {
        std::printf("FAIL sparse_pack bitmap=%d wire=%d: bytes differ\n", int(bitmap), int(w));
        ++failures;
      }
      at::Tensor rh = at::zeros({s.index_bytes}, at::kLong),
                 rd = at::zeros({s.index_bytes}, xd.options().dtype(at::kLong));
      if (bitmap) {
        codec::gpu::bitmap_counts_host(host.data_ptr<uint8_t>(), s.index_bytes, rh.data_ptr<int64_t>());
        codec::gpu::bitmap_counts_cuda(0, dev.data_ptr<uint8_t>(), s.index_bytes, rd.data_ptr<int64_t>());
        rh = rh.cumsum(0);
        rd = rd.cumsum(0);
      }
      at::Tensor yh = at::zeros({n}), yd = at::zeros({n}, xd.options());
      codec::gpu::sparse_unpack_host(host.data_ptr<uint8_t>(), rh.data_ptr<int64_t>(), s, yh.data_ptr<float>());
      codec::gpu::sparse_unpack_cuda(0, dev.data_ptr<uint8_t>(), rd.data_ptr<int64_t>(), s, yd.data_ptr<float>());
      if (!at::equal(yh, yd.cpu())) {
        std::printf("FAIL sparse_unpack bitmap=%d wire=%d: values differ\n", int(bitmap), int(w));
        ++failures;
      }
    }
  }
  // AQ-SGD: a delta and two updates of rows 3, 0, 5 of a (6, 20011) fp16 cache.
  at::Tensor ids = at::tensor({3, 0, 5}, at::kLong), idsd = ids.cuda();    // (B)
  at::Tensor xb = at::randn({3, n}), xbd = xb.cuda();                      // (B, D)
  at::Tensor rows = at::randn({6, n}).to(at::kHalf), rowsd = rows.cuda();  // (N, D)
  const codec::gpu::CacheRows mh{rows.data_ptr(), codec::gpu::WireType::kF16, n, ids.data_ptr<int64_t>(), 3};
  const codec::gpu::CacheRows md{rowsd.data_ptr(), codec::gpu::WireType::kF16, n, idsd.data_ptr<int64_t>(), 3};
  at::Tensor dh = at::empty({3, n}), dd = at::empty({3, n}, xd.options()), oh = at::empty({3, n}), od = dd.clone();
  codec::gpu::aqsgd_delta_host(xb.data_ptr<float>(), mh, dh.data_ptr<float>());
  codec::gpu::aqsgd_delta_cuda(0, xbd.data_ptr<float>(), md, dd.data_ptr<float>());
  codec::gpu::aqsgd_update_host(xb.data_ptr<float>(), mh, nullptr);
  codec::gpu::aqsgd_update_cuda(0, xbd.data_ptr<float>(), md, nullptr);
  codec::gpu::aqsgd_update_host(dh.data_ptr<float>(), mh, oh.data_ptr<float>());
  codec::gpu::aqsgd_update_cuda(0, dd.data_ptr<float>(), md, od.data_ptr<float>());
  if (!at::equal(dh, dd.cpu()) || !at::equal(oh, od.cpu()) || !at::equal(rows, rowsd.cpu())) {
    std::printf("FAIL aqsgd: deltas, outputs or cache rows differ\n");
    ++failures;
  }
  std::printf(failures ? "FAIL %d comparisons\n" : "OK kernels equal the host logic bit for bit\n", failures);
  return failures ? 1 : 0;
}
