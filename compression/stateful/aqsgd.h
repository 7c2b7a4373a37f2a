#pragma once
// AQ-SGD delta compression of activations (Wang et al., NeurIPS 2022), with any inner codec C
// (the paper's quantiser: aqsgd(quant(4, ...)); Rudakov et al.: aqsgd(topk(0.3))).
//
// Both ends keep a per-sample cache m(id), keyed by the sample ids of the micro-batch
// (CodecContext::sample_ids, required):
//  - warm-up (ctx.epoch < warmup, default the first epoch) or a micro-batch holding any sample the
//    cache has never seen: send x uncompressed (an "aqsgd" raw payload) and set m(id) <- x;
//  - otherwise send C(x - m(id)) (C's own payload) and set m(id) <- m(id) + C(x - m(id)) on both
//    ends; the receiver outputs m(id).
// The cache is stored in float32, float16 or bfloat16 (cache=fp16: half the memory; both ends
// round identically, so they stay equal), in memory (growing with the ids, or capacity=N rows) or
// in a memory-mapped file (file=PATH, capacity=N; the sender's rows in PATH.sender and the
// receiver's in PATH.receiver, since in a single process both live in one object).
// In eval mode the codec acts as plain C on x and never touches the caches (validation samples
// have ids of their own dataset).

#include <memory>

#include "compression/stateful/common.h"

namespace tl {

class AqSgd : public stateful::WrappingCompressor {
 public:
  struct Options {
    int64_t warmup_epochs = 1;           // epochs sent uncompressed
    stateful::SampleCacheOptions cache;  // capacity, storage dtype, optional file
  };
  AqSgd(CompressorPtr inner, Options opt);

  std::string spec() const override;
  Payload encode(const at::Tensor& x, const CodecContext& ctx) override;
  at::Tensor decode(const Payload& p, const CodecContext& ctx) override;
  bool decode_has_state() const override { return true; }  // the receiver's cache
  /// Backward mode `shared`: on the support of a delta payload; after a raw forward payload the
  /// gradient goes raw too (both ends know which one was sent).
  Payload encode_shared(const at::Tensor& g, const Payload& fwd, const CodecContext& ctx) override;
  at::Tensor decode_shared(const Payload& p, const Payload& fwd, const CodecContext& ctx) override;

  stateful::SampleCache& sender_cache() { return *sender_; }
  stateful::SampleCache& receiver_cache() { return *receiver_; }
  const Options& options() const { return opt_; }

  /// The uncompressed warm-up payload: codec "aqsgd", no parameters, body = the raw values.
  static Payload raw_payload(const at::Tensor& x);
  static at::Tensor decode_raw(const Payload& p);
  static bool is_raw(const Payload& p);

 private:
  Options opt_;
  std::unique_ptr<stateful::SampleCache> sender_, receiver_;
};

}  // namespace tl
