#include "distributed/torchrun_env.h"

#include <cerrno>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace shardwise::distributed {
namespace {

const char* kLaunchHint =
    "; launch with torchrun (e.g. torchrun --no-python --nproc_per_node=2 ./app) or set RANK, "
    "WORLD_SIZE, MASTER_ADDR and MASTER_PORT";

std::string text(const char* value) { return value == nullptr ? "" : value; }

}  // namespace

int64_t env_int(const std::function<const char*(const char*)>& getenv,
                const char* name,
                int64_t fallback,
                int64_t min_value,
                int64_t max_value) {
  const std::string value = text(getenv(name));
  if (value.empty()) return fallback;
  errno = 0;
  char* end = nullptr;
  const long long parsed = std::strtoll(value.c_str(), &end, 10);
  if (errno != 0 || end == value.c_str() || *end != '\0' || parsed < min_value ||
      parsed > max_value) {
    throw std::invalid_argument(std::string(name) + "='" + value + "' is not an integer in [" +
                                std::to_string(min_value) + ", " + std::to_string(max_value) +
                                "]; unset it or give one");
  }
  return parsed;
}

TorchrunEnv read_torchrun_env(const std::function<const char*(const char*)>& getenv) {
  for (const char* required : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    if (text(getenv(required)).empty()) {
      throw std::invalid_argument(std::string(required) + " is not set" + kLaunchHint);
    }
  }
  TorchrunEnv env;
  env.world_size = static_cast<int>(env_int(getenv, "WORLD_SIZE", 1, 1, 1 << 20));
  env.rank = static_cast<int>(env_int(getenv, "RANK", 0, 0, env.world_size - 1));
  env.local_world_size =
      static_cast<int>(env_int(getenv, "LOCAL_WORLD_SIZE", env.world_size, 1, env.world_size));
  env.local_rank = static_cast<int>(
      env_int(getenv, "LOCAL_RANK", env.rank % env.local_world_size, 0, env.local_world_size - 1));
  env.master_addr = text(getenv("MASTER_ADDR"));
  env.master_port = static_cast<int>(env_int(getenv, "MASTER_PORT", 0, 1, 65535));
  env.use_agent_store = text(getenv("TORCHELASTIC_USE_AGENT_STORE")) == "True";
  env.restart_count =
      static_cast<int>(env_int(getenv, "TORCHELASTIC_RESTART_COUNT", 0, 0, 1 << 20));
  return env;
}

TorchrunEnv read_torchrun_env() {
  return read_torchrun_env([](const char* name) { return std::getenv(name); });
}

}  // namespace shardwise::distributed
