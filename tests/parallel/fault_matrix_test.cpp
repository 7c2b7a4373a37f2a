// The fault matrix (issue 19; docs/FAULTS.md): 4 ranks of `tapeline train` on Gloo, one of them
// made to fail by dist.inject_fault (parallel/ranks/fault.h) at each phase of a run (rendezvous,
// forward send, backward send, all-reduce, evaluation, checkpoint writing) in each way (killed,
// stopped, exiting with an error, cut off the network, sending a truncated, bit-flipped or
// oversized message). For every case:
//   - every rank exits non-zero (a stopped rank is killed by the test once the others are gone)
//     within dist.timeout_s + kMarginS of the fault (+ kStartS at rendezvous: the others start then);
//   - another rank's error names the faulty rank, the phase and the step;
//   - the checkpoint on disk is the last complete one (epoch 1's) and loads;
//   - after a kill halfway through a checkpoint and in the 2 x 2 grid, `--resume` with 4 processes
//     ends with the uninterrupted run's metrics (mid-step kills: tests/tasks/multiprocess_train_test).
// Each case prints a row "| phase | kind | rank | first exit | last exit | message |" (appended to
// $TL_FAULT_TABLE when set) for docs/FAULTS.md's table.
//
// The network partition runs the ranks in a private network namespace (unshare, as root): the
// faulty rank in one of its own behind a veth pair, whose end it takes down. It is skipped, saying
// why, where that cannot be made. Everything else needs the tapeline executable, c10d's Gloo
// backend and Fashion-MNIST, and skips without them.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "layers/io/checkpoint.h"
#include "layers/io/safetensors.h"
#include "parallel/ranks/rendezvous.h"
#include "parallel/ranks/transport.h"
#include "tasks/data/dataset.h"
#include "tests/parallel/multiprocess.h"
#include "tests/tasks/task_testing.h"

