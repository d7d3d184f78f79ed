// shardwise._C's training rules: the learning-rate schedule (lr_schedule.h), the checkpoint
// writer rule (checkpoint_writer.h), the mesh-wide clip (mesh_clip.h) and the full state across
// the mesh (full_state.h).
#include "training/training_python.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "distributed/exact_norm.h"
#include "distributed/tree_reduce.h"
#include "training/checkpoint_writer.h"
#include "training/full_state.h"
#include "training/lr_schedule.h"
#include "training/mesh_clip.h"

namespace py = pybind11;

namespace shardwise::training {

void bind_training(py::module& m) {
  using Group = tensor_parallel::Group;
  m.def(
      "warmup_cosine_lr",
      [](int64_t step, double peak_lr, int64_t warmup_steps, int64_t max_steps,
         double final_ratio) {
        return warmup_cosine_lr({peak_lr, warmup_steps, max_steps, final_ratio}, step);
      },
      py::arg("step"), py::arg("peak_lr"), py::arg("warmup_steps"), py::arg("max_steps"),
      py::arg("final_ratio") = 0.1, "training/lr_schedule.h: linear warm-up, then cosine decay.");
  m.def(
      "checkpoint_writes",
      [](const mesh::MeshLayout& layout, int rank, bool tp_split, bool tied) {
        return writes(layout, rank, {tp_split, tied});
      },
      py::arg("layout"), py::arg("rank"), py::arg("tp_split"), py::arg("tied"),
      "training/checkpoint_writer.h: whether `rank` writes a parameter placed so.");
  m.def(
      "tree_all_reduce_",
      [](const Group& group, at::Tensor tensor) {
        distributed::tree_all_reduce_(*group, tensor);
        return tensor;
      },
      py::arg("group"), py::arg("tensor"), py::call_guard<py::gil_scoped_release>(),
      "distributed/tree_reduce.h: in place, the sum over `group` as the binary tree over ranks.");
  m.def(
      "tree_reduce_scatter",
      [](const Group& group, at::Tensor output, const at::Tensor& input) {
        auto work = distributed::tree_reduce_scatter(*group, output, input);
        if (work) work->wait();
        return output;
      },
      py::arg("group"), py::arg("output"), py::arg("input"),
      py::call_guard<py::gil_scoped_release>(),
      "distributed/tree_reduce.h: block `rank` of `input` summed over `group` by the tree.");
  m.def(
      "clip_grad_norm_exact_",
      [](const std::vector<at::Tensor>& grads, double max_norm, std::optional<Group> group) {
        return distributed::clip_grad_norm_exact_(grads, max_norm, group ? group->get() : nullptr);
      },
      py::arg("grads"), py::arg("max_norm"), py::arg("group") = py::none(),
      py::call_guard<py::gil_scoped_release>(),
      "distributed/exact_norm.h: clips by the exact norm over `group`; returns the norm.");
  m.def("pairwise_sum_rows", &distributed::pairwise_sum_rows, py::arg("stacked"),
        "distributed/tree_reduce.h: the rows summed as the balanced binary tree over the index.");
  py::class_<distributed::PairwiseGradients>(
      m, "PairwiseGradients",
      "distributed/tree_reduce.h: leaves (lists of tensors, taken) summed as the balanced binary "
      "tree over the push index.")
      .def(py::init<>())
      .def("push", &distributed::PairwiseGradients::push, py::arg("leaf"))
      .def("finish", &distributed::PairwiseGradients::finish)
      .def_property_readonly("count", &distributed::PairwiseGradients::count)
      .def_property_readonly("partial_sums", &distributed::PairwiseGradients::partial_sums);
  m.def(
      "clip_grad_norm_over_mesh",
      [](std::vector<at::Tensor> split, std::vector<at::Tensor> replicated,
         std::vector<at::Tensor> copies, double max_norm, std::optional<Group> tp_group,
         std::optional<Group> shard_group, std::optional<Group> stage_group) {
        tensor_parallel::ClipOptions options{max_norm, tp_group.value_or(Group()),
                                             shard_group.value_or(Group()),
                                             stage_group.value_or(Group())};
        return clip_grad_norm_over_mesh(
            {std::move(split), std::move(replicated), std::move(copies)}, options);
      },
      py::arg("split"), py::arg("replicated"), py::arg("copies"), py::arg("max_norm"),
      py::arg("tp_group") = py::none(), py::arg("shard_group") = py::none(),
      py::arg("stage_group") = py::none(), py::call_guard<py::gil_scoped_release>(),
      "training/mesh_clip.h: the whole model's gradient norm over the mesh, then the clip.");
  using Staged =
      std::tuple<std::string, std::vector<int64_t>, at::ScalarType, std::optional<at::Tensor>>;
  m.def(
      "gather_full_state",
      [](const mesh::MeshLayout& layout, int rank, const std::vector<std::vector<Staged>>& stages,
         std::optional<Group> pp_group, const GatherTp& gather_tp) {
        std::vector<std::vector<StagedParameter>> staged(stages.size());
        for (size_t s = 0; s < stages.size(); ++s) {
          for (const auto& [name, shape, dtype, value] : stages[s]) {
            staged[s].push_back({name, shape, value.value_or(at::Tensor()), dtype});
          }
        }
        const auto full =
            gather_full_state({layout, rank, pp_group.value_or(Group())}, staged, gather_tp);
        std::vector<std::pair<std::string, at::Tensor>> out;
        for (const auto& item : full) out.emplace_back(item.key(), item.value());
        return out;
      },
      py::arg("layout"), py::arg("rank"), py::arg("stages"), py::arg("pp_group") = py::none(),
      py::arg("gather_tp") = py::none(), py::call_guard<py::gil_scoped_release>(),
      "training/full_state.h: the full model's parameters on rank 0 ([] elsewhere) from "
      "stages[s] = [(name, full_shape, dtype, this rank's value or None)], stage s on pp "
      "coordinate s % pp; gather_tp(name, value) -> the whole tensor (collective over tp).");
}

}  // namespace shardwise::training
