#include "zero/zero_optimizer.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>

#include "sharding/shard_ops.h"

namespace shardwise::zero {
namespace {

class GradReadyHook : public torch::autograd::PostAccumulateGradHook {
 public:
  GradReadyHook(std::weak_ptr<ZeroOptimizer> owner, std::function<void()> ready)
      : owner_(std::move(owner)), ready_(std::move(ready)) {}
  void operator()(const torch::autograd::Variable&) override {
    if (!owner_.expired()) ready_();
  }

 private:
  std::weak_ptr<ZeroOptimizer> owner_;
  std::function<void()> ready_;
};

int group_size(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  return group ? group->getSize() : 1;
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(ZeroOptions options) : options_(std::move(options)) {
  TORCH_CHECK_VALUE(options_.stage >= 0 && options_.stage <= 3, "ZeRO: stage must be 0, 1, 2 or ",
                    "3, got ", options_.stage);
  TORCH_CHECK_VALUE(options_.reduce_bucket_numel > 0, "ZeRO: reduce_bucket_size must be > 0, got ",
                    options_.reduce_bucket_numel);
  TORCH_CHECK_VALUE(options_.gradient_clipping >= 0,
                    "ZeRO: gradient_clipping must be >= 0 (0: ", "off), got ",
                    options_.gradient_clipping);
  TORCH_CHECK_VALUE(options_.gradient_predivide_factor >= 0,
                    "ZeRO: gradient_predivide_factor must be > 0 (0: the data-parallel size), got ",
                    options_.gradient_predivide_factor);
  TORCH_CHECK_VALUE(
      options_.optimizer.kind != OptimizerKind::kLamb || !options_.tensor_parallel.group,
      "ZeRO: LAMB with tensor parallelism is not supported yet (a split parameter's trust ratio "
      "needs its norm over the tp group); use AdamW with a tp axis, or LAMB without one");
  dp_size_ = group_size(options_.group);
  rank_ = options_.group ? options_.group->getRank() : 0;
  if (options_.loss_scaler) scaler_ = std::make_unique<LossScaler>(*options_.loss_scaler);
  if (options_.deterministic) check_deterministic();
}

void ZeroOptimizer::check_deterministic() const {
  TORCH_CHECK_VALUE((dp_size_ & (dp_size_ - 1)) == 0, "ZeRO: deterministic needs a ",
                    "power-of-two data-parallel group (the gradients' summation tree), got ",
                    dp_size_, " ranks; use 1, 2, 4, 8, ..");
}

std::shared_ptr<ZeroOptimizer> ZeroOptimizer::create(std::vector<at::Tensor> params,
                                                     ZeroOptions options) {
  TORCH_CHECK_VALUE(options.stage <= 2, "ZeRO: create() is for stages 0-2; stage 3 shards ",
                    "parameters with the FSDP engine and steps them with create_local()");
  std::shared_ptr<ZeroOptimizer> zero(new ZeroOptimizer(std::move(options)));
  zero->init_partitioned(std::move(params));
  return zero;
}

std::shared_ptr<ZeroOptimizer> ZeroOptimizer::create_local(std::vector<at::Tensor> shards,
                                                           std::vector<PieceInfo> pieces,
                                                           ZeroOptions options) {
  std::shared_ptr<ZeroOptimizer> zero(new ZeroOptimizer(std::move(options)));
  zero->init_local(std::move(shards), std::move(pieces));
  return zero;
}

void ZeroOptimizer::allocate_state(const at::Tensor& like, int64_t numel) {
  const at::TensorOptions options =
      like.options().dtype(at::kFloat).pinned_memory(like.is_pinned());  // as the master
  std::vector<at::Tensor> state;
  const int count = options_.optimizer.kind == OptimizerKind::kSgd ? 1 : 2;
  for (int k = 0; k < count; ++k) state.push_back(at::zeros({numel}, options));
  state_.push_back(std::move(state));
}

void ZeroOptimizer::init_partitioned(std::vector<at::Tensor> params) {
  TORCH_CHECK_VALUE(!params.empty(), "ZeRO: no trainable parameters were given");
  TORCH_CHECK_VALUE(
      !options_.tensor_parallel.group || options_.tensor_parallel.split.size() == params.size(),
      "ZeRO: tensor_parallel.split has ", options_.tensor_parallel.split.size(), " entries for ",
      params.size(), " parameters; give one per parameter");
  world_ = options_.stage == 0 ? 1 : dp_size_;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    TORCH_CHECK_VALUE(p.is_contiguous(), "ZeRO: parameter ", i, " is not contiguous; call ",
                      ".contiguous() on the module's parameters first");
    TORCH_CHECK_TYPE(p.scalar_type() == params[0].scalar_type() && p.device() == params[0].device(),
                     "ZeRO: parameter ", i, " is ", p.scalar_type(), " on ", p.device(),
                     " but parameter 0 is ", params[0].scalar_type(), " on ", params[0].device(),
                     "; cast the model to one dtype and device");
    for (size_t j = 0; j < i; ++j) {
      TORCH_CHECK_VALUE(!p.is_same(params[j]), "ZeRO: parameter ", i, " is parameter ", j,
                        " again; pass each (tied) parameter once");
    }
  }
  params_ = std::move(params);
  bucket_of_.assign(params_.size(), -1);
  // Buckets in reverse parameter order: the order gradients become ready in backward.
  std::vector<int64_t> current;
  int64_t current_numel = 0;
  auto close = [&] {
    if (current.empty()) return;
    std::vector<int64_t> numels;
    for (int64_t i : current) numels.push_back(params_[i].numel());
    Bucket bucket{current, sharding::FlatLayout({numels, world_, shardwise::kShardAlign}),
                  partition_numel_};
    partition_numel_ += bucket.layout.shard_numel();
    for (int64_t i : current) bucket_of_[i] = static_cast<int>(buckets_.size());
    buckets_.push_back(std::move(bucket));
    current.clear();
    current_numel = 0;
  };
  for (int64_t i = static_cast<int64_t>(params_.size()) - 1; i >= 0; --i) {
    if (!current.empty() && current_numel + params_[i].numel() > options_.reduce_bucket_numel) {
      close();
    }
    current.push_back(i);
    current_numel += params_[i].numel();
  }
  close();
  const bool offload = options_.offload_optimizer;
  const bool pinned = offload && options_.pin_memory && params_[0].is_cuda();
  at::Tensor master =
      at::empty({partition_numel_}, params_[0]
                                        .options()
                                        .dtype(at::kFloat)
                                        .device(offload ? at::kCPU : params_[0].device())
                                        .pinned_memory(pinned));
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bucket = buckets_[b];
    std::vector<at::Tensor> pieces;
    std::vector<int64_t> numels;
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const at::Tensor flat = params_[bucket.params[k]].detach().view(-1);
      const int64_t start = bucket.layout.start(static_cast<int64_t>(k), part_rank());
      const int64_t valid = bucket.layout.valid(static_cast<int64_t>(k), part_rank());
      pieces.push_back(flat.narrow(0, std::min(start, flat.numel()), valid));
      numels.push_back(flat.numel());
      pieces_.push_back({bucket.params[k], start, valid, flat.numel()});
    }
    bucket_view(master, static_cast<int>(b))
        .copy_(shardwise::all_gather_copy_in(pieces, numels, world_, part_rank(), at::kFloat));
  }
  masters_ = {master};
  allocate_state(master, partition_numel_);
  if (reduces_in_backward()) {
    grad_partition_ = at::zeros({partition_numel_}, params_[0].options().dtype(reduce_type()));
    bucket_sums_.resize(buckets_.size());
    std::weak_ptr<ZeroOptimizer> weak = weak_from_this();
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!params_[i].requires_grad()) continue;
      ZeroOptimizer* self = this;
      const auto index = static_cast<int64_t>(i);
      torch::autograd::impl::set_post_acc_grad_hooks(
          params_[i],
          std::make_unique<GradReadyHook>(weak, [self, index] { self->on_grad_ready(index); }));
    }
  }
}

