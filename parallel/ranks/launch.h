#pragma once
// Local launcher: `tapeline train --nproc N ...` starts N ranks of the same executable on this
// machine, as torchrun would, for users without Python.
//
// Each child is the executable again (fork + exec of /proc/self/exe by default) with the given
// arguments (the caller removes its launcher flag, see take_nproc_flag) and the torchrun variables:
// MASTER_ADDR=127.0.0.1, MASTER_PORT, RANK = LOCAL_RANK = r, WORLD_SIZE = LOCAL_WORLD_SIZE = N.
// Like torchrun's agent, the launcher hosts the TCPStore itself (on a port the kernel picks) and
// sets TORCHELASTIC_USE_AGENT_STORE=True: the store exists before any rank starts, so no rank can
// try to connect before it listens, and no port can be taken between choosing and binding it.
// With host_store = false, rank 0 hosts it on a free port instead.
//
// Output: every line a child writes is re-emitted with the prefix "[rank r] ", stdout to stdout and
// stderr to stderr, whole lines only (a line is never mixed with another rank's). All ranks'
// output is kept: the ranks of a pipeline log different things (rank 0 the metrics, others their
// errors), and a failure is most often reported by a rank other than 0.
//
// Failures: when a child exits non-zero or is killed by a signal, the others get SIGTERM, then
// SIGKILL after grace_s; the result names the first rank that failed and how. Children also get
// SIGKILL if the launcher itself dies (PR_SET_PDEATHSIG). Ctrl-C reaches all of them (same process
// group).

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace tl::ranks {

struct LaunchOptions {
  int nproc = 1;
  /// The program to run; empty = this one (/proc/self/exe).
  std::string executable;
  /// argv[1..] of every child.
  std::vector<std::string> args;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0 = a free port
  /// Host the TCPStore in the launcher (TORCHELASTIC_USE_AGENT_STORE=True) or let rank 0 host it.
  bool host_store = true;
  /// Seconds between SIGTERM and SIGKILL when stopping the survivors of a failure.
  double grace_s = 5.0;
  /// Extra environment variables for the children (after the rank variables).
  std::vector<std::pair<std::string, std::string>> env;
  /// Receives each output line (without its newline). Default: prints "[rank r] line" to
  /// stdout or stderr.
  std::function<void(int rank, bool is_stderr, const std::string& line)> on_line;
};

struct LaunchResult {
  /// 0 when every rank exited 0; else the failed rank's exit status, or 128 + signal.
  int exit_code = 0;
  int failed_rank = -1;
  int signal = 0;  // the signal that killed failed_rank, 0 if it exited
  /// "rank 1 exited with status 3" / "rank 2 was killed by signal 9 (SIGKILL)", then what was done
  /// to the others.
  std::string message;
  bool ok() const { return exit_code == 0; }
};

/// Runs the ranks to completion (see above). Errors (bad options, fork/exec failures in the
/// launcher itself) throw; a failing rank does not: it is in the result.
LaunchResult launch_local(const LaunchOptions& options);

/// Removes "--nproc N" or "--nproc=N" (or `flag` instead of "--nproc") from `args` and returns N;
/// 0 when absent. N must be an integer >= 1: an error names the value otherwise.
int take_nproc_flag(std::vector<std::string>& args, const std::string& flag = "--nproc");

}  // namespace tl::ranks