namespace tl {
namespace {
namespace fs = std::filesystem;
namespace mp = tl::testing_mp;
using Clock = std::chrono::steady_clock;
using testing::jsonl_without_times;
using testing::tapeline_path;

constexpr double kTimeoutS = 4;  // dist.timeout_s of the faulty runs
constexpr double kMarginS = 5;   // what "within the timeout" allows on top (a loaded 2-core machine)
constexpr double kStartS = 10;   // at rendezvous, on top: the others' own start-up, which the clock includes
constexpr int kRanks = 4;
constexpr int kStepsPerEpoch = 4;  // train_limit 128 / batch 32

#define REQUIRE_FAULT_MATRIX()                                                                                 \
  if (!fs::exists(tapeline_path())) GTEST_SKIP() << tapeline_path() << " not built (make tapeline)";          \
  if (!ranks::Transport::available("gloo")) GTEST_SKIP() << "built without c10d's Gloo backend (libgloo-dev)"; \
  if (!fs::exists(fs::path(default_dataset_root("fashion-mnist")) / "train-images-idx3-ubyte.gz"))            \
  GTEST_SKIP() << "Fashion-MNIST not installed (Debian package dataset-fashion-mnist)"

// A tiny ResNet-8 in 4 stages, 2 epochs of 4 steps, a checkpoint after each, stateful codecs at the
// boundaries (a resumed run must restore them). `grid` "2x2": 2 stages x 2 replicas with
// error-feedback PowerSGD on the data-parallel gradients.
std::string write_config(const fs::path& dir, const std::string& grid) {
  const fs::path path = dir / "faults.ini";
  std::ofstream f(path);
  f << "[run]\nseed = 5\nthreads = 1\nlog_every = 1\n"
    << "[data]\ndataset = fashion-mnist\ntrain_limit = 128\ntest_limit = 64\n"
    << "[model]\narch = resnet8\nwidth = 0.25\ncuts = " << (grid == "2x2" ? "layer2" : "layer1, layer2, layer3")
    << "\n[train]\nepochs = 2\nbatch_size = 32\nmicro_batches = 4\nlr = 0.05\nmomentum = 0.9\n"
    << "[pipeline]\nschedule = 1f1b\n"
    << "[boundary]\nforward = ef(topk(0.2))\nbackward = quant(bits=8)\n";
  if (grid == "2x2") f << "[parallel]\ndp = 2\n[dp]\ncompression = ef(powersgd(rank=2))\n";
  return path.string();
}

struct Case {
  std::string phase;  // as dist.inject_fault spells it
  int victim;
  int step;
  std::string kind;
  std::string grid = "4";  // "4" (4 stages) or "2x2"
  bool pieces = false;      // every message body of 1 KiB or more in pieces (Note [bodies in pieces])
  std::string fault() const { return std::to_string(victim) + ":" + phase + ":" + std::to_string(step) + ":" + kind; }
};

// What the ranks of one faulty run did.
struct Outcome {
  std::vector<std::string> logs;
  std::vector<int> codes;         // exit codes (-1: killed by a signal, or by the test)
  std::vector<double> exit_s;     // when each rank was seen gone, from the fault (-1: not seen)
  bool fired = false;
  std::string fired_line;
};

// The ranks of one run, started directly (127.0.0.1) or in private network namespaces.
class Ranks {
 public:
  virtual ~Ranks() = default;
  virtual std::string log(int r) const = 0;
  // Exit code of rank r once it is gone; nullopt while it runs.
  virtual std::optional<int> poll(int r) = 0;
  // Ends every rank still there (SIGKILL).
  virtual void kill_all() = 0;
};

class DirectRanks : public Ranks {
 public:
  DirectRanks(const std::vector<std::string>& args, const fs::path& dir) {
    const int port = ranks::find_free_port();
    for (int r = 0; r < kRanks; ++r) {
      logs_.push_back((dir / ("rank" + std::to_string(r) + ".log")).string());
      guard_.pids.push_back(mp::spawn(tapeline_path().string(), args, mp::rank_env(r, kRanks, port), logs_.back()));
    }
    codes_.assign(kRanks, std::nullopt);
  }
  std::string log(int r) const override { return logs_[static_cast<size_t>(r)]; }
  std::optional<int> poll(int r) override {
    auto& c = codes_[static_cast<size_t>(r)];
    int status = 0;
    if (!c && ::waitpid(guard_.pids[static_cast<size_t>(r)], &status, WNOHANG) > 0) c = mp::exit_code(status);
    return c;
  }
  void kill_all() override {
    for (int r = 0; r < kRanks; ++r)
      if (!poll(r)) ::kill(guard_.pids[static_cast<size_t>(r)], SIGKILL);
    for (int r = 0; r < kRanks; ++r)
      while (!poll(r)) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }

 private:
  mp::ProcessGroupGuard guard_;
  std::vector<std::string> logs_;
  std::vector<std::optional<int>> codes_;
};

// Note [partition test]. Everything runs in a new network and PID namespace (unshare; the
// namespace's init is a shell, so killing the unshare process ends every rank). The faulty rank
// runs in a network namespace of its own, joined to the others' by a veth pair (10.91.0.1 on
// tlva, 10.91.0.2 on tlvb); Gloo binds to those interfaces (GLOO_SOCKET_IFNAME), the store is at
// rank 0's address. The shell writes each rank's exit code to rc<r> when it ends.
class PartitionedRanks : public Ranks {
 public:
  // The reason the namespaces cannot be made here, or "".
  static std::string unavailable() {
    if (::geteuid() != 0) return "needs root for network namespaces";
    for (const char* tool : {"unshare", "ip"})
      if (mp::find_tool(tool).empty()) return std::string(tool) + " not found (util-linux, iproute2)";
    const std::string probe = mp::find_tool("unshare") + " --net --pid --fork --mount-proc " + mp::find_tool("ip") +
                              " link add tlva type veth peer name tlvb >/dev/null 2>&1";
    if (std::system(probe.c_str()) != 0) return "cannot create a network namespace with a veth pair here";
    return "";
  }

