// Python bindings of the FSDP engine (shardwise._C.FsdpEngine), used by shardwise.fsdp.
#pragma once

#include <pybind11/pybind11.h>

namespace shardwise::fsdp {
void bind_fsdp(pybind11::module& m);
}
