#include "parallel/ranks/data_parallel.h"

#include "parallel/ranks/fault.h"
#include "parallel/ranks/group_sum.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "autograd/autograd.h"
#include "compression/codec_spec.h"
#include "parallel/pipeline.h"
#include "parallel/schedule.h"

namespace tl::ranks {

namespace {

// Message tags: step: 30 bits | kind: 4 bits (C10dChannel uses 1-3 and 9-11).
// Bucket b of the uncompressed gradients: kind 4 with b + 1 in the low bits (the packed
// compressed gradients are bucket 0).
constexpr int64_t kKindGradients = 4, kKindBuffers = 5;
int64_t tag(int64_t step, int64_t kind) { return ((step & ((int64_t(1) << 30) - 1)) << 30) | (kind << 26); }

// The matrix a parameter's gradient is compressed as: (shape[0], the rest).
at::Tensor as_matrix(const at::Tensor& g) { return g.reshape({g.size(0), -1}); }

// dst = g * T(scale) for a contiguous gradient of dtype T (Note [scaled into the bucket]); false
// for any other gradient.
template <class T>
bool scaled_copy(const at::Tensor& g, const at::Tensor& dst, double scale) {
  if (g.scalar_type() != c10::CppTypeToScalarType<T>::value || !g.is_contiguous()) return false;
  const T* in = g.data_ptr<T>();
  T* out = dst.data_ptr<T>();
  const T s = static_cast<T>(scale);
  for (int64_t i = 0, n = g.numel(); i < n; ++i) out[i] = in[i] * s;
  return true;
}

// Several payloads as one message: count, each one's length, then their bytes back to back, in a
// message buffer (the transport sends it as its frame, without a copy: Note [posted capacity]).
at::Tensor pack(const std::vector<Payload>& payloads) {
  int64_t total = 8 * static_cast<int64_t>(1 + payloads.size());
  for (const Payload& p : payloads) total += static_cast<int64_t>(p.nbytes());
  at::Tensor out = Transport::message_buffer(total);
  uint8_t* w = out.data_ptr<uint8_t>();
  const int64_t count = static_cast<int64_t>(payloads.size());
  std::memcpy(w, &count, 8), w += 8;
  for (const Payload& p : payloads) {
    const int64_t n = static_cast<int64_t>(p.nbytes());
    std::memcpy(w, &n, 8), w += 8;
  }
  for (const Payload& p : payloads) p.serialize_into(w), w += p.nbytes();
  return out;
}

// The payloads of a message, their bodies views of it (no copy).
std::vector<Payload> unpack(const at::Tensor& bytes, size_t expected, const std::string& from) {
  const uint8_t* r = bytes.numel() ? bytes.data_ptr<uint8_t>() : nullptr;
  const size_t size = static_cast<size_t>(bytes.numel());
  auto fail = [&](const std::string& what) { TORCH_CHECK(false, from, ": ", what, " (garbled data-parallel message)"); };
  if (size < 8) fail("a message of " + std::to_string(size) + " bytes");
  int64_t count;
  std::memcpy(&count, r, 8);
  if (count != static_cast<int64_t>(expected))
    fail(std::to_string(count) + " tensors where this rank has " + std::to_string(expected));
  if (size < 8 * (1 + expected)) fail("a message of " + std::to_string(size) + " bytes");
  std::vector<int64_t> lengths(expected);
  std::memcpy(lengths.data(), r + 8, 8 * expected);
  size_t at = 8 * (1 + expected);
  std::vector<Payload> out;
  for (int64_t n : lengths) {
    if (n < 0 || at + static_cast<size_t>(n) > size) fail("a tensor runs past the message's end");
    try {
      out.push_back(Payload::deserialize_view(bytes, at, static_cast<size_t>(n)));
    } catch (const c10::Error& e) {
      fail(e.what_without_backtrace());
    }
    at += static_cast<size_t>(n);
  }
  if (at != size) fail(std::to_string(size - at) + " bytes after the last tensor");
  return out;
}

}  // namespace

std::string dp_codec_problem(const std::string& text) {
  std::string error;
  if (!try_parse_compressor(text, &error)) return error;
  return dp_codec_problem(CodecSpec(text));
}

std::string dp_codec_problem(const CodecSpec& spec) {
  const std::string accepted =
      "accepted: stateless codecs and ef(...) of them, e.g. powersgd(rank=4), ef(powersgd(rank=4)), quant(bits=8), "
      "ef(topk(0.01))";
  auto refusing = [](MessageUse why) {
    return codec_names([why](const CodecRecord& r) { return r.traits.dp == why; });
  };
  for (const CodecRecord* r : spec.records()) {
    switch (r->traits.dp) {
      case MessageUse::kYes:
        break;
      case MessageUse::kNoDecoderState:
        return "its decoder keeps state per sender (" + refusing(MessageUse::kNoDecoderState) +
               "), which an all-gather of D replicas' payloads would need D copies of; " + accepted;
      case MessageUse::kNoTransform:
        return "learned or projecting codecs (" + refusing(MessageUse::kNoTransform) +
               ") apply to activations, not to gradients; " + accepted;
      case MessageUse::kNoSampleIds:
        return r->name + " needs the micro-batch's sample ids, which a gradient does not carry; " + accepted;
    }
  }
  return {};
}

ParameterStages parameter_stages(const Pipeline& pipeline) {
  ParameterStages out;
  for (size_t s = 0; s < pipeline.num_stages(); ++s)
    for (const auto& [n, p] : pipeline.stage(s)->named_parameters())
      out[p.data().unsafeGetTensorImpl()].insert(static_cast<int>(s));
  return out;
}

std::vector<SummedParameter> summed_parameters(const Pipeline& pipeline, const ParameterStages& stages,
                                               const StageLayout& layout, int rank,
                                               const std::function<bool(const std::string&)>& tied,
                                               const DataParallelOptions& options) {
  std::vector<SummedParameter> out;
  for (const auto& [n, p] : pipeline.named_parameters()) {
    auto it = stages.find(p.data().unsafeGetTensorImpl());
    SummedParameter s{n, p, false, {}};
    if (it != stages.end()) {
      if (layout.rank_of(*it->second.begin()) != rank || tied(n)) continue;  // another rank's, or tied
      s.stages.assign(it->second.begin(), it->second.end());
      s.compressed = p.dim() >= 2 && options.compresses(s.stages.front());
    }
    out.push_back(std::move(s));
  }
  return out;
}

bool DataParallelOptions::compresses(int64_t stage) const {
  return !compression.is_identity() &&
         (compress_stages.empty() ||
          std::find(compress_stages.begin(), compress_stages.end(), stage) != compress_stages.end());
}

DataParallelSync::DataParallelSync(Transport& transport, std::vector<int> group, int replica,
                                   std::vector<std::pair<std::string, Variable>> params,
                                   const std::vector<bool>& compressed,
                                   std::vector<std::pair<std::string, Variable>> buffers, std::vector<double> decay,
                                   const CodecSpec& spec)
    : transport_(transport), group_(std::move(group)), replica_(replica), params_(std::move(params)),
      buffers_(std::move(buffers)), decay_(std::move(decay)) {
  TORCH_CHECK(decay_.size() == buffers_.size(), "DataParallelSync: ", decay_.size(), " decays for ", buffers_.size(),
              " buffers");
  const std::string problem = dp_codec_problem(spec);
  TORCH_CHECK(problem.empty(), "dp.compression = ", spec, ": ", problem);
  TORCH_CHECK(compressed.size() == params_.size(), "DataParallelSync: ", compressed.size(), " flags for ",
              params_.size(), " parameters");
  for (size_t i = 0; i < params_.size(); ++i)
    codecs_.push_back(compressed[i] && params_[i].second.dim() >= 2 ? spec.build() : identity_compressor());
}

std::vector<std::vector<Payload>> DataParallelSync::all_gather(const std::vector<Payload>& mine, int64_t message_tag,
                                                               const std::string& context, at::Device device,
                                                               int64_t raw_bytes) {
  const int D = static_cast<int>(group_.size());
  const size_t count = mine.size();
  const at::Tensor message = pack(mine);
  for (int e = 0; e < D; ++e) {
    if (e == replica_) continue;
    const std::string to = context + " to replica " + std::to_string(e);
    fault_point(FaultPhase::AllReduce, -1, &transport_, true, to);  // Note [fault injection]
    transport_.send(group_[static_cast<size_t>(e)], message, message_tag, to);
    if (raw_bytes >= 0) ++stats_.messages, stats_.bytes += message.numel(), stats_.raw_bytes += raw_bytes;
  }
  std::vector<std::vector<Payload>> all(static_cast<size_t>(D));
  for (int e = 0; e < D; ++e) {
    if (e == replica_) {  // the same bytes the others decode (a payload's decode is a function of them)
      all[static_cast<size_t>(e)] = mine;
      continue;
    }
    const int from_rank = group_[static_cast<size_t>(e)];
    const std::string from =
        context + ", from replica " + std::to_string(e) + " (rank " + std::to_string(from_rank) + ")";
    all[static_cast<size_t>(e)] = unpack(transport_.recv(from_rank, message_tag, from).body, count, from);
    if (!device.is_cpu())
      for (Payload& p : all[static_cast<size_t>(e)]) p.host_body = p.body, p.body = p.body.to(device);
  }
  return all;
}

void DataParallelSync::set_bucket_bytes(int64_t bytes) {
  TORCH_CHECK(bytes > 0, "dp.bucket_mib: a bucket of ", bytes, " bytes; accepted: more than 0");
  bucket_bytes_ = bytes;
}

// Note [uncompressed gradients in buckets]: parameter order, one dtype a bucket, a parameter never
// split.
std::vector<std::vector<size_t>> bucket_layout(const std::vector<int64_t>& numel,
                                               const std::vector<at::ScalarType>& dtype,
                                               const std::vector<bool>& in_bucket, int64_t bucket_bytes) {
  std::vector<std::vector<size_t>> out;
  int64_t filled = 0;  // elements in the last bucket
  for (size_t i = 0; i < numel.size(); ++i) {
    if (!in_bucket[i]) continue;
    if (out.empty() || dtype[out.back().front()] != dtype[i] ||
        (filled > 0 && (filled + numel[i]) * static_cast<int64_t>(c10::elementSize(dtype[i])) > bucket_bytes))
      out.emplace_back(), filled = 0;
    out.back().push_back(i);
    filled += numel[i];
  }
  return out;
}

void DataParallelSync::layout_buckets() {
  std::vector<bool> in(params_.size(), false);
  std::vector<int64_t> numel;
  std::vector<at::ScalarType> dtype;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Variable& p = params_[i].second;
    in[i] = p.requires_grad() && p.device().is_cpu() && at::isFloatingType(p.scalar_type()) &&
            codecs_[i]->spec() == "identity";
    numel.push_back(p.numel()), dtype.push_back(p.scalar_type());
  }
  if (in == in_bucket_ && !buckets_.empty()) return;
  in_bucket_ = std::move(in);
  buckets_.clear();
  bucket_of_.assign(params_.size(), SIZE_MAX);
  for (const std::vector<size_t>& members : bucket_layout(numel, dtype, in_bucket_, bucket_bytes_)) {
    buckets_.emplace_back(), buckets_.back().dtype = dtype[members.front()];
    for (size_t i : members) {
      buckets_.back().parts.push_back({i, buckets_.back().numel}), buckets_.back().numel += numel[i];
      bucket_of_[i] = buckets_.size() - 1;
    }
  }
}

