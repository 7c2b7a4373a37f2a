// tl_gpu_check: built only where CMake enabled CUDA (a CUDA libtorch and nvcc), from the CUDA-only
// sources and nothing else: the NCCL and Gloo paths of c10d_compat, the fused codec kernels and
// their host logic. CI builds it against PyTorch 2.x's CUDA libtorch (scripts/build-gpu --check):
// compiling those sources and resolving every symbol they use is the check. On a machine with a
// GPU it also runs the quantisation, sparse packing, TopK selection and AQ-SGD kernels on one tensor and compares their bytes and
// values with the host logic (docs/GPU.md); the full comparison with the codecs is `ctest -L gpu`.
#include <ATen/ATen.h>

#include <cstdio>
#include <cstring>

#include "compression/cuda/aqsgd_cuda.h"
#include "compression/cuda/quant_cuda.h"
#include "compression/cuda/sparse_cuda.h"
#include "compression/cuda/topk_cuda.h"
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
  // Scales made on the device (Note [scales in the kernels]): one per tensor of 4M elements (a full
  // grid of partial minima and maxima), per channel of a (64, 65537) view, per block of 128.
  {
    at::Tensor big = at::randn({64 * 65537}) * 3;  // (N)
    big[1234567] = -77;
    at::Tensor bigd = big.cuda(), partials = at::empty({codec::gpu::kQuantPartialFloats}, bigd.options());
    const int64_t nb = big.numel();
    for (const bool minmax : {false, true}) {
      for (const int bits : {2, 4, 8}) {
        const codec::gpu::ScaleParams p{bits, minmax, codec::gpu::WireType::kBF16, 1};
        const int64_t bytes = (minmax ? 4 : 2) + (nb * bits + 7) / 8;
        at::Tensor host = at::empty({bytes}, at::kByte), dev = at::empty({bytes}, bigd.options().dtype(at::kByte));
        const codec::QuantParams q{bits, minmax, false, 0, nullptr, nullptr};
        const codec::QuantGeometry g{nb, nb, 1};
        codec::gpu::quant_tensor_host(big.data_ptr<float>(), g, q, p, host.data_ptr<uint8_t>(), nullptr);
        codec::gpu::quant_tensor_cuda(0, bigd.data_ptr<float>(), g, q, p, partials.data_ptr<float>(),
                                      dev.data_ptr<uint8_t>(), nullptr);
        if (!at::equal(host, dev.cpu())) {
          std::printf("FAIL quant_tensor bits=%d minmax=%d: bytes differ\n", bits, int(minmax));
          ++failures;
        }
        at::Tensor yh = at::empty({nb}), yd = at::empty({nb}, bigd.options());
        codec::gpu::dequant_tensor_host(host.data_ptr<uint8_t>(), g, p, yh.data_ptr<float>());
        codec::gpu::dequant_tensor_cuda(0, dev.data_ptr<uint8_t>(), g, p, yd.data_ptr<float>());
        if (!at::equal(yh, yd.cpu())) {
          std::printf("FAIL dequant_tensor bits=%d minmax=%d: values differ\n", bits, int(minmax));
          ++failures;
        }
      }
      // Channels (inner 1 and inner 7) and blocks: wire scales and a, b, step, lo.
      struct Shape {
        const char* what;
        int64_t outer, groups, inner, block;
      };
      for (const Shape sh : {Shape{"channel", 64, 65537, 1, 0}, Shape{"channel", 599, 1000, 7, 0},
                             Shape{"block", 0, (nb + 127) / 128, 0, 128}, Shape{"block", 0, (nb + 99999) / 100000, 0, 100000},
                             Shape{"block", 0, (nb + 32) / 33, 0, 33}, Shape{"block", 0, (nb + 1499) / 1500, 0, 1500},
                             Shape{"block", 0, (nb + 4095) / 4096, 0, 4096}}) {
        const codec::gpu::ScaleParams p{4, minmax, codec::gpu::WireType::kF16, sh.groups};
        const int64_t wb = (minmax ? 2 : 1) * sh.groups * 2;
        at::Tensor wh = at::empty({wb}, at::kByte), wd = at::empty({wb}, bigd.options().dtype(at::kByte));
        at::Tensor fh = at::zeros({4, sh.groups}), fd = at::zeros({4, sh.groups}, bigd.options());  // a, b, step, lo
        auto f = [&](at::Tensor& t, int i) { return t[i].data_ptr<float>(); };
        const int64_t used = sh.block ? nb : sh.outer * sh.groups * sh.inner;
        if (sh.block) {
          codec::gpu::block_scales_host(big.data_ptr<float>(), used, sh.block, p, wh.data_ptr<uint8_t>(), f(fh, 0),
                                        f(fh, 1), f(fh, 2), f(fh, 3));
          codec::gpu::block_scales_cuda(0, bigd.data_ptr<float>(), used, sh.block, p, partials.data_ptr<float>(),
                                        wd.data_ptr<uint8_t>(), f(fd, 0), f(fd, 1), f(fd, 2), f(fd, 3));
        } else {
          codec::gpu::channel_scales_host(big.data_ptr<float>(), sh.outer, sh.inner, p, wh.data_ptr<uint8_t>(),
                                          f(fh, 0), f(fh, 1), f(fh, 2), f(fh, 3));
          codec::gpu::channel_scales_cuda(0, bigd.data_ptr<float>(), sh.outer, sh.inner, p, wd.data_ptr<uint8_t>(),
                                          f(fd, 0), f(fd, 1), f(fd, 2), f(fd, 3));
        }
        if (!at::equal(wh, wd.cpu()) || !at::equal(fh, fd.cpu())) {
          std::printf("FAIL %s_scales inner=%ld block=%ld minmax=%d: scales differ\n", sh.what,
                      static_cast<long>(sh.inner), static_cast<long>(sh.block), int(minmax));
          ++failures;
        }
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
      const int64_t chunks = codec::gpu::bitmap_chunks(s.index_bytes);
      at::Tensor rh = at::zeros({chunks}, at::kLong), rd = at::zeros({chunks}, xd.options().dtype(at::kLong));
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
  // TopK's radix selection: one row and five rows of x, k large and small, and small integers
  // (ties across tiles), against the host loops: the kept indices and each row's k-th key.
  at::Tensor ties = at::randint(-3, 4, {n}).to(at::kFloat), tiesd = ties.cuda();
  for (const auto& [src, srcd, s] : {std::make_tuple(x, xd, codec::gpu::TopkShape{1, n, 2001}),
                                     std::make_tuple(x, xd, codec::gpu::TopkShape{5, n / 5, 17}),
                                     std::make_tuple(ties, tiesd, codec::gpu::TopkShape{1, n, 5000})}) {
    const auto bytes = at::TensorOptions().dtype(at::kByte);
    at::Tensor zh = at::zeros({codec::gpu::topk_zeroed_bytes(s)}, bytes);
    at::Tensor rh = at::empty({codec::gpu::topk_rest_bytes(s)}, bytes);
    at::Tensor zd = zh.cuda(), rd = rh.cuda();
    at::Tensor ih = at::empty({s.rows * s.k}, at::kLong), id = ih.cuda();
    codec::gpu::topk_select_host(src.data_ptr<float>(), s, zh.data_ptr<uint8_t>(), rh.data_ptr<uint8_t>(),
                                 ih.data_ptr<int64_t>());
    codec::gpu::topk_select_cuda(0, srcd.data_ptr<float>(), s, zd.data_ptr<uint8_t>(), rd.data_ptr<uint8_t>(),
                                 id.data_ptr<int64_t>());
    // The rows' states (RadixRow) lead the zeroed bytes.
    const int64_t state = s.rows * int64_t(sizeof(codec::gpu::RadixRow));
    if (!at::equal(ih, id.cpu()) || !at::equal(zh.slice(0, 0, state), zd.cpu().slice(0, 0, state))) {
      std::printf("FAIL topk_select rows=%lld k=%lld: indices or k-th keys differ\n", (long long)s.rows,
                  (long long)s.k);
      ++failures;
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
