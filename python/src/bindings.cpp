// tapeline._C: the codecs, payloads and boundaries of the C++ toolkit for Python (docs/PYTHON.md).
// Thin: every codec, payload and boundary here is the C++ library's own object, so the bytes are
// the toolkit's bytes. The Python package (python/tapeline/*.py) builds the torch.nn.Module,
// autograd, DDP and pipelining glue on top.
//
// Note [errors across the binding]. The library reports bad input with TORCH_CHECK (c10::Error).
// A spec that does not parse or build is the caller's bad argument: ValueError with the parser's
// message (without the C++ backtrace). Any other c10::Error (a corrupt payload, a codec refusing a
// tensor) is RuntimeError with its message.
//
// The boundary halves' encode and decode run without the GIL (they touch no Python object), a
// codec's on messages of 1M elements or more (ReleaseGilIfLong): a DDP hook's reduction or another
// Python thread goes on meanwhile.
//
// Note [the binding's cost]. What a codec call from Python costs over the same call in C++
// (bench/bench_python.py), measured on fp16 of a (64, 4) tensor, 2.5 us per encode in C++: the
// call with its tensor argument 0.15 to 0.35 us, the Payload object returned 0.2 us, five defaulted
// arguments and the GIL's release and retaking 0.05 us or more each; about 1 us per call. So
// tapeline.Codec inherits encode and decode from _Codec (a Python method in between cost 1.3 us
// per encode + decode), a one-argument call has its own overload, x is detached only when it
// requires grad (detach() makes a TensorImpl: 0.4 us), and a short call keeps the GIL.

#include <torch/extension.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "compression/boundary.h"
#include "compression/codec_spec.h"
#include "compression/compressor.h"
#include "compression/payload.h"
#include "compression/registry.h"
#include "compression/spec.h"
#include "parallel/ranks/data_parallel.h"

namespace py = pybind11;

namespace tl::python {
namespace {

// Runs f, turning c10::Error into RuntimeError (Note [errors across the binding]).
template <class F>
auto checked(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error& e) {
    throw std::runtime_error(e.what_without_backtrace());
  }
}

struct ValueError : std::exception {
  explicit ValueError(std::string m) : message(std::move(m)) {}
  const char* what() const noexcept override { return message.c_str(); }
  std::string message;
};

CodecContext make_context(const std::optional<at::Tensor>& sample_ids, int64_t micro_batch, int64_t step,
                          double progress, bool training, int64_t epoch = 0) {
  CodecContext ctx;
  ctx.epoch = epoch;
  if (sample_ids) ctx.sample_ids = sample_ids->to(at::kLong);
  ctx.micro_batch = micro_batch;
  ctx.step = step;
  ctx.progress = progress;
  ctx.training = training;
  return ctx;
}

std::string dtype_name(at::ScalarType t) { return c10::toString(t); }

// A payload's wire bytes as a 1-D uint8 CPU tensor (what torch.distributed sends).
at::Tensor payload_to_tensor(const Payload& p) {
  at::Tensor out = at::empty({static_cast<int64_t>(p.nbytes())}, at::kByte);
  p.serialize_into(out.data_ptr<uint8_t>());
  return out;
}

Payload payload_from_tensor(const at::Tensor& t, at::Device device) {
  TORCH_CHECK(t.scalar_type() == at::kByte && t.dim() == 1,
              "Payload.from_tensor: expected a 1-D uint8 tensor of payload bytes, got ", t.scalar_type(), " of ",
              t.dim(), " dims");
  const at::Tensor c = t.to(at::kCPU).contiguous();
  return Payload::deserialize(c.data_ptr<uint8_t>(), static_cast<size_t>(c.numel()), device);
}

// A tensor the codecs may keep (error feedback keeps its input's residual): never one autograd
// tracks. detach() costs a TensorImpl, so only when x requires grad (Note [the binding's cost]).
at::Tensor untracked(const at::Tensor& x) { return x.requires_grad() ? x.detach() : x; }

// Lets other Python threads run during a codec call on a message of `elements` elements when it
// is long enough to matter (4 MiB of float32: 0.3 ms for the cheapest codec); a shorter one keeps
// the GIL, whose release and retaking cost more than the call's wait is worth (Note [the binding's
// cost]; Python itself switches threads every 5 ms).
class ReleaseGilIfLong {
 public:
  explicit ReleaseGilIfLong(int64_t elements) {
    if (elements >= (int64_t(1) << 20)) release_.emplace();
  }

