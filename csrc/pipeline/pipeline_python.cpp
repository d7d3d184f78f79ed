#include "pipeline/pipeline_python.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "pipeline/deferred_linear.h"
#include "pipeline/executor.h"
#include "pipeline/partition.h"
#include "pipeline/pipeline.h"
#include "pipeline/schedule.h"
#include "pipeline/schedule_validator.h"
#include "pipeline/split_by_time.h"

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

using Fn = std::function<at::Tensor(const at::Tensor&)>;
using LossFn = std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>;

std::vector<TimedBlock> timed_blocks(std::vector<Fn> forwards,
                                     std::vector<std::vector<at::Tensor>> parameters) {
  TORCH_CHECK_VALUE(forwards.size() == parameters.size(), "split: one parameter list per block");
  std::vector<TimedBlock> blocks;
  for (size_t k = 0; k < forwards.size(); ++k) {
    blocks.push_back({std::move(forwards[k]), std::move(parameters[k])});
  }
  return blocks;
}

TimingOptions timing(int repeats, std::optional<LossFn> loss, std::optional<at::Tensor> target) {
  TimingOptions o;
  o.repeats = repeats;
  if (loss) o.loss = std::move(*loss);
  if (target) o.target = *target;
  return o;
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
      [](const Schedule& s, double forward, double backward, bool buffered_sends,
         std::vector<double> stage_forward, std::vector<double> stage_backward) {
        CostModel costs;
        costs.forward = forward;
        costs.backward = backward;
        costs.backward_input = costs.backward_weight = backward / 2;
        costs.buffered_sends = buffered_sends;
        costs.stage_forward = std::move(stage_forward);
        costs.stage_backward = std::move(stage_backward);
        return report_dict(validate(s, costs));
      },
      py::arg("schedule"), py::arg("forward") = 1.0, py::arg("backward") = 2.0,
      py::arg("buffered_sends") = true, py::arg("stage_forward") = std::vector<double>{},
      py::arg("stage_backward") = std::vector<double>{});
  py::class_<Pipeline, std::shared_ptr<Pipeline>>(m, "Pipeline",
                                                  "A pipeline training step (pipeline/pipeline.h).")
      .def(py::init([](std::vector<int> stage_ids, std::vector<Fn> forwards,
                       std::vector<std::vector<std::pair<std::string, at::Tensor>>> parameters,
                       std::vector<std::optional<std::function<void(bool)>>> gradient_syncs,
                       const Schedule& schedule, int rank, std::optional<Group> group,
                       std::optional<Group> data_parallel_group,
                       const std::vector<std::tuple<int, std::string, int, std::string>>& tied,
                       std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> loss,
                       bool deterministic, int accumulation,
                       std::optional<std::function<void(int, int)>> before_forward) {
             const size_t n = stage_ids.size();
             TORCH_CHECK_VALUE(
                 forwards.size() == n && parameters.size() == n && gradient_syncs.size() == n,
                 "Pipeline: one forward, parameter list and sync per stage id");
             std::vector<PipelineStage> stages(n);
             for (size_t k = 0; k < n; ++k) {
               stages[k] = {stage_ids[k], std::move(forwards[k]), std::move(parameters[k]),
                            gradient_syncs[k] ? *gradient_syncs[k] : nullptr};
             }
             PipelineOptions o;
             o.schedule = schedule;
             o.rank = rank;
             if (group) o.group = *group;
             if (data_parallel_group) o.data_parallel_group = *data_parallel_group;
             for (const auto& [a, name_a, b, name_b] : tied)
               o.tied.push_back({a, name_a, b, name_b});
             o.loss = std::move(loss);
             o.deterministic = deterministic;
             o.accumulation = accumulation;
             if (before_forward) o.before_forward = *before_forward;
             py::gil_scoped_release release;  // the tied exchange waits for other processes
             return std::make_shared<Pipeline>(std::move(stages), std::move(o));
           }),
           py::arg("stage_ids"), py::arg("forwards"), py::arg("parameters"),
           py::arg("gradient_syncs"), py::arg("schedule"), py::arg("rank"), py::arg("group"),
           py::arg("data_parallel_group"), py::arg("tied"), py::arg("loss"),
           py::arg("deterministic") = false, py::arg("accumulation") = 1,
           py::arg("before_forward") = py::none())
      .def("step",
           [](Pipeline& p, std::optional<at::Tensor> inputs, std::optional<at::Tensor> targets) {
             StepResult r;
             {
               // Autograd must run without the GIL; the stage and loss callables take it back.
               py::gil_scoped_release release;
               r = p.step(inputs.value_or(at::Tensor()), targets.value_or(at::Tensor()));
             }
             return py::dict(py::arg("loss") = r.loss, py::arg("times") = r.times,
                             py::arg("peak_stashed") = r.peak_stashed,
                             py::arg("losses") = r.losses);
           })
      .def("evaluate",
           [](Pipeline& p, std::optional<at::Tensor> inputs, std::optional<at::Tensor> targets) {
             py::gil_scoped_release release;  // the stage and loss callables take it back
             return p.evaluate(inputs.value_or(at::Tensor()), targets.value_or(at::Tensor())).loss;
           })
      .def(
          "evaluate_losses",
          [](Pipeline& p, std::optional<at::Tensor> inputs, std::optional<at::Tensor> targets) {
            py::gil_scoped_release release;
            return p.evaluate(inputs.value_or(at::Tensor()), targets.value_or(at::Tensor())).losses;
          })
      .def("clip_grad_norm_", &Pipeline::clip_grad_norm_, py::arg("max_norm"),
           py::call_guard<py::gil_scoped_release>());
  m.def(
      "pipeline_group_times",
      [](std::vector<Fn> forwards, std::vector<std::vector<at::Tensor>> parameters,
         const std::vector<std::vector<int>>& groups, const at::Tensor& sample, int repeats,
         std::optional<LossFn> loss, std::optional<at::Tensor> target) {
        const auto blocks = timed_blocks(std::move(forwards), std::move(parameters));
        const TimingOptions o = timing(repeats, std::move(loss), std::move(target));
        py::gil_scoped_release release;
        return group_times(blocks, groups, sample, o);
      },
      py::arg("forwards"), py::arg("parameters"), py::arg("groups"), py::arg("sample"),
      py::arg("repeats"), py::arg("loss"), py::arg("target"));
  m.def(
      "pipeline_split_by_time",
      [](std::vector<Fn> forwards, std::vector<std::vector<at::Tensor>> parameters, int num_stages,
         const at::Tensor& sample, int repeats, std::optional<LossFn> loss,
         std::optional<at::Tensor> target, bool refine) {
        const auto blocks = timed_blocks(std::move(forwards), std::move(parameters));
        const TimingOptions o = timing(repeats, std::move(loss), std::move(target));
        py::gil_scoped_release release;
        return split_by_time(blocks, num_stages, sample, o, refine);
      },
      py::arg("forwards"), py::arg("parameters"), py::arg("num_stages"), py::arg("sample"),
      py::arg("repeats"), py::arg("loss"), py::arg("target"), py::arg("refine"));
  m.def("pipeline_split_by_parameters", &split_by_parameters, py::arg("parameters"),
        py::arg("num_stages"));
  m.def("pipeline_stage_groups", &stage_groups, py::arg("starts"), py::arg("num_blocks"));
}

}  // namespace shardwise::pipeline
