// Checkpoint slots of parameters and their AdamW moments, as shardwise-train's owned_slots
// writes them: for each parameter slot (name, start, a 1-D view of elements [k, k + n) of
// `params[i]`), also "name:exp_avg" and "name:exp_avg_sq" over the same elements of that
// parameter's AdamW state. Several slots may view one parameter (a tensor-parallel shard lies in
// the full tensor as several runs). Works for torch::optim::AdamW and optim::FusedAdamW (the same
// state).
#pragma once

#include <torch/optim/adamw.h>

#include <cstdint>
#include <vector>

#include "sharding/checkpoint_pieces.h"

namespace shardwise::optim {

// `parameter_slots[i]` views `params[i]` (an error otherwise). With `create_state`, a parameter
// without AdamW state gets zeroed moments (to be filled by loading); without it, such a parameter
// has no moment slots.
std::vector<sharding::TensorSlice> adamw_slots(
    const std::vector<sharding::TensorSlice>& parameter_slots,
    const std::vector<at::Tensor>& params,
    torch::optim::AdamW& optimizer,
    bool create_state);

// The largest step count in the optimizer's state (0 before the first step).
int64_t adamw_step_count(torch::optim::AdamW& optimizer);
// Sets every parameter state's step count (after loading moments).
void set_adamw_step_count(torch::optim::AdamW& optimizer, int64_t step);

}  // namespace shardwise::optim
