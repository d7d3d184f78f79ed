// torchrun's variables are validated before anything connects: each bad or missing one is named.
#include <gtest/gtest.h>

#include <map>
#include <stdexcept>
#include <string>

#include "distributed/torchrun_env.h"

namespace {

using shardwise::distributed::read_torchrun_env;

std::function<const char*(const char*)> env_of(const std::map<std::string, std::string>& vars) {
  return [vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

std::map<std::string, std::string> torchrun_vars() {
  return {{"RANK", "3"},
          {"WORLD_SIZE", "4"},
          {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"MASTER_ADDR", "10.0.0.1"},
          {"MASTER_PORT", "29511"}};
}

std::string error_of(const std::map<std::string, std::string>& vars) {
  try {
    read_torchrun_env(env_of(vars));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(TorchrunEnv, ReadsEveryVariable) {
  auto env = read_torchrun_env(env_of(torchrun_vars()));
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "10.0.0.1");
  EXPECT_EQ(env.master_port, 29511);
  EXPECT_FALSE(env.use_agent_store);
}

TEST(TorchrunEnv, LocalRankDefaultsFromRankAndAgentStoreIsRecognised) {
  auto vars = torchrun_vars();
  vars.erase("LOCAL_RANK");
  vars.erase("LOCAL_WORLD_SIZE");
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  vars["TORCHELASTIC_RESTART_COUNT"] = "2";
  auto env = read_torchrun_env(env_of(vars));
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.local_rank, 3);
  EXPECT_TRUE(env.use_agent_store);
  EXPECT_EQ(env.restart_count, 2);
}

TEST(TorchrunEnv, MissingVariablesAreNamedWithTheFix) {
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    auto vars = torchrun_vars();
    vars.erase(name);
    const std::string error = error_of(vars);
    EXPECT_NE(error.find(std::string(name) + " is not set"), std::string::npos) << error;
    EXPECT_NE(error.find("torchrun"), std::string::npos) << error;
  }
}

TEST(TorchrunEnv, BadValuesAreNamed) {
  const std::map<std::string, std::string> bad{{"RANK", "4"},        {"RANK", "-1"},
                                               {"WORLD_SIZE", "0"},  {"MASTER_PORT", "70000"},
                                               {"MASTER_PORT", "x"}, {"LOCAL_RANK", "2"}};
  for (const auto& [name, value] : bad) {
    auto vars = torchrun_vars();
    vars[name] = value;
    const std::string error = error_of(vars);
    EXPECT_NE(error.find(name + "='" + value + "'"), std::string::npos) << error;
  }
  auto vars = torchrun_vars();
  vars["RANK"] = "1x";
  EXPECT_NE(error_of(vars).find("RANK='1x'"), std::string::npos);
}

}  // namespace
