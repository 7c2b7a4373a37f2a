#include "parallel/ranks/fault.h"

#include <net/if.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <mutex>
#include <stdexcept>
#include <sstream>
#include <vector>

namespace tl::ranks {

namespace {

struct Armed {
  std::atomic<bool> any{false};  // a fault is armed here: the hooks' fast path reads only this
  std::mutex mutex;
  std::optional<Fault> fault;  // this rank's, not fired yet
  int rank = -1;
  int64_t step = 0;  // the training step set last
};
Armed& armed() {
  static Armed a;
  return a;
}

const std::vector<std::pair<const char*, FaultPhase>> kPhases = {
    {"rendezvous", FaultPhase::Rendezvous}, {"forward", FaultPhase::Forward},     {"backward", FaultPhase::Backward},
    {"allreduce", FaultPhase::AllReduce},   {"evaluate", FaultPhase::Evaluate}, {"checkpoint", FaultPhase::Checkpoint}};
const std::vector<std::pair<const char*, FaultKind>> kKinds = {
    {"kill", FaultKind::Kill},         {"stop", FaultKind::Stop},       {"exit", FaultKind::Exit},
    {"partition", FaultKind::Partition}, {"truncate", FaultKind::Truncate}, {"bitflip", FaultKind::BitFlip},
    {"oversize", FaultKind::Oversize}};

template <typename T>
std::string names(const std::vector<std::pair<const char*, T>>& table) {
  std::string out;
  for (const auto& [n, _] : table) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

Corruption corruption_of(FaultKind kind) {
  switch (kind) {
    case FaultKind::Truncate:
      return Corruption::Truncate;
    case FaultKind::BitFlip:
      return Corruption::BitFlip;
    case FaultKind::Oversize:
      return Corruption::Oversize;
    default:
      return Corruption::None;
  }
}

}  // namespace

const char* phase_name(FaultPhase phase) {
  for (const auto& [n, p] : kPhases)
    if (p == phase) return n;
  return "?";
}

const char* kind_name(FaultKind kind) {
  for (const auto& [n, k] : kKinds)
    if (k == kind) return n;
  return "?";
}

bool is_corruption(FaultKind kind) { return corruption_of(kind) != Corruption::None; }

Fault parse_fault(const std::string& text) {
  auto fail = [&](const std::string& why) {
    throw std::invalid_argument("expected RANK:PHASE:STEP:KIND, e.g. 2:backward:5:kill (docs/FAULTS.md); " + why);
  };
  std::vector<std::string> parts;
  std::stringstream ss(text);
  for (std::string p; std::getline(ss, p, ':');) parts.push_back(p);
  if (parts.size() != 4) fail("got " + std::to_string(parts.size()) + " part(s) separated by ':'");
  auto number = [&](const std::string& s, const char* what) {
    if (s.empty() || s.size() > 12 || s.find_first_not_of("0123456789") != std::string::npos)
      fail(std::string(what) + " is an integer >= 0, got '" + s + "'");
    return std::stoll(s);
  };
  Fault f;
  f.text = text;
  f.rank = static_cast<int>(number(parts[0], "RANK"));
  f.step = number(parts[2], "STEP");
  bool found = false;
  for (const auto& [n, p] : kPhases)
    if (parts[1] == n) f.phase = p, found = true;
  if (!found) fail("PHASE is one of " + names(kPhases) + ", got '" + parts[1] + "'");
  found = false;
  for (const auto& [n, k] : kKinds)
    if (parts[3] == n) f.kind = k, found = true;
  if (!found) fail("KIND is one of " + names(kKinds) + ", got '" + parts[3] + "'");
  if (f.phase == FaultPhase::Rendezvous && f.step != 0)
    fail("the rendezvous happens once, before step 1: its STEP is 0, got " + parts[2]);
  if (f.phase == FaultPhase::Rendezvous && is_corruption(f.kind))
    fail("rendezvous accepts kill, stop, exit and partition: the ranks send no message of tapeline's before they "
         "have met, so there is none to " + parts[3]);
  return f;
}

void arm_fault(const Fault& fault, int rank, int replicas) {
  TORCH_CHECK(!(fault.phase == FaultPhase::AllReduce && is_corruption(fault.kind) && replicas < 2),
              "dist.inject_fault = '", fault.text, "': corrupting an all-reduce needs parallel.dp > 1; with one ",
              "replica the step's all-reduces are c10d collectives of raw numbers, with no frame of tapeline's to ",
              kind_name(fault.kind));
  TORCH_CHECK(!(fault.phase == FaultPhase::Checkpoint && is_corruption(fault.kind) && fault.rank == 0),
              "dist.inject_fault = '", fault.text, "': rank 0 receives the checkpoint's parts and sends none; ",
              "corrupt another rank's part (e.g. 1:checkpoint:", fault.step, ":", kind_name(fault.kind), ")");
  std::lock_guard<std::mutex> lock(armed().mutex);
  armed().rank = rank;
  armed().fault.reset();
  if (fault.rank == rank) armed().fault = fault;
  armed().any = armed().fault.has_value();
}

void disarm_fault() {
  std::lock_guard<std::mutex> lock(armed().mutex);
  armed().fault.reset();
  armed().any = false;
}

void set_fault_step(int64_t step) {
  std::lock_guard<std::mutex> lock(armed().mutex);
  armed().step = step;
}

std::optional<Fault> unfired_fault() {
  std::lock_guard<std::mutex> lock(armed().mutex);
  return armed().fault;
}

void fault_point(FaultPhase phase, int64_t step, Transport* transport, bool sends, const std::string& where) {
  if (!armed().any.load(std::memory_order_relaxed)) return;  // every message passes here
  Fault f;
  int rank = -1;
  {
    std::lock_guard<std::mutex> lock(armed().mutex);
    if (!armed().fault || armed().fault->phase != phase) return;
    const int64_t at = step >= 0 ? step : armed().step;
    if (at < armed().fault->step) return;
    if (is_corruption(armed().fault->kind) && !(sends && transport)) return;
    f = *armed().fault;
    rank = armed().rank;
    armed().fault.reset();  // fires once
    armed().any = false;
  }
  std::ostringstream os;
  os << "rank " << rank << ": injected fault (dist.inject_fault = " << f.text << "): " << kind_name(f.kind) << " at "
     << phase_name(f.phase) << ", " << where;
  const std::string what = os.str();
  std::cerr << what << std::endl;
  switch (f.kind) {
    case FaultKind::Kill:
      ::raise(SIGKILL);
      break;
    case FaultKind::Stop:
      ::raise(SIGSTOP);
      break;
    case FaultKind::Exit:
      TORCH_CHECK(false, what, ": exiting with this error");
    case FaultKind::Partition:
      take_network_down();
      break;
    default:
      transport->corrupt_next_send(corruption_of(f.kind));
  }
}

namespace {
// The network namespace of process `pid` ("" where it cannot be read).
std::string net_namespace(const std::string& pid) {
  char buf[128];
  const ssize_t n = ::readlink(("/proc/" + pid + "/ns/net").c_str(), buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}
}  // namespace

void take_network_down() {
  // A rank that shares init's network namespace would cut the machine (and every other rank on it)
  // off, not itself: refuse.
  const std::string mine = net_namespace("self");
  TORCH_CHECK(!mine.empty(), "partition: cannot read this rank's network namespace (/proc/self/ns/net)");
  TORCH_CHECK(net_namespace("1") != mine, "partition: this rank is in the network namespace of process 1 (", mine,
              "); taking its interfaces down would cut the whole machine off. Run the rank in a network namespace ",
              "of its own (docs/FAULTS.md shows how)");
  struct if_nameindex* list = ::if_nameindex();
  TORCH_CHECK(list, "partition: cannot list the network interfaces: ", std::strerror(errno));
  std::vector<std::string> interfaces;
  for (struct if_nameindex* i = list; i->if_index != 0 && i->if_name; ++i) interfaces.push_back(i->if_name);
  ::if_freenameindex(list);
  const int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  TORCH_CHECK(s >= 0, "partition: cannot open a socket for interface control: ", std::strerror(errno));
  std::vector<std::string> down;
  std::string failed;
  for (const auto& name : interfaces) {
    struct ifreq req;
    std::memset(&req, 0, sizeof(req));
    std::strncpy(req.ifr_name, name.c_str(), IFNAMSIZ - 1);
    if (::ioctl(s, SIOCGIFFLAGS, &req) != 0) continue;
    if (req.ifr_flags & IFF_LOOPBACK) continue;
    req.ifr_flags &= ~IFF_UP;
    if (::ioctl(s, SIOCSIFFLAGS, &req) != 0)
      failed += " " + name + " (" + std::strerror(errno) + ")";
    else
      down.push_back(name);
  }
  ::close(s);
  TORCH_CHECK(failed.empty(), "partition: could not take down:", failed,
              "; the rank needs CAP_NET_ADMIN in its network namespace");
  TORCH_CHECK(!down.empty(), "partition: this rank's network namespace has no interface but loopback, which it ",
              "shares with the other ranks of this machine; run it in a network namespace of its own ",
              "(docs/FAULTS.md shows how)");
  std::string list_down;
  for (const auto& n : down) list_down += " " + n;
  std::cerr << "partition: took down" << list_down << std::endl;
}

}  // namespace tl::ranks
