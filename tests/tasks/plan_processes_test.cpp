// `tapeline plan` against real processes (docs/TIME.md, "The plan against real processes"): the
// plans of configs/plan/two_replicas_slow_link.ini (two data-parallel replicas) and
// two_tensor_ranks_slow_link.ini (one stage split over two tensor ranks) against
// `tapeline train --nproc 2`, and the plan of configs/plan/two_stage_slow_link.ini (GPT-2 tiny in
// 2 stages, bf16 both ways) against
//  - `tapeline train --nproc 2`: two processes on Gloo over loopback, the link emulated by the
//    receiving transport (Note [link emulation at the receiver]);
//  - two torchrun agents (`--nnodes 2`), one per network namespace, joined by a veth pair whose two
//    ends tc shapes (tbf), nothing emulated.
// Compared like with like: a rank's `wait_s` in the plan is the time its clock waited for messages;
// a process's `comm_s` (metrics.jsonl's rank_times) is the time its interpreter blocked in recv.
// Both are per step; the plan's compute is the `cpu` device model, the processes' is measured.
// Skipped, saying why, without the tapeline executable, Gloo or WordNet, and for the second test
// without root, unshare, ip, tc with tbf, or a torchrun that speaks this libtorch's store.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "parallel/ranks/c10d_compat.h"
#include "parallel/ranks/transport.h"
#include "tasks/runner/plan.h"
#include "tests/parallel/multiprocess.h"
#include "tests/tasks/task_testing.h"

