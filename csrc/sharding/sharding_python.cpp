// shardwise._C.FlatLayout: the one rule of where a sharded parameter's elements live
// (flat_layout.h), with the sharding ops' alignment (kShardAlign), for the Python wrappers and
// fake kernels that need its sizes.
#include "sharding/sharding_python.h"

#include <pybind11/stl.h>

#include <string>
#include <utility>
#include <vector>

#include "sharding/flat_layout.h"
#include "sharding/shard_ops.h"

namespace py = pybind11;

namespace shardwise::sharding {
namespace {

// Parameter i of `layout`, checked (the accessors index vectors unchecked).
int64_t checked(const FlatLayout& layout, int64_t i) {
  if (i < 0 || i >= layout.num_params()) {
    throw py::index_error("FlatLayout: parameter " + std::to_string(i) + " of " +
                          std::to_string(layout.num_params()));
  }
  return i;
}

}  // namespace

void bind_sharding(py::module& m) {
  py::class_<FlatLayout>(m, "FlatLayout")
      .def(py::init([](std::vector<int64_t> numels, int world_size) {
             return FlatLayout({std::move(numels), world_size, kShardAlign});
           }),
           py::arg("numels"), py::arg("world_size"))
      .def("num_params", &FlatLayout::num_params)
      .def(
          "chunk", [](const FlatLayout& l, int64_t i) { return l.chunk(checked(l, i)); },
          py::arg("i"))
      .def(
          "offset", [](const FlatLayout& l, int64_t i) { return l.offset(checked(l, i)); },
          py::arg("i"))
      .def(
          "start", [](const FlatLayout& l, int64_t i, int r) { return l.start(checked(l, i), r); },
          py::arg("i"), py::arg("rank"))
      .def(
          "valid", [](const FlatLayout& l, int64_t i, int r) { return l.valid(checked(l, i), r); },
          py::arg("i"), py::arg("rank"))
      .def("shard_numel", &FlatLayout::shard_numel)
      .def_property_readonly_static("align", [](const py::object&) { return kShardAlign; });
}

}  // namespace shardwise::sharding
