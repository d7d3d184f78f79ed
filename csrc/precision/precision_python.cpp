// Direct Python entries of the casting ops. They call the C++ API of cast_ops.h, which goes
// through the dispatcher like torch.ops.shardwise.* (autograd, CPU/CUDA, Python dispatch modes
// and tensor subclasses with __torch_dispatch__ all apply); what they skip is torch.ops' boxed
// argument parsing, a few microseconds per call that a small cast cannot hide. The Python wrappers
// (shardwise.ops.precision) use them for plain tensors in eager mode only, and torch.ops under
// torch.compile or a __torch_function__ override.
#include "precision/precision_python.h"

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <vector>

#include "precision/cast_ops.h"

namespace py = pybind11;

namespace shardwise::precision {

void bind_precision(py::module& m) {
  using Release = py::call_guard<py::gil_scoped_release>;
  m.def("cast", &shardwise::cast, py::arg("input"), py::arg("dtype"), Release());
  m.def("cast_check_finite", &shardwise::cast_check_finite, py::arg("input"), py::arg("dtype"),
        Release());
  m.def(
      "multi_cast_",
      [](const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs) {
        return shardwise::multi_cast_(inputs, outputs);
      },
      py::arg("inputs"), py::arg("outputs"), Release());
}

}  // namespace shardwise::precision
