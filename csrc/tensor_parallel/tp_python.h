// Python bindings of the tensor-parallel layers (shardwise._C), used by shardwise.tensor_parallel,
// and of the mesh layout, used by shardwise.mesh.
#pragma once

#include <pybind11/pybind11.h>

namespace shardwise::tensor_parallel {
void bind_tensor_parallel(pybind11::module& m);
}
