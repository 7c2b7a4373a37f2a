// A loopback shaped by tc against the transport's link emulation (parallel/link.h). Two ranks of
// parallel_dist_helper run the `timed` ping-pong inside a private network namespace whose loopback
// tc shapes (netem delay and rate; tbf rate alone in a second test, for kernels without netem), then
// inside a second, unshaped namespace with the transport emulating the same link (TL_LINK_MBPS,
// TL_LINK_MS). Per message size, the two one-way times must agree within 20%. Needs root, unshare
// and tc, and the qdisc in the kernel; skips naming what is missing otherwise.
//
// Each namespace is also a pid namespace whose first process is the shell running the ranks, so
// killing its unshare process (the hang guard, ProcessGroupGuard) kills every process in it, and the
// network namespace goes with them. A private namespace also means the port cannot collide.
//
// Note [shaped loopback vs emulated link]. What is compared: per message size, the median over 10
// messages of the time from the sender's stamp (taken in Transport::send) to Transport::recv
// returning on the receiver, in a ping-pong (dist_helper.cpp, Note [one-way times]).
//  - Emulated: the receiver sleeps until stamp + latency + 8 n / bandwidth (Note [the link model];
//    the link is idle, no queueing); the unshaped loopback's own ~0.1 ms is hidden in that.
//  - netem on lo, "delay D rate R": a packet enqueued at t leaves at
//    max(t + D, departure of the packet queued before it) + length / R. A message whose packets TCP
//    hands over at once (Gloo sets TCP_NODELAY; 5 warm-up rounds open TCP's windows first) is
//    complete at D + bytes / R: the same, its bytes counting ~150 of headers (the frame's header,
//    Gloo's preamble, TCP/IP), 0.03 ms at 40 Mbit/s.
//  - Both directions of lo pass its one qdisc: the acks (the helper's and TCP's) are delayed and
//    rate-limited too, sharing the rate with the data. In a ping-pong they never overlap a measured
//    message, so a link per direction (what the transport emulates: `link` applies to every peer)
//    describes them.
//  - Why not a stream: Gloo transmits a send only once the receiver's recv has been announced to
//    it, and the transport posts the next frame recv when the previous message is complete. Over a
//    real link of one-way delay D, a stream is therefore stop-and-wait, D + transmission + D (the
//    announcement's way back) per message, and a body over 128 KiB (its recv posted once its header
//    has arrived) costs 2 D more, while the emulation models a pipelined link without handshakes.
//    In the ping-pong the announcement is there before the next send, and messages up to 128 KiB
//    travel inside their frame: one crossing, both sides. (So the emulation is optimistic for
//    streams and large bodies over long delays: it emulates the network, not Gloo's handshakes.)
//  - tbf, rate only: lo's MTU is set to 1500 so that every packet fits tbf's small bucket (4000
//    bytes, the 0.8 ms at 40 Mbit/s a message gets for free); tbf splits TCP's larger segments.
//    At this MTU tbf counts 66 bytes of Ethernet/IP/TCP headers per 1448-byte segment, while the
//    emulation counts bodies only: its bandwidth is goodput. So the emulated link gets the goodput
//    of the shaped one, 40 Mbit/s * 1448 / 1514 (with 40 Mbit/s the shaped times came out 6-10%
//    longer). What remains, ~2.5%, is TCP's ACKs, one per two segments, passing the same qdisc the
//    other way (tc -s qdisc, printed on failure, counts bytes and packets). With netem, lo keeps
//    its 64 KiB MTU and both costs are ~0.1%.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "parallel/ranks/transport.h"
#include "parallel/link.h"
#include "tests/parallel/multiprocess.h"

