// Python bindings of the flat layout (shardwise._C.FlatLayout), used by shardwise.ops.sharding.
#pragma once

#include <pybind11/pybind11.h>

namespace shardwise::sharding {
void bind_sharding(pybind11::module& m);
}