void DataParallelSync::sum_bucket(size_t b, double scale) {
  Bucket& bucket = buckets_[b];
  at::Tensor& flat = bucket.flat;
  // A bucket is reused when nothing else holds it: no gradient's view, no send still in flight.
  const bool reuse =
      flat.defined() && flat.numel() == bucket.numel && flat.use_count() == 1 && flat.storage().use_count() == 1;
  // A message buffer: sent whole (two replicas), it is the message's frame, not copied into one.
  if (!reuse) flat = Transport::message_buffer(bucket.numel * c10::elementSize(bucket.dtype)).view(bucket.dtype);
  // Note [scaled into the bucket]. Scaling the gradient in place (scale_grads' g.mul_(scale)) and
  // then copying it into the bucket would pass over its bytes twice; mul_out writes g * scale
  // straight into the bucket, one pass, as a copy alone would. The operand is the one mul_(Scalar)
  // forms (a wrapped number, cast to the gradient's dtype by the same kernel), so the bucket holds
  // the bits scale_grads would have left in the gradient. Contiguous float32 and float64
  // gradients take a plain loop instead (scaled_copy): ATen's kernel multiplies each value by the
  // scale rounded once to the dtype, which is what the loop does, bit for bit, and a loop wakes no
  // thread pool (whose spinning threads starve the other replica on few cores, as for the memcpy
  // below). The gradient itself stays unscaled: it is replaced by its view of the sum when the
  // sums are waited for (reduce_gradients). Gradients kept as views of the bucket (DDP's
  // gradient_as_bucket_view) would save nothing more here: the engine moves a leaf's first
  // gradient of the step into .grad without a copy and adds the later micro-batches' in place
  // (autograd/engine.cpp), so a gradient living in the bucket costs the same one pass (the first
  // gradient copied in), and a bucket zeroed to add into turns a -0.0 gradient into +0.0, which
  // one process does not.
  at::Tensor scale_operand;
  if (scale != 1.0) {
    scale_operand = at::scalar_tensor(scale, at::kDouble);
    scale_operand.unsafeGetTensorImpl()->set_wrapped_number(true);
  }
  for (const Bucket::Part& part : bucket.parts) {
    Variable p = params_[part.param].second;
    at::Tensor g = p.grad();
    at::Tensor dst = flat.narrow(0, part.offset, p.numel());
    if (!g.defined()) {  // none on any replica: zeros in its place, and it keeps none
      std::memset(dst.data_ptr(), 0, static_cast<size_t>(dst.numel() * dst.element_size()));
      continue;
    }
    if (scale != 1.0) {  // Note [scaled into the bucket]
      if (!scaled_copy<float>(g, dst, scale) && !scaled_copy<double>(g, dst, scale)) {
        at::Tensor out = dst.view(g.sizes());
        at::mul_out(out, g, scale_operand);
      }
      scaled_.insert(p.impl());
    } else if (g.is_contiguous()) {  // a memcpy: no thread pool woken (its threads spin, starving the peer)
      std::memcpy(dst.data_ptr(), g.data_ptr(), static_cast<size_t>(g.numel() * g.element_size()));
    } else {
      dst.view(g.sizes()).copy_(g);
    }
  }
  bucket.started = true;
  const std::string context =
      where_ + ", data-parallel gradients of replica " + std::to_string(replica_) + ", bucket " + std::to_string(b);
  const int64_t bytes = flat.numel() * flat.element_size();
  if (sums_during_backward()) {
    fault_point(FaultPhase::AllReduce, -1, &transport_, false, context);  // Note [fault injection]: no frame follows
    transport_.start_group_sum(group_, flat, context);
    // What this replica sends, as all_reduce_in_rank_order counts it: two replicas, the tensor once;
    // more, every other member's chunk and then its own summed chunk to each of them.
    const int64_t M = static_cast<int64_t>(group_.size()), n = flat.numel(), me = replica_;
    const int64_t own = n * (me + 1) / M - n * me / M;
    const int64_t sent = M == 2 ? bytes : (n - own + (M - 1) * own) * flat.element_size();
    stats_.messages += M == 2 ? 1 : 2 * (M - 1), stats_.bytes += sent, stats_.raw_bytes += sent;
    return;
  }
  const at::Tensor sum =
      all_reduce_in_rank_order(transport_, group_, replica_, flat, tag(step_, kKindGradients) | int64_t(b + 1), context,
                               [&](const std::string& to, int64_t n) {
                                 fault_point(FaultPhase::AllReduce, -1, &transport_, true, to);
                                 ++stats_.messages, stats_.bytes += n, stats_.raw_bytes += n;
                               });
  for (const Bucket::Part& part : bucket.parts) {
    Variable p = params_[part.param].second;
    if (p.grad().defined()) p.set_grad(sum.narrow(0, part.offset, p.numel()).view(p.sizes()));
  }
}

