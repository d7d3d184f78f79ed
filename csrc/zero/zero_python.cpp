#include "zero/zero_python.h"

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>

#include "zero/grad_scaler.h"
#include "zero/zero_optimizer.h"

namespace py = pybind11;

namespace shardwise::zero {
namespace {

using Group = c10::intrusive_ptr<c10d::ProcessGroup>;
using Release = py::call_guard<py::gil_scoped_release>;

// The options from the mapping shardwise.zero.config builds (already validated there).
ZeroOptions options_of(const py::dict& d,
                       std::optional<Group> group,
                       std::optional<Group> tp_group = std::nullopt,
                       std::vector<bool> tp_split = {}) {
  ZeroOptions o;
  if (tp_group) o.tensor_parallel = {*tp_group, std::move(tp_split)};
  o.stage = d["stage"].cast<int>();
  if (group) o.group = *group;
  o.reduce_bucket_numel = d["reduce_bucket_numel"].cast<int64_t>();
  if (d.contains("allgather_bucket_numel")) {
    o.allgather_bucket_numel = d["allgather_bucket_numel"].cast<int64_t>();
  }
  o.overlap_comm = d["overlap_comm"].cast<bool>();
  o.offload_optimizer = d["offload_optimizer"].cast<bool>();
  if (d.contains("pin_memory")) o.pin_memory = d["pin_memory"].cast<bool>();
  o.gradient_clipping = d["gradient_clipping"].cast<double>();
  if (d.contains("deterministic")) o.deterministic = d["deterministic"].cast<bool>();
  if (d.contains("gradient_predivide_factor")) {
    o.gradient_predivide_factor = d["gradient_predivide_factor"].cast<double>();
  }
  if (d.contains("loss_scaler") && !d["loss_scaler"].is_none()) {
    py::dict s = d["loss_scaler"];
    LossScalerOptions scaler;
    scaler.dynamic = s["dynamic"].cast<bool>();
    scaler.initial_scale = s["initial_scale"].cast<double>();
    scaler.window = s["window"].cast<int64_t>();
    scaler.hysteresis = s["hysteresis"].cast<int>();
    scaler.min_scale = s["min_scale"].cast<double>();
    o.loss_scaler = scaler;
  }
  py::dict opt = d["optimizer"];
  const std::string kind = opt["type"].cast<std::string>();
  o.optimizer.kind = kind == "sgd"    ? OptimizerKind::kSgd
                     : kind == "lamb" ? OptimizerKind::kLamb
                                      : OptimizerKind::kAdamW;
  o.optimizer.lr = opt["lr"].cast<double>();
  o.optimizer.beta1 = opt["beta1"].cast<double>();
  o.optimizer.beta2 = opt["beta2"].cast<double>();
  o.optimizer.eps = opt["eps"].cast<double>();
  o.optimizer.weight_decay = opt["weight_decay"].cast<double>();
  o.optimizer.momentum = opt["momentum"].cast<double>();
  o.optimizer.dampening = opt["dampening"].cast<double>();
  o.optimizer.nesterov = opt["nesterov"].cast<bool>();
  if (opt.contains("max_coeff")) {
    o.optimizer.bias_correction = opt["bias_correction"].cast<bool>();
    o.optimizer.eps_inside_sqrt = opt["eps_inside_sqrt"].cast<bool>();
    o.optimizer.max_coeff = opt["max_coeff"].cast<double>();
    o.optimizer.min_coeff = opt["min_coeff"].cast<double>();
  }
  return o;
}

py::list pieces_to_python(const std::vector<StatePiece>& pieces) {
  py::list out;
  for (const StatePiece& p : pieces) {
    py::dict tensors;
    for (const auto& [name, t] : p.tensors) tensors[py::str(name)] = t.clone();
    out.append(py::dict(py::arg("param") = p.info.param, py::arg("start") = p.info.start,
                        py::arg("numel") = p.info.numel, py::arg("full_numel") = p.info.full_numel,
                        py::arg("tensors") = tensors));
  }
  return out;
}

std::vector<StatePiece> pieces_from_python(const py::list& list) {
  std::vector<StatePiece> out;
  for (const py::handle& h : list) {
    py::dict d = py::reinterpret_borrow<py::dict>(h);
    StatePiece p;
    p.info = {d["param"].cast<int64_t>(), d["start"].cast<int64_t>(), d["numel"].cast<int64_t>(),
              d["full_numel"].cast<int64_t>()};
    for (const auto& [name, t] : py::dict(d["tensors"])) {
      p.tensors[name.cast<std::string>()] = t.cast<at::Tensor>();
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace

void bind_zero(py::module& m) {
  py::class_<GradScaler>(m, "GradScaler",
                         "fp16 gradient scaling for any strategy (zero/grad_scaler.h).")
      .def(py::init([](bool dynamic, double initial_scale, int64_t window, int hysteresis,
                       double min_scale, std::optional<Group> group) {
             LossScalerOptions o;
             o.dynamic = dynamic;
             o.initial_scale = initial_scale;
             o.window = window;
             o.hysteresis = hysteresis;
             o.min_scale = min_scale;
             return GradScaler(o, group.value_or(Group()));
           }),
           py::arg("dynamic") = true, py::arg("initial_scale") = 65536.0, py::arg("window") = 1000,
           py::arg("hysteresis") = 2, py::arg("min_scale") = 1.0, py::arg("group") = py::none())
      .def_property_readonly("scale", &GradScaler::scale)
      .def("unscale_", &GradScaler::unscale_, py::arg("grads"), Release())
      .def("update", &GradScaler::update, py::arg("overflow"))
      .def("state",
           [](const GradScaler& g) {
             const LossScalerState& s = g.scaler().state();
             return py::dict(py::arg("scale") = s.scale, py::arg("iteration") = s.iteration,
                             py::arg("last_overflow") = s.last_overflow,
                             py::arg("hysteresis_left") = s.hysteresis_left);
           })
      .def("load_state", [](GradScaler& g, const py::dict& d) {
        LossScalerState s;
        s.scale = d["scale"].cast<double>();
        s.iteration = d["iteration"].cast<int64_t>();
        s.last_overflow = d["last_overflow"].cast<int64_t>();
        s.hysteresis_left = d["hysteresis_left"].cast<int>();
        g.scaler().set_state(s);
      });
  py::class_<ZeroOptimizer, std::shared_ptr<ZeroOptimizer>>(
      m, "ZeroOptimizer", "The C++ ZeRO optimizer (zero/zero_optimizer.h).")
      .def(py::init([](std::vector<at::Tensor> params, const py::dict& options,
                       std::optional<Group> group, std::optional<Group> tp_group,
                       std::vector<bool> tp_split) {
             return ZeroOptimizer::create(
                 std::move(params), options_of(options, group, tp_group, std::move(tp_split)));
           }),
           py::arg("params"), py::arg("options"), py::arg("group"),
           py::arg("tp_group") = py::none(), py::arg("tp_split") = std::vector<bool>{})
      .def_static(
          "local",
          [](std::vector<at::Tensor> shards, const std::vector<std::array<int64_t, 4>>& pieces,
             const py::dict& options, std::optional<Group> group, std::optional<Group> tp_group,
             std::vector<bool> tp_split) {
            std::vector<PieceInfo> infos;
            for (const auto& p : pieces) infos.push_back({p[0], p[1], p[2], p[3]});
            return ZeroOptimizer::create_local(
                std::move(shards), std::move(infos),
                options_of(options, group, tp_group, std::move(tp_split)));
          },
          py::arg("shards"), py::arg("pieces"), py::arg("options"), py::arg("group"),
          py::arg("tp_group") = py::none(), py::arg("tp_split") = std::vector<bool>{})
      .def("step", &ZeroOptimizer::step, Release())
      .def("zero_grad", &ZeroOptimizer::zero_grad)
      .def("loss_scale", &ZeroOptimizer::loss_scale)
      .def("last_grad_norm", &ZeroOptimizer::last_grad_norm)
      .def("lamb_coefficients", &ZeroOptimizer::lamb_coefficients)
      .def("step_count", &ZeroOptimizer::step_count)
      .def("set_lr", &ZeroOptimizer::set_lr)
      .def("num_buckets", &ZeroOptimizer::num_buckets)
      .def("pinned", &ZeroOptimizer::pinned)
      .def("bucket_shard_numels", &ZeroOptimizer::bucket_shard_numels)
      .def("max_in_flight", &ZeroOptimizer::max_in_flight)
      .def("master_bytes", &ZeroOptimizer::master_bytes)
      .def("state_bytes", &ZeroOptimizer::state_bytes)
      .def("grad_partition_bytes", &ZeroOptimizer::grad_partition_bytes)
      .def("state_pieces",
           [](const ZeroOptimizer& z) { return pieces_to_python(z.state_pieces()); })
      .def(
          "load_state_pieces",
          [](ZeroOptimizer& z, const py::list& pieces, int64_t step_count) {
            std::vector<StatePiece> saved = pieces_from_python(pieces);
            py::gil_scoped_release release;
            z.load_state_pieces(saved, step_count);
          },
          py::arg("pieces"), py::arg("step_count"))
      .def("scaler_state",
           [](const ZeroOptimizer& z) -> std::optional<py::dict> {
             const LossScalerState* s = z.scaler_state();
             if (s == nullptr) return std::nullopt;
             return py::dict(py::arg("scale") = s->scale, py::arg("iteration") = s->iteration,
                             py::arg("last_overflow") = s->last_overflow,
                             py::arg("hysteresis_left") = s->hysteresis_left);
           })
      .def("set_scaler_state", [](ZeroOptimizer& z, const py::dict& d) {
        z.set_scaler_state({d["scale"].cast<double>(), d["iteration"].cast<int64_t>(),
                            d["last_overflow"].cast<int64_t>(), d["hysteresis_left"].cast<int>()});
      });
}

}  // namespace shardwise::zero
