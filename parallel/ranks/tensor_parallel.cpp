#include "parallel/ranks/tensor_parallel.h"

#include "autograd/autograd.h"
#include "compression/codec_spec.h"
#include "parallel/ranks/fault.h"
#include "parallel/ranks/group_sum.h"

namespace tl::ranks {

namespace {

// Message tags: step: 30 bits | kind 6: 4 bits | the group's all-reduce count: 26 bits (C10dChannel
// uses kinds 1-3 and 9-11, DataParallelSync 4 and 5). A rank whose count differs from its peer's
// ran another sequence of sublayers: the transport reports the tag mismatch.
constexpr int64_t kKindTensorParallel = 6;
int64_t tag(int64_t step, int64_t count) {
  return ((step & ((int64_t(1) << 30) - 1)) << 30) | (kKindTensorParallel << 26) | (count & ((int64_t(1) << 26) - 1));
}

const char* direction_name(TpDirection d) { return d == TpDirection::Forward ? "forward" : "backward"; }

bool scatters(const CodecRecord& r) { return r.traits.reduce_scatter; }

std::string algorithm_problem(const std::string& algorithm) {
  if (algorithm == "allgather" || algorithm == "reduce_scatter") return "";
  return "tp.algorithm = " + algorithm + ": unknown; accepted: allgather (every codec), reduce_scatter (" +
         codec_names(scatters) + ")";
}

}  // namespace

std::string tp_codec_problem(const std::string& text, const std::string& algorithm) {
  std::string error = algorithm_problem(algorithm);
  if (!error.empty()) return error;
  if (!try_parse_compressor(text, &error)) return error;
  return tp_codec_problem(CodecSpec(text), algorithm);
}

std::string tp_codec_problem(const CodecSpec& spec, const std::string& algorithm) {
  const auto rs = scatters;
  const std::string bad_algorithm = algorithm_problem(algorithm);
  if (!bad_algorithm.empty()) return bad_algorithm;
  const std::string accepted =
      "accepted: stateless codecs, ef(...) and ef21(...) of them, e.g. quant(bits=8), quant(bits=4), topk(0.1), "
      "ef(topk(0.1)), powersgd(rank=4)";
  for (const CodecRecord* r : spec.records()) {
    switch (r->traits.tp) {
      case MessageUse::kYes:
        break;
      case MessageUse::kNoSampleIds:
        return r->name +
               " keeps a per-sample cache that needs the micro-batch's sample ids, which an all-reduce "
               "inside a transformer block does not carry; " +
               accepted;
      case MessageUse::kNoTransform:
        return "learned or projecting codecs (" +
               codec_names([](const CodecRecord& c) { return c.traits.tp == MessageUse::kNoTransform; }) +
               ") sit at pipeline boundaries, not inside a layer's all-reduce; " + accepted;
      case MessageUse::kNoDecoderState:
        return r->name + " keeps receiver state that a tensor-parallel all-reduce does not hold; " + accepted;
    }
  }
  if (algorithm == "reduce_scatter" && !(spec.call().next == nullptr && spec.record().traits.reduce_scatter))
    return "tp.algorithm = reduce_scatter sums chunks that are compressed again after the sum: only " +
           codec_names(rs) + " (stateless, per chunk) are defined for it; use tp.algorithm = allgather for " + spec.text();
  return "";
}

TensorParallelSync::TensorParallelSync(Transport& transport, std::vector<int> group, int rank,
                                       const std::vector<std::string>& sites, const TensorParallelOptions& options)
    : transport_(transport), group_(std::move(group)), rank_(rank), options_(options) {
  for (const auto& [key, spec] : {std::pair{"tp.forward", options.forward}, {"tp.backward", options.backward}}) {
    const std::string problem = tp_codec_problem(spec, options.algorithm);
    TORCH_CHECK(problem.empty(), key, " = ", spec, ": ", problem);
  }
  const size_t T = group_.size();
  for (const auto& s : sites) {
    Site& site = sites_[s];
    for (size_t e = 0; e < T; ++e) {
      site.forward.push_back(options.forward.build());
      site.backward.push_back(options.backward.build());
    }
  }
}

void TensorParallelSync::set_phase(int64_t step, const std::string& where, bool training, bool compress) {
  step_ = step, where_ = where, training_ = training, compress_ = compress;
  calls_ = 0;
}

void TensorParallelSync::send_to(int peer, const Payload& p, const std::string& what, int64_t raw_bytes) {
  const std::string to = what + " to tensor rank " + std::to_string(peer);
  fault_point(FaultPhase::AllReduce, -1, &transport_, true, to);  // Note [fault injection]
  transport_.send_payload(group_[static_cast<size_t>(peer)], p, tag(step_, calls_), to);
  if (training_)  // counted as boundary bytes are: training steps only
    ++stats_.messages, stats_.bytes += static_cast<int64_t>(p.nbytes()), stats_.raw_bytes += raw_bytes;
}

Payload TensorParallelSync::recv_from(int peer, const std::string& what) {
  const int from = group_[static_cast<size_t>(peer)];
  return transport_.recv_payload(
      from, tag(step_, calls_),
      what + ", from tensor rank " + std::to_string(peer) + " (rank " + std::to_string(from) + ")");
}

at::Tensor TensorParallelSync::all_reduce(const at::Tensor& x, const std::string& site, TpDirection direction) {
  NoGradGuard no_grad;
  auto it = sites_.find(site);
  TORCH_CHECK(it != sites_.end(), "tensor parallelism: all-reduce of unknown site '", site, "'");
  const std::string what = where_ + ", tensor-parallel all-reduce of " + site + " (" + direction_name(direction) + ")";
  const CodecSpec& spec = direction == TpDirection::Forward ? options_.forward : options_.backward;
  const bool compress = !spec.is_identity() && compress_ &&
                        (training_ || direction == TpDirection::Backward || options_.active_at_inference);
  CodecContext ctx;
  ctx.training = training_;
  if (training_) ++stats_.all_reduces;
  at::Tensor out;
  if (!compress && x.is_cpu() && at::isFloatingType(x.scalar_type()) && group_.size() > 1) {
    // Note [uncompressed tensor-parallel sums]: in place on a copy, reduce-scatter then all-gather.
    // Two ranks sum into the received buffer and leave x as it is; more change their copy in place.
    const at::Tensor flat = group_.size() == 2 ? x.contiguous().view(-1) : x.contiguous().clone().view(-1);
    auto before_send = [&](const std::string& to, int64_t bytes) {
      fault_point(FaultPhase::AllReduce, -1, &transport_, true, to);  // Note [fault injection]
      if (training_) ++stats_.messages, stats_.bytes += bytes, stats_.raw_bytes += bytes;
    };
    out = all_reduce_in_rank_order(transport_, group_, rank_, flat, tag(step_, calls_), what, before_send)
              .view(x.sizes());
  } else if (!compress) {
    out = all_gather_sum(x, nullptr, what, ctx);
  } else {
    auto& codecs = direction == TpDirection::Forward ? it->second.forward : it->second.backward;
    out = options_.algorithm == "reduce_scatter" ? reduce_scatter_sum(x, *codecs[static_cast<size_t>(rank_)], what, ctx)
                                                 : all_gather_sum(x, &codecs, what, ctx);
  }
  ++calls_;
  return out;
}

at::Tensor TensorParallelSync::all_gather_sum(const at::Tensor& x, std::vector<CompressorPtr>* codecs,
                                              const std::string& what, const CodecContext& ctx) {
  const CompressorPtr& identity = identity_compressor();
  const int T = static_cast<int>(group_.size());
  const int64_t raw = x.numel() * 4;
  // Uncompressed, decoding a payload gives back the tensor itself: no need to decode our own.
  const Payload mine = codecs ? (*codecs)[static_cast<size_t>(rank_)]->encode(x, ctx) : identity_payload_view(x);
  for (int e = 0; e < T; ++e)
    if (e != rank_) send_to(e, mine, what, raw);
  const at::Tensor sum = sum_in_rank_order(T, [&](int e) {
    at::Tensor term;
    if (e == rank_)
      term = codecs ? (*codecs)[static_cast<size_t>(e)]->decode(mine, ctx) : x;
    else
      term = (codecs ? *(*codecs)[static_cast<size_t>(e)] : *identity).decode(recv_from(e, what), ctx);
    TORCH_CHECK(term.sizes().equals(x.sizes()), what, ": tensor rank ", e, " sent a tensor of shape ", term.sizes(),
                " where this rank has ", x.sizes(), " (the ranks ran different computations)");
    return term.to(x.scalar_type());
  });
  return T == 1 ? sum.clone() : sum;  // a term may be x itself
}

at::Tensor TensorParallelSync::reduce_scatter_sum(const at::Tensor& x, Compressor& codec, const std::string& what,
                                                  const CodecContext& ctx) {
  const int T = static_cast<int>(group_.size());
  const int64_t cols = x.dim() >= 1 ? x.size(-1) : 1;
  const at::Tensor m = x.contiguous().reshape({-1, cols});  // (rows, C)
  const int64_t rows = m.size(0);
  TORCH_CHECK(rows >= T, what, ": tp.algorithm = reduce_scatter needs at least ", T, " rows (tokens) to cut into ", T,
              " chunks, the tensor ", x.sizes(), " has ", rows, "; use tp.algorithm = allgather");
  auto chunk = [&](const at::Tensor& t, int j) {  // rows [j rows / T, (j + 1) rows / T)
    const int64_t begin = rows * j / T, end = rows * (j + 1) / T;
    return t.narrow(0, begin, end - begin);
  };
  // Reduce-scatter: chunk j of every rank to rank j, summed there in rank order.
  std::vector<Payload> out(static_cast<size_t>(T));
  for (int j = 0; j < T; ++j) {
    const at::Tensor c = chunk(m, j).contiguous();
    out[static_cast<size_t>(j)] = codec.encode(c, ctx);
    if (j != rank_) send_to(j, out[static_cast<size_t>(j)], what + " (reduce-scatter)", c.numel() * 4);
  }
  const at::Tensor mine = sum_in_rank_order(T, [&](int e) {
    const at::Tensor term =
        codec.decode(e == rank_ ? out[static_cast<size_t>(e)] : recv_from(e, what + " (reduce-scatter)"), ctx);
    TORCH_CHECK(term.sizes().equals(chunk(m, rank_).sizes()), what, ": tensor rank ", e, " sent a chunk of shape ",
                term.sizes(), ", expected ", chunk(m, rank_).sizes());
    return term.to(x.scalar_type());
  });
  // All-gather of the summed chunks, each decoded from its payload on every rank (its owner too).
  const Payload summed = codec.encode(mine, ctx);
  for (int e = 0; e < T; ++e)
    if (e != rank_) send_to(e, summed, what + " (all-gather)", mine.numel() * 4);
  std::vector<at::Tensor> chunks;
  for (int e = 0; e < T; ++e) {
    const at::Tensor c = codec.decode(e == rank_ ? summed : recv_from(e, what + " (all-gather)"), ctx);
    TORCH_CHECK(c.sizes().equals(chunk(m, e).sizes()), what, ": tensor rank ", e, " sent a summed chunk of shape ",
                c.sizes(), ", expected ", chunk(m, e).sizes());
    chunks.push_back(c.to(x.scalar_type()));
  }
  return at::cat(chunks, 0).view(x.sizes());
}

TensorMap TensorParallelSync::codec_state() const {
  TensorMap out;
  for (const auto& [name, site] : sites_)
    for (const auto& [dir, codecs] : {std::pair{"forward", &site.forward}, {"backward", &site.backward}})
      for (size_t e = 0; e < codecs->size(); ++e)
        for (const auto& [k, t] : (*codecs)[e]->state_dict())
          out[name + "." + dir + "." + std::to_string(e) + "." + k] = t;
  return out;
}

void TensorParallelSync::load_codec_state(const TensorMap& state) {
  std::map<std::string, TensorMap> per_codec;  // "<site>.<dir>.<sender>" -> entries
  const TensorMap current = codec_state();
  for (const auto& [k, t] : state) {
    TORCH_CHECK(current.count(k), "tensor-parallel codec state: '", k,
                "' belongs to no codec of this rank (tp.forward = ", options_.forward,
                ", tp.backward = ", options_.backward, ")");
  }
  for (auto& [name, site] : sites_)
    for (const auto& [dir, codecs] : {std::pair{"forward", &site.forward}, {"backward", &site.backward}})
      for (size_t e = 0; e < codecs->size(); ++e) {
        const std::string prefix = name + "." + dir + "." + std::to_string(e) + ".";
        TensorMap mine;
        for (const auto& [k, t] : state)
          if (k.rfind(prefix, 0) == 0) mine[k.substr(prefix.size())] = t;
        if (!mine.empty()) (*codecs)[e]->load_state_dict(mine, /*strict=*/false);
      }
}

}  // namespace tl::ranks
