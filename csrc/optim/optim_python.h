// shardwise._C's optimizer functions (LAMB's step with its reduction across ranks).
#pragma once

#include <pybind11/pybind11.h>

namespace shardwise::optim {

void bind_optim(pybind11::module& m);

}  // namespace shardwise::optim
