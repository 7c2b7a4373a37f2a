#pragma once
// Where a rank is and whom it meets: the torchrun environment (RESEARCH.md, "Facts for the
// distributed runtime"). torchrun, `tapeline train --nproc N` (parallel/ranks/launch.h) and a
// hand-written launch script all set the same variables:
//   RANK, WORLD_SIZE                       required
//   MASTER_ADDR, MASTER_PORT               required: where the TCPStore listens
//   LOCAL_RANK, LOCAL_WORLD_SIZE           optional (default RANK, WORLD_SIZE: one machine)
//   TORCHELASTIC_USE_AGENT_STORE           "True": torchrun's agent already hosts the TCPStore on
//                                          MASTER_PORT; every rank connects as a client.
//                                          Otherwise rank 0 hosts it.
//   TORCHELASTIC_RESTART_COUNT             optional: keys of each restart live under their own
//                                          prefix in the (long-lived) agent store.
// No c10d types here: see c10d_compat.h and transport.h for the connection itself.

#include <functional>
#include <string>

namespace tl::ranks {

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool agent_store = false;
  int restart_count = 0;

  /// Reads the variables above. Errors name the variable, its value and what is accepted
  /// ("RANK=7 is not below WORLD_SIZE=4"; "MASTER_PORT is not set: launch with torchrun or
  /// tapeline --nproc N").
  static DistEnv from_env();
  /// As from_env, reading through `lookup` (returns nullptr for unset): for tests.
  static DistEnv from_lookup(const std::function<const char*(const char*)>& lookup);
  /// True when RANK or WORLD_SIZE is set, i.e. this process was launched as one of several ranks.
  static bool launched();
  /// launched() and WORLD_SIZE is not 1 (a world of one rank is a single process).
  static bool one_of_several();

  /// "rank 1/4 (local 1/4), store 127.0.0.1:29500 hosted by rank 0".
  std::string describe() const;
  /// The store key prefix of this attempt: "tapeline/attempt_<restart_count>" (c10d's PrefixStore
  /// adds the "/").
  std::string store_prefix() const;
};

/// A TCP port that was free on `host` a moment ago (bind to port 0, read it, close). Another
/// process may take it before the caller binds it; callers that host the store retry on failure.
int find_free_port(const std::string& host = "127.0.0.1");

/// True for 127.x.x.x, ::1 and "localhost".
bool is_loopback_address(const std::string& addr);

/// The CUDA device of the rank with local rank `local_rank` on a machine with `device_count`
/// devices: local_rank mod device_count (with `tapeline train --nproc N` the local rank is the rank,
/// so rank r uses device r mod devices). Error naming the rank when there is no device.
int cuda_device_for(int local_rank, int device_count);

}  // namespace tl::ranks
