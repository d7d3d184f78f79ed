#include "fsdp/fsdp_python.h"

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "fsdp/fsdp_engine.h"

namespace py = pybind11;

namespace shardwise::fsdp {
namespace {

std::optional<at::ScalarType> dtype_of(const std::optional<std::string>& name) {
  if (!name) return std::nullopt;
  if (*name == "float32") return at::kFloat;
  if (*name == "float64") return at::kDouble;
  if (*name == "bfloat16") return at::kBFloat16;
  if (*name == "float16") return at::kHalf;
  throw py::value_error("dtype '" + *name + "'; valid: float32, float64, bfloat16, float16");
}

BackwardPrefetch prefetch_of(const std::string& name) {
  if (name == "backward_pre") return BackwardPrefetch::kBackwardPre;
  if (name == "backward_post") return BackwardPrefetch::kBackwardPost;
  if (name == "none") return BackwardPrefetch::kNone;
  throw py::value_error("backward_prefetch '" + name +
                        "'; valid: backward_pre, backward_post, none");
}

using Group = c10::intrusive_ptr<c10d::ProcessGroup>;

UnitOptions unit_options(const std::string& name,
                         std::optional<Group> shard_group,
                         std::optional<Group> replicate_group,
                         std::optional<std::string> param_dtype,
                         std::optional<std::string> reduce_dtype,
                         bool reshard_after_forward,
                         bool offload_to_cpu) {
  UnitOptions options;
  options.name = name;
  if (shard_group) options.shard_group = *shard_group;
  if (replicate_group) options.replicate_group = *replicate_group;
  options.param_dtype = dtype_of(param_dtype);
  options.reduce_dtype = dtype_of(reduce_dtype);
  options.reshard_after_forward = reshard_after_forward;
  options.offload_to_cpu = offload_to_cpu;
  return options;
}

std::vector<std::tuple<int64_t, int64_t, int64_t>> slices_of(const FsdpUnit& unit) {
  std::vector<std::tuple<int64_t, int64_t, int64_t>> slices;
  for (const OwnedSlice& s : unit.owned_slices()) slices.emplace_back(s.start, s.valid, s.numel);
  return slices;
}

// The full shape of each of the unit's parameters, in params() order.
std::vector<std::vector<int64_t>> shapes_of(const FsdpUnit& unit) {
  std::vector<std::vector<int64_t>> shapes;
  for (int64_t i = 0; i < unit.layout().num_params(); ++i) shapes.push_back(unit.shape(i));
  return shapes;
}
// Methods that may wait for a collective release the GIL: a backend's worker thread may need it
// (gloo's Work destructor drops Python objects), and other Python threads should run meanwhile.
using Release = py::call_guard<py::gil_scoped_release>;

// A unit made on its own, before any engine (fully_shard); an engine adopts it later.
void bind_unit(py::module& m) {
  py::class_<FsdpUnit, std::shared_ptr<FsdpUnit>>(m, "FsdpUnit",
                                                  "One FSDP unit (fsdp_unit.h), made on its own.")
      .def(py::init([](std::vector<at::Tensor> params, const std::string& name,
                       std::optional<Group> shard_group, std::optional<Group> replicate_group,
                       std::optional<std::string> param_dtype,
                       std::optional<std::string> reduce_dtype, bool reshard_after_forward,
                       bool offload_to_cpu, bool pin_memory,
                       std::optional<Group> post_forward_group) {
             UnitOptions options =
                 unit_options(name, shard_group, replicate_group, param_dtype, reduce_dtype,
                              reshard_after_forward, offload_to_cpu);
             options.pin_memory = pin_memory;
             if (post_forward_group) options.post_forward_group = *post_forward_group;
             const at::Device device = params.empty() ? at::Device(at::kCPU) : params[0].device();
             options.lanes = shared_lanes(device);
             return std::make_shared<FsdpUnit>(std::move(params), options);
           }),
           py::arg("params"), py::arg("name"), py::arg("shard_group"), py::arg("replicate_group"),
           py::arg("param_dtype"), py::arg("reduce_dtype"), py::arg("reshard_after_forward"),
           py::arg("offload_to_cpu"), py::arg("pin_memory"),
           py::arg("post_forward_group") = py::none())
      .def_property_readonly("name", &FsdpUnit::name)
      .def("holds_post_forward_shard", &FsdpUnit::holds_post_forward_shard)
      .def("post_forward_group",
           [](const FsdpUnit& u) -> std::optional<Group> {
             const Group& group = u.options().post_forward_group;
             return group ? std::optional<Group>(group) : std::nullopt;
           })
      .def("sharded_param_bytes", &FsdpUnit::sharded_param_bytes)
      .def("unshard_async", &FsdpUnit::unshard_async, Release())
      .def("unshard", &FsdpUnit::unshard, Release())
      .def("reshard", &FsdpUnit::reshard, Release())
      .def("unsharded", &FsdpUnit::unsharded)
      .def("set_reshard_after_forward", &FsdpUnit::set_reshard_after_forward)
      .def("set_reshard_after_backward", &FsdpUnit::set_reshard_after_backward)
      .def("set_requires_gradient_sync", &FsdpUnit::set_requires_gradient_sync)
      .def("reshard_after_forward",
           [](const FsdpUnit& u) { return u.options().reshard_after_forward; })
      .def("full_parameters", &FsdpUnit::full_parameters, Release())
      .def("load_full_parameters", &FsdpUnit::load_full_parameters)
      .def("shard_views", &FsdpUnit::shard_views)
      .def("grad_shard_views", &FsdpUnit::grad_shard_views)
      .def("owned_slices", &slices_of)
      .def("shapes", &shapes_of)
      .def("shard_rank", &FsdpUnit::shard_rank)
      .def("shard_size", &FsdpUnit::shard_size)
      .def("pinned", [](const FsdpUnit& u) {
        return !u.shard_views().empty() && u.shard_views()[0].is_pinned();
      });
}

}  // namespace

void bind_fsdp(py::module& m) {
  py::class_<FsdpEngine, std::shared_ptr<FsdpEngine>>(m, "FsdpEngine",
                                                      "The C++ FSDP engine (fsdp_engine.h).")
      .def(py::init([](bool forward_prefetch, const std::string& backward_prefetch,
                       std::optional<Group> world_group) {
             EngineOptions options;
             options.forward_prefetch = forward_prefetch;
             options.backward_prefetch = prefetch_of(backward_prefetch);
             if (world_group) options.world_group = *world_group;
             return FsdpEngine::create(options);
           }),
           py::arg("forward_prefetch"), py::arg("backward_prefetch"), py::arg("world_group"))
      .def(
          "add_unit",
          [](FsdpEngine& engine, std::vector<at::Tensor> params, const std::string& name,
             std::optional<Group> shard_group, std::optional<Group> replicate_group,
             std::optional<std::string> param_dtype, std::optional<std::string> reduce_dtype,
             bool reshard_after_forward, bool offload_to_cpu, bool keep_low_precision_grads,
             bool pin_memory, bool deterministic, std::optional<Group> post_forward_group,
             bool quantized_all_gather, bool quantized_reduce_scatter) {
            UnitOptions options = unit_options(name, shard_group, replicate_group, param_dtype,
                                               reduce_dtype, reshard_after_forward, offload_to_cpu);
            options.keep_low_precision_grads = keep_low_precision_grads;
            options.pin_memory = pin_memory;
            options.deterministic = deterministic;
            if (post_forward_group) options.post_forward_group = *post_forward_group;
            options.quantized_all_gather = quantized_all_gather;
            options.quantized_reduce_scatter = quantized_reduce_scatter;
            return engine.add_unit(std::move(params), options);
          },
          py::arg("params"), py::arg("name"), py::arg("shard_group"), py::arg("replicate_group"),
          py::arg("param_dtype"), py::arg("reduce_dtype"), py::arg("reshard_after_forward"),
          py::arg("offload_to_cpu"), py::arg("keep_low_precision_grads") = false,
          py::arg("pin_memory") = false, py::arg("deterministic") = false,
          py::arg("post_forward_group") = py::none(), py::arg("quantized_all_gather") = false,
          py::arg("quantized_reduce_scatter") = false)
      .def("adopt_unit",
           [](FsdpEngine& engine, std::shared_ptr<FsdpUnit> unit) {
             return engine.add_unit(std::move(unit));
           })
      .def("set_forward_prefetch", &FsdpEngine::set_forward_prefetch)
      .def("set_backward_prefetch", &FsdpEngine::set_backward_prefetch)
      .def("set_root", &FsdpEngine::set_root)
      .def("num_units", &FsdpEngine::num_units)
      .def("pre_forward", &FsdpEngine::pre_forward, Release())
      .def("post_forward", &FsdpEngine::post_forward, Release())
      .def("set_requires_gradient_sync", &FsdpEngine::set_requires_gradient_sync)
      .def("requires_gradient_sync", &FsdpEngine::requires_gradient_sync)
      .def("clip_grad_norm_", &FsdpEngine::clip_grad_norm_, py::arg("max_norm"),
           py::arg("norm_type") = 2.0, Release())
      .def("reshard_all", &FsdpEngine::reshard_all, Release())
      .def("forward_order", &FsdpEngine::forward_order)
      .def(
          "unshard", [](FsdpEngine& e, int u) { e.unit(u).unshard(); }, Release())
      .def(
          "reshard", [](FsdpEngine& e, int u) { e.unit(u).reshard(); }, Release())
      .def(
          "full_parameters", [](FsdpEngine& e, int u) { return e.unit(u).full_parameters(); },
          Release())
      .def("load_full_parameters",
           [](FsdpEngine& e, int u, const std::vector<at::Tensor>& full) {
             e.unit(u).load_full_parameters(full);
           })
      .def("shard_views", [](FsdpEngine& e, int u) { return e.unit(u).shard_views(); })
      .def("grad_shard_views", [](FsdpEngine& e, int u) { return e.unit(u).grad_shard_views(); })
      .def("owned_slices", [](FsdpEngine& e, int u) { return slices_of(e.unit(u)); })
      .def("shapes", [](FsdpEngine& e, int u) { return shapes_of(e.unit(u)); })
      .def("shard_rank", [](FsdpEngine& e, int u) { return e.unit(u).shard_rank(); })
      .def("shard_size", [](FsdpEngine& e, int u) { return e.unit(u).shard_size(); })
      .def("param_bytes", [](FsdpEngine& e, int u) { return e.unit(u).sharded_param_bytes(); })
      .def("grad_bytes", [](FsdpEngine& e, int u) { return e.unit(u).sharded_grad_bytes(); });
  bind_unit(m);
}

}  // namespace shardwise::fsdp
