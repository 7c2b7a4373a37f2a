#include "compression/codecs/quant.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <vector>

#include "compression/codecs/common.h"
#include "compression/codecs/quant_kernels.h"
#include "compression/cuda/quant_cuda.h"

namespace tl {
namespace {

constexpr const char* kQuantName = "quant";
using Scale = QuantOptions::Scale;
using Mode = QuantOptions::Mode;

// Where the scale groups lie in a tensor of `shape` (see quant_kernels.h), and the same as a 3-D
// view (outer, groups, inner) for the portable path: element (o, g, i) uses group g.
struct Geometry {
  codec::QuantGeometry g;
  int64_t outer, inner;  // channel: view (outer, groups, inner); tensor/block: (groups, run) after padding
};

Geometry geometry(const std::vector<int64_t>& shape, Scale scale, int64_t dim, int64_t block) {
  const int64_t n = codec::shape_numel(shape);
  Geometry geo;
  switch (scale) {
    case Scale::kTensor:
      geo.g = {n, std::max<int64_t>(n, 1), 1};
      geo.outer = 1;
      geo.inner = geo.g.run;
      break;
    case Scale::kChannel: {
      int64_t outer = 1, inner = 1;
      for (int64_t i = 0; i < dim; ++i) outer *= shape[i];
      for (size_t i = dim + 1; i < shape.size(); ++i) inner *= shape[i];
      geo.g = {n, std::max<int64_t>(inner, 1), std::max<int64_t>(shape[dim], 1)};
      geo.outer = outer;
      geo.inner = inner;
      break;
    }
    case Scale::kBlock:
      geo.g = {n, block, std::max<int64_t>((n + block - 1) / block, 1)};
      geo.outer = 1;
      geo.inner = block;
      break;
  }
  return geo;
}

// Rounds float values to `t` and moves those that rounded the wrong way one representable step
// (int16 bit patterns: +1 moves away from zero) so that the result is >= v (up) or <= v (down).
// A zero of either sign becomes +0 (Note [zero scales] in compression/cuda/quant_logic.h).
at::Tensor round_outward(const at::Tensor& v0, at::ScalarType t, bool up) {
  const at::Tensor v = at::where(v0 == 0, at::zeros_like(v0), v0);  // -0 -> +0
  if (t == at::kFloat) return v;
  at::Tensor r = v.to(t);
  at::Tensor wrong = up ? r.to(at::kFloat) < v : r.to(at::kFloat) > v;
  at::Tensor bits = r.view(at::kShort).to(at::kInt);
  at::Tensor neg = (bits < 0).to(at::kInt);
  at::Tensor step = up ? 1 - 2 * neg : 2 * neg - 1;
  at::Tensor moved = (bits + step).to(at::kShort).view(t);
  return at::where(wrong, moved, r).to(at::kFloat);
}

// Per-group quantities both ends derive from the wire scales, by the same ATen ops.
struct Derived {
  at::Tensor a, b, step, lo;  // (G) float
};
Derived derive(const at::Tensor& scales, Mode mode, int64_t bits, int64_t groups) {
  Derived d;
  if (mode == Mode::kMaxAbs) {
    const double p = static_cast<double>(int64_t(1) << (bits - 1));
    d.a = scales + 1e-6f;
    d.step = scales / p;
  } else {
    const double levels = static_cast<double>((int64_t(1) << bits) - 1);
    d.lo = scales.narrow(0, 0, groups);
    at::Tensor hi = scales.narrow(0, groups, groups);
    at::Tensor range = hi - d.lo;
    d.a = d.lo;
    d.b = at::where(range > 0, levels / range, at::zeros_like(range));
    // Divided by a tensor, not a scalar: CUDA's division by a host scalar multiplies by its
    // reciprocal, one ulp off the CPU's quotient for levels that are not powers of two (found by
    // QuantGpu.KernelPayloadsEqualCpuBytes on an H200); a tensor divisor is an exact division on both.
    d.step = range / at::full_like(range, levels);
  }
  return d;
}

}  // namespace

Quantize::Quantize(QuantOptions o) : Compressor("Quantize"), o_(std::move(o)) {
  TORCH_CHECK(o_.bits >= 1 && o_.bits <= 8, kQuantName, ": bits=", o_.bits, " is not accepted; accepted: 1..8");
  TORCH_CHECK(o_.block >= 1, kQuantName, ": block=", o_.block, " is not accepted; accepted: an integer >= 1");
  if (o_.stochastic) generator_ = BufferedGenerator(at::detail::createCPUGenerator(o_.seed), *this, "generator");
}

CompressorPtr Quantize::from_spec(SpecArgs& args) {
  constexpr size_t kNamed = SpecArgs::kNamedOnly;
  QuantOptions o;
  o.bits = args.integer(0, "bits", 8);
  if (o.bits < 1 || o.bits > 8) args.fail(0, "bits", "an integer in 1..8");
  const std::string scale = args.word(kNamed, "scale", {"tensor", "channel", "block"}, std::string("tensor"));
  o.scale = scale == "channel" ? Scale::kChannel : scale == "block" ? Scale::kBlock : Scale::kTensor;
  const SpecValue* dim = args.peek(kNamed, "dim");
  if (dim && std::holds_alternative<double>(dim->v)) {
    o.dim = args.integer(kNamed, "dim");
  } else {
    args.word(kNamed, "dim", {"auto"}, std::string("auto"));
  }
  o.block = args.integer(kNamed, "block", 256);
  if (o.block < 1) args.fail(kNamed, "block", "an integer >= 1");
  if ((dim && o.scale != Scale::kChannel) || (args.has(kNamed, "block") && o.scale != Scale::kBlock))
    TORCH_CHECK(false, kQuantName, ": dim= goes with scale=channel and block= with scale=block, in '", args.call().text,
                "'");
  o.mode = args.word(kNamed, "mode", {"maxabs", "minmax"}, std::string("maxabs")) == "minmax" ? Mode::kMinMax
                                                                                              : Mode::kMaxAbs;
  o.stochastic = args.word(kNamed, "round", {"nearest", "stochastic"}, std::string("nearest")) == "stochastic";
  o.scale_type = codec::wire_type_from_word(args.word(kNamed, "scales", codec::wire_type_words(), std::string("fp16")));
  const int64_t seed = args.integer(kNamed, "seed", 0);
  if (seed < 0) args.fail(kNamed, "seed", "an integer >= 0");
  o.seed = static_cast<uint64_t>(seed);
  return std::make_shared<Quantize>(o);
}

std::string Quantize::spec() const {
  std::string s = "quant(" + std::to_string(o_.bits) + ", scale=";
  switch (o_.scale) {
    case Scale::kTensor:
      s += "tensor";
      break;
    case Scale::kChannel:
      s += "channel, dim=" + (o_.dim ? std::to_string(*o_.dim) : std::string("auto"));
      break;
    case Scale::kBlock:
      s += "block, block=" + std::to_string(o_.block);
      break;
  }
  s += std::string(", mode=") + (o_.mode == Mode::kMinMax ? "minmax" : "maxabs") +
       ", round=" + (o_.stochastic ? "stochastic" : "nearest") + ", scales=" + codec::wire_type_word(o_.scale_type);
  if (o_.stochastic) s += ", seed=" + std::to_string(o_.seed);
  return s + ")";
}

int64_t Quantize::channel_dim(int64_t ndim) const {
  TORCH_CHECK(ndim >= 2, kQuantName, ": scale=channel needs a tensor of at least 2 dims, got ", ndim,
              "; use scale=tensor or scale=block");
  int64_t d = o_.dim ? *o_.dim : (ndim >= 4 ? 1 : ndim - 1);
  TORCH_CHECK(d >= -ndim && d < ndim, kQuantName, ": dim=", d, " is out of range for a tensor of ", ndim, " dims");
  return d < 0 ? d + ndim : d;
}

Payload Quantize::encode(const at::Tensor& x, const CodecContext& ctx) { return encode_impl(x, ctx, nullptr); }

Payload Quantize::encode_with_residual(const at::Tensor& x, const CodecContext& ctx, at::Tensor* residual) {
  return encode_impl(x, ctx, residual);
}

Payload Quantize::encode_with_minmax(const at::Tensor& x, const float* mn, const float* mx, const CodecContext& ctx) {
  return encode_impl(x, ctx, nullptr, mn, mx);
}

Payload Quantize::encode_impl(const at::Tensor& x, const CodecContext& ctx, at::Tensor* residual, const float* given_mn,
                              const float* given_mx) {
  if (residual) *residual = at::Tensor();
  codec::check_input(x, kQuantName);
  const std::vector<int64_t> shape = x.sizes().vec();
  const int64_t dim = o_.scale == Scale::kChannel ? channel_dim(x.dim()) : -1;
  const Geometry geo = geometry(shape, o_.scale, dim, o_.block);
  const int64_t n = geo.g.n, groups = geo.g.groups;
  const bool cpu = codec::use_cpu_kernel(x);
  TORCH_CHECK(!given_mn || (cpu && groups > 1 && x.scalar_type() == at::kFloat), kQuantName,
              ": encode_with_minmax takes float32 CPU tensors of several scale groups on the fast path");
  // Note [CUDA kernels or ATen ops] (compression/cuda/quant_cuda.h).
  const bool cuda = codec::use_cuda_kernel(x);
  const bool emulated = cpu && codec::gpu::host_emulation();  // the kernels' logic on the host
  at::Tensor xf = x.to(at::kFloat).contiguous().reshape({-1});
  auto payload = [&](at::Tensor body) {
    Payload p;
    p.codec = codec_id(kQuantName);
    p.dtype = x.scalar_type();
    p.shape = shape;
    p.params = {o_.bits,
                static_cast<int64_t>(o_.scale),
                static_cast<int64_t>(o_.mode),
                o_.stochastic ? 1 : 0,
                dim,
                o_.scale == Scale::kBlock ? o_.block : 0,
                codec::wire_type_param(o_.scale_type)};
    p.body = std::move(body);
    return p;
  };
  auto stochastic_seed = [&]() -> uint64_t {
    if (!o_.stochastic) return 0;
    // The per-call seed comes from the codec's CPU generator, kept on the host (no device read).
    const uint64_t seed = next_random64(generator_.get());
    generator_.commit();
    return seed;
  };
  const bool minmax = o_.mode == Mode::kMinMax;
  const codec::gpu::ScaleParams sp{static_cast<int>(o_.bits), minmax, codec::kernel_wire_type(o_.scale_type), groups};
  const int64_t scale_bytes = (minmax ? 2 : 1) * groups * static_cast<int64_t>(c10::elementSize(o_.scale_type));
  const int64_t packed_bytes = (n * o_.bits + 7) / 8;

  // One scale for the tensor, on the device: two kernels from x to the body (Note [scales in the
  // kernels] in quant_logic.h).
  if ((cuda || emulated) && groups == 1 && n > 0 && !given_mn) {
    at::Tensor body = at::empty({scale_bytes + packed_bytes}, xf.options().dtype(at::kByte));
    const codec::QuantParams q{static_cast<int>(o_.bits), minmax, o_.stochastic, stochastic_seed(), nullptr, nullptr};
    // Error feedback's residual x - decode(payload) in the same pass (float32 x only: otherwise the
    // residual is of the cast input).
    at::Tensor r = residual && x.scalar_type() == at::kFloat ? at::empty({n}, xf.options()) : at::Tensor();  // (n)
    float* rp = r.defined() ? r.data_ptr<float>() : nullptr;
    if (cuda) {
      at::Tensor partials = at::empty({codec::gpu::kQuantPartialFloats}, xf.options());
      codec::gpu::quant_tensor_cuda(xf.get_device(), xf.data_ptr<float>(), geo.g, q, sp, partials.data_ptr<float>(),
                                    body.data_ptr<uint8_t>(), rp);
    } else {
      codec::gpu::quant_tensor_host(xf.data_ptr<float>(), geo.g, q, sp, body.data_ptr<uint8_t>(), rp);
      const at::Tensor scale = body.narrow(0, 0, scale_bytes).view(o_.scale_type).to(at::kFloat);
      TORCH_CHECK(at::isfinite(scale).all().item<bool>(), kQuantName, ": a scale is not finite in ",
                  codec::wire_type_word(o_.scale_type), " (the tensor holds inf/NaN, or values beyond the ",
                  "type's range: use scales=fp32)");
    }
    if (r.defined()) *residual = r.view(shape);
    return payload(body);
  }

  // Blocks on the CPU (and channels of dim 0, whose elements are one run each): min, max, scales
  // and codes by tiles of whole blocks, one read of x (Note [block scales in one pass]).
  const bool runs_are_groups = o_.scale == Scale::kBlock || (o_.scale == Scale::kChannel && geo.outer == 1);
  if (cpu && !emulated && !given_mn && runs_are_groups && geo.g.run > 1 && n > 0) {
    at::Tensor body = at::empty({scale_bytes + packed_bytes}, xf.options().dtype(at::kByte));
    std::vector<float> a(groups), b(minmax ? groups : 0), step(groups), lo(minmax ? groups : 0);
    const codec::QuantParams q{static_cast<int>(o_.bits), minmax, o_.stochastic, stochastic_seed(), nullptr, nullptr};
    uint8_t* out = body.data_ptr<uint8_t>();
    const bool finite = codec::block_quantise_cpu(xf.data_ptr<float>(), geo.g, sp, q, out, a.data(),
                                                  minmax ? b.data() : a.data(), step.data(),
                                                  minmax ? lo.data() : step.data(), out + scale_bytes);
    TORCH_CHECK(finite, kQuantName, ": a scale is not finite in ", codec::wire_type_word(o_.scale_type),
                " (the tensor holds inf/NaN, or values beyond the type's range: use scales=fp32)");
    return payload(body);
  }

  // Per-group min and max.
  at::Tensor mn, mx;
  if (n == 0) {
    mn = mx = at::zeros({groups}, xf.options());
  } else if ((cuda || emulated) && !given_mn) {
    // channels and blocks: min, max and scales by channel_scales_cuda or block_scales_cuda below
    // (Note [scales in the kernels]; one scale for the tensor took the path above)
  } else if (groups == 1 && !cpu) {
    std::tie(mn, mx) = at::aminmax(xf);
    mn = mn.reshape({1});
    mx = mx.reshape({1});
  } else if (cpu) {
    mn = at::empty({groups}, xf.options());
    mx = at::empty({groups}, xf.options());
    if (given_mn) {
      std::memcpy(mn.data_ptr<float>(), given_mn, groups * sizeof(float));
      std::memcpy(mx.data_ptr<float>(), given_mx, groups * sizeof(float));
    } else {
      codec::group_minmax_cpu(xf.data_ptr<float>(), geo.g, mn.data_ptr<float>(), mx.data_ptr<float>());
    }
  } else if (o_.scale == Scale::kChannel) {
    at::Tensor v = xf.view({geo.outer, groups, geo.inner});
    mn = v.amin({0, 2});
    mx = v.amax({0, 2});
  } else {  // blocks: pad the last one with a copy of its last element (neutral for min and max)
    at::Tensor padded = at::cat({xf, xf.narrow(0, n - 1, 1).expand({groups * o_.block - n})}).view({groups, o_.block});
    mn = padded.amin(1);
    mx = padded.amax(1);
  }

  // Wire scales, rounded outward; both ends use exactly these. On the fused path one kernel writes
  // them into the body and derives a, b, step, lo (Note [fused scales] in quant_logic.h).
  const bool fused_scales = cuda || cpu;  // the CPU: Note [scales on the CPU] (quant_kernels.cpp)
  at::Tensor scales, wire, body;  // scales: float; wire: the scales in the wire type (unfused paths)
  Derived d;
  if (fused_scales) {
    body = at::empty({scale_bytes + packed_bytes}, xf.options().dtype(at::kByte));
    d.a = at::empty({groups}, xf.options());
    d.step = at::empty({groups}, xf.options());
    d.b = minmax ? at::empty({groups}, xf.options()) : d.a;
    d.lo = minmax ? at::empty({groups}, xf.options()) : d.step;
    auto* out = body.data_ptr<uint8_t>();
    float *a = d.a.data_ptr<float>(), *b = d.b.data_ptr<float>(), *step = d.step.data_ptr<float>(),
          *lo = d.lo.data_ptr<float>();
    if (!mn.defined()) {  // channels or blocks on the device, or their logic on the host
      const float* xp = xf.data_ptr<float>();
      // A channel whose elements are one contiguous run (dim 0) is a block of `inner` elements.
      const bool as_blocks = o_.scale == Scale::kBlock || geo.outer == 1;
      const int64_t block = o_.scale == Scale::kBlock ? o_.block : geo.inner;
      if (as_blocks && cuda) {
        at::Tensor partials = at::empty({codec::gpu::kQuantPartialFloats}, xf.options());
        codec::gpu::block_scales_cuda(xf.get_device(), xp, n, block, sp, partials.data_ptr<float>(), out, a, b, step,
                                      lo);
      } else if (as_blocks) {
        codec::gpu::block_scales_host(xp, n, block, sp, out, a, b, step, lo);
      } else if (cuda) {
        codec::gpu::channel_scales_cuda(xf.get_device(), xp, geo.outer, geo.inner, sp, out, a, b, step, lo);
      } else {
        codec::gpu::channel_scales_host(xp, geo.outer, geo.inner, sp, out, a, b, step, lo);
      }
      if (!codec::on_device(x)) scales = body.narrow(0, 0, scale_bytes).view(o_.scale_type).to(at::kFloat);
    } else if (cpu && !emulated) {
      const at::Tensor lo_c = mn.contiguous(), hi_c = mx.contiguous();  // (G)
      const bool finite =
          codec::quant_scales_cpu(lo_c.data_ptr<float>(), hi_c.data_ptr<float>(), sp, out, a, b, step, lo);
      TORCH_CHECK(finite, kQuantName, ": a scale is not finite in ", codec::wire_type_word(o_.scale_type),
                  " (the tensor holds inf/NaN, or values beyond the type's range: use scales=fp32)");
    } else {
      const at::Tensor v = (minmax ? mn : at::maximum(-mn, mx)).contiguous(), hi = mx.contiguous();  // (G)
      if (cuda)
        codec::gpu::quant_scales_cuda(xf.get_device(), v.data_ptr<float>(), hi.data_ptr<float>(), sp, out, a, b, step,
                                      lo);
      else
        codec::gpu::quant_scales_host(v.data_ptr<float>(), hi.data_ptr<float>(), sp, out, a, b, step, lo);
      if (!codec::on_device(x)) scales = body.narrow(0, 0, scale_bytes).view(o_.scale_type).to(at::kFloat);
    }
  } else {
    if (!minmax)
      scales = round_outward(at::maximum(-mn, mx), o_.scale_type, /*up=*/true);
    else
      scales = at::cat({round_outward(mn, o_.scale_type, false), round_outward(mx, o_.scale_type, true)});
    wire = scales.to(o_.scale_type);
    scales = wire.to(at::kFloat);
    d = derive(scales, o_.mode, o_.bits, groups);
  }
  // Checked on the host only: on a device the test would synchronise every message, so there a
  // non-finite scale makes its group decode to inf/NaN instead (Note [host synchronisation]).
  if (scales.defined() && !codec::on_device(x)) {  // the CPU fast path: checked by quant_scales_cpu
    TORCH_CHECK(at::isfinite(scales).all().item<bool>(), kQuantName, ": a scale is not finite in ",
                codec::wire_type_word(o_.scale_type), " (the tensor holds inf/NaN, or values beyond the ",
                "type's range: use scales=fp32)");
  }

  const uint64_t seed = stochastic_seed();

  if (cpu || cuda) {
    // Scales then codes, written in place.
    if (!fused_scales) {
      body = at::empty({scale_bytes + packed_bytes}, xf.options().dtype(at::kByte));
      body.narrow(0, 0, scale_bytes).copy_(wire.contiguous().view(at::kByte));
    }
    at::Tensor a = d.a.contiguous(), b = o_.mode == Mode::kMinMax ? d.b.contiguous() : a;
    codec::QuantParams q{static_cast<int>(o_.bits), o_.mode == Mode::kMinMax, o_.stochastic, seed,
                         a.data_ptr<float>(),       b.data_ptr<float>()};
    uint8_t* codes = body.data_ptr<uint8_t>() + scale_bytes;
    // Error feedback's residual x - decode(payload), written by the fused kernel (float32 x only:
    // otherwise the residual is of the cast input).
    const bool fused_residual = residual && x.scalar_type() == at::kFloat && (cuda || codec::gpu::host_emulation());
    if (fused_residual) {
      at::Tensor r = at::empty({n}, xf.options());  // (n)
      at::Tensor step = d.step.contiguous(), lo = o_.mode == Mode::kMinMax ? d.lo.contiguous() : step;
      codec::DequantParams dq{static_cast<int>(o_.bits), o_.mode == Mode::kMinMax, step.data_ptr<float>(),
                              lo.data_ptr<float>()};
      if (n > 0 && cuda) {
        codec::gpu::quantise_pack_residual_cuda(xf.get_device(), xf.data_ptr<float>(), geo.g, q, dq, codes,
                                                r.data_ptr<float>());
      } else if (n > 0) {
        codec::gpu::quantise_pack_residual_host(xf.data_ptr<float>(), geo.g, q, dq, codes, r.data_ptr<float>());
      }
      *residual = r.view(shape);
    } else if (n == 0) {
    } else if (cuda) {
      codec::gpu::quantise_pack_cuda(xf.get_device(), xf.data_ptr<float>(), geo.g, q, codes);
    } else if (codec::gpu::host_emulation()) {
      codec::gpu::quantise_pack_host(xf.data_ptr<float>(), geo.g, q, codes);
    } else {
      codec::quantise_pack_cpu(xf.data_ptr<float>(), geo.g, q, codes);
    }
  } else if (n > 0) {
    // Portable path: the same formulas with broadcasting over the (outer, G, inner) view.
    const int64_t pad = o_.scale == Scale::kBlock ? groups * o_.block - n : 0;
    at::Tensor v3 = (pad > 0 ? at::constant_pad_nd(xf, {0, pad}, 0) : xf).view({geo.outer, groups, geo.inner});
    auto bc = [&](const at::Tensor& t) { return t.view({1, groups, 1}); };
    const double p = static_cast<double>(int64_t(1) << (o_.bits - 1));
    at::Tensor v;
    double lo, hi, off;
    if (o_.mode == Mode::kMaxAbs) {
      v = v3 / bc(d.a) * p;
      lo = -p, hi = p - 1, off = p;
    } else {
      v = (v3 - bc(d.a)) * bc(d.b);
      lo = 0, hi = static_cast<double>((int64_t(1) << o_.bits) - 1), off = 0;
    }
    if (o_.stochastic) {
      at::Generator g = x.device().is_cpu() ? at::detail::createCPUGenerator(seed)
                                            : at::globalContext().defaultGenerator(x.device()).clone();
      g.set_current_seed(seed);
      v = at::floor(v + at::rand(v.sizes(), g, v.options()));
    } else {
      v = at::round(v);
    }
    at::Tensor codes = (v.clamp(lo, hi) + off).to(at::kByte).reshape({-1}).narrow(0, 0, n);
    BodyWriter w;
    w.put(wire);
    w.put(pack_bits(codes, o_.bits));
    body = w.finish();
  } else {
    BodyWriter w;
    w.put(wire);
    body = w.finish();
  }

  return payload(body);
}

at::Tensor Quantize::decode(const Payload& p, const CodecContext& ctx) {
  codec::check_payload(p, kQuantName, 7);
  const int64_t bits = p.params[0];
  TORCH_CHECK(bits >= 1 && bits <= 8, kQuantName, ": corrupt payload: bits=", bits);
  TORCH_CHECK(p.params[1] >= 0 && p.params[1] <= 2 && p.params[2] >= 0 && p.params[2] <= 1 && p.params[3] >= 0 &&
                  p.params[3] <= 1,
              kQuantName, ": corrupt payload: scale kind ", p.params[1], ", mode ", p.params[2], ", round ",
              p.params[3]);
  const Scale scale = static_cast<Scale>(p.params[1]);
  const Mode mode = static_cast<Mode>(p.params[2]);
  const int64_t dim = p.params[4], block = p.params[5];
  if (scale == Scale::kChannel) {
    TORCH_CHECK(dim >= 0 && dim < static_cast<int64_t>(p.shape.size()), kQuantName, ": corrupt payload: channel dim ",
                dim, " for ", p.shape.size(), " dims");
  } else {
    TORCH_CHECK(dim == -1, kQuantName, ": corrupt payload: channel dim ", dim, " without scale=channel");
  }
  TORCH_CHECK(scale == Scale::kBlock ? block >= 1 : block == 0, kQuantName, ": corrupt payload: block=", block);
  const at::ScalarType scale_type = codec::wire_type_from_param(p.params[6], kQuantName);
  const Geometry geo = geometry(p.shape, scale, dim, block);
  const int64_t n = geo.g.n, groups = geo.g.groups;

  BodyReader r(p, kQuantName);
  const at::Tensor wire = r.take(scale_type, mode == Mode::kMaxAbs ? groups : 2 * groups);
  at::Tensor packed = r.take(at::kByte, (n * bits + 7) / 8);
  r.finish();
  const at::TensorOptions floats = packed.options().dtype(at::kFloat);
  const bool cuda = codec::use_cuda_kernel(packed);
  const bool cpu = codec::use_cpu_kernel(packed), emulated = cpu && codec::gpu::host_emulation();
  const codec::gpu::ScaleParams sp{static_cast<int>(bits), mode == Mode::kMinMax, codec::kernel_wire_type(scale_type),
                                   groups};
  if ((cuda || emulated) && groups == 1 && n > 0 && p.body.is_contiguous()) {
    // One kernel derives the scale and decodes (Note [scales in the kernels] in quant_logic.h).
    at::Tensor out = at::empty({n}, floats);
    const auto* body = static_cast<const uint8_t*>(p.body.data_ptr());
    if (cuda)
      codec::gpu::dequant_tensor_cuda(packed.get_device(), body, geo.g, sp, out.data_ptr<float>());
    else
      codec::gpu::dequant_tensor_host(body, geo.g, sp, out.data_ptr<float>());
    return out.to(p.dtype).view(p.shape);
  }
  Derived d;
  if (cuda || cpu) {  // one kernel (one loop) derives step and lo (Note [fused scales] in quant_logic.h)
    const at::Tensor w = wire.contiguous();
    d.step = at::empty({groups}, floats);
    d.lo = mode == Mode::kMinMax ? at::empty({groups}, floats) : d.step;
    const auto* wp = static_cast<const uint8_t*>(w.data_ptr());
    if (cuda)
      codec::gpu::quant_derive_cuda(packed.get_device(), wp, sp, d.step.data_ptr<float>(), d.lo.data_ptr<float>());
    else if (emulated)
      codec::gpu::quant_derive_host(wp, sp, d.step.data_ptr<float>(), d.lo.data_ptr<float>());
    else
      codec::quant_derive_cpu(wp, sp, d.step.data_ptr<float>(), d.lo.data_ptr<float>());
  } else {
    d = derive(wire.to(at::kFloat), mode, bits, groups);
  }

  at::Tensor out;
  if (codec::use_cpu_kernel(packed) || cuda) {
    out = at::empty({n}, floats);
    at::Tensor step = d.step.contiguous(), lo = mode == Mode::kMinMax ? d.lo.contiguous() : step;
    codec::DequantParams q{static_cast<int>(bits), mode == Mode::kMinMax, step.data_ptr<float>(), lo.data_ptr<float>()};
    const uint8_t* in = packed.data_ptr<uint8_t>();
    if (n == 0) {
    } else if (cuda) {
      codec::gpu::unpack_dequantise_cuda(packed.get_device(), in, geo.g, q, out.data_ptr<float>());
    } else if (codec::gpu::host_emulation()) {
      codec::gpu::unpack_dequantise_host(in, geo.g, q, out.data_ptr<float>());
    } else {
      codec::unpack_dequantise_cpu(in, geo.g, q, out.data_ptr<float>());
    }
  } else if (n == 0) {
    out = at::empty({0}, floats);
  } else {
    const int64_t pad = scale == Scale::kBlock ? groups * block - n : 0;
    at::Tensor c = unpack_bits(packed, bits, n).to(at::kFloat);
    if (pad > 0) c = at::constant_pad_nd(c, {0, pad}, 0);
    at::Tensor c3 = c.view({geo.outer, groups, geo.inner});
    auto bc = [&](const at::Tensor& t) { return t.view({1, groups, 1}); };
    const double pw = static_cast<double>(int64_t(1) << (bits - 1));
    at::Tensor x3 = mode == Mode::kMaxAbs ? (c3 - pw) * bc(d.step) : c3 * bc(d.step) + bc(d.lo);
    out = x3.reshape({-1}).narrow(0, 0, n);
  }
  return out.to(p.dtype).view(p.shape);
}

// ---- sizing (Note [sizing a payload] in compressor.h) ------------------------------------------

PayloadSize Quantize::payload_size(const std::vector<int64_t>& shape, at::ScalarType dtype) const {
  const int64_t ndim = static_cast<int64_t>(shape.size());
  const int64_t dim = o_.scale == Scale::kChannel ? channel_dim(ndim) : -1;
  const Geometry geo = geometry(shape, o_.scale, dim, o_.block);
  const int64_t n = geo.g.n;
  const int64_t scales =
      (o_.mode == Mode::kMinMax ? 2 : 1) * geo.g.groups * static_cast<int64_t>(c10::elementSize(o_.scale_type));
  const int64_t codes = n > 0 ? (n * o_.bits + 7) / 8 : 0;
  return {payload_header_bytes(ndim, 7) + scales + codes, PayloadSize::Kind::Exact};
}

}  // namespace tl
