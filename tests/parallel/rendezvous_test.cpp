// DistEnv: the torchrun variables, parsed with errors that name the variable and what is accepted.
#include "parallel/ranks/rendezvous.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <map>

namespace tl::ranks {
namespace {

DistEnv parse(const std::map<std::string, std::string>& vars) {
  return DistEnv::from_lookup([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::string error_of(const std::map<std::string, std::string>& vars) {
  try {
    parse(vars);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

const std::map<std::string, std::string> kTorchrun = {{"RANK", "1"},
                                                      {"WORLD_SIZE", "4"},
                                                      {"LOCAL_RANK", "1"},
                                                      {"LOCAL_WORLD_SIZE", "2"},
                                                      {"MASTER_ADDR", "10.0.0.5"},
                                                      {"MASTER_PORT", "29500"},
                                                      {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                                      {"TORCHELASTIC_RESTART_COUNT", "2"}};

TEST(DistEnv, ReadsTheTorchrunVariables) {
  const DistEnv e = parse(kTorchrun);
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "10.0.0.5");
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_TRUE(e.agent_store);
  EXPECT_EQ(e.store_prefix(), "tapeline/attempt_2");
  EXPECT_EQ(e.describe(), "rank 1/4 (local 1/2), store 10.0.0.5:29500 hosted by the launcher's agent");
}

TEST(DistEnv, OptionalVariablesDefaultToOneMachine) {
  const DistEnv e = parse({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "localhost"}, {"MASTER_PORT", "1234"}});
  EXPECT_EQ(e.local_rank, 3);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_FALSE(e.agent_store);
  EXPECT_EQ(e.restart_count, 0);
  auto f = kTorchrun;
  f["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_FALSE(parse(f).agent_store);
}

TEST(DistEnv, ErrorsNameTheVariableAndWhatIsAccepted) {
  auto with = [](std::string k, std::string v) {
    auto m = kTorchrun;
    if (v.empty())
      m.erase(k);
    else
      m[k] = v;
    return m;
  };
  EXPECT_NE(error_of(with("MASTER_PORT", "")).find("MASTER_PORT is not set: launch with torchrun"), std::string::npos);
  EXPECT_NE(error_of(with("RANK", "")).find("RANK is not set"), std::string::npos);
  EXPECT_NE(error_of(with("RANK", "4")).find("RANK=4 is not below WORLD_SIZE=4"), std::string::npos);
  EXPECT_NE(error_of(with("RANK", "one")).find("RANK='one' is not an integer"), std::string::npos);
  EXPECT_NE(error_of(with("MASTER_PORT", "70000")).find("MASTER_PORT=70000 is out of range: accepted 1..65535"),
            std::string::npos);
  EXPECT_NE(error_of(with("WORLD_SIZE", "0")).find("WORLD_SIZE=0 is out of range"), std::string::npos);
  EXPECT_NE(error_of(with("LOCAL_RANK", "2")).find("LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"), std::string::npos);
  EXPECT_NE(error_of(with("TORCHELASTIC_USE_AGENT_STORE", "yes")).find("accepted True/False"), std::string::npos);
  EXPECT_NE(error_of(with("MASTER_ADDR", "")).find("MASTER_ADDR is not set"), std::string::npos);
}

TEST(DistEnv, FreePortAndLoopback) {
  const int p = find_free_port();
  EXPECT_GT(p, 0);
  EXPECT_LE(p, 65535);
  EXPECT_TRUE(is_loopback_address("127.0.0.1"));
  EXPECT_TRUE(is_loopback_address("localhost"));
  EXPECT_FALSE(is_loopback_address("10.0.0.5"));
}

}  // namespace
}  // namespace tl::ranks
