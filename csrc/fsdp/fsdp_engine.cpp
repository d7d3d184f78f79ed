#include "fsdp/fsdp_engine.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "distributed/exact_norm.h"

namespace shardwise::fsdp {
namespace {

// Counts a parameter's gradient as ready once autograd has accumulated it into `.grad`.
class GradReadyHook : public torch::autograd::PostAccumulateGradHook {
 public:
  GradReadyHook(std::weak_ptr<FsdpEngine> engine, std::function<void()> ready)
      : engine_(std::move(engine)), ready_(std::move(ready)) {}
  void operator()(const torch::autograd::Variable&) override {
    if (!engine_.expired()) ready_();
  }

 private:
  std::weak_ptr<FsdpEngine> engine_;
  std::function<void()> ready_;
};

}  // namespace

std::shared_ptr<FsdpEngine> FsdpEngine::create(EngineOptions options) {
  return std::shared_ptr<FsdpEngine>(new FsdpEngine(std::move(options)));
}

FsdpUnit& FsdpEngine::unit(int index) {
  TORCH_CHECK_INDEX(index >= 0 && index < num_units(), "FSDP: no unit ", index, " (there are ",
                    num_units(), ")");
  return *units_[index];
}

int FsdpEngine::add_unit(std::vector<at::Tensor> params, UnitOptions options) {
  check_not_taken(params, options.name);
  if (!options.lanes) {
    if (!lanes_) {
      lanes_ = options_.lanes
                   ? options_.lanes
                   : make_lanes(params.empty() ? at::Device(at::kCPU) : params[0].device());
    }
    options.lanes = lanes_;
  }
  return add_unit(std::make_shared<FsdpUnit>(std::move(params), std::move(options)));
}

void FsdpEngine::check_not_taken(const std::vector<at::Tensor>& params,
                                 const std::string& name) const {
  for (const auto& existing : units_) {
    for (const auto& p : existing->params()) {
      for (const auto& q : params) {
        TORCH_CHECK_VALUE(!p.is_same(q), "FSDP: a parameter of unit '", name,
                          "' already belongs to unit '", existing->name(),
                          "'; a shared (tied) parameter must live in one unit: wrap the common "
                          "parent of the modules that share it instead of each module");
      }
    }
  }
}

int FsdpEngine::add_unit(std::shared_ptr<FsdpUnit> unit) {
  TORCH_CHECK_VALUE(unit != nullptr, "FSDP add_unit: the unit is null");
  for (const auto& existing : units_) {
    TORCH_CHECK_VALUE(existing != unit, "FSDP: unit '", unit->name(), "' was added twice");
  }
  check_not_taken(unit->params(), unit->name());
  const int index = num_units();
  units_.push_back(std::move(unit));
  forward_targets_.emplace_back();
  backward_targets_.emplace_back();
  std::weak_ptr<FsdpEngine> weak = weak_from_this();
  for (const auto& p : units_.back()->params()) {
    if (!p.requires_grad()) continue;
    FsdpEngine* self = this;
    torch::autograd::impl::set_post_acc_grad_hooks(
        p, std::make_unique<GradReadyHook>(weak, [self, index] { self->on_grad_ready(index); }));
  }
  pre_backward_done_.push_back(false);
  post_backward_done_.push_back(false);
  grads_ready_.push_back(0);
  return index;
}

int FsdpEngine::forward_position(int unit) const {
  for (int k = static_cast<int>(recorded_order_.size()) - 1; k >= 0; --k) {
    if (recorded_order_[k] == unit) return k;
  }
  return -1;
}

void FsdpEngine::set_forward_prefetch(int index, std::vector<int> targets) {
  unit(index);
  for (int target : targets) unit(target);
  forward_targets_[index] = std::move(targets);
}

void FsdpEngine::set_backward_prefetch(int index, std::vector<int> targets) {
  unit(index);
  for (int target : targets) unit(target);
  backward_targets_[index] = std::move(targets);
}

void FsdpEngine::prefetch(int unit) {
  // In backward, a unit already reduced needs no parameters again this iteration.
  if (unit < 0 || unit >= num_units() || (in_backward_ && post_backward_done_[unit])) return;
  if (!in_backward_) units_[unit]->drop_post_forward_shard();  // a forward gathers it all anew
  units_[unit]->unshard_async();
}

void FsdpEngine::pre_forward(int index) {
  FsdpUnit& u = unit(index);
  if (in_backward_) {  // recomputation under activation checkpointing
    u.unshard();
    u.declare_compute("recomputed forward");
    return;
  }
  if (index == root_) current_order_.clear();
  current_order_.push_back(index);
  u.drop_post_forward_shard();  // left by a forward whose backward never ran: maybe stale
  u.unshard();
  u.declare_compute("forward");
  for (int target : forward_targets_[index]) prefetch(target);
  if (options_.forward_prefetch && current_order_.size() < recorded_order_.size()) {
    prefetch(recorded_order_[current_order_.size()]);
  }
}

void FsdpEngine::post_forward(int index, const std::vector<at::Tensor>& outputs) {
  FsdpUnit& u = unit(index);
  if (in_backward_) return;
  if (!at::GradMode::is_enabled()) {  // evaluation: no backward follows to reshard
    if (index != root_) return u.reshard();
    for (auto& each : units_) {
      each->discard_gather();  // a prefetch the forward did not use
      each->reshard();
    }
    return;
  }
  if (u.options().reshard_after_forward) u.reshard_post_forward();
  std::weak_ptr<FsdpEngine> weak = weak_from_this();
  for (const at::Tensor& output : outputs) {
    if (!output.defined() || !output.requires_grad()) continue;
    output.register_hook([weak, index](const at::Tensor& grad) {
      if (auto engine = weak.lock()) engine->pre_backward(index);
      return grad;
    });
  }
}

void FsdpEngine::pre_backward(int index) {
  if (!in_backward_) {
    in_backward_ = true;
    std::weak_ptr<FsdpEngine> weak = weak_from_this();
    torch::autograd::Engine::get_default_engine().queue_callback([weak] {
      if (auto engine = weak.lock()) engine->finalize_backward();
    });
  }
  if (pre_backward_done_[index]) return;
  pre_backward_done_[index] = true;
  units_[index]->unshard();
  units_[index]->declare_compute("backward");
  for (int target : backward_targets_[index]) prefetch(target);
  if (options_.backward_prefetch == BackwardPrefetch::kBackwardPre &&
      backward_targets_[index].empty()) {
    const int position = forward_position(index);
    if (position > 0) prefetch(recorded_order_[position - 1]);
  }
}

void FsdpEngine::on_grad_ready(int index) {
  if (!in_backward_ || post_backward_done_[index]) return;
  // A unit with frozen parameters may still need them after its last gradient arrives (a frozen
  // norm weight for the input gradient): it reduces at the end of backward instead.
  if (units_[index]->requires_grad_count() < static_cast<int>(units_[index]->params().size())) {
    return;
  }
  if (++grads_ready_[index] >= units_[index]->requires_grad_count()) post_backward(index);
}

void FsdpEngine::post_backward(int index) {
  if (post_backward_done_[index]) return;
  post_backward_done_[index] = true;
  FsdpUnit& u = *units_[index];
  const bool sync = sync_ && u.options().requires_gradient_sync;
  if (sync) {
    while (reduce_queue_.size() >= kReduceBuffers) {  // frees the buffer this reduction reuses
      units_[reduce_queue_.front()]->finish_reduce();
      reduce_queue_.pop_front();
    }
  }
  u.reduce_gradients(sync, &reduce_buffers_[reduces_issued_ % kReduceBuffers]);
  if (u.reduce_pending()) {
    reduce_queue_.push_back(index);
    ++reduces_issued_;
  }
  if (u.options().reshard_after_backward) u.reshard();
  if (options_.backward_prefetch == BackwardPrefetch::kBackwardPost &&
      backward_targets_[index].empty()) {
    const int position = forward_position(index);
    if (position > 0) prefetch(recorded_order_[position - 1]);
  }
}

void FsdpEngine::finalize_backward() {
  // Units that ran forward but whose gradients were not all accumulated (unused parameters)
  // reduce now, in reverse forward order, identically on every rank.
  std::set<int> ran(current_order_.begin(), current_order_.end());
  for (auto it = current_order_.rbegin(); it != current_order_.rend(); ++it) {
    if (!post_backward_done_[*it] && units_[*it]->requires_grad_count() > 0) post_backward(*it);
  }
  for (int index : reduce_queue_) units_[index]->finish_reduce();
  reduce_queue_.clear();
  // The reduce-scatter inputs are reused within a backward and released after it, so they do
  // not add to the next forward's peak (which is where the activations peak).
  for (auto& buffer : reduce_buffers_) {
    if (buffer.defined() && !units_.empty()) units_[0]->lanes().freed(buffer);
    buffer = at::Tensor();
  }
  for (auto& u : units_) {
    u->discard_gather();  // a prefetch that was not used: its data predates the optimizer step
    u->drop_post_forward_shard();  // kept for a backward that did not need this unit
    if (u->options().reshard_after_backward) u->reshard();
  }
  std::fill(pre_backward_done_.begin(), pre_backward_done_.end(), false);
  std::fill(post_backward_done_.begin(), post_backward_done_.end(), false);
  std::fill(grads_ready_.begin(), grads_ready_.end(), 0);
  in_backward_ = false;
  if (!order_checked_) {
    recorded_order_ = current_order_;
    order_checked_ = true;
    check_order_across_ranks();
  }
}

void FsdpEngine::check_order_across_ranks() {
  const auto& group = options_.world_group;
  if (!group || group->getSize() == 1) return;
  at::Device device = units_.empty() || units_[0]->params().empty()
                          ? at::Device(at::kCPU)
                          : units_[0]->params()[0].device();
  const auto options = at::TensorOptions().dtype(at::kLong).device(device);
  at::Tensor length = at::full({1}, static_cast<int64_t>(recorded_order_.size()), options);
  at::Tensor lengths = at::empty({group->getSize()}, options);
  group->_allgather_base(lengths, length)->wait();
  const int64_t longest = lengths.max().item<int64_t>();
  at::Tensor mine = at::full({longest}, -1, options);
  for (size_t k = 0; k < recorded_order_.size(); ++k) mine[k] = recorded_order_[k];
  at::Tensor all = at::empty({group->getSize() * longest}, options);
  group->_allgather_base(all, mine)->wait();
  at::Tensor table = all.view({group->getSize(), longest}).cpu();
  for (int r = 1; r < group->getSize(); ++r) {
    for (int64_t k = 0; k < longest; ++k) {
      const int64_t a = table[0][k].item<int64_t>();
      const int64_t b = table[r][k].item<int64_t>();
      if (a == b) continue;
      auto name = [this](int64_t u) {
        return u < 0 ? std::string("(nothing)") : "'" + units_[u]->name() + "'";
      };
      TORCH_CHECK(false, "FSDP: the forward order differs across ranks: at position ", k,
                  " rank 0 ran unit ", name(a), " but rank ", r, " ran unit ", name(b),
                  "; every rank must run the same wrapped modules in the same order");
    }
  }
}

void FsdpEngine::reshard_all() {
  for (auto& u : units_) u->reshard();
}

double FsdpEngine::clip_grad_norm_(double max_norm, double norm_type) {
  const bool infinite = std::isinf(norm_type);
  TORCH_CHECK_VALUE(infinite || norm_type == 2.0, "FSDP clip_grad_norm_: norm_type ", norm_type,
                    " is not supported; use 2.0 or inf");
  std::vector<at::Tensor> grads;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  for (auto& u : units_) {
    if (!group) group = u->options().shard_group;
    for (const auto& g : u->grad_shard_views()) {
      if (g.defined()) grads.push_back(g);
    }
  }
  const bool deterministic = !units_.empty() && units_[0]->options().deterministic;
  if (deterministic && !infinite) {  // the exact sum: the same bits however the shards fall
    return distributed::clip_grad_norm_exact_(grads, max_norm, group.get());
  }
  at::Device device = grads.empty() ? at::Device(at::kCPU) : grads[0].device();
  at::Tensor total = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
  for (const auto& g : grads) {
    if (g.numel() == 0) continue;  // a rank may hold no element of a small parameter
    const at::Tensor local = g.to(at::kFloat);
    total = infinite ? at::maximum(total, local.abs().max().reshape({1}))
                     : total + local.pow(2).sum().reshape({1});
  }
  if (group && group->getSize() > 1) {
    std::vector<at::Tensor> tensors{total};
    c10d::AllreduceOptions reduce;
    reduce.reduceOp = infinite ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
    group->allreduce(tensors, reduce)->wait();
  }
  const double norm = infinite ? total.item<double>() : std::sqrt(total.item<double>());
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1.0) {
    for (auto& g : grads) g.mul_(coefficient);
  }
  return norm;
}

}  // namespace shardwise::fsdp
