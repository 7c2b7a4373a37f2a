#include "parallel/ranks/launch.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>

#include "parallel/link.h"
#include "parallel/ranks/c10d_compat.h"
#include "parallel/ranks/rendezvous.h"

extern char** environ;

namespace tl::ranks {
namespace {

std::string signal_name(int sig) {
  switch (sig) {
    case SIGKILL:
      return "SIGKILL";
    case SIGTERM:
      return "SIGTERM";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGABRT:
      return "SIGABRT";
    case SIGINT:
      return "SIGINT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGILL:
      return "SIGILL";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGHUP:
      return "SIGHUP";
    default: {
      const char* s = ::strsignal(sig);
      return s ? s : "unknown";
    }
  }
}

std::string describe_status(int rank, int status) {
  std::ostringstream os;
  if (WIFSIGNALED(status))
    os << "rank " << rank << " was killed by signal " << WTERMSIG(status) << " (" << signal_name(WTERMSIG(status))
       << ")";
  else
    os << "rank " << rank << " exited with status " << WEXITSTATUS(status);
  return os.str();
}

struct Child {
  int rank = 0;
  pid_t pid = -1;
  int fd[2] = {-1, -1};  // stdout, stderr read ends
  std::string partial[2];
  bool running = true;
  int status = 0;
};

// A C array of C strings over `v` (which must outlive it).
std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

int take_nproc_flag(std::vector<std::string>& args, const std::string& flag) {
  int n = 0;
  bool seen = false;
  for (size_t i = 0; i < args.size();) {
    std::string value;
    size_t take = 0;
    if (args[i] == flag) {
      TORCH_CHECK(i + 1 < args.size(), flag, " needs a value: the number of local ranks (>= 1)");
      value = args[i + 1];
      take = 2;
    } else if (args[i].rfind(flag + "=", 0) == 0) {
      value = args[i].substr(flag.size() + 1);
      take = 1;
    } else {
      ++i;
      continue;
    }
    TORCH_CHECK(!seen, flag, " is given twice");
    seen = true;
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(value.c_str(), &end, 10);
    TORCH_CHECK(errno == 0 && !value.empty() && *end == '\0' && v >= 1 && v <= 4096, flag, " '", value,
                "': accepted an integer number of local ranks >= 1");
    n = static_cast<int>(v);
    args.erase(args.begin() + i, args.begin() + i + take);
  }
  return n;
}

LaunchResult launch_local(const LaunchOptions& o) {
  TORCH_CHECK(o.nproc >= 1, "launch: nproc must be >= 1, got ", o.nproc);
  TORCH_CHECK(o.grace_s >= 0, "launch: grace_s must be >= 0, got ", o.grace_s);
  std::string exe = o.executable;
  if (exe.empty()) {
    char buf[4096];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    TORCH_CHECK(n > 0, "launch: cannot resolve /proc/self/exe: ", std::strerror(errno));
    exe.assign(buf, n);
  }
  TORCH_CHECK(::access(exe.c_str(), X_OK) == 0, "launch: '", exe, "' is not an executable file");
  int port = o.master_port;
  compat::StorePtr store;  // alive until every rank has exited
  if (o.host_store) {
    try {
      store = compat::make_tcp_server(port, std::chrono::seconds(60), &port);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "launch: cannot host the TCPStore on port ", o.master_port, ": ", e.what());
    }
  } else if (port <= 0) {
    port = find_free_port(o.master_addr);
  }

  // Everything the children need is built before fork: after fork only async-signal-safe calls.
  const std::set<std::string> ours = {"RANK",
                                      "WORLD_SIZE",
                                      "LOCAL_RANK",
                                      "LOCAL_WORLD_SIZE",
                                      "MASTER_ADDR",
                                      "MASTER_PORT",
                                      "GROUP_RANK",
                                      "TORCHELASTIC_USE_AGENT_STORE",
                                      "TORCHELASTIC_RESTART_COUNT"};
  std::vector<std::string> base_env;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    bool extra = false;
    for (const auto& [k, v] : o.env) extra |= k == key;
    if (!ours.count(key) && !extra) base_env.push_back(kv);
  }
  std::vector<std::string> argv_s = {exe};
  argv_s.insert(argv_s.end(), o.args.begin(), o.args.end());
  std::vector<char*> argv = c_strings(argv_s);
  std::vector<std::vector<std::string>> env_s(o.nproc);
  std::vector<std::vector<char*>> envp(o.nproc);
  for (int r = 0; r < o.nproc; ++r) {
    env_s[r] = base_env;
    env_s[r].push_back("MASTER_ADDR=" + o.master_addr);
    env_s[r].push_back("MASTER_PORT=" + std::to_string(port));
    env_s[r].push_back("RANK=" + std::to_string(r));
    env_s[r].push_back("LOCAL_RANK=" + std::to_string(r));
    env_s[r].push_back("WORLD_SIZE=" + std::to_string(o.nproc));
    env_s[r].push_back("LOCAL_WORLD_SIZE=" + std::to_string(o.nproc));
    env_s[r].push_back("GROUP_RANK=0");
    if (o.host_store) env_s[r].push_back("TORCHELASTIC_USE_AGENT_STORE=True");
    for (const auto& [k, v] : o.env) env_s[r].push_back(k + "=" + v);
    envp[r] = c_strings(env_s[r]);
  }