void DataParallelSync::sum_during_backward(std::vector<std::vector<int>> stages) {
  TORCH_CHECK(stages.size() == params_.size(), "DataParallelSync: stages of ", stages.size(), " parameters for ",
              params_.size());
  transport_.open_group(group_, "the data-parallel process group of replica " + std::to_string(replica_));
  stages_ = std::move(stages);
  param_index_.clear();
  for (size_t i = 0; i < params_.size(); ++i) param_index_.emplace(params_[i].second.impl(), i);
}

void DataParallelSync::begin_step(int64_t step, const std::string& where, double scale) {
  if (!sums_during_backward()) return;
  in_step_ = true, step_ = step, where_ = where, scale_ = scale;
  done_.clear();
  scaled_.clear();
  final_.assign(params_.size(), false);
  layout_buckets();
  for (Bucket& b : buckets_) b.started = false;
}

void DataParallelSync::stage_done(int stage) {
  if (!in_step_) return;
  NoGradGuard no_grad;
  done_.insert(stage);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b].started) continue;
    bool ready = true;
    for (const Bucket::Part& part : buckets_[b].parts) {
      const std::vector<int>& holders = stages_[part.param];
      ready = ready && (final_[part.param] || (!holders.empty() && std::all_of(holders.begin(), holders.end(), [&](int s) {
                                                 return done_.count(s) > 0;
                                               })));
    }
    if (ready) sum_bucket(b, scale_);
  }
}

