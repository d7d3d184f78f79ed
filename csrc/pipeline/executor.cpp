#include "pipeline/executor.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "pipeline/schedule_validator.h"

namespace shardwise::pipeline {
namespace {

constexpr int64_t kHeader = 10;  // dtype, rank, up to 8 sizes
constexpr int kMaxDims = static_cast<int>(kHeader) - 2;

}  // namespace

PipelineExecutor::PipelineExecutor(std::vector<int> stage_ids,
                                   std::vector<StageFn> stages,
                                   ExecutorOptions options)
    : options_(std::move(options)), stage_ids_(std::move(stage_ids)), stages_(std::move(stages)) {
  const Schedule& s = options_.schedule;
  try {
    check_schedule(s);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
  TORCH_CHECK_VALUE(options_.rank >= 0 && options_.rank < s.num_ranks, "pipeline: rank ",
                    options_.rank, " is outside the schedule's ", s.num_ranks, " ranks");
  TORCH_CHECK_VALUE(
      s.num_ranks == 1 || (options_.group && options_.group->getSize() == s.num_ranks),
      "pipeline: the process group must have the schedule's ", s.num_ranks, " ranks");
  TORCH_CHECK_VALUE(stage_ids_.size() == stages_.size(), "pipeline: ", stage_ids_.size(),
                    " stage ids for ", stages_.size(), " stage functions");
  std::vector<int> expected;
  for (int st = 0; st < s.num_stages; ++st) {
    if (s.rank_of(st) == options_.rank) expected.push_back(st);
  }
  std::vector<int> given = stage_ids_;
  std::sort(given.begin(), given.end());
  TORCH_CHECK_VALUE(given == expected, "pipeline: rank ", options_.rank, " must hold stages ",
                    c10::ArrayRef<int>(expected), " of the schedule, got ",
                    c10::ArrayRef<int>(given));
  TORCH_CHECK_VALUE(static_cast<bool>(options_.loss), "pipeline: a loss function is required");
  evaluation_ = forward_only(s);
  check_schedule(evaluation_);
  const auto& list = s.ranks[options_.rank];
  for (int stage : stage_ids_) {
    size_t last = 0;
    for (size_t k = 0; k < list.size(); ++k) {
      const bool backward =
          list[k].kind == ActionKind::kBackward || list[k].kind == ActionKind::kBackwardInput;
      if (backward && list[k].stage == stage) last = k;
    }
    last_backwards_.push_back(last);
  }
}

PipelineExecutor::Stash& PipelineExecutor::stash(int stage, int microbatch) {
  return stash_[{stage, microbatch}];
}

void PipelineExecutor::forward(const Action& a,
                               const std::vector<at::Tensor>& inputs,
                               StepResult& result) {
  const Schedule& s = options_.schedule;
  Stash& st = stash(a.stage, a.microbatch);
  at::Tensor input;
  if (a.stage == 0) {
    TORCH_CHECK_INDEX(a.microbatch < static_cast<int>(inputs.size()), "pipeline: step() got ",
                      inputs.size(), " microbatches but the schedule has ", s.num_microbatches);
    input = inputs[a.microbatch];
  } else {
    input = st.input.defined() ? st.input : stash(a.stage - 1, a.microbatch).output.detach();
    if (evaluating_) stash_.erase({a.stage - 1, a.microbatch});  // consumed (st stays valid)
    if (input.is_floating_point() && !evaluating_) input.requires_grad_(true);
  }
  st.input = input;
  const auto index = std::find(stage_ids_.begin(), stage_ids_.end(), a.stage) - stage_ids_.begin();
  at::Tensor output;
  if (options_.before_forward) options_.before_forward(a.stage, a.microbatch);
  {
    WeightGradStore::Capture capture(weight_grads_.get());  // deferred_linear layers find it
    output = stages_[index](input);
  }
  if (a.stage == s.num_stages - 1) {
    const at::Tensor loss = options_.loss(output, a.microbatch);
    const double divisor = options_.loss_divisor > 0 && !evaluating_ ? options_.loss_divisor
                                                                     : double(s.num_microbatches);
    st.loss = loss / divisor;
    result.loss += st.loss.item<double>();
    result.losses.resize(s.num_microbatches);
    result.losses[a.microbatch] = loss.item<double>();
    if (evaluating_) stash_.erase({a.stage, a.microbatch});
  } else {
    st.output = output;
    if (evaluating_) st.input = at::Tensor();
  }
  result.peak_stashed = std::max(result.peak_stashed, ++stashed_);
}

void PipelineExecutor::backward(const Action& a) {
  const Schedule& s = options_.schedule;
  Stash& st = stash(a.stage, a.microbatch);
  const bool split = a.kind == ActionKind::kBackwardInput;
  weight_grads_->set_deferring(split);
  struct Reset {
    WeightGradStore* store;
    ~Reset() { store->set_deferring(false); }
  } reset{weight_grads_.get()};
  if (a.stage == s.num_stages - 1) {
    torch::autograd::backward({st.loss});
  } else {
    at::Tensor grad = st.output_grad;
    if (!grad.defined()) {  // the next stage is on this rank
      auto next = stash_.find({a.stage + 1, a.microbatch});
      TORCH_CHECK(next != stash_.end() && next->second.input_grad.defined(),
                  "pipeline: no gradient for the output of stage ", a.stage, " microbatch ",
                  a.microbatch);
      grad = next->second.input_grad;
      stash_.erase(next);
    }
    if (st.output.requires_grad()) torch::autograd::backward({st.output}, {grad});
  }
  at::Tensor input_grad = a.stage > 0 && st.input.requires_grad() ? st.input.grad() : at::Tensor();
  st = Stash{};
  if (split) {
    deferred_[{a.stage, a.microbatch}] = weight_grads_->take();
  } else {
    --stashed_;
  }
  if (input_grad.defined()) {
    st.input_grad = input_grad;
  } else {
    stash_.erase({a.stage, a.microbatch});
  }
}

void PipelineExecutor::backward_weight(const Action& a) {
  auto it = deferred_.find({a.stage, a.microbatch});
  TORCH_CHECK(it != deferred_.end(), "pipeline: W", a.stage, ".", a.microbatch,
              " has no input-gradient action before it");
  for (auto& work : it->second) work();
  deferred_.erase(it);
  --stashed_;
}

void PipelineExecutor::send(const at::Tensor& tensor, int peer) {
  TORCH_CHECK_VALUE(tensor.dim() <= kMaxDims, "pipeline: tensors between stages may have at most ",
                    kMaxDims, " dimensions, got ", tensor.dim());
  at::Tensor header = at::zeros({kHeader}, at::kLong);
  header[0] = static_cast<int64_t>(tensor.scalar_type());
  header[1] = tensor.dim();
  for (int64_t d = 0; d < tensor.dim(); ++d) header[2 + d] = tensor.size(d);
  for (const at::Tensor& t : {header, tensor.contiguous()}) {
    std::vector<at::Tensor> list{t};
    pending_sends_.push_back(options_.group->send(list, peer, 0));
    sent_.push_back(t);
  }
}

at::Tensor PipelineExecutor::receive(int peer) {
  std::vector<at::Tensor> header{at::empty({kHeader}, at::kLong)};
  options_.group->recv(header, peer, 0)->wait();
  const int64_t* h = header[0].const_data_ptr<int64_t>();
  std::vector<int64_t> sizes(h + 2, h + 2 + h[1]);
  const auto dtype = static_cast<at::ScalarType>(h[0]);
  std::vector<at::Tensor> data{at::empty(sizes, at::device(options_.device).dtype(dtype))};
  options_.group->recv(data, peer, 0)->wait();
  return data[0];
}

// Posts the group's sends, then completes its receives in order.
void PipelineExecutor::run_group(const std::vector<Action>& list, size_t begin, size_t end) {
  const Schedule& s = options_.schedule;
  for (size_t k = begin; k < end; ++k) {
    const Action& a = list[k];
    if (a.kind == ActionKind::kSendForward) {
      send(stash(a.stage, a.microbatch).output.detach(), s.rank_of(a.stage + 1));
      if (evaluating_) stash_.erase({a.stage, a.microbatch});
    } else if (a.kind == ActionKind::kSendBackward) {
      auto it = stash_.find({a.stage, a.microbatch});
      TORCH_CHECK(it != stash_.end() && it->second.input_grad.defined(),
                  "pipeline: no input gradient to send for stage ", a.stage);
      send(it->second.input_grad, s.rank_of(a.stage - 1));
      stash_.erase(it);
    }
  }
  for (size_t k = begin; k < end; ++k) {
    const Action& a = list[k];
    if (a.kind == ActionKind::kRecvForward) {
      stash(a.stage, a.microbatch).input = receive(s.rank_of(a.stage - 1));
    } else if (a.kind == ActionKind::kRecvBackward) {
      stash(a.stage, a.microbatch).output_grad = receive(s.rank_of(a.stage + 1));
    }
  }
}

StepResult PipelineExecutor::step(const std::vector<at::Tensor>& inputs) {
  return run(options_.schedule.ranks[options_.rank], inputs);
}

StepResult PipelineExecutor::evaluate(const std::vector<at::Tensor>& inputs) {
  at::NoGradGuard no_grad;
  evaluating_ = true;
  struct Reset {
    bool& flag;
    ~Reset() { flag = false; }
  } reset{evaluating_};
  return run(evaluation_.ranks[options_.rank], inputs);
}

StepResult PipelineExecutor::run(const std::vector<Action>& list,
                                 const std::vector<at::Tensor>& inputs) {
  const Schedule& s = options_.schedule;
  StepResult result;
  stash_.clear();
  deferred_.clear();
  stashed_ = 0;
  const auto start = std::chrono::steady_clock::now();
  auto now = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  for (size_t k = 0; k < list.size();) {
    const double begin = now();
    if (s.is_communication(list[k])) {
      size_t end = k;
      while (end < list.size() && s.is_communication(list[end])) ++end;
      run_group(list, k, end);
      for (; k < end; ++k) result.times.push_back({begin, now()});
      continue;
    }
    // each compute action a profiler range of its name ("pipeline:F1.0"): traces show the
    // schedule as it ran (the name is built only while a profiler records)
    RECORD_USER_SCOPE("pipeline:" + action_name(list[k]));
    if (list[k].kind == ActionKind::kForward) {
      forward(list[k], inputs, result);
    } else if (list[k].kind == ActionKind::kBackwardWeight) {
      backward_weight(list[k]);
    } else {
      const auto is_last = std::find(last_backwards_.begin(), last_backwards_.end(), k);
      if (is_last != last_backwards_.end() && options_.before_last_backward) {
        options_.before_last_backward(list[k].stage);
      }
      backward(list[k]);
      if (options_.after_backward) options_.after_backward(list[k].stage, list[k].microbatch);
    }
    result.times.push_back({begin, now()});
    ++k;
  }
  for (auto& work : pending_sends_) work->wait();
  pending_sends_.clear();
  sent_.clear();
  stash_.clear();
  deferred_.clear();
  return result;
}

}  // namespace shardwise::pipeline
