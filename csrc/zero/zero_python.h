// Python bindings of the ZeRO optimizer (shardwise._C.ZeroOptimizer), used by shardwise.zero.
#pragma once

#include <pybind11/pybind11.h>

namespace shardwise::zero {
void bind_zero(pybind11::module& m);
}
