#include "optim/optim_python.h"

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "optim/lamb_ops.h"

namespace py = pybind11;

namespace shardwise::optim {

// _C.fused_lamb_: lamb_ops.h's fused_lamb_, the per-parameter sums all-reduced over `group`
// when given (the ranks holding the parameters' other pieces), and the rows of parameters split
// over tensor parallelism (`tp_split_rows`) over `tp_group` as well.
void bind_optim(py::module& m) {
  m.def(
      "fused_lamb_",
      [](const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
         const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
         const std::vector<at::Tensor>& low_precision, const py::dict& hyper,
         const std::vector<int64_t>& param_of,
         std::optional<c10::intrusive_ptr<c10d::ProcessGroup>> group,
         std::optional<c10::intrusive_ptr<c10d::ProcessGroup>> tp_group,
         const std::vector<int64_t>& tp_split_rows) {
        LambOptions o;
        o.lr = hyper["lr"].cast<double>();
        o.beta1 = hyper["beta1"].cast<double>();
        o.beta2 = hyper["beta2"].cast<double>();
        o.eps = hyper["eps"].cast<double>();
        o.weight_decay = hyper["weight_decay"].cast<double>();
        o.step = hyper["step"].cast<int64_t>();
        o.bias_correction = hyper["bias_correction"].cast<bool>();
        o.eps_inside_sqrt = hyper["eps_inside_sqrt"].cast<bool>();
        o.max_coeff = hyper["max_coeff"].cast<double>();
        o.min_coeff = hyper["min_coeff"].cast<double>();
        o.grad_scale = hyper["grad_scale"].cast<double>();
        py::gil_scoped_release release;
        auto all_reduce = [](const c10::intrusive_ptr<c10d::ProcessGroup>& g, at::Tensor& t) {
          std::vector<at::Tensor> tensors{t};
          g->allreduce(tensors)->wait();
        };
        const bool sharded = group && (*group)->getSize() > 1;
        const bool split = tp_group && (*tp_group)->getSize() > 1 && !tp_split_rows.empty();
        std::function<void(at::Tensor&)> reduce;
        if (sharded || split) {
          reduce = [&](at::Tensor& sums) {
            if (sharded) all_reduce(*group, sums);
            if (!split) return;
            const at::Tensor rows = at::tensor(tp_split_rows, at::kLong).to(sums.device());
            at::Tensor parts = sums.index_select(0, rows);
            all_reduce(*tp_group, parts);
            sums.index_copy_(0, rows, parts);
          };
        }
        return fused_lamb_(params, grads, exp_avgs, exp_avg_sqs, low_precision, o, param_of,
                           reduce);
      },
      py::arg("params"), py::arg("grads"), py::arg("exp_avgs"), py::arg("exp_avg_sqs"),
      py::arg("low_precision"), py::arg("hyper"), py::arg("param_of"),
      py::arg("group") = py::none(), py::arg("tp_group") = py::none(),
      py::arg("tp_split_rows") = std::vector<int64_t>{},
      "One LAMB step (lamb_ops.h); hyper: lr, beta1, beta2, eps, weight_decay, step, "
      "bias_correction, eps_inside_sqrt, max_coeff, min_coeff, grad_scale. Returns the trust "
      "ratios, one per parameter.");
}

}  // namespace shardwise::optim
