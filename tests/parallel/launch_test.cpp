// The local launcher: N ranks of a program with the torchrun variables, output prefixed per rank,
// a failing or killed rank stops the others (SIGTERM, then SIGKILL after the grace period) and is
// named in the result; ranks it starts can talk through the transport.
#include "parallel/ranks/launch.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <mutex>
#include <set>
#include <tuple>

#include "parallel/ranks/transport.h"
#include "tests/parallel/multiprocess.h"

namespace tl::ranks {
namespace {
using tl::testing_mp::helper_path;

struct Lines {
  std::mutex mutex;
  std::vector<std::tuple<int, bool, std::string>> lines;
  std::string all() {
    std::string s;
    for (auto& [r, err, l] : lines) s += "[rank " + std::to_string(r) + (err ? " err] " : "] ") + l + "\n";
    return s;
  }
  bool has(int rank, bool err, const std::string& text) {
    for (auto& [r, e, l] : lines)
      if (r == rank && e == err && l.find(text) != std::string::npos) return true;
    return false;
  }
};

LaunchOptions options(int n, std::vector<std::string> args, Lines& sink) {
  LaunchOptions o;
  o.nproc = n;
  o.executable = helper_path();
  o.args = std::move(args);
  // Ranks of the "fail" scenario mark themselves up here (see dist_helper.cpp).
  static int counter = 0;
  const std::string up =
      ::testing::TempDir() + "tl_launch_up_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
  ::mkdir(up.c_str(), 0700);
  o.env = {{"TL_UP_DIR", up}};
  o.on_line = [&sink](int rank, bool is_stderr, const std::string& line) {
    std::lock_guard<std::mutex> lock(sink.mutex);
    sink.lines.emplace_back(rank, is_stderr, line);
  };
  return o;
}

#define SKIP_WITHOUT_HELPER() \
  if (helper_path().empty()) GTEST_SKIP() << "parallel_dist_helper was not built"

TEST(Launch, TakeNprocFlag) {
  std::vector<std::string> a = {"train", "--nproc", "4", "--config", "x.ini"};
  EXPECT_EQ(take_nproc_flag(a), 4);
  EXPECT_EQ(a, (std::vector<std::string>{"train", "--config", "x.ini"}));
  a = {"train", "--nproc=2"};
  EXPECT_EQ(take_nproc_flag(a), 2);
  EXPECT_EQ(a, (std::vector<std::string>{"train"}));
  EXPECT_EQ(take_nproc_flag(a), 0);
  for (std::vector<std::string> bad :
       {std::vector<std::string>{"--nproc"}, {"--nproc", "0"}, {"--nproc=x"}, {"--nproc", "2", "--nproc", "3"}}) {
    try {
      take_nproc_flag(bad);
      ADD_FAILURE() << "accepted a bad --nproc";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("--nproc"), std::string::npos);
    }
  }
}

TEST(Launch, EveryRankRunsWithItsVariablesAndPrefixedOutput) {
  SKIP_WITHOUT_HELPER();
  Lines sink;
  const LaunchResult r = launch_local(options(3, {"hello"}, sink));
  EXPECT_TRUE(r.ok()) << r.message << "\n" << sink.all();
  for (int k = 0; k < 3; ++k) {
    EXPECT_TRUE(sink.has(k, false, "hello from rank " + std::to_string(k) + " of 3")) << sink.all();
    EXPECT_TRUE(sink.has(k, false, "second line " + std::to_string(k))) << sink.all();
    // A last line without newline still comes out whole, on stderr.
    EXPECT_TRUE(sink.has(k, true, "stderr of rank " + std::to_string(k))) << sink.all();
  }
}

TEST(Launch, FailingRankStopsTheOthersAndIsNamed) {
  SKIP_WITHOUT_HELPER();
  Lines sink;
  LaunchOptions o = options(3, {"fail", "1", "7"}, sink);
  o.grace_s = 5;
  const LaunchResult r = launch_local(o);
  std::cout << r.message << "\n";
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.failed_rank, 1);
  EXPECT_EQ(r.exit_code, 7);
  EXPECT_EQ(r.signal, 0);
  EXPECT_NE(r.message.find("rank 1 exited with status 7"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("rank 0 was killed by signal 15 (SIGTERM)"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("rank 2 was killed by signal 15 (SIGTERM)"), std::string::npos) << r.message;
  EXPECT_TRUE(sink.has(1, true, "rank 1 failing with status 7")) << sink.all();
  EXPECT_FALSE(sink.has(0, false, "was not stopped")) << sink.all();
  // Each rank saw the variables.
  EXPECT_TRUE(sink.has(2, false, "rank 2 of 3 up")) << sink.all();
  EXPECT_TRUE(sink.has(2, false, "LOCAL_RANK=2")) << sink.all();
}

TEST(Launch, KilledRankIsNamedWithItsSignal) {
  SKIP_WITHOUT_HELPER();
  Lines sink;
  const LaunchResult r = launch_local(options(3, {"fail", "2", "kill"}, sink));
  EXPECT_EQ(r.failed_rank, 2);
  EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_EQ(r.exit_code, 128 + SIGKILL);
  EXPECT_NE(r.message.find("rank 2 was killed by signal 9 (SIGKILL)"), std::string::npos) << r.message;
}

TEST(Launch, RanksIgnoringSigtermAreKilledAfterTheGracePeriod) {
  SKIP_WITHOUT_HELPER();
  Lines sink;
  LaunchOptions o = options(3, {"fail", "1", "5", "stubborn"}, sink);
  o.grace_s = 0.5;
  const LaunchResult r = launch_local(o);
  EXPECT_EQ(r.failed_rank, 1);
  EXPECT_EQ(r.exit_code, 5);
  EXPECT_NE(r.message.find("rank 0 was killed by signal 9 (SIGKILL)"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("then SIGKILL"), std::string::npos) << r.message;
}

TEST(Launch, LaunchedRanksTalkThroughTheTransport) {
  SKIP_WITHOUT_HELPER();
  if (!Transport::available("gloo")) GTEST_SKIP() << "built without c10d's Gloo backend";
  Lines sink;
  LaunchOptions o = options(2, {"exchange", "12"}, sink);
  o.env.emplace_back("TL_TIMEOUT_S", "30");
  const LaunchResult r = launch_local(o);
  EXPECT_TRUE(r.ok()) << r.message << "\n" << sink.all();
  // The launcher hosted the store: every rank connected as a client.
  EXPECT_TRUE(sink.has(0, false, "OK exchange rank 0 agent_store=1 sent=12 received=12")) << sink.all();
  EXPECT_TRUE(sink.has(1, false, "OK exchange rank 1 agent_store=1")) << sink.all();
}

TEST(Launch, RankZeroCanHostTheStore) {
  SKIP_WITHOUT_HELPER();
  if (!Transport::available("gloo")) GTEST_SKIP() << "built without c10d's Gloo backend";
  Lines sink;
  LaunchOptions o = options(2, {"exchange", "4"}, sink);
  o.host_store = false;
  const LaunchResult r = launch_local(o);
  EXPECT_TRUE(r.ok()) << r.message << "\n" << sink.all();
  EXPECT_TRUE(sink.has(0, false, "OK exchange rank 0 agent_store=0")) << sink.all();
  EXPECT_TRUE(sink.has(1, false, "OK exchange rank 1 agent_store=0")) << sink.all();
}

TEST(Launch, BadOptionsAreErrors) {
  LaunchOptions o;
  o.nproc = 0;
  EXPECT_THROW(launch_local(o), c10::Error);
  o.nproc = 1;
  o.executable = "/nonexistent/program";
  try {
    launch_local(o);
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'/nonexistent/program' is not an executable file"), std::string::npos);
  }
}

}  // namespace
}  // namespace tl::ranks