void DataParallelSync::leaf_final(int stage, VariableImpl* leaf) {
  if (!in_step_) return;
  auto it = param_index_.find(leaf);
  if (it == param_index_.end()) return;  // not summed here (a tied parameter, an input)
  const size_t i = it->second;
  if (stages_[i].size() != 1 || stages_[i].front() != stage) return;  // final once all its stages are done
  final_[i] = true;
  const size_t b = bucket_of_[i];
  if (b == SIZE_MAX || buckets_[b].started) return;
  for (const Bucket::Part& part : buckets_[b].parts)
    if (!final_[part.param]) return;
  NoGradGuard no_grad;
  sum_bucket(b, scale_);
}

void DataParallelSync::reduce_gradients(int64_t step, const std::string& where) {
  const int D = static_cast<int>(group_.size());
  if (D == 1 || params_.empty()) return;
  NoGradGuard no_grad;
  if (!in_step_) {  // no begin_step: the whole layout is summed now
    step_ = step, where_ = where;
    layout_buckets();
    for (Bucket& b : buckets_) b.started = false;
  }
  in_step_ = false;
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (!buckets_[b].started) sum_bucket(b, 1.0);  // the caller has scaled the rest
  if (sums_during_backward()) {
    transport_.wait_group_sums();
    for (const Bucket& bucket : buckets_)
      for (const Bucket::Part& part : bucket.parts) {
        Variable p = params_[part.param].second;
        if (p.grad().defined()) p.set_grad(bucket.flat.narrow(0, part.offset, p.numel()).view(p.sizes()));
      }
  }
  const std::vector<bool>& in_bucket = in_bucket_;
  if (std::all_of(in_bucket.begin(), in_bucket.end(), [](bool b) { return b; })) return;
  CodecContext ctx;
  std::vector<Payload> mine;
  int64_t raw = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Variable& p = params_[i].second;
    const at::Tensor& g = p.grad();
    if (in_bucket[i] || !g.defined()) {  // summed already, or none here (none on the other replicas): a placeholder
      mine.push_back(identity_compressor()->encode(at::empty({0}, p.options()), ctx));
      continue;
    }
    const at::Tensor x = p.dim() >= 2 ? as_matrix(g) : g;
    mine.push_back(codecs_[i]->spec() == "identity" && at::isFloatingType(x.scalar_type()) ? identity_payload_view(x) : codecs_[i]->encode(x, ctx));
    raw += g.numel() * g.element_size();
  }
  const auto all = all_gather(mine, tag(step, kKindGradients),
                              where + ", data-parallel gradients of replica " + std::to_string(replica_),
                              params_.front().second.device(), raw);
  for (size_t i = 0; i < params_.size(); ++i) {
    Variable p = params_[i].second;
    const bool here = p.grad().defined();
    auto check = [&](int e) -> const Payload& {
      const Payload& payload = all[static_cast<size_t>(e)][i];
      TORCH_CHECK((payload.numel() > 0 || p.numel() == 0) == here, where, ": '", params_[i].first, "' has ",
                  here ? "a gradient" : "no gradient", " on replica ", replica_, " but ", here ? "none" : "one",
                  " on replica ", e, " (the replicas ran different stages)");
      return payload;
    };
    if (in_bucket[i]) continue;
    if (!here) {
      check(0);
      continue;
    }
    p.set_grad(sum_in_rank_order(D, [&](int e) {  // Note [sums in rank order]
      at::Tensor d = codecs_[i]->decode(check(e), ctx);
      TORCH_CHECK(d.numel() == p.numel(), where, ": replica ", e, " sent a gradient of ", d.numel(),
                  " values for '", params_[i].first, "' (", p.numel(), " here)");
      return d.reshape(p.sizes()).to(p.data().scalar_type());
    }));
  }
}

