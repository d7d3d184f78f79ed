// Python bindings of the casting ops' direct entries (shardwise._C), used by shardwise.ops.
#pragma once

#include <pybind11/pybind11.h>

namespace shardwise::precision {
void bind_precision(pybind11::module& m);
}
