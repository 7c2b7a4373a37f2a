#include "parallel/channel.h"

#include <c10/util/Exception.h>

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

void LocalChannel::send(int src, int dst, const MessageKey& key, StageMessage message, double now_s) {
  double delivered = now_s;
  auto link = links_.find({src, dst});
  if (link != links_.end() && message.payload)
    delivered = link->second.transmit(now_s, static_cast<int64_t>(message.payload->nbytes()));
  queues_[{src, dst}].push_back({key, std::move(message), delivered});
}

std::optional<Delivered> LocalChannel::recv(int src, int dst, const MessageKey& key, double now_s) {
  auto it = queues_.find({src, dst});
  if (it == queues_.end() || it->second.empty()) return std::nullopt;  // not sent yet
  Queued& q = it->second.front();
  TORCH_CHECK(q.key == key, "pipeline: rank ", dst, " expects ", key.describe(), " from rank ", src,
              " but the link delivers ", q.key.describe(), " first (the schedule's sends and receives disagree)");
  Delivered d{std::move(q.message), std::max(now_s, q.delivered_s)};
  it->second.pop_front();
  return d;
}

size_t LocalChannel::in_flight() const {
  size_t n = 0;
  for (const auto& [pair, q] : queues_) n += q.size();
  return n;
}

}  // namespace tl
