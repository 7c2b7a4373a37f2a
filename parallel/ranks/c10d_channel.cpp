#include "parallel/ranks/c10d_channel.h"

#include "compression/spec.h"
#include "parallel/ranks/fault.h"

namespace tl::ranks {

C10dChannel::C10dChannel(Transport& transport, std::vector<int> ranks, int64_t step, Phase phase,
                         std::vector<bool> measured, std::string where, at::Device device)
    : transport_(transport), ranks_(std::move(ranks)), step_(step), phase_(phase), measured_(std::move(measured)),
      where_(std::move(where)), device_(device) {}

void C10dChannel::set_step(int64_t step, std::vector<bool> measured, std::string where) {
  step_ = step;
  measured_ = std::move(measured);
  where_ = std::move(where);
}

int64_t C10dChannel::tag(int64_t step, Phase phase, const MessageKey& key, bool reference) {
  // step: 30 bits | kind: 4 bits | boundary: 10 bits | micro-batch: 16 bits.
  const int64_t kind = (phase == Phase::Evaluate ? 3 : key.activation ? 1 : 2) | (reference ? 8 : 0);
  const int64_t t = ((step & ((int64_t(1) << 30) - 1)) << 30) | (kind << 26) | ((key.boundary & 0x3FF) << 16) |
                    (key.micro_batch & 0xFFFF);
  return reference ? (t | wire::kTagNoLink) : t;
}

std::string C10dChannel::context(const MessageKey& key) const {
  return where_ + ", boundary " + std::to_string(key.boundary + 1) + (key.activation ? " forward" : " backward") +
         ", micro-batch " + std::to_string(key.micro_batch);
}

void C10dChannel::send(int src, int dst, const MessageKey& key, StageMessage message, double now_s) {
  if (!message.payload) return;  // backward mode none: the receiver does not wait for it
  const std::string ctx = context(key);
  // Note [fault injection]: evaluation counts from the training step before it.
  if (phase_ == Phase::Evaluate)
    fault_point(FaultPhase::Evaluate, -1, &transport_, true, ctx);
  else
    fault_point(key.activation ? FaultPhase::Forward : FaultPhase::Backward, step_, &transport_, true, ctx);
  transport_.send_payload(ranks_.at(static_cast<size_t>(dst)), *message.payload, tag(step_, phase_, key, false), ctx);
  if (message.reference.defined())
    transport_.send_payload(ranks_.at(static_cast<size_t>(dst)), identity_compressor()->encode(message.reference, {}),
                            tag(step_, phase_, key, true), ctx + " (reference for statistics)");
}

std::optional<Delivered> C10dChannel::recv(int src, int dst, const MessageKey& key, double now_s) {
  const std::string ctx = context(key);
  const int from = ranks_.at(static_cast<size_t>(src));
  Message info;
  Delivered d;
  d.message.payload = transport_.recv_payload(from, tag(step_, phase_, key, false), ctx, device_, &info);
  if (static_cast<size_t>(key.boundary) < measured_.size() && measured_[static_cast<size_t>(key.boundary)]) {
    Message ref_info;
    const Payload ref = transport_.recv_payload(from, tag(step_, phase_, key, true), ctx + " (reference for statistics)",
                                                device_, &ref_info);
    d.message.reference = identity_compressor()->decode(ref, {});  // its wait is not the link's: not counted
  }
  d.ready_s = now_s + info.wait_s;
  return d;
}

}  // namespace tl::ranks
