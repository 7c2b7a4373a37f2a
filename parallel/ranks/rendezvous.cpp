#include "parallel/ranks/rendezvous.h"

#include <arpa/inet.h>
#include <c10/util/Exception.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace tl::ranks {
namespace {

const char* kHow =
    "launch with torchrun or `tapeline ... --nproc N`, or set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT";

// A whole decimal integer in [lo, hi]; errors name the variable and its value.
int parse_int(const char* name, const char* value, long lo, long hi) {
  TORCH_CHECK(value != nullptr && *value != '\0', name, " is not set: ", kHow);
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(value, &end, 10);
  TORCH_CHECK(errno == 0 && end != value && *end == '\0', name, "='", value, "' is not an integer");
  TORCH_CHECK(v >= lo && v <= hi, name, "=", v, " is out of range: accepted ", lo, "..", hi);
  return static_cast<int>(v);
}

}  // namespace

DistEnv DistEnv::from_lookup(const std::function<const char*(const char*)>& lookup) {
  DistEnv e;
  e.world_size = parse_int("WORLD_SIZE", lookup("WORLD_SIZE"), 1, 1 << 20);
  e.rank = parse_int("RANK", lookup("RANK"), 0, 1 << 20);
  TORCH_CHECK(e.rank < e.world_size, "RANK=", e.rank, " is not below WORLD_SIZE=", e.world_size);
  const char* addr = lookup("MASTER_ADDR");
  TORCH_CHECK(addr != nullptr && *addr != '\0', "MASTER_ADDR is not set: ", kHow);
  e.master_addr = addr;
  e.master_port = parse_int("MASTER_PORT", lookup("MASTER_PORT"), 1, 65535);
  const char* lr = lookup("LOCAL_RANK");
  e.local_rank = (lr && *lr) ? parse_int("LOCAL_RANK", lr, 0, 1 << 20) : e.rank;
  const char* lws = lookup("LOCAL_WORLD_SIZE");
  e.local_world_size = (lws && *lws) ? parse_int("LOCAL_WORLD_SIZE", lws, 1, 1 << 20) : e.world_size;
  TORCH_CHECK(e.local_rank < e.local_world_size, "LOCAL_RANK=", e.local_rank,
              " is not below LOCAL_WORLD_SIZE=", e.local_world_size);
  const char* agent = lookup("TORCHELASTIC_USE_AGENT_STORE");
  const std::string a = agent ? agent : "";
  if (a == "True" || a == "true" || a == "1") {
    e.agent_store = true;
  } else {
    TORCH_CHECK(a.empty() || a == "False" || a == "false" || a == "0", "TORCHELASTIC_USE_AGENT_STORE='", a,
                "': accepted True/False (also true/false, 1/0)");
  }
  const char* rc = lookup("TORCHELASTIC_RESTART_COUNT");
  e.restart_count = (rc && *rc) ? parse_int("TORCHELASTIC_RESTART_COUNT", rc, 0, 1 << 30) : 0;
  return e;
}

DistEnv DistEnv::from_env() {
  return from_lookup([](const char* name) { return static_cast<const char*>(std::getenv(name)); });
}

bool DistEnv::launched() { return std::getenv("RANK") != nullptr || std::getenv("WORLD_SIZE") != nullptr; }

bool DistEnv::one_of_several() {
  const char* w = std::getenv("WORLD_SIZE");
  return launched() && !(w && std::string(w) == "1");
}

std::string DistEnv::describe() const {
  std::ostringstream os;
  os << "rank " << rank << "/" << world_size << " (local " << local_rank << "/" << local_world_size << "), store "
     << master_addr << ":" << master_port << (agent_store ? " hosted by the launcher's agent" : " hosted by rank 0");
  return os.str();
}

std::string DistEnv::store_prefix() const { return "tapeline/attempt_" + std::to_string(restart_count); }

int find_free_port(const std::string& host) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  TORCH_CHECK(fd >= 0, "find_free_port: socket() failed: ", std::strerror(errno));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = 0;
  if (::inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1) sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    const int err = errno;
    ::close(fd);
    TORCH_CHECK(false, "find_free_port: bind on ", host, " failed: ", std::strerror(err));
  }
  socklen_t len = sizeof(sa);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  ::close(fd);
  return ntohs(sa.sin_port);
}

bool is_loopback_address(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

int cuda_device_for(int local_rank, int device_count) {
  TORCH_CHECK(device_count > 0, "local rank ", local_rank,
              ": run.device = cuda but no CUDA device is visible (CUDA_VISIBLE_DEVICES, driver); use run.device = cpu");
  TORCH_CHECK(local_rank >= 0, "local rank ", local_rank, " is negative");
  return local_rank % device_count;
}

}  // namespace tl::ranks