void ZeroOptimizer::init_local(std::vector<at::Tensor> shards, std::vector<PieceInfo> pieces) {
  TORCH_CHECK_VALUE(shards.size() == pieces.size(), "ZeRO: ", shards.size(), " shards but ",
                    pieces.size(), " piece descriptions; pass one per shard");
  TORCH_CHECK_VALUE(!options_.offload_optimizer, "ZeRO stage 3: offload_optimizer is done by ",
                    "the FSDP engine (its CPU offload of shards); leave it 'none' here");
  for (size_t i = 0; i < shards.size(); ++i) {
    TORCH_CHECK_TYPE(shards[i].scalar_type() == at::kFloat, "ZeRO stage 3: shard ", i, " is ",
                     shards[i].scalar_type(), "; the FSDP master shards must be float32");
    TORCH_CHECK_VALUE(shards[i].numel() == pieces[i].numel, "ZeRO stage 3: shard ", i, " has ",
                      shards[i].numel(), " elements but its piece says ", pieces[i].numel);
    const auto& tp = options_.tensor_parallel;
    TORCH_CHECK_VALUE(!tp.group || (pieces[i].param >= 0 &&
                                    pieces[i].param < static_cast<int64_t>(tp.split.size())),
                      "ZeRO: tensor_parallel.split has ", tp.split.size(), " entries but shard ", i,
                      " is of parameter ", pieces[i].param, "; give one per parameter id");
    allocate_state(shards[i], shards[i].numel());
  }
  local_ = true;
  world_ = dp_size_;
  masters_ = std::move(shards);
  pieces_ = std::move(pieces);
}

