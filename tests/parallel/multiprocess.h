#pragma once
// Test harness for multi-process tests: start ranks of parallel_dist_helper (or any program) with
// the torchrun variables, their output in a log file, and wait for them with a hang guard that
// kills what is left. Every test that starts processes holds a ProcessGroupGuard, so a failed
// ASSERT never leaves processes behind.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/common/testing.h"

extern char** environ;

namespace tl::testing_mp {

using EnvList = std::vector<std::pair<std::string, std::string>>;

inline std::string helper_path() {
#ifdef TL_DIST_HELPER
  return TL_DIST_HELPER;
#else
  return "";
#endif
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::string temp_log(const std::string& name) {
  return ::testing::TempDir() + "tl_mp_" + std::to_string(::getpid()) + "_" + name + ".log";
}

/// Starts `exe args`, with this process's environment minus the rank variables plus `env`;
/// stdout and stderr go to `log`. Returns the pid.
inline pid_t spawn(const std::string& exe, const std::vector<std::string>& args, const EnvList& env,
                   const std::string& log) {
  static const std::set<std::string> drop = {"RANK",
                                             "WORLD_SIZE",
                                             "LOCAL_RANK",
                                             "LOCAL_WORLD_SIZE",
                                             "MASTER_ADDR",
                                             "MASTER_PORT",
                                             "TORCHELASTIC_USE_AGENT_STORE"};
  std::vector<std::string> env_s;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    if (!drop.count(kv.substr(0, kv.find('=')))) env_s.push_back(kv);
  }
  for (const auto& [k, v] : env) env_s.push_back(k + "=" + v);
  std::vector<std::string> argv_s = {exe};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv, envp;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (auto& s : env_s) envp.push_back(s.data());
  envp.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    FILE* f = std::fopen(log.c_str(), "w");
    if (f) {
      ::dup2(::fileno(f), 1);
      ::dup2(::fileno(f), 2);
    }
    ::execve(exe.c_str(), argv.data(), envp.data());
    ::_exit(127);
  }
  return pid;
}

/// Waits for `pid` at most `limit_s`; returns its wait status, or -1 if it had to be killed (a hang).
inline int wait_or_kill(pid_t pid, double limit_s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  int status = 0;
  while (std::chrono::steady_clock::now() < end) {
    if (::waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return -1;
}

inline int exit_code(int status) { return status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

/// Kills (SIGKILL) and reaps every process it holds that is still there, at scope exit.
struct ProcessGroupGuard {
  std::vector<pid_t> pids;
  ~ProcessGroupGuard() {
    for (pid_t p : pids) {
      int st;
      if (::waitpid(p, &st, WNOHANG) == 0) {
        ::kill(p, SIGKILL);
        ::waitpid(p, &st, 0);
      }
    }
  }
};

/// Runs `exe args` to its end with a hang guard of `limit_s`; returns (exit code, output). The exit
/// code is -1 when it was killed (by a signal, or by the guard).
inline std::pair<int, std::string> run_to_end(const std::string& exe, const std::vector<std::string>& args,
                                              const std::string& log, double limit_s = 300) {
  ProcessGroupGuard guard;
  const pid_t pid = spawn(exe, args, {}, log);
  guard.pids.push_back(pid);
  const int status = wait_or_kill(pid, limit_s);
  return {status < 0 ? -1 : exit_code(status), read_file(log)};
}

/// The torchrun variables of rank r of n with the store at 127.0.0.1:port.
inline EnvList rank_env(int r, int n, int port, EnvList extra = {}) {
  EnvList e = {{"MASTER_ADDR", "127.0.0.1"},      {"MASTER_PORT", std::to_string(port)},
               {"RANK", std::to_string(r)},       {"WORLD_SIZE", std::to_string(n)},
               {"LOCAL_RANK", std::to_string(r)}, {"LOCAL_WORLD_SIZE", std::to_string(n)}};
  e.insert(e.end(), extra.begin(), extra.end());
  return e;
}

/// `name` in the usual system directories ("" if absent): the tests' PATH may lack the sbin ones.
inline std::string find_tool(const std::string& name) {
  for (const char* dir : {"/usr/sbin", "/sbin", "/usr/bin", "/bin"}) {
    const std::string p = std::string(dir) + "/" + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

/// `s` quoted for sh: 'it'\''s'.
inline std::string sh_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// scripts/torchrun: the torchrun of the libtorch the scripts build against (README.md, "Which
/// libtorch"). `why_not` is "" when it can launch ranks of a build against libtorch `ours`
/// (its torch has the same major version, so torchrun's agent store and the ranks' TCPStore
/// speak one protocol), else the reason, for a skip or a note.
struct Torchrun {
  std::string path, why_not;
};
inline Torchrun torchrun_for(const std::string& ours) {
  Torchrun t;
  t.path = (std::filesystem::path(tl::testing::source_dir()) / "scripts" / "torchrun").string();
  const std::string out = temp_log("torch_version");
  const int rc = std::system((sh_quote(t.path) + " --torch-version >" + sh_quote(out) + " 2>/dev/null").c_str());
  std::string version = read_file(out);
  std::remove(out.c_str());
  while (!version.empty() && (version.back() == '\n' || version.back() == ' ')) version.pop_back();
  const auto major = [](const std::string& v) { return v.substr(0, v.find('.')); };
  if (rc != 0 || version.empty())
    t.why_not = t.path + " has no torch (scripts/setup unpacks the wheel's; Debian: python3-torch)";
  else if (major(version) != major(ours))
    t.why_not = t.path + " runs torch '" + version + "' but tapeline is built against libtorch " + ours +
                ": their TCPStores do not talk (TAPELINE_LIBTORCH chooses both: README.md)";
  return t;
}

}  // namespace tl::testing_mp
