#pragma once
// Channel: how the messages of a pipeline step travel between the pipeline ranks. The one
// schedule interpreter (parallel/interpreter.h) runs a rank's lowered list over a Channel; two
// implementations exist:
//   - LocalChannel (this file): every rank in this process, messages handed over in memory, each
//     rank on its own virtual clock, links emulated on those clocks (parallel/link.h);
//   - C10dChannel (parallel/ranks/c10d_channel.h): one process per rank, messages on a c10d
//     Transport, real clocks, links emulated at the receiver.
// Both deliver the messages of one (src, dst) rank pair in send order and check that each
// receive gets the message it expects, so a schedule whose two ends disagree fails the same way
// in and out of process.
//
// Note [reference tensors]. A boundary that measures its error (relative error, density) needs
// both ends of a message: the sender's tensor and the receiver's decoded one. The sender puts
// its tensor (forward: the boundary input h; backward: the gradient it encoded) beside the
// payload as `reference`; the receiver measures. In process the reference is a handle; across
// processes it is a second message, uncompressed, neither counted in the boundary's bytes nor
// delayed by the emulated link (it only exists because statistics are on: run.measure_error).
// So every statistic a run writes is the same in and out of process.

#include <ATen/ATen.h>

#include <deque>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "compression/payload.h"
#include "parallel/link.h"

namespace tl {

/// Which message: the activation (forward) or gradient (backward) of micro-batch `micro_batch`
/// at boundary `boundary` (0-based: between stages boundary and boundary + 1).
struct MessageKey {
  bool activation = true;
  int boundary = 0;
  int micro_batch = 0;
  bool operator<(const MessageKey& o) const {
    return std::tie(activation, boundary, micro_batch) < std::tie(o.activation, o.boundary, o.micro_batch);
  }
  bool operator==(const MessageKey& o) const {
    return activation == o.activation && boundary == o.boundary && micro_batch == o.micro_batch;
  }
  /// "activation 3 of boundary 2" (boundaries numbered from 1, as in the config).
  std::string describe() const;
};

/// What crosses a boundary for one message.
struct StageMessage {
  std::optional<Payload> payload;  // nullopt: nothing on the wire (backward mode none)
  at::Tensor reference;            // Note [reference tensors]; undefined when not measuring
};

/// A message as the receiver gets it: when it is there on the receiver's clock.
struct Delivered {
  StageMessage message;
  double ready_s = 0.0;
};

class Channel {
 public:
  virtual ~Channel() = default;
  /// Hands `message` from pipeline rank `src` to `dst`, sent at `now_s` on src's clock.
  virtual void send(int src, int dst, const MessageKey& key, StageMessage message, double now_s) = 0;
  /// The message `key` from `src` to `dst` and when it is ready on dst's clock (>= now_s). nullopt
  /// when it has not been sent yet (the caller comes back later; only an in-process channel can
  /// say so: a process waits). A different message first in line is an error.
  virtual std::optional<Delivered> recv(int src, int dst, const MessageKey& key, double now_s) = 0;
};

/// Every rank in this process. Links per directed rank pair (one queue per direction: full
/// duplex), set with set_link; messages not sent yet make recv return nullopt.
class LocalChannel final : public Channel {
 public:
  /// The emulated link from rank `src` to rank `dst` (default: ideal).
  void set_link(int src, int dst, const LinkSpec& spec);
  /// How the links charge messages (Note [link models] in link.h); default pipelined.
  void set_link_model(LinkModel model) { model_ = model; }
  /// The link from `src` to `dst` (nullptr if none was set): its bytes and messages so far.
  const Link* link(int src, int dst) const;
  void send(int src, int dst, const MessageKey& key, StageMessage message, double now_s) override;
  std::optional<Delivered> recv(int src, int dst, const MessageKey& key, double now_s) override;
  /// Messages sent and not received (0 after a complete step).
  size_t in_flight() const;
  /// A new step on fresh clocks: the queues emptied (a step that failed half-way), every link's
  /// queue and counters reset; the links and the link model kept.
  void reset();

 private:
  struct Queued {
    MessageKey key;
    StageMessage message;
    double delivered_s;  // inbound: not yet known (charged at recv)
    double sent_s;
  };
  LinkModel model_ = LinkModel::Pipelined;
  std::map<int, double> inbound_free_s_;  // inbound: per receiving rank, its wire's last arrival
  std::map<std::pair<int, int>, std::deque<Queued>> queues_;
  std::map<std::pair<int, int>, Link> links_;
};

}  // namespace tl
