#include "pipeline/pipeline_python.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "pipeline/deferred_linear.h"
#include "pipeline/executor.h"
#include "pipeline/partition.h"
#include "pipeline/schedule.h"
#include "pipeline/schedule_validator.h"

namespace py = pybind11;

namespace shardwise::pipeline {
namespace {

using Group = c10::intrusive_ptr<c10d::ProcessGroup>;

ScheduleKind kind_of(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::k1F1B;
  if (name == "interleaved_1f1b") return ScheduleKind::kInterleaved1F1B;
  if (name == "zb_h1") return ScheduleKind::kZeroBubbleH1;
  throw py::value_error("schedule '" + name + "'; valid: gpipe, 1f1b, interleaved_1f1b, zb_h1");
}

py::dict report_dict(const ValidationReport& r) {
  return py::dict(py::arg("ok") = r.ok, py::arg("error") = r.error,
                  py::arg("makespan") = r.makespan, py::arg("bubble_fraction") = r.bubble_fraction,
                  py::arg("peak_in_flight") = r.peak_in_flight, py::arg("times") = r.times);
}

}  // namespace

void bind_pipeline(py::module& m) {
  py::class_<Schedule>(m, "PipelineSchedule", "A pipeline schedule (pipeline/schedule.h).")
      .def_readonly("name", &Schedule::name)
      .def_readonly("num_ranks", &Schedule::num_ranks)
      .def_readonly("num_stages", &Schedule::num_stages)
      .def_readonly("num_microbatches", &Schedule::num_microbatches)
      .def("actions",
           [](const Schedule& s, int rank) {
             std::vector<std::string> names;
             for (const Action& a : s.ranks.at(rank)) names.push_back(action_name(a));
             return names;
           })
      .def("__str__", [](const Schedule& s) { return to_string(s); });
  m.def(
      "make_pipeline_schedule",
      [](const std::string& kind, int ranks, int microbatches, int virtual_stages) {
        ScheduleOptions o{kind_of(kind), ranks, microbatches, virtual_stages};
        try {
          return make_schedule(o);
        } catch (const std::invalid_argument& e) {
          throw py::value_error(e.what());
        }
      },
      py::arg("kind"), py::arg("num_ranks"), py::arg("num_microbatches"),
      py::arg("virtual_stages") = 1);
  m.def(
      "deferred_linear",
      [](const at::Tensor& input, const at::Tensor& weight, std::optional<at::Tensor> bias) {
        return deferred_linear(input, weight, bias);
      },
      py::arg("input"), py::arg("weight"), py::arg("bias") = py::none(),
      "at::linear whose weight gradients a zero-bubble schedule defers to its W actions.");
  m.def(
      "balanced_partition",
      [](const std::vector<double>& costs, int num_stages) {
        try {
          return balanced_partition(costs, num_stages);
        } catch (const std::invalid_argument& e) {
          throw py::value_error(e.what());
        }
      },
      py::arg("costs"), py::arg("num_stages"),
      "First block of each stage: contiguous runs minimizing the largest total cost.");
  m.def(
      "validate_pipeline_schedule",
      [](const Schedule& s, double forward, double backward, bool buffered_sends) {
        CostModel costs;
        costs.forward = forward;
        costs.backward = backward;
        costs.backward_input = costs.backward_weight = backward / 2;
        costs.buffered_sends = buffered_sends;
        return report_dict(validate(s, costs));
      },
      py::arg("schedule"), py::arg("forward") = 1.0, py::arg("backward") = 2.0,
      py::arg("buffered_sends") = true);
  py::class_<PipelineExecutor, std::shared_ptr<PipelineExecutor>>(
      m, "PipelineExecutor", "The C++ pipeline executor (pipeline/executor.h).")
      .def(py::init([](std::vector<int> stage_ids,
                       std::vector<std::function<at::Tensor(const at::Tensor&)>> stages,
                       const Schedule& schedule, int rank, std::optional<Group> group,
                       std::function<at::Tensor(const at::Tensor&, int)> loss,
                       std::optional<std::function<void(int)>> before_last_backward) {
             ExecutorOptions o;
             o.schedule = schedule;
             o.rank = rank;
             if (group) o.group = *group;
             o.loss = std::move(loss);
             if (before_last_backward) o.before_last_backward = *before_last_backward;
             return std::make_shared<PipelineExecutor>(std::move(stage_ids), std::move(stages),
                                                       std::move(o));
           }),
           py::arg("stage_ids"), py::arg("stages"), py::arg("schedule"), py::arg("rank"),
           py::arg("group"), py::arg("loss"), py::arg("before_last_backward") = py::none())
      .def("step", [](PipelineExecutor& e, const std::vector<at::Tensor>& inputs) {
        StepResult r;
        {
          // Autograd must run without the GIL; the stage and loss callables take it back.
          py::gil_scoped_release release;
          r = e.step(inputs);
        }
        return py::dict(py::arg("loss") = r.loss, py::arg("times") = r.times,
                        py::arg("peak_stashed") = r.peak_stashed);
      });
}

}  // namespace shardwise::pipeline