namespace tl {
namespace {
namespace fs = std::filesystem;
namespace mp = tl::testing_mp;

const fs::path kIni = fs::path(testing::source_dir()) / "configs" / "plan" / "two_stage_slow_link.ini";

// Why this machine cannot train the config in two processes, or "".
std::string cannot_run() {
  if (!fs::exists(testing::tapeline_path())) return testing::tapeline_path().string() + " not built (make tapeline)";
  if (!ranks::Transport::available("gloo")) return "built without c10d's Gloo backend (libgloo-dev)";
  if (!fs::exists("/usr/share/wordnet/data.noun")) return "WordNet not found (Debian package wordnet-base)";
  return "";
}

// A run's last epoch, per step: each rank's compute and wait, the step, the bytes each way.
struct Measured {
  double step_s = 0;
  std::vector<double> compute_s, wait_s;
  int64_t bytes_forward = 0, bytes_backward = 0;
};

// A run's last epoch_end record of metrics.jsonl (null: none).
nlohmann::json last_epoch(const fs::path& run) {
  std::ifstream f(run / "metrics.jsonl");
  nlohmann::json last;
  for (std::string line; std::getline(f, line);)
    if (line.find("\"epoch_end\"") != std::string::npos) last = nlohmann::json::parse(line);
  return last;
}

Measured measured(const fs::path& run) {
  const nlohmann::json last = last_epoch(run);
  if (last.is_null()) return {};
  const double steps = last["step"].get<double>();  // one epoch: the global step is its count
  Measured m;
  m.step_s = last["train_time_s"].get<double>() / steps;
  for (const auto& r : last["rank_times"]) {
    m.compute_s.push_back(r["compute_s"].get<double>() / steps);
    m.wait_s.push_back(r["comm_s"].get<double>() / steps);
  }
  m.bytes_forward = last["boundaries"][0]["bytes_forward"].get<int64_t>() / static_cast<int64_t>(steps);
  m.bytes_backward = last["boundaries"][0]["bytes_backward"].get<int64_t>() / static_cast<int64_t>(steps);
  return m;
}

// Prints the plan beside a run; expects each rank's wait within 10% of the plan's, and the bytes
// each way equal (so is each link's busy time, 8 bytes / bandwidth).
void expect_waits_as_planned(const Plan& plan, const Measured& m, const std::string& what) {
  ASSERT_EQ(m.wait_s.size(), plan.rank_plans.size()) << what;
  std::printf("%s, per step: planned step %.4f s, measured %.4f s\n", what.c_str(), plan.step_s, m.step_s);
  std::printf("rank  compute planned  measured   wait planned  measured  ratio\n");
  for (size_t r = 0; r < m.wait_s.size(); ++r) {
    const PlanRank& p = plan.rank_plans[r];
    std::printf("%4zu  %15.4f  %8.4f  %13.4f  %8.4f  %5.3f\n", r, p.compute_s, m.compute_s[r], p.wait_s, m.wait_s[r],
                m.wait_s[r] / p.wait_s);
    EXPECT_NEAR(m.wait_s[r], p.wait_s, 0.1 * p.wait_s) << what << ", rank " << r;
  }
  for (const PlanLink& l : plan.links) EXPECT_EQ(l.forward ? m.bytes_forward : m.bytes_backward, l.bytes) << what;
}

// Emulated links: 4 Mbit/s + 20 ms, a 131 ms message; compute is 2 to 5% of the step. Compute
// slower than the preset delays the peer's messages: at twice the preset (load 9 on 2 cores) the
// waits came out 1 to 2.5% above the plan's.
TEST(PlanAgainstProcesses, LinkWaitsOfTwoProcessesWithinTenPercent) {
  const std::string why = cannot_run();
  if (!why.empty()) GTEST_SKIP() << why;
  const Plan plan = plan_step(Config::load(kIni.string(), {{"timeline.device", "cpu"}}));
  testing::TempDir dir;
  const fs::path run = dir.path() / "run";
  const auto [code, out] = mp::run_to_end(testing::tapeline_path().string(),
                                          {"train", "--config", kIni.string(), "--nproc", "2", "--train.epochs=1",
                                           "--no-plot", "--quiet", "--out", run.string()},
                                          mp::temp_log("plan_nproc2"), 300);
  ASSERT_EQ(code, 0) << out;
  expect_waits_as_planned(plan, measured(run), "--nproc 2 on emulated links");
}

// Note [data parallelism in a plan]: two replicas of a one-stage GPT-2 summing 1.75 MB of
// gradients over an emulated 10 Mbit/s + 20 ms link, about 1.42 s a step against tens of
// milliseconds of compute. A process's comm_s holds its sums (DistExecutor counts them as
// waiting); the plan's rank waits wait_s + dp_sum_s. The bytes are the plan's exactly.
TEST(PlanAgainstProcesses, DataParallelSumsOfTwoReplicasWithinTenPercent) {
  const std::string why = cannot_run();
  if (!why.empty()) GTEST_SKIP() << why;
  const fs::path ini = fs::path(testing::source_dir()) / "configs" / "plan" / "two_replicas_slow_link.ini";
  const Plan plan = plan_step(Config::load(ini.string(), {{"timeline.device", "cpu"}}));
  ASSERT_EQ(plan.replicas, 2);
  ASSERT_EQ(plan.rank_plans.size(), 1u);
  testing::TempDir dir;
  const fs::path run = dir.path() / "run";
  const auto [code, out] =
      mp::run_to_end(testing::tapeline_path().string(),
                     {"train", "--config", ini.string(), "--nproc", "2", "--no-plot", "--quiet", "--out", run.string()},
                     mp::temp_log("plan_dp2"), 300);
  ASSERT_EQ(code, 0) << out;
  const nlohmann::json last = last_epoch(run);
  ASSERT_FALSE(last.is_null()) << out;
  const double steps = last["step"].get<double>();
  const PlanRank& p = plan.rank_plans[0];
  EXPECT_EQ(last["bytes_dp"].get<int64_t>(), static_cast<int64_t>(steps) * 2 * p.dp_bytes);
  const double planned = p.wait_s + p.dp_sum_s;
  std::printf("two replicas, per step: planned sums %.4f s (%lld bytes a rank), step %.4f s\n", p.dp_sum_s,
              static_cast<long long>(p.dp_bytes), plan.step_s);
  for (const auto& r : last["rank_times"]) {
    const double wait = r["comm_s"].get<double>() / steps;
    std::printf("replica wait: planned %.4f s, measured %.4f s, ratio %.3f\n", planned, wait, wait / planned);
    EXPECT_NEAR(wait, planned, 0.1 * planned);
  }
}

// Note [tensor parallelism in a plan]: one stage of GPT-2 tiny split over two tensor ranks whose
// blocks all-reduce 256 KiB sums over an emulated 10 Mbit/s + 20 ms link, uncompressed and through
// quant(bits=8) both ways. bytes_tp (every rank's) is the plan's tensor rank 0's times the two
// ranks, exactly; a process counts its all-reduces as compute, so its compute_s is compared with the
// plan's (the cpu model's compute plus tp_s), within 10%.
TEST(PlanAgainstProcesses, TensorParallelAllReducesOfTwoTensorRanks) {
  const std::string why = cannot_run();
  if (!why.empty()) GTEST_SKIP() << why;
  const fs::path ini = fs::path(testing::source_dir()) / "configs" / "plan" / "two_tensor_ranks_slow_link.ini";
  testing::TempDir dir;
  for (const std::string codec : {"identity", "quant(bits=8)"}) {
    SCOPED_TRACE(codec);
    const Plan plan = plan_step(
        Config::load(ini.string(), {{"timeline.device", "cpu"}, {"tp.forward", codec}, {"tp.backward", codec}}));
    ASSERT_EQ(plan.tensor, 2);
    ASSERT_EQ(plan.rank_plans.size(), 1u);
    const PlanRank& p = plan.rank_plans[0];
    const fs::path run = dir.path() / ("run-" + std::to_string(codec.size()));
    const auto [code, out] = mp::run_to_end(testing::tapeline_path().string(),
                                            {"train", "--config", ini.string(), "--nproc", "2", "--tp.forward=" + codec,
                                             "--tp.backward=" + codec, "--no-plot", "--quiet", "--out", run.string()},
                                            mp::temp_log("plan_tp2"), 300);
    ASSERT_EQ(code, 0) << out;
    const nlohmann::json last = last_epoch(run);
    ASSERT_FALSE(last.is_null()) << out;
    const double steps = last["step"].get<double>();
    EXPECT_EQ(last["bytes_tp"].get<int64_t>(), static_cast<int64_t>(steps) * 2 * p.tp_bytes);
    std::printf(
        "%s: planned %lld all-reduces a step, %lld bytes in %lld messages a tensor rank, %.4f s on the link; "
        "measured %lld bytes a step (both ranks)\n",
        codec.c_str(), static_cast<long long>(p.tp_all_reduces), static_cast<long long>(p.tp_bytes),
        static_cast<long long>(p.tp_messages), p.tp_s,
        static_cast<long long>(last["bytes_tp"].get<int64_t>() / static_cast<int64_t>(steps)));
    for (const auto& r : last["rank_times"]) {
      const double compute = r["compute_s"].get<double>() / steps;
      std::printf("tensor rank compute (with the all-reduces): planned %.4f s, measured %.4f s, ratio %.3f\n",
                  p.compute_s, compute, compute / p.compute_s);
      EXPECT_NEAR(compute, p.compute_s, 0.1 * p.compute_s);
    }
  }
}

// ---- two nodes on a shaped veth link ----------------------------------------------------------------

struct Tools {
  std::string unshare, ip, tc;
};

// Why two namespaces cannot be joined by a veth pair shaped with `qdisc` here, or "".
std::string cannot_shape(const Tools& t, const std::string& qdisc) {
  if (::geteuid() != 0) return "needs root, to create network namespaces and run tc";
  if (t.unshare.empty() || t.ip.empty() || t.tc.empty()) return "no unshare (util-linux), ip or tc (iproute2)";
  const std::string log = mp::temp_log("veth_probe");
  mp::ProcessGroupGuard guard;
  guard.pids.push_back(
      mp::spawn(t.unshare,
                {"--net", "sh", "-c",
                 t.ip + " link add va type veth peer name vb && " + t.tc + " qdisc add dev va root " + qdisc},
                {}, log));
  const int code = mp::exit_code(mp::wait_or_kill(guard.pids[0], 30));
  const std::string out = mp::read_file(log);
  std::remove(log.c_str());
  if (code != 0)
    return "a veth pair shaped by `tc qdisc add dev va root " + qdisc + "` fails in a new network namespace: " + out;
  return "";
}

// Note [two nodes on a veth pair]. The test's shell is the first process of new network, pid and
// mount namespaces (node 0); killing its unshare kills everything under it, node 1 included. It
// makes the veth pair va (10.77.0.1, node 0) - vb (10.77.0.2), starts node 1's shell in a network
// namespace of its own, moves vb there, and each end shapes its egress with tbf: one link per
// direction, as the plan's pipelined links. Each node runs a torchrun agent (--nnodes 2, one
// process; node 0 hosts the store); Gloo binds the veth (GLOO_SOCKET_IFNAME). Node 1 keeps its
// namespace (and so the pair) until node 0 has printed tc's statistics.
// Rate only: this kernel has no netem to add a delay, and over a delayed link each message would
// also wait for Gloo's recv-ready notice (Note [shaped loopback vs emulated link] in
// tests/parallel/netns_test.cpp), which the plan's links do not model.
std::string two_node_script(const Tools& t, const std::string& qdisc, const std::string& torchrun,
                            const std::vector<std::string>& train_args, const fs::path& dir) {
  std::string train;
  for (const auto& a : train_args) train += " " + mp::sh_quote(a);
  auto agent = [&](int node, const std::string& ifname) {
    return "GLOO_SOCKET_IFNAME=" + ifname + " " + mp::sh_quote(torchrun) + " --nnodes 2 --node_rank " +
           std::to_string(node) + " --nproc_per_node 1 --master_addr 10.77.0.1 --master_port 29500 --no_python " +
           mp::sh_quote(testing::tapeline_path().string()) + train;
  };
  // Waits at most 30 s for a file.
  auto await = [&](const std::string& file) {
    return "for i in $(seq 600); do [ -e " + mp::sh_quote((dir / file).string()) + " ] && break; sleep 0.05; done\n";
  };
  const std::string d = mp::sh_quote(dir.string());
  const std::string node1 = "set -e\n" + t.ip + " link set lo up\nfor i in $(seq 600); do " + t.ip +
                            " link show vb >/dev/null 2>&1 && break; sleep 0.05; done\n" + t.ip +
                            " addr add 10.77.0.2/24 dev vb\n" + t.ip + " link set vb up\n" + t.tc +
                            " qdisc add dev vb root " + qdisc + "\ns=0\n" + agent(1, "vb") + " || s=$?\necho $s >" + d +
                            "/node1.status\n" + await("stats.done") + "exit $s\n";
  return "set -e\n" + t.ip + " link set lo up\n" + t.ip + " link add va type veth peer name vb\n" + t.ip +
         " addr add 10.77.0.1/24 dev va\n" + t.ip + " link set va up\n" + t.tc + " qdisc add dev va root " + qdisc +
         "\n" + t.unshare + " --net sh -c " + mp::sh_quote(node1) + " >" + d + "/node1.log 2>&1 & p1=$!\n" +
         "me=$(readlink /proc/self/ns/net)\n"
         "while [ \"$(readlink /proc/$p1/ns/net)\" = \"$me\" ]; do sleep 0.02; done\n" +
         t.ip + " link set vb netns $p1\ns0=0\n" + agent(0, "va") + " >" + d + "/node0.log 2>&1 || s0=$?\n" +
         await("node1.status") + t.tc + " -s qdisc show dev va\ntouch " + d + "/stats.done\n" +
         "s1=0; wait $p1 || s1=$?\n"
         "echo \"node 0 exited with $s0, node 1 with $s1\"\n"
         "[ $s0 -eq 0 ] && [ $s1 -eq 0 ]\n";
}

// 4 Mbit/s each way (tbf), no delay. The plan's links get the veth's goodput: tbf counts the 66
// bytes of Ethernet, IP and TCP headers of each 1448-byte segment (Note [shaped loopback vs
// emulated link]), so 4 x 1448 / 1514 Mbit/s, latency 0. The same link emulated over loopback
// (`--nproc 2`) is the third run. On the shaped link the tied embedding's gradient sum (128 KiB,
// Note [tied sums in a plan]) crosses the link too: the shaped step is the plan's step plus
// tied_sum_s, the emulated one (its sum on loopback) the plan's step.
TEST(PlanAgainstProcesses, TwoNodesOnAShapedVethLink) {
  std::string why = cannot_run();
  if (!why.empty()) GTEST_SKIP() << why;
  const Tools t{mp::find_tool("unshare"), mp::find_tool("ip"), mp::find_tool("tc")};
  const std::string qdisc = "tbf rate 4mbit burst 4000 limit 1000000";
  why = cannot_shape(t, qdisc);
  if (!why.empty()) GTEST_SKIP() << why;
  const mp::Torchrun torchrun = mp::torchrun_for(ranks::compat::torch_version());
  if (!torchrun.why_not.empty()) GTEST_SKIP() << torchrun.why_not;

  const std::string goodput = std::to_string(4.0 * 1448 / 1514);
  const Plan plan = plan_step(Config::load(
      kIni.string(), {{"timeline.device", "cpu"}, {"boundary.bandwidth_mbps", goodput}, {"boundary.latency_ms", "0"}}));
  testing::TempDir dir;
  const std::vector<std::string> common = {"train",     "--config", kIni.string(), "--train.epochs=1",
                                           "--no-plot", "--quiet"};
  // The shaped link: nothing emulated.
  std::vector<std::string> shaped_args = common;
  for (const char* a : {"--boundary.bandwidth_mbps=0", "--boundary.latency_ms=0", "--out"}) shaped_args.push_back(a);
  shaped_args.push_back((dir.path() / "shaped").string());
  const std::string script = two_node_script(t, qdisc, torchrun.path, shaped_args, dir.path());
  mp::ProcessGroupGuard guard;
  const std::string log = mp::temp_log("two_nodes");
  guard.pids.push_back(
      mp::spawn(t.unshare, {"--net", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c", script}, {}, log));
  const int code = mp::exit_code(mp::wait_or_kill(guard.pids[0], 180));
  const std::string shell = mp::read_file(log);
  std::remove(log.c_str());
  auto node_logs = [&] {
    return "--- node 0:\n" + mp::read_file((dir.path() / "node0.log").string()) + "--- node 1:\n" +
           mp::read_file((dir.path() / "node1.log").string());
  };
  ASSERT_EQ(code, 0) << shell << node_logs();
  std::printf("%s", shell.c_str());  // tc's statistics: bytes and packets through va (node 0 -> node 1)
  const Measured shaped = measured(dir.path() / "shaped");
  expect_waits_as_planned(plan, shaped, "two nodes on a tbf-shaped veth pair");

  // The same link emulated over loopback.
  std::vector<std::string> emulated_args = common;
  for (const char* a : {"--nproc", "2", "--boundary.latency_ms=0", "--out"}) emulated_args.push_back(a);
  emulated_args.push_back((dir.path() / "emulated").string());
  emulated_args.push_back("--boundary.bandwidth_mbps=" + goodput);
  const auto [ecode, eout] =
      mp::run_to_end(testing::tapeline_path().string(), emulated_args, mp::temp_log("two_nodes_emulated"), 300);
  ASSERT_EQ(ecode, 0) << eout;
  const Measured emulated = measured(dir.path() / "emulated");
  expect_waits_as_planned(plan, emulated, "the same link emulated (--nproc 2)");
  std::printf("step: planned %.4f s + tied sum %.4f s = %.4f s; shaped %.4f s; emulated %.4f s (+ tied sum %.4f s)\n",
              plan.step_s, plan.tied_sum_s, plan.step_s + plan.tied_sum_s, shaped.step_s, emulated.step_s,
              emulated.step_s + plan.tied_sum_s);
  EXPECT_NEAR(shaped.step_s, plan.step_s + plan.tied_sum_s, 0.15 * (plan.step_s + plan.tied_sum_s));
  EXPECT_NEAR(shaped.step_s, emulated.step_s + plan.tied_sum_s, 0.15 * shaped.step_s);
}

}  // namespace
}  // namespace tl