  PartitionedRanks(const std::vector<std::string>& args, const fs::path& dir, int victim) : dir_(dir) {
    const std::string ip = mp::find_tool("ip"), unshare = mp::find_tool("unshare");
    std::string cmd;
    for (const auto& a : args) cmd += " " + mp::sh_quote(a);
    auto env = [&](int r, const std::string& ifname) {
      // The store is on rank 0, wherever that is.
      std::string e = std::string("env MASTER_ADDR=") + (victim == 0 ? "10.91.0.2" : "10.91.0.1") + " MASTER_PORT=29577 WORLD_SIZE=4 LOCAL_WORLD_SIZE=4 RANK=" +
                      std::to_string(r) + " LOCAL_RANK=" + std::to_string(r) + " GLOO_SOCKET_IFNAME=" + ifname;
      return e + " " + mp::sh_quote(tapeline_path().string()) + cmd;
    };
    std::ostringstream s;
    s << "cd " << mp::sh_quote(dir.string()) << " || exit 1\n"
      << ip << " link set lo up && " << ip << " link add tlva type veth peer name tlvb && " << ip
      << " addr add 10.91.0.1/24 dev tlva && " << ip << " link set tlva up || exit 1\n";
    for (int r = 0; r < kRanks; ++r) {
      const std::string out = "rank" + std::to_string(r) + ".log";
      if (r == victim) {
        // Waits for tlvb to be moved into its namespace, configures it, runs the rank, and stays: the
        // namespace (and with it the veth pair) must outlive the rank, as a real network would.
        const std::string rc = "rc" + std::to_string(r);
        const std::string inner = "while ! " + ip + " link show tlvb >/dev/null 2>&1; do sleep 0.02; done; " + ip +
                                  " link set lo up && " + ip + " addr add 10.91.0.2/24 dev tlvb && " + ip +
                                  " link set tlvb up; " + env(r, "tlvb") + "; echo $? > " + rc + ".tmp; mv " + rc +
                                  ".tmp " + rc + "; exec sleep 3600";
        // tlvb moves once unshare has made the namespace (its pid's differs from ours).
        s << "( " << unshare << " --net sh -c " << mp::sh_quote(inner) << " >" << out << " 2>&1 & p=$!; "
          << "while [ \"$(readlink /proc/$p/ns/net)\" = \"$(readlink /proc/$$/ns/net)\" ]; do sleep 0.01; done; " << ip
          << " link set tlvb netns $p ) &\n";
      } else {
        s << "( " << env(r, "tlva") << " >" << out << " 2>&1; echo $? > rc" << r << ".tmp; mv rc" << r << ".tmp rc"
          << r << " ) &\n";
      }
    }
    // The shell is the PID namespace's init: were it to end, every process in it would go too, the
    // faulty rank perhaps before its exit code was written. It stays until the test kills it.
    s << "wait; exec sleep 86400\n";
    std::ofstream(dir / "ranks.sh") << s.str();
    pid_ = mp::spawn(unshare, {"--net", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", (dir / "ranks.sh").string()},
                     {}, (dir / "ranks.sh.log").string());
    guard_.pids.push_back(pid_);
  }
  std::string log(int r) const override { return (dir_ / ("rank" + std::to_string(r) + ".log")).string(); }
  std::optional<int> poll(int r) override {
    std::ifstream f(dir_ / ("rc" + std::to_string(r)));
    int code = 0;
    if (f >> code) return code;
    return std::nullopt;
  }
  void kill_all() override {
    ::kill(pid_, SIGKILL);  // --kill-child: the namespace's init, and with it every rank
    int st = 0;
    ::waitpid(pid_, &st, 0);
  }

 private:
  fs::path dir_;
  pid_t pid_ = -1;
  mp::ProcessGroupGuard guard_;
};

// Words an error of each phase uses for where it was.
std::vector<std::string> phase_words(const std::string& phase) {
  if (phase == "rendezvous") return {"rendezvous", "connect", "store"};
  if (phase == "forward") return {"forward"};
  if (phase == "backward") return {"backward"};
  if (phase == "allreduce") return {"replica", "loss", "all-reduce", "gradient"};
  if (phase == "evaluate") return {"evaluation"};
  return {"checkpoint"};
}

// The step a fault fired at, from the faulty rank's line ("... step 6, ..." or "after step 5").
std::string fired_step(const std::string& line) {
  for (const std::string key : {"after step ", " step "}) {
    const size_t at = line.find(key);
    if (at == std::string::npos) continue;
    size_t end = at + key.size();
    while (end < line.size() && std::isdigit(static_cast<unsigned char>(line[end]))) ++end;
    if (end > at + key.size()) return line.substr(at + key.size(), end - at - key.size());
  }
  return "";
}

void append_row(const std::string& row) {
  std::cout << row << std::endl;
  if (const char* table = std::getenv("TL_FAULT_TABLE")) std::ofstream(table, std::ios::app) << row << "\n";
}

// What the processes whose command line mentions `dir` are doing (state and each thread's kernel
// wait channel), and so which are left: said when a rank outlives the limit.
std::string processes_in(const fs::path& dir) {
  std::string out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string pid = e.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = mp::read_file((e.path() / "cmdline").string());
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (cmd.find(dir.string()) == std::string::npos) continue;  // the ranks, their shells
    out += "pid " + pid + ": " + cmd.substr(0, 120) + "\n";
    std::istringstream status(mp::read_file((e.path() / "status").string()));
    for (std::string line; std::getline(status, line);)
      if (line.rfind("State:", 0) == 0) out += "  " + line + "\n";
    std::error_code ec;
    for (const auto& t : fs::directory_iterator(e.path() / "task", ec))
      out += "  thread " + t.path().filename().string() + " " + mp::read_file((t.path() / "comm").string()).substr(0, 15) +
             " waits in " + mp::read_file((t.path() / "wchan").string()) + "\n";
  }
  return out;
}

class FaultMatrix : public ::testing::Test {
 protected:
  // The uninterrupted run of `grid` (for the resumes), made once per test.
  const fs::path& reference(const std::string& grid) {
    auto it = references_.find(grid);
    if (it != references_.end()) return it->second;
    const fs::path out = dir_.path() / ("reference_" + grid);
    auto [code, log] = mp::run_to_end(tapeline_path().string(),
                                      {"train", "--config", write_config(dir_.path(), grid), "--out", out.string(),
                                       "--no-plot", "--quiet", "--nproc", "4"},
                                      (dir_.path() / ("reference_" + grid + ".log")).string());
    EXPECT_EQ(code, 0) << log;
    return references_[grid] = out;
  }