 private:
  std::optional<py::gil_scoped_release> release_;
};

// One codec for one message stream: the C++ compressor and the spec it was built from.
class Codec {
 public:
  explicit Codec(const std::string& text) {
    try {
      spec_ = CodecSpec(text);
      codec_ = spec_.build();
    } catch (const c10::Error& e) {
      throw ValueError(e.what_without_backtrace());
    }
  }
  explicit Codec(CompressorPtr codec) : codec_(std::move(codec)) {}

  Payload encode(const at::Tensor& x, const std::optional<at::Tensor>& sample_ids, int64_t micro_batch, int64_t epoch,
                 int64_t step, double progress) {
    const ReleaseGilIfLong gil(x.numel());
    return checked([&] {
      NoGradGuard no_grad;
      return codec_->encode(untracked(x),
                            make_context(sample_ids, micro_batch, step, progress, codec_->is_training(), epoch));
    });
  }
  at::Tensor decode(const Payload& p, const std::optional<at::Tensor>& sample_ids, int64_t micro_batch, int64_t epoch,
                    int64_t step, double progress) {
    const ReleaseGilIfLong gil(p.numel());
    return checked([&] {
      NoGradGuard no_grad;
      return codec_->decode(p, make_context(sample_ids, micro_batch, step, progress, codec_->is_training(), epoch));
    });
  }
  const CompressorPtr& get() const { return codec_; }

 private:
  CodecSpec spec_;
  CompressorPtr codec_;
};

std::map<std::string, at::Tensor> state_of(const Module& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [k, v] : m.state_dict()) out[k] = v;
  return out;
}

void load_state_into(Module& m, const std::map<std::string, at::Tensor>& state, bool strict) {
  checked([&] {
    TensorMap t(state.begin(), state.end());
    m.load_state_dict(t, strict);
    return 0;
  });
}

py::dict stats_dict(const DirectionStats& d) {
  py::dict o;
  o["messages"] = d.messages;
  o["bytes"] = d.bytes;
  o["raw_bytes"] = d.raw_bytes;
  o["last_bytes"] = d.last_bytes;
  o["last_raw_bytes"] = d.last_raw_bytes;
  o["measured"] = d.measured;
  o["rel_error_mean"] = d.rel_error_mean;
  o["rel_error_last"] = d.rel_error_last;
  o["density_mean"] = d.density_mean;
  o["density_last"] = d.density_last;
  o["ratio"] = d.ratio();
  return o;
}

BoundaryPtr make_boundary(const std::string& name, const std::string& forward, const std::string& backward,
                          const std::string& mode, bool active_at_inference) {
  BoundaryPtr b;
  try {
    b = std::make_shared<Boundary>(name, forward, backward, parse_backward_mode(mode), active_at_inference);
  } catch (const c10::Error& e) {
    throw ValueError(e.what_without_backtrace());
  }
  // Learned or projecting codecs (ae, subspace) put transforms on tapeline's own tape around the
  // wire, which a torch model cannot train: refused rather than silently left untrained.
  for (const char* which : {"forward", "backward"}) {
    const CompressorPtr& c = std::string(which) == "forward" ? b->forward_codec() : b->backward_codec();
    if (c->has_transform() || c->constrains_model())
      throw ValueError(std::string("Boundary: the ") + which + " codec '" + c->spec() +
                       "' has a learned transform or constrains the model (ae, subspace): not available from "
                       "Python (its weights live on tapeline's own tape); use it from the C++ toolkit");
  }
  return b;
}

