#pragma once
// Link emulation: what a message of n bytes would cost on a link of a given bandwidth and latency,
// as a queue. Used by the in-process executor (on a virtual or a real clock) and by the
// multi-process transport's receiver (sleeping until the emulated delivery time).
//
// Note [the link model]. A link transmits one message at a time, in the order messages are handed
// to it, and is pipelined: latency (propagation) of one message overlaps the transmission of the
// next. A message of n bytes handed over at t_sent starts transmitting at
//     start = max(t_sent, free_at)          (waits for the messages before it)
// occupies the link until free_at = start + 8 n / bandwidth, and is delivered at
//     delivered = free_at + latency.
// Bandwidth 0 means unlimited (no transmission time, no queueing); latency 0 means none. With
// both 0 a message is delivered when sent. Bandwidth is in Mbit/s = 10^6 bit/s (network units).
//
// Note [clocks across processes]. The sender stamps each message with steady_now_ns(), i.e.
// std::chrono::steady_clock, which on Linux is CLOCK_MONOTONIC: one clock for the whole machine
// (seconds since boot), so timestamps of different processes on one machine compare directly.
// Across machines they do not: there the receiver must use its own arrival time as t_sent (the
// transport does so when the peer's boot id differs; see parallel/ranks/transport.h), which
// charges the real network's time on top of the emulated one.

#include <cstdint>
#include <mutex>
#include <string>

namespace tl {

// Note [link models]. How the in-process timeline (LocalChannel) charges messages on the links:
//  - pipelined (default, Note [the link model]): one Link per direction of each rank pair, a
//    message's latency overlapping the next one's transmission;
//  - inbound: ProtocolNanoGPT's frozen receiver-side simulation (train_gpt.py, SimPipelineStage).
//    Each rank has one wire into it, shared by the activations from the rank before and the
//    gradients from the rank after. A message is charged when the receiver takes it, in the
//    order its schedule takes them: it starts at max(the wire's last arrival, its sent time) and
//    arrives 8 n / bandwidth + latency later; that arrival is the wire's next start. So latency
//    does not overlap the next message, and the two directions into a rank queue behind each
//    other. Their sends are isends stamped when the tensor is ready, so under this model the
//    interpreter stamps each message when its compute produced it (Note [eager sends] in
//    parallel/interpreter.cpp), not when the lowered list reaches the send. The multi-process
//    transport emulates pipelined links only.
enum class LinkModel { Pipelined, Inbound };
/// "pipelined" or "inbound"; an error names the accepted ones.
LinkModel link_model_of(const std::string& name);

struct LinkSpec {
  double bandwidth_mbps = 0;  // 0 = unlimited
  double latency_ms = 0;
  bool is_ideal() const { return bandwidth_mbps <= 0 && latency_ms <= 0; }
  /// "80 Mbit/s, 100 ms" / "unlimited, 0 ms".
  std::string describe() const;
};

/// A link's queue (Note [the link model]). Times are seconds on the caller's clock (any epoch, as
/// long as every call uses the same one). Thread-safe.
class Link {
 public:
  explicit Link(LinkSpec spec = {});
  /// Copies and moves take the other link's state (its queue) under its lock, so links can live
  /// in containers.
  Link(const Link& other);
  Link& operator=(const Link& other);

  /// Hands a message of `bytes` to the link at `sent_s`; returns its delivery time. Messages must
  /// be handed over in the order they travel (times may be equal or even decrease: a message never
  /// starts before the previous one has left).
  double transmit(double sent_s, int64_t bytes);
  /// 8 * bytes / bandwidth; 0 when unlimited.
  double transmission_s(int64_t bytes) const;
  /// When the link finishes transmitting what it was handed so far.
  double free_at_s() const;
  /// Total bytes and messages handed to the link.
  int64_t bytes() const;
  int64_t messages() const;
  /// Empties the queue (a new step or run on a fresh clock).
  void reset();
  const LinkSpec& spec() const { return spec_; }

 private:
  LinkSpec spec_;
  mutable std::mutex mutex_;
  double free_at_s_;
  int64_t bytes_ = 0;
  int64_t messages_ = 0;
};

/// Time source for executors: a real monotonic clock or a fake one for tests and virtual runs.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual double now_s() = 0;
  /// Returns at or after `t_s` (immediately if it has passed).
  virtual void sleep_until_s(double t_s) = 0;
};

/// std::chrono::steady_clock (CLOCK_MONOTONIC on Linux, shared by all processes of a machine).
class SteadyClock final : public Clock {
 public:
  double now_s() override;
  void sleep_until_s(double t_s) override;
};

/// A clock that moves only when told to (advance) or when someone sleeps (it jumps to the wake-up
/// time). Not thread-safe: one virtual timeline driven by one thread.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(double start_s = 0.0) : now_(start_s) {}
  double now_s() override { return now_; }
  void sleep_until_s(double t_s) override;
  void advance(double dt_s);
  /// Total time spent in sleep_until_s.
  double slept_s() const { return slept_; }

 private:
  double now_;
  double slept_ = 0.0;
};

/// steady_clock now in nanoseconds: the timestamp a sender puts in a message header.
int64_t steady_now_ns();
/// The same instant in seconds, as SteadyClock::now_s reports it.
inline double steady_ns_to_s(int64_t ns) { return static_cast<double>(ns) * 1e-9; }
/// The steady clock in seconds (differences only: its zero is arbitrary).
inline double steady_now_s() { return steady_ns_to_s(steady_now_ns()); }

/// Hands a message sent at `sent_s` (on `clock`'s timeline) to `link` and sleeps on `clock` until
/// its delivery. Returns the seconds slept: 0 when the message is already due (e.g. the real
/// transfer was slower than the emulated one).
double wait_for_delivery(Link& link, Clock& clock, double sent_s, int64_t bytes);

}  // namespace tl