  auto emit = o.on_line;
  static std::mutex print_mutex;
  if (!emit) {
    emit = [](int rank, bool is_stderr, const std::string& line) {
      std::lock_guard<std::mutex> lock(print_mutex);
      FILE* f = is_stderr ? stderr : stdout;
      std::fprintf(f, "[rank %d] %s\n", rank, line.c_str());
      std::fflush(f);
    };
  }

  std::vector<Child> kids(o.nproc);
  const pid_t parent = ::getpid();
  std::fflush(stdout);
  std::fflush(stderr);
  for (int r = 0; r < o.nproc; ++r) {
    int out[2], err[2];
    TORCH_CHECK(::pipe2(out, O_CLOEXEC) == 0 && ::pipe2(err, O_CLOEXEC) == 0,
                "launch: pipe failed: ", std::strerror(errno));
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::dup2(out[1], 1);  // dup2 clears close-on-exec on the copies
      ::dup2(err[1], 2);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(126);  // the launcher died before prctl took effect
      ::execve(exe.c_str(), argv.data(), envp[r].data());
      const char msg[] = "launch: execve failed\n";
      [[maybe_unused]] auto w = ::write(2, msg, sizeof(msg) - 1);
      ::_exit(127);
    }
    ::close(out[1]);
    ::close(err[1]);
    if (pid < 0) {
      const int e = errno;
      ::close(out[0]);
      ::close(err[0]);
      for (int k = 0; k < r; ++k) ::kill(kids[k].pid, SIGKILL);
      for (int k = 0; k < r; ++k) ::waitpid(kids[k].pid, nullptr, 0);
      TORCH_CHECK(false, "launch: fork of rank ", r, " failed: ", std::strerror(e));
    }
    kids[r].rank = r;
    kids[r].pid = pid;
    kids[r].fd[0] = out[0];
    kids[r].fd[1] = err[0];
  }

  LaunchResult result;
  bool stopping = false, killed = false;
  double kill_at = 0.0, all_exited_at = -1.0;
  std::vector<int> stopped;
  auto drain = [&](Child& c, int k, bool eof) {
    std::string& buf = c.partial[k];
    size_t pos;
    while ((pos = buf.find('\n')) != std::string::npos) {
      emit(c.rank, k == 1, buf.substr(0, pos));
      buf.erase(0, pos + 1);
    }
    if (eof && !buf.empty()) {
      emit(c.rank, k == 1, buf);
      buf.clear();
    }
  };

  for (;;) {
    // 1. Output.
    std::vector<pollfd> fds;
    std::vector<std::pair<int, int>> who;
    for (auto& c : kids)
      for (int k = 0; k < 2; ++k)
        if (c.fd[k] >= 0) {
          fds.push_back({c.fd[k], POLLIN, 0});
          who.emplace_back(c.rank, k);
        }
    if (!fds.empty()) {
      const int n = ::poll(fds.data(), fds.size(), 50);
      if (n > 0) {
        for (size_t i = 0; i < fds.size(); ++i) {
          if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
          Child& c = kids[who[i].first];
          const int k = who[i].second;
          char buf[65536];
          const ssize_t got = ::read(c.fd[k], buf, sizeof(buf));
          if (got > 0) {
            c.partial[k].append(buf, got);
            drain(c, k, false);
          } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
            ::close(c.fd[k]);
            c.fd[k] = -1;
            drain(c, k, true);
          }
        }
      }
    } else {
      ::usleep(20000);
    }
    // 2. Exits.
    bool any_running = false;
    for (auto& c : kids) {
      if (!c.running) continue;
      int st = 0;
      const pid_t w = ::waitpid(c.pid, &st, WNOHANG);
      if (w == c.pid) {
        c.running = false;
        c.status = st;
        const bool failed = WIFSIGNALED(st) || WEXITSTATUS(st) != 0;
        if (stopping) {
          stopped.push_back(c.rank);
        } else if (failed) {
          result.failed_rank = c.rank;
          result.signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
          result.exit_code = WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
          result.message = describe_status(c.rank, st);
          stopping = true;
          kill_at = steady_now_s() + o.grace_s;
          for (auto& d : kids)
            if (d.running && d.pid != c.pid) ::kill(d.pid, SIGTERM);
        }
      } else {
        any_running = true;
      }
    }
    if (stopping && !killed && any_running && steady_now_s() >= kill_at) {
      for (auto& d : kids)
        if (d.running) ::kill(d.pid, SIGKILL);
      killed = true;
    }
    // 3. Done when every child is reaped and its pipes are closed (or, should a grandchild hold a
    // pipe open, a second after the last exit).
    if (!any_running) {
      if (all_exited_at < 0) all_exited_at = steady_now_s();
      bool open = false;
      for (auto& c : kids) open |= c.fd[0] >= 0 || c.fd[1] >= 0;
      if (!open || steady_now_s() - all_exited_at > 1.0) break;
    }
  }
  for (auto& c : kids)
    for (int k = 0; k < 2; ++k)
      if (c.fd[k] >= 0) {
        drain(c, k, true);
        ::close(c.fd[k]);
      }
  if (result.failed_rank >= 0 && !stopped.empty()) {
    std::ostringstream os;
    os << "; stopped the other ranks (" << (killed ? "SIGTERM, then SIGKILL after " : "SIGTERM, grace ") << o.grace_s
       << " s):";
    for (int r : stopped) os << " " << describe_status(r, kids[r].status) << ";";
    result.message += os.str();
  }
  return result;
}

}  // namespace tl::ranks
