#include "tensor_parallel/tp_python.h"

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "mesh/mesh_layout.h"
#include "mesh/parallel_layout.h"
#include "tensor_parallel/grad_norm.h"
#include "tensor_parallel/parallel_attention.h"
#include "tensor_parallel/parallel_linear.h"
#include "tensor_parallel/shard_tensor.h"
#include "tensor_parallel/tp_shapes.h"
#include "tensor_parallel/vocab_parallel.h"

namespace py = pybind11;

namespace shardwise::tensor_parallel {
namespace {

ParallelOptions options_of(const Group& group,
                           bool sequence_parallel,
                           int64_t sequence_dim,
                           bool save_gathered = false) {
  ParallelOptions options;
  options.group = group;
  options.sequence_parallel = sequence_parallel;
  options.sequence_dim = sequence_dim;
  options.save_gathered = save_gathered;
  return options;
}

// Collectives inside may wait on a backend thread that needs the GIL (gloo's Work destructor).
using Release = py::call_guard<py::gil_scoped_release>;

void bind_mesh(py::module& m) {
  using mesh::MeshLayout;
  py::class_<MeshLayout>(m, "MeshLayout", "An N-D device mesh's rank layout (mesh/mesh_layout.h).")
      .def(py::init([](const std::vector<int>& sizes, const std::vector<std::string>& names,
                       int world_size) {
             try {
               return MeshLayout(sizes, names, world_size);
             } catch (const std::invalid_argument& e) {
               throw py::value_error(e.what());
             }
           }),
           py::arg("sizes"), py::arg("names"), py::arg("world_size"))
      .def_property_readonly("world_size", &MeshLayout::world_size)
      .def("size", &MeshLayout::size, py::arg("axis"))
      .def("coordinate", &MeshLayout::coordinate, py::arg("rank"), py::arg("axis"))
      .def("groups", &MeshLayout::groups, py::arg("axes"))
      .def("group_of", &MeshLayout::group_of, py::arg("rank"), py::arg("axes"))
      .def("is_writer", &MeshLayout::is_writer, py::arg("rank"), py::arg("replicated_over"))
      .def("describe", &MeshLayout::describe);
  using mesh::ParallelLayout;
  py::class_<ParallelLayout>(m, "ParallelLayout",
                             "The run's parallel layout, resolved once (mesh/parallel_layout.h).")
      .def(py::init(
               [](int world_size,
                  const std::vector<
                      std::tuple<std::string, std::vector<int>, std::vector<std::string>>>& meshes,
                  int tensor_parallel_size, int pipeline_parallel_size) {
                 mesh::ParallelLayoutOptions options;
                 options.world_size = world_size;
                 for (const auto& [key, sizes, names] : meshes) {
                   options.meshes.push_back({key, sizes, names});
                 }
                 options.tensor_parallel_size = tensor_parallel_size;
                 options.pipeline_parallel_size = pipeline_parallel_size;
                 try {
                   return ParallelLayout(options);
                 } catch (const std::invalid_argument& e) {
                   throw py::value_error(e.what());
                 }
               }),
           py::arg("world_size"), py::arg("meshes"), py::arg("tensor_parallel_size") = 0,
           py::arg("pipeline_parallel_size") = 0)
      .def_property_readonly("world_size", &ParallelLayout::world_size)
      .def_property_readonly("mesh_key", &ParallelLayout::mesh_key)
      .def_property_readonly("mesh_sizes", &ParallelLayout::mesh_sizes)
      .def_property_readonly("mesh_names", &ParallelLayout::mesh_names)
      .def_property_readonly("tensor_parallel_size", &ParallelLayout::tensor_parallel_size)
      .def_property_readonly("pipeline_parallel_size", &ParallelLayout::pipeline_parallel_size)
      .def_property_readonly("data_parallel_size", &ParallelLayout::data_parallel_size)
      .def("axis_size", &ParallelLayout::axis_size, py::arg("axis"))
      .def("data_axis", &ParallelLayout::data_axis, py::arg("strategy"))
      .def("layout", &ParallelLayout::layout, py::arg("data_kind"));
  m.def(
      "canonical_mesh_axis",
      [](const std::string& name) {
        try {
          return mesh::canonical_axis(name);
        } catch (const std::invalid_argument& e) {
          throw py::value_error(e.what());
        }
      },
      py::arg("name"));
  m.def("mesh_axis_order", &mesh::axis_order);
}

}  // namespace

void bind_tensor_parallel(py::module& m) {
  bind_mesh(m);
  m.def(
      "tp_column_parallel_linear",
      [](const at::Tensor& input, const at::Tensor& weight, std::optional<at::Tensor> bias,
         const Group& group, bool sequence_parallel, int64_t sequence_dim, bool save_gathered) {
        return column_parallel_linear(
            input, weight, bias, options_of(group, sequence_parallel, sequence_dim, save_gathered));
      },
      py::arg("input"), py::arg("weight"), py::arg("bias"), py::arg("group"),
      py::arg("sequence_parallel") = false, py::arg("sequence_dim") = 1,
      py::arg("save_gathered") = false, Release());
  m.def(
      "tp_row_parallel_linear",
      [](const at::Tensor& input, const at::Tensor& weight, std::optional<at::Tensor> bias,
         const Group& group, bool sequence_parallel, int64_t sequence_dim) {
        return row_parallel_linear(input, weight, bias,
                                   options_of(group, sequence_parallel, sequence_dim));
      },
      py::arg("input"), py::arg("weight"), py::arg("bias"), py::arg("group"),
      py::arg("sequence_parallel") = false, py::arg("sequence_dim") = 1, Release());
  m.def(
      "tp_vocab_parallel_embedding",
      [](const at::Tensor& ids, const at::Tensor& weight, int64_t vocab_start, const Group& group,
         bool sequence_parallel, int64_t sequence_dim) {
        return vocab_parallel_embedding(ids, weight, vocab_start,
                                        options_of(group, sequence_parallel, sequence_dim));
      },
      py::arg("ids"), py::arg("weight"), py::arg("vocab_start"), py::arg("group"),
      py::arg("sequence_parallel") = false, py::arg("sequence_dim") = 1, Release());
  m.def(
      "tp_vocab_parallel_cross_entropy",
      [](const at::Tensor& logits, const at::Tensor& targets, const Group& group,
         int64_t vocab_start, int64_t ignore_index, const std::string& reduction) {
        CrossEntropyOptions options;
        options.group = group;
        options.vocab_start = vocab_start;
        options.ignore_index = ignore_index;
        options.reduction = reduction;
        return vocab_parallel_cross_entropy(logits, targets, options);
      },
      py::arg("logits"), py::arg("targets"), py::arg("group"), py::arg("vocab_start"),
      py::arg("ignore_index") = -100, py::arg("reduction") = "mean", Release());
  m.def(
      "tp_parallel_self_attention",
      [](const at::Tensor& x, const at::Tensor& qkv_weight, std::optional<at::Tensor> qkv_bias,
         const at::Tensor& proj_weight, std::optional<at::Tensor> proj_bias, int64_t local_heads,
         bool causal, const Group& group, bool sequence_parallel) {
        AttentionWeights w{qkv_weight, qkv_bias.value_or(at::Tensor()), proj_weight,
                           proj_bias.value_or(at::Tensor())};
        return parallel_self_attention(x, w, local_heads, causal,
                                       options_of(group, sequence_parallel, 1));
      },
      py::arg("x"), py::arg("qkv_weight"), py::arg("qkv_bias"), py::arg("proj_weight"),
      py::arg("proj_bias"), py::arg("local_heads"), py::arg("causal"), py::arg("group"),
      py::arg("sequence_parallel") = false, Release());
  m.def("tp_copy_to_region", &copy_to_region, py::arg("input"), py::arg("group"), Release());
  m.def("tp_reduce_from_region", &reduce_from_region, py::arg("input"), py::arg("group"),
        Release());
  m.def("tp_gather_along", &gather_along, py::arg("input"), py::arg("dim"), py::arg("group"),
        Release());
  m.def("tp_reduce_scatter_along", &reduce_scatter_along, py::arg("input"), py::arg("dim"),
        py::arg("group"), Release());
  m.def("tp_scatter_along", &scatter_along, py::arg("input"), py::arg("dim"), py::arg("group"),
        Release());
  m.def(
      "tp_clip_grad_norm_",
      [](const std::vector<at::Tensor>& split, const std::vector<at::Tensor>& replicated,
         double max_norm, std::optional<Group> tp_group, std::optional<Group> shard_group,
         std::optional<Group> stage_group) {
        return clip_grad_norm_(split, replicated,
                               {max_norm, tp_group.value_or(Group()), shard_group.value_or(Group()),
                                stage_group.value_or(Group())});
      },
      py::arg("split"), py::arg("replicated"), py::arg("max_norm"), py::arg("tp_group"),
      py::arg("shard_group"), py::arg("stage_group") = py::none(), Release(),
      "tensor_parallel/grad_norm.h");
  m.def(
      "tp_shard_runs",
      [](const std::vector<int64_t>& shape, int64_t dim, int64_t chunks, int rank, int size) {
        std::vector<std::tuple<int64_t, int64_t, int64_t>> out;
        try {
          for (const ShardRun& r : shard_runs(shape, dim, chunks, rank, size)) {
            out.emplace_back(r.full_start, r.local_start, r.length);
          }
        } catch (const std::invalid_argument& e) {
          throw py::value_error(e.what());
        }
        return out;
      },
      py::arg("shape"), py::arg("dim"), py::arg("chunks"), py::arg("rank"), py::arg("size"),
      "(full_start, local_start, length) runs of a shard in the flattened full tensor.");
  m.def(
      "tp_shard_tensor",
      [](const at::Tensor& full, int64_t dim, int64_t chunks, int rank, int size,
         const std::string& module, const std::string& name) {
        return shard_tensor(full, ShardSpec{dim, chunks, rank, size, module, name});
      },
      py::arg("full"), py::arg("dim"), py::arg("chunks"), py::arg("rank"), py::arg("size"),
      py::arg("module"), py::arg("name"));
}

}  // namespace shardwise::tensor_parallel
