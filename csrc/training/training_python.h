// Python bindings of the training rules (shardwise._C: warmup_cosine_lr, checkpoint_writes,
// clip_grad_norm_over_mesh), which shardwise-train calls so both trainers share them.
#pragma once

#include <pybind11/pybind11.h>

namespace shardwise::training {
void bind_training(pybind11::module& m);
}