// One half of a Boundary (the sender's or the receiver's side of one direction), bound with the
// arguments every half takes; In: the tensor sent or the payload received.
template <class In, class F>
void def_half(py::class_<Boundary, BoundaryPtr>& cls, const char* name, const char* in, F half) {
  cls.def(
      name,
      [half](Boundary& b, const In& x, const std::optional<at::Tensor>& ids, int64_t micro_batch, int64_t epoch) {
        return checked([&] { return half(b, x, make_context(ids, micro_batch, 0, -1, true, epoch)); });
      },
      py::call_guard<py::gil_scoped_release>(), py::arg(in), py::arg("sample_ids") = py::none(),
      py::arg("micro_batch") = 0, py::arg("epoch") = 0);
}

}  // namespace

void define_module(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  py::class_<Payload>(m, "Payload", "One compressed message: the C++ toolkit's wire bytes (compression/payload.h).")
      .def_property_readonly(
          "nbytes", [](const Payload& p) { return static_cast<int64_t>(p.nbytes()); },
          "Exact bytes on the wire: header and body.")
      .def_property_readonly("header_bytes", [](const Payload& p) { return static_cast<int64_t>(p.header_bytes()); })
      .def_property_readonly(
          "codec", [](const Payload& p) { return checked([&] { return codec_name(p.codec); }); },
          "Name of the codec that packed it.")
      .def_property_readonly("codec_id", [](const Payload& p) { return p.codec; })
      .def_property_readonly(
          "shape", [](const Payload& p) { return p.shape; }, "Shape of the original tensor.")
      .def_property_readonly("dtype", [](const Payload& p) { return dtype_name(p.dtype); })
      .def_property_readonly("params", [](const Payload& p) { return p.params; })
      .def("__bytes__",
           [](const Payload& p) {
             std::string s(p.nbytes(), '\0');
             checked([&] {
               p.serialize_into(reinterpret_cast<uint8_t*>(s.data()));
               return 0;
             });
             return py::bytes(s);
           })
      .def(
          "to_tensor", [](const Payload& p) { return checked([&] { return payload_to_tensor(p); }); },
          "The wire bytes as a 1-D uint8 CPU tensor.")
      .def_static(
          "from_bytes",
          [](const py::bytes& b) {
            const std::string_view v = b;
            return checked([&] { return Payload::deserialize(reinterpret_cast<const uint8_t*>(v.data()), v.size()); });
          },
          py::arg("data"), "Parses and validates wire bytes (a corrupt buffer raises RuntimeError saying why).")
      .def_static(
          "from_tensor",
          [](const at::Tensor& t, const std::string& device) {
            return checked([&] { return payload_from_tensor(t, at::Device(device)); });
          },
          py::arg("data"), py::arg("device") = "cpu", "As from_bytes, from a 1-D uint8 tensor.")
      .def("__len__", [](const Payload& p) { return p.nbytes(); })
      .def("__repr__", [](const Payload& p) {
        std::string shape;
        for (int64_t s : p.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(s);
        return "Payload(codec=" + checked([&] { return codec_name(p.codec); }) + ", shape=(" + shape +
               "), dtype=" + dtype_name(p.dtype) + ", nbytes=" + std::to_string(p.nbytes()) + ")";
      });

  // The base of tapeline.Codec (python/tapeline/codec.py), which inherits encode and decode: no
  // Python frame between the caller and the codec (Note [the binding's cost]).
  py::class_<Codec, std::shared_ptr<Codec>>(m, "_Codec")
      .def(py::init<const std::string&>(), py::arg("spec"))
      // First the one-argument calls, the common ones: no defaults to fill in.
      .def(
          "encode", [](Codec& c, const at::Tensor& x) { return c.encode(x, std::nullopt, 0, 0, 0, -1); }, py::arg("x"))
      .def(
          "decode", [](Codec& c, const Payload& p) { return c.decode(p, std::nullopt, 0, 0, 0, -1); },
          py::arg("payload"))
      .def("encode", &Codec::encode, py::arg("x"), py::arg("sample_ids") = py::none(), py::arg("micro_batch") = 0,
           py::arg("epoch") = 0, py::arg("step") = 0, py::arg("progress") = -1.0,
           "Packs x (float32, float16 or bfloat16, any shape) into a Payload. sample_ids: (B) the samples of the "
           "micro-batch, for per-sample codecs (aqsgd, whose warm-up is counted in epochs).")
      .def("decode", &Codec::decode, py::arg("payload"), py::arg("sample_ids") = py::none(), py::arg("micro_batch") = 0,
           py::arg("epoch") = 0, py::arg("step") = 0, py::arg("progress") = -1.0,
           "Unpacks a Payload to a tensor of the original shape and dtype.")
      .def(
          "decode",
          [](Codec& c, const py::buffer& data, const std::optional<at::Tensor>& sample_ids, int64_t micro_batch,
             int64_t epoch, int64_t step, double progress) {
            const py::buffer_info b = data.request();
            const Payload p = checked([&] {
              return Payload::deserialize(static_cast<const uint8_t*>(b.ptr), static_cast<size_t>(b.size * b.itemsize));
            });
            return c.decode(p, sample_ids, micro_batch, epoch, step, progress);
          },
          py::arg("data"), py::arg("sample_ids") = py::none(), py::arg("micro_batch") = 0, py::arg("epoch") = 0,
          py::arg("step") = 0, py::arg("progress") = -1.0, "As decode, from a payload's wire bytes (bytes(payload)).")
      .def_property_readonly("spec", [](const Codec& c) { return c.get()->spec(); })
      .def_property_readonly("decode_has_state", [](const Codec& c) { return c.get()->decode_has_state(); })
      .def_property_readonly("has_transform", [](const Codec& c) { return c.get()->has_transform(); })
      .def("state_dict", [](const Codec& c) { return state_of(*c.get()); })
      .def(
          "load_state_dict",
          [](Codec& c, const std::map<std::string, at::Tensor>& s, bool strict) {
            load_state_into(*c.get(), s, strict);
          },
          py::arg("state"), py::arg("strict") = true)
      .def(
          "train", [](Codec& c, bool on) { c.get()->train(on); }, py::arg("mode") = true)
      .def_property_readonly("training", [](const Codec& c) { return c.get()->is_training(); })
      .def("level", [](const Codec& c) -> py::object {
        auto l = c.get()->level();
        if (!l) return py::none();
        return py::make_tuple(l->value, l->label);
      });

  py::class_<Boundary, BoundaryPtr> boundary(m, "_Boundary");
  def_half<at::Tensor>(boundary, "send_forward", "z", [](Boundary& b, const at::Tensor& z, const CodecContext& ctx) {
    return b.send_forward(untracked(z), ctx);
  });
  def_half<Payload>(boundary, "receive_forward", "payload",
                    [](Boundary& b, const Payload& p, const CodecContext& ctx) { return b.receive_forward(p, ctx); });
  def_half<at::Tensor>(
      boundary, "send_backward", "grad",
      [](Boundary& b, const at::Tensor& g, const CodecContext& ctx) { return b.send_backward(untracked(g), ctx); });
  def_half<Payload>(boundary, "receive_backward", "payload",
                    [](Boundary& b, const Payload& p, const CodecContext& ctx) { return b.receive_backward(p, ctx); });
  boundary
      .def(py::init(&make_boundary), py::arg("name"), py::arg("forward"), py::arg("backward"), py::arg("mode"),
           py::arg("active_at_inference"))
      .def("active", &Boundary::active)
      .def("measure_forward",
           [](Boundary& b, const at::Tensor& h, const at::Tensor& out, const at::Tensor& zhat) {
             checked([&] {
               NoGradGuard no_grad;
               b.measure_forward(h.detach(), out.detach(), zhat.detach());
               return 0;
             });
           })
      .def("measure_backward",
           [](Boundary& b, const at::Tensor& g, const at::Tensor& ghat) {
             checked([&] {
               NoGradGuard no_grad;
               b.measure_backward(g.detach(), ghat.detach());
               return 0;
             });
           })
      .def_property_readonly("sends_gradient", &Boundary::sends_gradient)
      .def("stats",
           [](const Boundary& b) {
             const BoundaryStats s = b.stats();
             py::dict o;
             o["forward"] = stats_dict(s.forward);
             o["backward"] = stats_dict(s.backward);
             return o;
           })
      .def("reset_stats", &Boundary::reset_stats)
      .def(
          "train", [](Boundary& b, bool on) { b.train(on); }, py::arg("mode") = true)
      .def_property("active_at_inference", &Boundary::active_at_inference, &Boundary::set_active_at_inference)
      .def_property("measure_error", &Boundary::measures_error, &Boundary::set_measure_error)
      .def_property_readonly("mode", [](const Boundary& b) { return to_string(b.mode()); })
      .def_property_readonly("forward_spec", [](const Boundary& b) { return b.forward_codec()->spec(); })
      .def_property_readonly("backward_spec", [](const Boundary& b) { return b.backward_codec()->spec(); })
      .def("describe", &Boundary::describe)
      .def("state_dict", [](const Boundary& b) { return state_of(b); })
      .def(
          "load_state_dict",
          [](Boundary& b, const std::map<std::string, at::Tensor>& s, bool strict) { load_state_into(b, s, strict); },
          py::arg("state"), py::arg("strict") = true)
      .def("after_optimizer_step", &Boundary::after_optimizer_step);

  m.def(
      "codecs", [] { return known_compressors(); }, "Spec name -> help line of every codec.");
  m.def(
      "dp_codec_problem",
      [](const std::string& text) { return checked([&] { return ranks::dp_codec_problem(text); }); }, py::arg("spec"),
      "Why `spec` cannot compress data-parallel gradients (empty: it can), as the C++ grid says it.");
  m.def(
      "_time_codec",
      [](const std::string& spec, const at::Tensor& x, int repeats) {
        // bench/bench_python.py's reference: the same codec on the same tensor, encode and decode
        // timed in C++ (one warm-up pair, then `repeats` pairs: the best encode, decode and pair),
        // the loop the Python side times, so that the difference is what the binding costs.
        return checked([&] {
          NoGradGuard no_grad;
          CompressorPtr c = CodecSpec(spec).build();
          const CodecContext ctx;
          double best_enc = 1e30, best_dec = 1e30, best_pair = 1e30;
          for (int r = 0; r <= repeats; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            Payload p = c->encode(x, ctx);
            const auto t1 = std::chrono::steady_clock::now();
            at::Tensor y = c->decode(p, ctx);
            const auto t2 = std::chrono::steady_clock::now();
            if (r == 0) continue;
            best_enc = std::min(best_enc, std::chrono::duration<double>(t1 - t0).count());
            best_dec = std::min(best_dec, std::chrono::duration<double>(t2 - t1).count());
            best_pair = std::min(best_pair, std::chrono::duration<double>(t2 - t0).count());
          }
          return py::make_tuple(best_enc, best_dec, best_pair);
        });
      },
      py::arg("spec"), py::arg("x"), py::arg("repeats") = 5);
  m.def("identity_payload_bytes", [](const at::Tensor& t) { return identity_payload_bytes(t); });
}

}  // namespace tl::python

PYBIND11_MODULE(_C, m) { tl::python::define_module(m); }