namespace tl::ranks {
namespace {
using namespace tl::testing_mp;

struct Tools {
  std::string unshare, ip, tc;
};

struct Outcome {
  int code = -1;  // exit code; -1: killed by the hang guard
  std::string log;
};

// Runs `sh -c script` as the first process of new network, pid and mount namespaces (the latter for
// a /proc showing the namespace's pids, which the transport reads), bounded by limit_s.
Outcome in_new_namespaces(const Tools& tools, const std::string& name, const std::string& script,
                          const EnvList& env = {}, double limit_s = 30) {
  ProcessGroupGuard guard;
  const std::string log = temp_log("netns_" + name);
  guard.pids.push_back(
      spawn(tools.unshare, {"--net", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c", script}, env, log));
  Outcome out;
  out.code = exit_code(wait_or_kill(guard.pids[0], limit_s));
  out.log = read_file(log);
  std::remove(log.c_str());
  return out;
}

// Why this machine cannot shape a private loopback with `qdisc`, or "" when it can.
std::string cannot_shape(const Tools& tools, const std::string& qdisc) {
  if (!Transport::available("gloo")) return "tapeline was built without c10d's Gloo backend";
  if (helper_path().empty()) return "parallel_dist_helper was not built";
  if (::geteuid() != 0) return "needs root, to create network namespaces and run tc";
  if (tools.unshare.empty()) return "no unshare (util-linux) in /usr/sbin, /sbin, /usr/bin, /bin";
  if (tools.ip.empty() || tools.tc.empty()) return "no ip or tc (iproute2) in /usr/sbin, /sbin, /usr/bin, /bin";
  Outcome o = in_new_namespaces(tools, "probe_unshare", "true");
  if (o.code != 0) return "cannot create namespaces (unshare --net --pid --fork --kill-child --mount-proc): " + o.log;
  const std::string add = "tc qdisc add dev lo root " + qdisc;
  o = in_new_namespaces(tools, "probe_tc",
                        tools.ip + " link set lo up && " + tools.tc + " qdisc add dev lo root " + qdisc);
  if (o.code != 0)
    return "`" + add + "` fails in a new network namespace" +
           (o.log.find("unknown") != std::string::npos ? " (this kernel lacks the qdisc)" : "") + ": " + o.log;
  return "";
}

struct TimedRun {
  Outcome sh;                          // the shell: the exit codes of the ranks, tc's statistics
  std::string rank_logs;               // both ranks' output
  std::map<int64_t, double> median_s;  // rank 1's TIMED lines: median one-way time by message size
};

// rank 1's "TIMED bytes=B ... median_s=M ..." lines.
std::map<int64_t, double> parse_timed(const std::string& log) {
  std::map<int64_t, double> out;
  size_t at = 0;
  while ((at = log.find("TIMED bytes=", at)) != std::string::npos) {
    const size_t end = log.find('\n', at);
    const std::string line = log.substr(at, end - at);
    const size_t m = line.find("median_s=");
    if (m != std::string::npos) out[std::stoll(line.substr(12))] = std::stod(line.substr(m + 9));
    at = end;
  }
  return out;
}

// Runs the helper's `timed COUNT SIZES...` as 2 ranks in one new network namespace whose loopback
// `setup` (shell commands, may be empty) has shaped; `env` is added to both ranks' environment.
TimedRun run_timed(const Tools& tools, const std::string& name, const std::string& setup, int count,
                   const std::vector<int64_t>& sizes, const EnvList& env) {
  std::string args = "timed " + std::to_string(count);
  for (int64_t n : sizes) args += " " + std::to_string(n);
  std::string logs[2], script = "set -e\n" + tools.ip + " link set lo up\n" + setup + "\n";
  for (int r = 0; r < 2; ++r) {
    logs[r] = temp_log("netns_" + name + "_rank" + std::to_string(r));
    script += "RANK=" + std::to_string(r) + " LOCAL_RANK=" + std::to_string(r) + " " + sh_quote(helper_path()) + " " +
              args + " >" + sh_quote(logs[r]) + " 2>&1 & p" + std::to_string(r) + "=$!\n";
  }
  script +=
      "s0=0; wait $p0 || s0=$?\n"
      "s1=0; wait $p1 || s1=$?\n" +
      tools.tc +
      " -s qdisc show dev lo\n"
      "echo \"rank 0 exited with $s0, rank 1 with $s1\"\n"
      "[ $s0 -eq 0 ] && [ $s1 -eq 0 ]\n";
  // The namespace is private: any port will do. Each rank bounds its waits (TL_TIMEOUT_S), and the
  // hang guard the whole run.
  EnvList e = {{"MASTER_ADDR", "127.0.0.1"},
               {"MASTER_PORT", "29500"},
               {"WORLD_SIZE", "2"},
               {"LOCAL_WORLD_SIZE", "2"},
               {"TL_TIMEOUT_S", "20"}};
  e.insert(e.end(), env.begin(), env.end());
  TimedRun run;
  run.sh = in_new_namespaces(tools, name, script, e, 60);
  for (int r = 0; r < 2; ++r) {
    run.rank_logs += "--- rank " + std::to_string(r) + ":\n" + read_file(logs[r]);
    std::remove(logs[r].c_str());
  }
  run.median_s = parse_timed(run.rank_logs);
  return run;
}

// Note [shaped loopback vs emulated link]: the same ping-pong over a loopback with `qdisc` (and MTU
// `mtu`, when > 0) and over an unshaped one with `link` emulated; the one-way times agree within 20%
// for every size.
void expect_shaped_like_emulated(const Tools& tools, const std::string& name, const std::string& qdisc, int mtu,
                                 const LinkSpec& link, const std::vector<int64_t>& sizes) {
  const int count = 10;
  std::string setup = tools.tc + " qdisc add dev lo root " + qdisc;
  if (mtu > 0) setup = tools.ip + " link set lo mtu " + std::to_string(mtu) + "\n" + setup;
  const TimedRun shaped = run_timed(tools, name + "_shaped", setup, count, sizes, {});
  ASSERT_EQ(shaped.sh.code, 0) << shaped.sh.log << shaped.rank_logs;
  const TimedRun emulated = run_timed(
      tools, name + "_emulated", "", count, sizes,
      {{"TL_LINK_MBPS", std::to_string(link.bandwidth_mbps)}, {"TL_LINK_MS", std::to_string(link.latency_ms)}});
  ASSERT_EQ(emulated.sh.code, 0) << emulated.sh.log << emulated.rank_logs;
  std::printf("one-way time of a message, median of %d (tc: %s%s; emulated: %s)\n", count, qdisc.c_str(),
              mtu > 0 ? (", mtu " + std::to_string(mtu)).c_str() : "", link.describe().c_str());
  std::printf("%10s %12s %12s %8s\n", "bytes", "tc (ms)", "emulated", "ratio");
  for (int64_t n : sizes) {
    ASSERT_TRUE(shaped.median_s.count(n) && emulated.median_s.count(n)) << shaped.rank_logs << emulated.rank_logs;
    const double real = shaped.median_s.at(n), emu = emulated.median_s.at(n);
    std::printf("%10lld %12.2f %12.2f %8.3f\n", (long long)n, real * 1e3, emu * 1e3, real / emu);
    EXPECT_LE(std::abs(real / emu - 1.0), 0.2)
        << n << " bytes: " << real << " s on the shaped loopback, " << emu << " s emulated\n--- shaped:\n"
        << shaped.sh.log << shaped.rank_logs << "--- emulated:\n"
        << emulated.rank_logs;
  }
}

Tools tools() { return {find_tool("unshare"), find_tool("ip"), find_tool("tc")}; }

// 25 ms and 40 Mbit/s: 1 KiB costs ~25 ms (latency), 128 KiB ~51 ms (half of it transmission).
TEST(NetnsLoopback, NetemDelayAndRateMatchLinkEmulation) {
  const Tools t = tools();
  const std::string qdisc = "netem delay 25ms rate 40mbit limit 10000";
  const std::string why = cannot_shape(t, qdisc);
  if (!why.empty()) GTEST_SKIP() << why;
  expect_shaped_like_emulated(t, "netem", qdisc, 0, LinkSpec{40, 25}, {1024, 128 << 10});
}

// Rate alone (tbf), for kernels without netem: 128 KiB costs ~27 ms, 512 KiB (a separate body) ~110 ms.
TEST(NetnsLoopback, TbfRateMatchesLinkEmulation) {
  const Tools t = tools();
  const std::string qdisc = "tbf rate 40mbit burst 4000 limit 1000000";
  const std::string why = cannot_shape(t, qdisc);
  if (!why.empty()) GTEST_SKIP() << why;
  const LinkSpec goodput{40.0 * 1448 / 1514, 0};  // Note [shaped loopback vs emulated link]
  expect_shaped_like_emulated(t, "tbf", qdisc, 1500, goodput, {128 << 10, 512 << 10});
}

}  // namespace
}  // namespace tl::ranks
