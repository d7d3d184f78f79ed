// The variables torchrun (and torch.distributed's env:// rendezvous) give each worker, read and
// validated before anything connects: a missing or malformed one is an error naming the variable
// and the fix, not a hang or a crash later. Torch-free; distributed/process_group.h connects.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace shardwise::distributed {

struct TorchrunEnv {
  int rank = 0;              // RANK
  int world_size = 1;        // WORLD_SIZE
  int local_rank = 0;        // LOCAL_RANK (default: rank)
  int local_world_size = 1;  // LOCAL_WORLD_SIZE (default: world_size)
  std::string master_addr;   // MASTER_ADDR
  int master_port = 0;       // MASTER_PORT
  // TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent already serves the store at
  // MASTER_ADDR:MASTER_PORT, so rank 0 connects to it instead of starting one, and keys go under
  // "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>" (as torch.distributed does).
  bool use_agent_store = false;
  int restart_count = 0;
};

// Reads the variables through `getenv` (a parameter so tests need not touch the process's
// environment). Throws std::invalid_argument naming the first missing or bad variable.
TorchrunEnv read_torchrun_env(const std::function<const char*(const char*)>& getenv);
TorchrunEnv read_torchrun_env();  // from this process's environment

// An integer environment variable: `fallback` when unset or empty; throws std::invalid_argument
// naming the variable when it is not an integer in [min_value, max_value].
int64_t env_int(const std::function<const char*(const char*)>& getenv,
                const char* name,
                int64_t fallback,
                int64_t min_value,
                int64_t max_value);

}  // namespace shardwise::distributed