  // Runs one case and checks what the header of this file promises.
  void run_case(const Case& c) {
    SCOPED_TRACE("dist.inject_fault = " + c.fault() + " (" + c.grid + ")");
    const fs::path dir = dir_.path() / (c.phase + "_" + c.kind + (c.pieces ? "_pieces" : ""));
    fs::create_directories(dir);
    const fs::path run_dir = dir / "run";
    std::vector<std::string> args = {"train", "--config", write_config(dir, c.grid), "--out", run_dir.string(),
                                     "--no-plot", "--quiet", "--dist.timeout_s=" + std::to_string(kTimeoutS),
                                     "--dist.inject_fault=" + c.fault()};
    if (c.pieces) args.push_back("--dist.pieces_min_bytes=1024");
    std::unique_ptr<Ranks> ranks;
    if (c.kind == "partition")
      ranks = std::make_unique<PartitionedRanks>(args, dir, c.victim);
    else
      ranks = std::make_unique<DirectRanks>(args, dir);

    // Watch: the faulty rank's "injected fault" line starts the clock; then every rank's end.
    Outcome o;
    o.codes.assign(kRanks, -2);
    o.exit_s.assign(kRanks, -1);
    const auto start = Clock::now();
    Clock::time_point fired_at;
    const double limit_s = kTimeoutS + kMarginS + kStartS + 30;  // then it is a hang: kill and fail
    auto done = [&] {
      for (int r = 0; r < kRanks; ++r)
        if (o.exit_s[static_cast<size_t>(r)] < 0 && !(c.kind == "stop" && r == c.victim)) return false;
      return true;
    };
    while (!done()) {
      const auto now = Clock::now();
      if (!o.fired) {
        const std::string vlog = mp::read_file(ranks->log(c.victim));
        const size_t at = vlog.find("injected fault");
        if (at != std::string::npos) {
          o.fired = true, fired_at = now;
          o.fired_line = vlog.substr(vlog.rfind('\n', at) + 1, vlog.find('\n', at) - vlog.rfind('\n', at) - 1);
        }
      }
      for (int r = 0; r < kRanks; ++r) {
        if (o.exit_s[static_cast<size_t>(r)] >= 0) continue;
        if (auto code = ranks->poll(r)) {
          o.codes[static_cast<size_t>(r)] = *code;
          o.exit_s[static_cast<size_t>(r)] =
              o.fired ? std::chrono::duration<double>(now - fired_at).count() : 0.0;
        }
      }
      const double since = std::chrono::duration<double>(now - (o.fired ? fired_at : start)).count();
      if (since > (o.fired ? limit_s : 90)) break;
      if (!o.fired && std::all_of(o.exit_s.begin(), o.exit_s.end(), [](double t) { return t >= 0; })) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::string hung;
    for (int r = 0; r < kRanks; ++r)
      if (o.exit_s[static_cast<size_t>(r)] < 0 && !(c.kind == "stop" && r == c.victim)) {
        hung = processes_in(dir) + "files:";
        for (const auto& e : fs::directory_iterator(dir)) hung += " " + e.path().filename().string();
        hung += "\n";
      }
    ranks->kill_all();  // the stopped rank, or what hung
    for (int r = 0; r < kRanks; ++r) o.logs.push_back(mp::read_file(ranks->log(r)));
    auto all_logs = [&] {
      std::string s;
      for (int r = 0; r < kRanks; ++r) s += "---- rank " + std::to_string(r) + ":\n" + o.logs[static_cast<size_t>(r)];
      return s;
    };

    ASSERT_TRUE(o.fired) << "the fault never fired\n" << all_logs();
    if (c.pieces) {  // the corrupted message was one in pieces ("(CONTEXT, B bytes, in K pieces) had ...")
      EXPECT_NE(o.logs[static_cast<size_t>(c.victim)].find(" pieces) "), std::string::npos) << all_logs();
    }
    double first = 1e9, last = 0;
    for (int r = 0; r < kRanks; ++r) {
      if (c.kind == "stop" && r == c.victim) continue;
      const double t = o.exit_s[static_cast<size_t>(r)];
      EXPECT_GE(t, 0) << "rank " << r << " was still running " << limit_s << " s after the fault\n"
                      << hung << all_logs();
      EXPECT_NE(o.codes[static_cast<size_t>(r)], 0) << "rank " << r << " exited 0\n" << all_logs();
      EXPECT_LE(t, kTimeoutS + kMarginS + (c.phase == "rendezvous" ? kStartS : 0)) << "rank " << r;
      if (r != c.victim) first = std::min(first, t), last = std::max(last, t);
    }

    // Some other rank names the faulty one, the phase and the step.
    const std::string name = "rank " + std::to_string(c.victim), step = fired_step(o.fired_line);
    int naming = -1;
    for (int r = 0; r < kRanks && naming < 0; ++r) {
      if (r == c.victim) continue;
      const std::string& log = o.logs[static_cast<size_t>(r)];
      bool phase = false;
      for (const auto& w : phase_words(c.phase)) phase = phase || log.find(w) != std::string::npos;
      if (log.find(name) != std::string::npos && phase && (step.empty() || log.find("step " + step) != std::string::npos))
        naming = r;
    }
    EXPECT_GE(naming, 0) << "no rank names " << name << ", the phase (" << c.phase << ") and step " << step << "\n"
                         << all_logs();

    // The checkpoint on disk is complete: epoch 1's, or epoch 2's where rank 0 finished writing it
    // after it was cut off the network (and then timed out at the barrier after it).
    const fs::path ckpt = run_dir / "checkpoint.safetensors";
    if (fs::exists(ckpt)) {
      EXPECT_NO_THROW(load_safetensors(ckpt.string())) << "a half-written checkpoint";
      const int64_t at = read_checkpoint_info(ckpt.string()).step;
      const bool written_after_cut = c.phase == "checkpoint" && c.kind == "partition" && c.victim == 0;
      EXPECT_TRUE(at == kStepsPerEpoch || (written_after_cut && at == 2 * kStepsPerEpoch)) << "checkpoint of step " << at;
    } else {
      EXPECT_TRUE(c.phase == "rendezvous" || c.step <= kStepsPerEpoch) << "epoch 1's checkpoint is missing";
    }

    // A rank that raised mid-write removed its temporary file (a killed or stopped one cannot).
    if (c.kind == "exit" && fs::exists(run_dir)) {
      for (const auto& e : fs::directory_iterator(run_dir))
        EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << "left behind: " << e.path();
    }

    // The row of the table, and the message the others saw first.
    std::string message;
    if (naming >= 0) {
      const std::string& log = o.logs[static_cast<size_t>(naming)];
      const size_t at = log.find(name);
      const size_t b = log.rfind('\n', at) == std::string::npos ? 0 : log.rfind('\n', at) + 1;
      message = "rank " + std::to_string(naming) + ": " + log.substr(b, std::min<size_t>(log.find('\n', at), b + 400) - b);
      std::replace(message.begin(), message.end(), '|', '/');
    }
    std::ostringstream row;
    row << std::fixed << std::setprecision(1) << "| " << c.phase << " | " << c.kind << " | " << c.victim
        << (c.grid == "2x2" ? " (2x2)" : "") << (c.pieces ? " (in pieces)" : "") << " | " << first << " s | " << last
        << " s | " << message << " |";
    append_row(row.str());

    // Resumes after a kill mid-step are MultiProcessTrain's (tests/tasks); here those that differ:
    // after rank 0 died halfway through a checkpoint (its temporary file left), and in a grid.
    if (c.kind == "kill" && (c.phase == "checkpoint" || c.grid == "2x2")) resume_matches(c, run_dir);
  }

  // `--resume` with 4 processes ends as the uninterrupted run.
  void resume_matches(const Case& c, const fs::path& run_dir) {
    if (!fs::exists(run_dir / "checkpoint.safetensors")) return;
    const fs::path& ref = reference(c.grid);
    auto [code, log] = mp::run_to_end(tapeline_path().string(),
                                      {"train", "--resume", run_dir.string(), "--nproc", "4", "--no-plot", "--quiet"},
                                      (run_dir.parent_path() / "resume.log").string());
    ASSERT_EQ(code, 0) << log;
    EXPECT_EQ(jsonl_without_times(run_dir), jsonl_without_times(ref));
  }

  // Every kind at `phase`; corruptions from `corrupter` where the victim sends no message.
  void run_phase(const std::string& phase, int victim, int step, const std::string& grid = "4", int corrupter = -1) {
    static const std::string partition_unavailable = PartitionedRanks::unavailable();
    const char* only = std::getenv("TL_FAULT_KINDS");  // e.g. "partition,stop": only these
    for (const std::string kind : {"kill", "stop", "exit", "partition", "truncate", "bitflip", "oversize"}) {
      if (only && *only && ("," + std::string(only) + ",").find("," + kind + ",") == std::string::npos) continue;
      const bool corruption = kind == "truncate" || kind == "bitflip" || kind == "oversize";
      if (phase == "rendezvous" && corruption) continue;  // no message of tapeline's yet
      if (kind == "partition" && !partition_unavailable.empty()) {
        std::cout << "skipped: " << phase << " partition: " << partition_unavailable << std::endl;
        continue;
      }
      run_case({phase, corruption && corrupter >= 0 ? corrupter : victim, step, kind, grid});
      if (HasFatalFailure()) return;
    }
  }

  testing::TempDir dir_;
  std::map<std::string, fs::path> references_;
};

// A rank that never arrives: the others wait dist.timeout_s at the store or the first connection.
TEST_F(FaultMatrix, Rendezvous) {
  REQUIRE_FAULT_MATRIX();
  run_phase("rendezvous", 2, 0);
}

// Stage 1's activation sends in the middle of epoch 2 (step 6).
TEST_F(FaultMatrix, ForwardSend) {
  REQUIRE_FAULT_MATRIX();
  run_phase("forward", 1, 6);
}

// As ForwardSend, the corruptions of a message whose body travels in pieces (from 1 KiB on, where
// 8 MiB is the default): a flipped bit, a cut last piece, an oversized header.
TEST_F(FaultMatrix, ForwardSendInPieces) {
  REQUIRE_FAULT_MATRIX();
  for (const std::string kind : {"truncate", "bitflip", "oversize"}) {
    Case c{"forward", 1, 6, kind};
    c.pieces = true;
    run_case(c);
    if (HasFatalFailure()) return;
  }
}

// Stage 2's gradient sends in the middle of epoch 2.
TEST_F(FaultMatrix, BackwardSend) {
  REQUIRE_FAULT_MATRIX();
  run_phase("backward", 2, 6);
}

// The step's all-reduces in a 2 x 2 grid: rank 3 (stage 1 of replica 1) at the loss tally, or its
// data-parallel gradient message to replica 0 (corruptions).
TEST_F(FaultMatrix, AllReduce) {
  REQUIRE_FAULT_MATRIX();
  run_phase("allreduce", 3, 6, "2x2");
}

// Evaluation after epoch 2 (the first evaluation after step 5): stage 1's activations.
TEST_F(FaultMatrix, Evaluation) {
  REQUIRE_FAULT_MATRIX();
  run_phase("evaluate", 1, 5);
}

// Epoch 2's checkpoint: rank 0, which writes it, halfway through its temporary file; rank 2's part
// on its way to rank 0 (corruptions).
TEST_F(FaultMatrix, CheckpointWriting) {
  REQUIRE_FAULT_MATRIX();
  run_phase("checkpoint", 0, 5, "4", 2);
}


// The corruption soak: 4 ranks on emulated links (1 ms, 200 Mbit/s) for up to TL_SOAK_STEPS steps
// of 16 images (default 150; at most 3,750, Fashion-MNIST's 60,000 images; the issue's soak is
// 2,000), one bit of each message flipped at random after its checksum with probability
// dist.corrupt_rate (TL_SOAK_RATE, default 4e-4: the first corruption a few dozen steps in). For
// each of TL_SOAK_SEEDS seeds (default 1):
//   - the run fails, every rank non-zero, at the first corrupted message: a receiver's error says
//     "body checksum mismatch" (or that the header check failed) and names the sender and the
//     message number that the sender logged as corrupted;
//   - no step at or after the corrupted message's step is in metrics.jsonl: nothing trained on it.
// The control (TL_SOAK_CONTROL=1): the same seed with dist.checksum = false, to see what a
// corrupted message does unchecked (reported, not asserted: it may decode or not).
std::vector<std::string> lines_with(const std::string& log, const std::string& what) {
  std::vector<std::string> out;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);)
    if (line.find(what) != std::string::npos) out.push_back(line);
  return out;
}

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::stoll(v) : fallback;
}

