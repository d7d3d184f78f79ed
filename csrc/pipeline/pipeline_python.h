// Python bindings of the pipeline schedules, validator and executor (shardwise._C), used by
// shardwise.pipeline.
#pragma once

#include <pybind11/pybind11.h>

namespace shardwise::pipeline {
void bind_pipeline(pybind11::module& m);
}