std::vector<at::Tensor> DataParallelSync::snapshot_buffers() const {
  std::vector<at::Tensor> out;
  for (const auto& [n, b] : buffers_) out.push_back(b.data().clone());
  return out;
}

void DataParallelSync::sync_buffers(int64_t step, const std::string& where, const std::vector<at::Tensor>& since,
                                    int64_t k) {
  const int D = static_cast<int>(group_.size());
  if (D == 1 || buffers_.empty()) return;
  NoGradGuard no_grad;
  std::vector<Payload> mine;
  for (const auto& [n, b] : buffers_)  // integer counters travel as float64 (exact below 2^53)
    mine.push_back(identity_compressor()->encode(at::isFloatingType(b.scalar_type()) ? b.data() : b.data().to(at::kDouble), {}));
  const auto all = all_gather(mine, tag(step, kKindBuffers),
                              where + ", data-parallel buffers of replica " + std::to_string(replica_),
                              buffers_.front().second.device(), -1);
  for (size_t i = 0; i < buffers_.size(); ++i) {
    at::Tensor b = buffers_[i].second.data();
    const bool floating = at::isFloatingType(b.scalar_type());
    const double a = decay_[i];
    const at::Tensor& r0 = since.at(i);
    at::Tensor sum;
    for (int e = 0; e < D; ++e) {
      at::Tensor v = identity_compressor()->decode(all[static_cast<size_t>(e)][i], {}).to(b.scalar_type());
      TORCH_CHECK(v.sizes().equals(b.sizes()), where, ": replica ", e, " sent buffer '", buffers_[i].first,
                  "' of shape ", v.sizes(), " (", b.sizes(), " here)");
      if (!floating)
        v = v - r0;  // the replica's increment
      else if (a > 0)
        v = (v - r0 * std::pow(a, k)) * std::pow(a, (D - 1 - e) * k);  // c_e, aged by the replicas after e
      sum = sum.defined() ? sum.add_(v) : v.clone();
    }
    if (!floating)
      b.copy_(r0 + sum);
    else if (a > 0)
      b.copy_(r0 * std::pow(a, D * k) + sum);
    else
      b.copy_(sum.div_(static_cast<double>(D)));
  }
}

TensorMap DataParallelSync::codec_state() const {
  TensorMap out;
  for (size_t i = 0; i < params_.size(); ++i)
    for (const auto& [k, t] : codecs_[i]->state_dict())
      if (t.defined()) out[params_[i].first + "." + k] = t;
  return out;
}

void DataParallelSync::load_codec_state(const TensorMap& state) {
  std::vector<TensorMap> per(params_.size());
  for (const auto& [k, t] : state) {
    size_t i = 0;
    while (i < params_.size() && k.rfind(params_[i].first + ".", 0) != 0) ++i;
    TORCH_CHECK(i < params_.size(), "data-parallel codec state: entry '", k,
                "' belongs to no parameter of this rank's stages (a checkpoint of another model or grid?)");
    per[i][k.substr(params_[i].first.size() + 1)] = t;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (per[i].empty()) continue;
    try {
      codecs_[i]->load_state_dict(per[i], /*strict=*/false);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "data-parallel codec state of '", params_[i].first, "': ", e.what_without_backtrace());
    }
  }
}

}  // namespace tl::ranks
