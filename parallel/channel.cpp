#include "parallel/channel.h"

#include <c10/util/Exception.h>

#include <limits>
#include <string>

namespace tl {

std::string MessageKey::describe() const {
  return std::string(activation ? "activation " : "gradient ") + std::to_string(micro_batch) + " of boundary " +
         std::to_string(boundary + 1);
}

void LocalChannel::set_link(int src, int dst, const LinkSpec& spec) {
  links_.erase({src, dst});
  links_.emplace(std::make_pair(src, dst), Link(spec));
}

const Link* LocalChannel::link(int src, int dst) const {
  auto it = links_.find({src, dst});
  return it == links_.end() ? nullptr : &it->second;
}

void LocalChannel::send(int src, int dst, const MessageKey& key, StageMessage message, double now_s) {
  double delivered = now_s;
  auto link = links_.find({src, dst});
  if (link != links_.end() && message.payload && model_ == LinkModel::Pipelined)
    delivered = link->second.transmit(now_s, static_cast<int64_t>(message.payload->nbytes()));
  queues_[{src, dst}].push_back({key, std::move(message), delivered, now_s});
}

// GCC 12 warns that the moved message's payload members "may be used uninitialized" where the
// optional<Payload> inside it is moved (a false positive of its -Wmaybe-uninitialized with
// std::optional, fixed in GCC 13); off for this function only.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
std::optional<Delivered> LocalChannel::recv(int src, int dst, const MessageKey& key, double now_s) {
  auto it = queues_.find({src, dst});
  if (it == queues_.end() || it->second.empty()) return std::nullopt;  // not sent yet
  Queued& q = it->second.front();
  TORCH_CHECK(q.key == key, "pipeline: rank ", dst, " expects ", key.describe(), " from rank ", src,
              " but the link delivers ", q.key.describe(), " first (the schedule's sends and receives disagree)");
  auto link = links_.find({src, dst});
  if (model_ == LinkModel::Inbound && link != links_.end() && q.message.payload) {
    // Note [link models]: the wire into dst is free at its last arrival. Link::transmit starts no
    // earlier than `start`, which is past this link's own last arrival, so it adds exactly the
    // transmission and the latency (and counts the bytes).
    auto free = inbound_free_s_.emplace(dst, -std::numeric_limits<double>::infinity()).first;
    const double start = std::max(free->second, q.sent_s);
    q.delivered_s = free->second = link->second.transmit(start, static_cast<int64_t>(q.message.payload->nbytes()));
  }
  Delivered d{std::move(q.message), std::max(now_s, q.delivered_s)};
  it->second.pop_front();
  return d;
}
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic pop
#endif

size_t LocalChannel::in_flight() const {
  size_t n = 0;
  for (const auto& [pair, q] : queues_) n += q.size();
  return n;
}

void LocalChannel::reset() {
  queues_.clear();
  inbound_free_s_.clear();
  for (auto& [pair, link] : links_) link.reset();
}

}  // namespace tl