at::Tensor ZeroOptimizer::bucket_view(const at::Tensor& partition, int bucket) const {
  return partition.narrow(0, buckets_[bucket].offset, buckets_[bucket].layout.shard_numel());
}

// ---- stage 2: reduce-scatter during backward ----------------------------------------------

void ZeroOptimizer::on_grad_ready(int64_t param) {
  if (!in_backward_) {
    in_backward_ = true;
    std::weak_ptr<ZeroOptimizer> weak = weak_from_this();
    torch::autograd::Engine::get_default_engine().queue_callback([weak] {
      if (auto zero = weak.lock()) zero->finalize_backward();
    });
  }
  Bucket& bucket = buckets_[bucket_of_[param]];
  ++bucket.ready;
  launch_ready_buckets();
}

// Buckets launch in bucket order only (the same collective order on every rank even if
// gradients complete in a different order).
void ZeroOptimizer::launch_ready_buckets() {
  while (next_launch_ < buckets_.size()) {
    Bucket& bucket = buckets_[next_launch_];
    int needed = 0;
    for (int64_t i : bucket.params) needed += params_[i].requires_grad() ? 1 : 0;
    if (bucket.ready < needed) return;
    launch_reduce(static_cast<int>(next_launch_++));
  }
}

void ZeroOptimizer::launch_reduce(int b) {
  Bucket& bucket = buckets_[b];
  while (in_flight_.size() >= reduce_buffers_.size()) finish_oldest();
  std::vector<std::optional<at::Tensor>> grads;
  std::vector<int64_t> numels;
  bool any = false;
  for (int64_t i : bucket.params) {
    at::Tensor grad = params_[i].grad();
    if (grad.defined()) {
      grads.emplace_back(grad.reshape(-1));
      any = true;
    } else {
      grads.emplace_back(std::nullopt);
    }
    numels.push_back(params_[i].numel());
  }
  if (!any) grads[0] = at::zeros({numels[0]}, params_[0].options());
  const int64_t bytes = bucket.layout.total_numel() * c10::elementSize(reduce_type());
  at::Tensor& scratch = reduce_buffers_[reduces_issued_++ % reduce_buffers_.size()];
  if (!scratch.defined() || scratch.numel() < bytes) {
    scratch = at::empty({bytes}, params_[0].options().dtype(at::kByte));
  }
  at::Tensor input = scratch.narrow(0, 0, bytes).view(reduce_type());
  const bool tree = options_.deterministic;  // sums: no pre-divide
  shardwise::reduce_scatter_copy_in_(grads, numels, world_, tree ? 1.0 : 1.0 / predivide_factor(),
                                     input);
  for (int64_t i : bucket.params) params_[i].mutable_grad() = at::Tensor();  // frees .grad
  Reduction reduction{b, input, {}};  // world 1: reduced in place
  if (world_ > 1) {
    reduction.output = at::empty({bucket.layout.shard_numel()}, input.options());
    reduction.work =
        tree ? distributed::tree_reduce_scatter(*options_.group, reduction.output, input)
             : options_.group->_reduce_scatter_base(reduction.output, input);
  } else if (dp_size_ > 1 && tree) {  // stage 0: all-reduce the whole bucket
    distributed::tree_all_reduce_(*options_.group, input);
  } else if (dp_size_ > 1) {
    std::vector<at::Tensor> tensors{input};
    reduction.work = options_.group->allreduce(tensors);
  }
  bucket.launched = true;
  in_flight_.push_back(std::move(reduction));
  max_in_flight_ = std::max(max_in_flight_, static_cast<int>(in_flight_.size()));
  if (!options_.overlap_comm) finish_oldest();
}

void ZeroOptimizer::finish_oldest() {
  Reduction reduction = std::move(in_flight_.front());
  in_flight_.pop_front();
  if (reduction.work) reduction.work->wait();
  at::Tensor target = bucket_view(grad_partition_, reduction.bucket);
  if (!options_.deterministic) {
    target.add_(reduction.output);
    return;
  }
  // A leaf of the bucket's tree over micro-batches (a copy: world 1 reduces in the scratch).
  distributed::PairwiseGradients& sum = bucket_sums_[reduction.bucket];
  sum.push({world_ == 1 ? reduction.output.clone() : reduction.output});
  std::vector<at::Tensor> out{target};
  sum.total_into(out);
}

void ZeroOptimizer::finalize_backward() {
  for (size_t b = next_launch_; b < buckets_.size(); ++b) {  // unused parameters: zeros
    launch_reduce(static_cast<int>(b));
  }
  while (!in_flight_.empty()) finish_oldest();
  for (Bucket& bucket : buckets_) {
    bucket.ready = 0;
    bucket.launched = false;
  }
  next_launch_ = 0;
  in_backward_ = false;
  grads_pending_ = true;
}

}  // namespace shardwise::zero
