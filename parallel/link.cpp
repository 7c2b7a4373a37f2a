#include "parallel/link.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <sstream>
#include <thread>

namespace tl {

LinkModel link_model_of(const std::string& name) {
  if (name == "pipelined") return LinkModel::Pipelined;
  if (name == "inbound") return LinkModel::Inbound;
  TORCH_CHECK(false, "link model '", name, "' is not known; accepted: pipelined, inbound");
}

std::string LinkSpec::describe() const {
  std::ostringstream os;
  if (bandwidth_mbps > 0)
    os << bandwidth_mbps << " Mbit/s";
  else
    os << "unlimited";
  os << ", " << latency_ms << " ms";
  return os.str();
}

Link::Link(LinkSpec spec) : spec_(spec), free_at_s_(-std::numeric_limits<double>::infinity()) {
  TORCH_CHECK(std::isfinite(spec.bandwidth_mbps) && spec.bandwidth_mbps >= 0,
              "link: bandwidth must be >= 0 Mbit/s (0 = unlimited), got ", spec.bandwidth_mbps);
  TORCH_CHECK(std::isfinite(spec.latency_ms) && spec.latency_ms >= 0, "link: latency must be >= 0 ms, got ",
              spec.latency_ms);
}

Link::Link(const Link& other) : spec_(other.spec_) {
  std::lock_guard<std::mutex> lock(other.mutex_);
  free_at_s_ = other.free_at_s_;
  bytes_ = other.bytes_;
  messages_ = other.messages_;
}

Link& Link::operator=(const Link& other) {
  if (this == &other) return *this;
  std::scoped_lock lock(mutex_, other.mutex_);
  spec_ = other.spec_;
  free_at_s_ = other.free_at_s_;
  bytes_ = other.bytes_;
  messages_ = other.messages_;
  return *this;
}

double Link::transmission_s(int64_t bytes) const {
  if (spec_.bandwidth_mbps <= 0) return 0.0;
  return 8.0 * static_cast<double>(bytes) / (spec_.bandwidth_mbps * 1e6);
}

double Link::transmit(double sent_s, int64_t bytes) {
  TORCH_CHECK(bytes >= 0, "link: message of ", bytes, " bytes");
  const double tx = transmission_s(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  const double start = std::max(sent_s, free_at_s_);
  free_at_s_ = start + tx;
  bytes_ += bytes;
  ++messages_;
  return free_at_s_ + spec_.latency_ms * 1e-3;
}

double Link::free_at_s() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return free_at_s_;
}

int64_t Link::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

int64_t Link::messages() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return messages_;
}

void Link::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  free_at_s_ = -std::numeric_limits<double>::infinity();
  bytes_ = 0;
  messages_ = 0;
}

int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double SteadyClock::now_s() { return steady_ns_to_s(steady_now_ns()); }

void SteadyClock::sleep_until_s(double t_s) {
  using namespace std::chrono;
  const auto target = steady_clock::time_point(duration_cast<steady_clock::duration>(duration<double>(t_s)));
  // sleep_until may wake early on some systems; loop until the clock says so.
  while (steady_clock::now() < target) std::this_thread::sleep_until(target);
}

void FakeClock::sleep_until_s(double t_s) {
  if (t_s > now_) {
    slept_ += t_s - now_;
    now_ = t_s;
  }
}

void FakeClock::advance(double dt_s) {
  TORCH_CHECK(dt_s >= 0, "FakeClock: cannot go back in time (advance by ", dt_s, ")");
  now_ += dt_s;
}

double wait_for_delivery(Link& link, Clock& clock, double sent_s, int64_t bytes) {
  const double due = link.transmit(sent_s, bytes);
  const double now = clock.now_s();
  if (due <= now) return 0.0;
  clock.sleep_until_s(due);
  return due - now;
}

}  // namespace tl