TEST_F(FaultMatrix, CorruptionSoak) {
  REQUIRE_FAULT_MATRIX();
  const int64_t steps = env_int("TL_SOAK_STEPS", 150), seeds = env_int("TL_SOAK_SEEDS", 1);
  const char* rate_env = std::getenv("TL_SOAK_RATE");
  const std::string rate = rate_env && *rate_env ? rate_env : "0.0004";
  const bool control = env_int("TL_SOAK_CONTROL", 0) != 0;
  for (int64_t seed = 1; seed <= seeds; ++seed) {
    for (const bool checksum : {true, false}) {
      if (!checksum && !control) continue;
      SCOPED_TRACE("seed " + std::to_string(seed) + (checksum ? "" : ", no checksum"));
      const fs::path dir = dir_.path() / ("soak" + std::to_string(seed) + (checksum ? "" : "_control"));
      fs::create_directories(dir);
      const fs::path run_dir = dir / "run";
      const std::vector<std::string> args = {
          "train", "--config", write_config(dir, "4"), "--out", run_dir.string(), "--no-plot", "--quiet",
          "--train.epochs=1", "--train.batch_size=16", "--data.train_limit=" + std::to_string(steps * 16),
          "--boundary.latency_ms=1", "--boundary.bandwidth_mbps=200", "--dist.timeout_s=" + std::to_string(kTimeoutS),
          "--dist.corrupt_rate=" + rate, "--dist.corrupt_seed=" + std::to_string(seed),
          "--dist.checksum=" + std::string(checksum ? "true" : "false")};
      DirectRanks ranks(args, dir);
      const auto start = Clock::now();
      std::vector<int> codes(kRanks, -2);
      for (bool running = true; running;) {
        running = false;
        for (int r = 0; r < kRanks; ++r)
          if (auto code = ranks.poll(r)) codes[static_cast<size_t>(r)] = *code;
          else running = true;
        if (std::chrono::duration<double>(Clock::now() - start).count() > 60 + steps * 0.5) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      ranks.kill_all();
      std::string logs;
      std::vector<std::string> injected, caught;
      for (int r = 0; r < kRanks; ++r) {
        const std::string log = mp::read_file(ranks.log(r));
        logs += "---- rank " + std::to_string(r) + ":\n" + log;
        for (auto& l : lines_with(log, "(fault injection)")) injected.push_back(l);
        for (auto& l : lines_with(log, "error:")) caught.push_back(l);
      }
      int64_t last_step = 0;
      {
        std::ifstream f(run_dir / "metrics.jsonl");
        for (std::string line; std::getline(f, line);)
          if (!line.empty()) last_step = std::max<int64_t>(last_step, nlohmann::json::parse(line).value("step", 0));
      }
      if (!checksum) {
        std::cout << "soak control, seed " << seed << ": " << injected.size() << " corrupted message(s), "
                  << "trained to step " << last_step << " of " << steps << ", exit codes " << codes[0] << " "
                  << codes[1] << " " << codes[2] << " " << codes[3]
                  << (caught.empty() ? std::string() : "; first error: " + caught.front().substr(0, 300)) << std::endl;
        continue;
      }
      if (injected.empty()) {  // no message drew a corruption: a clean run
        for (int r = 0; r < kRanks; ++r) EXPECT_EQ(codes[static_cast<size_t>(r)], 0) << logs;
        std::cout << "soak seed " << seed << ": no corruption drawn in " << steps << " steps" << std::endl;
        continue;
      }
      for (int r = 0; r < kRanks; ++r) EXPECT_NE(codes[static_cast<size_t>(r)], 0) << "rank " << r << "\n" << logs;
      // A receiver names a corrupted message: "rank R: receive of message #N from rank S (...)".
      bool matched = false;
      std::string first_step;
      for (const auto& inj : injected) {  // "rank S: message #N to rank R (CONTEXT, B bytes) had bit ..."
        const size_t a = inj.find("rank "), m = inj.find("message #"), t = inj.find(" to rank ");
        if (a == std::string::npos || m == std::string::npos || t == std::string::npos) continue;
        const std::string sender = inj.substr(a + 5, inj.find(':', a) - a - 5);
        const std::string seq = inj.substr(m + 9, inj.find(' ', m + 9) - m - 9);
        const std::string receiver = inj.substr(t + 9, inj.find(' ', t + 9) - t - 9);
        for (const auto& err : caught) {
          if (err.find("rank " + receiver + ": receive of message #" + seq + " from rank " + sender) ==
                  std::string::npos ||
              (err.find("checksum mismatch") == std::string::npos && err.find("header") == std::string::npos))
            continue;
          matched = true;
          first_step = fired_step(inj);
        }
      }
      EXPECT_TRUE(matched) << "no receiver names a corrupted message as corrupt\n" << logs;
      if (!first_step.empty()) {
        EXPECT_LT(last_step, std::stoll(first_step)) << "a step with a corrupted message completed";
      }
      std::cout << "soak seed " << seed << ": " << injected.size() << " corrupted message(s), first at step "
                << (first_step.empty() ? "?" : first_step) << ", caught; metrics end at step " << last_step
                << ", all ranks exited in " << std::fixed << std::setprecision(1)
                << std::chrono::duration<double>(Clock::now() - start).count() << " s from the start" << std::endl;
    }
  }
}

}  // namespace
}  // namespace tl
