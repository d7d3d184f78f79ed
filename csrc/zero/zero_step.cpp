// ZeroOptimizer::step and what it needs: the stage 0/1 reduction at the accumulation boundary,
// the overflow check and gradient norm over the group, the fused optimizer call and the
// all-gather of the updated parameters.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <cmath>

#include "distributed/exact_norm.h"
#include "optim/lamb_ops.h"
#include "sharding/shard_ops.h"
#include "tensor_parallel/grad_norm.h"
#include "zero/zero_optimizer.h"

namespace shardwise::zero {
namespace {

void all_reduce_sum(const c10::intrusive_ptr<c10d::ProcessGroup>& group, at::Tensor& tensor) {
  std::vector<at::Tensor> tensors{tensor};
  group->allreduce(tensors)->wait();
}

}  // namespace

at::Tensor ZeroOptimizer::reduce_all_now() {
  grad_partition_ = at::zeros({partition_numel_}, params_[0].options());
  for (size_t b = 0; b < buckets_.size(); ++b) launch_reduce(static_cast<int>(b));
  while (!in_flight_.empty()) finish_oldest();
  return grad_partition_;
}

std::vector<at::Tensor> ZeroOptimizer::local_grads() const {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& master : masters_) {
    at::Tensor grad = master.grad();
    grads.push_back(grad.defined() ? grad.reshape(-1) : at::zeros_like(master).reshape(-1));
  }
  return grads;
}

bool ZeroOptimizer::any_overflow(const std::vector<at::Tensor>& grads) const {
  at::Tensor flag = at::zeros({1}, grads[0].options().dtype(at::kFloat));
  for (const at::Tensor& grad : grads) flag.add_(at::logical_not(at::isfinite(grad)).any());
  if (dp_size_ > 1 && (local_ || world_ > 1)) all_reduce_sum(options_.group, flag);
  const auto& tp = options_.tensor_parallel.group;
  if (tp && tp->getSize() > 1) all_reduce_sum(tp, flag);  // every tp rank skips alike
  return flag.item<float>() > 0;
}

// The 2-norm of the whole model's gradient: partitions are disjoint across ranks (padding is
// zero), so the squares are summed over the group; stage 0 gradients are already complete.
double ZeroOptimizer::global_norm(const std::vector<at::Tensor>& grads) const {
  if (options_.tensor_parallel.group) return tensor_parallel_norm(grads);
  if (options_.deterministic) {  // exact: the same bits however the partitions fall
    const bool split = dp_size_ > 1 && (local_ || world_ > 1);
    return distributed::exact_norm(grads, split ? options_.group.get() : nullptr);
  }
  at::Tensor squares = at::zeros({1}, grads[0].options().dtype(at::kDouble));
  for (const at::Tensor& grad : grads) {
    squares.add_(at::linalg_vector_norm(grad, 2, {}, false, at::kFloat).to(at::kDouble).pow(2));
  }
  if (dp_size_ > 1 && (local_ || world_ > 1)) all_reduce_sum(options_.group, squares);
  return std::sqrt(squares.item<double>());
}

// With tensor parallelism: each piece's squares go to the split or the replicated sum by its
// parameter (the partition's pieces lie where state_pieces() says), then
// tensor_parallel::global_norm reduces them over the data group (partitions) and the tp group.
double ZeroOptimizer::tensor_parallel_norm(const std::vector<at::Tensor>& grads) const {
  const std::vector<bool>& split = options_.tensor_parallel.split;
  double sums[2] = {0.0, 0.0};  // split, replicated
  for_each_piece([&](size_t k, size_t master, int64_t offset) {
    const at::Tensor grad = grads[master].narrow(0, offset, pieces_[k].numel);
    const double sq = at::linalg_vector_norm(grad, 2, {}, false, at::kDouble).pow(2).item<double>();
    sums[split[pieces_[k].param] ? 0 : 1] += sq;
  });
  tensor_parallel::ClipOptions reduce;
  reduce.tp_group = options_.tensor_parallel.group;
  if (local_ || world_ > 1) reduce.shard_group = options_.group;
  return tensor_parallel::global_norm(sums[0], sums[1], reduce);
}

void ZeroOptimizer::run_optimizer(const std::vector<at::Tensor>& masters,
                                  const std::vector<at::Tensor>& grads,
                                  const std::vector<at::Tensor>& low,
                                  const std::vector<std::vector<at::Tensor>>& state,
                                  double grad_scale) {
  const OptimizerOptions& o = options_.optimizer;
  std::vector<at::Tensor> first, second;
  for (const auto& s : state) {
    first.push_back(s[0]);
    if (s.size() > 1) second.push_back(s[1]);
  }
  if (o.kind == OptimizerKind::kLamb) {
    run_lamb(masters, grads, low, first, second, grad_scale);
  } else if (o.kind == OptimizerKind::kAdamW) {
    static auto op =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("shardwise::fused_adamw_", "")
            .typed<void(at::TensorList, at::TensorList, at::TensorList, at::TensorList,
                        at::TensorList, double, double, double, double, double, int64_t, double)>();
    op.call(masters, grads, first, second, low, o.lr, o.beta1, o.beta2, o.eps, o.weight_decay,
            step_count_, grad_scale);
  } else {
    if (o.momentum == 0.0) first.clear();  // as torch's SGD: no momentum, no buffer to update
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("shardwise::fused_sgd_", "")
                         .typed<void(at::TensorList, at::TensorList, at::TensorList, at::TensorList,
                                     double, double, double, double, bool, bool, double)>();
    op.call(masters, grads, first, low, o.lr, o.momentum, o.dampening, o.weight_decay, o.nesterov,
            step_count_ == 1, grad_scale);
  }
}

// LAMB's trust ratio is a whole parameter's: the step runs over each piece of the partition (or
// each local shard) as its own tensor, naming its parameter, and the per-parameter sums of
// squares are added up over the group, whose ranks hold the parameters' other pieces.
void ZeroOptimizer::run_lamb(const std::vector<at::Tensor>& masters,
                             const std::vector<at::Tensor>& grads,
                             const std::vector<at::Tensor>& low,
                             const std::vector<at::Tensor>& exp_avgs,
                             const std::vector<at::Tensor>& exp_avg_sqs,
                             double grad_scale) {
  const OptimizerOptions& o = options_.optimizer;
  std::vector<at::Tensor> p, g, m, v, l;
  std::vector<int64_t> param_of;
  for_each_piece([&](size_t k, size_t master, int64_t offset) {
    const int64_t numel = pieces_[k].numel;
    if (numel == 0) return;
    p.push_back(masters[master].narrow(0, offset, numel));
    g.push_back(grads[master].narrow(0, offset, numel));
    m.push_back(exp_avgs[master].narrow(0, offset, numel));
    v.push_back(exp_avg_sqs[master].narrow(0, offset, numel));
    if (!low.empty()) l.push_back(low[master].narrow(0, offset, numel));
    param_of.push_back(pieces_[k].param);
  });
  optim::LambOptions lamb;
  lamb.lr = o.lr;
  lamb.beta1 = o.beta1;
  lamb.beta2 = o.beta2;
  lamb.eps = o.eps;
  lamb.weight_decay = o.weight_decay;
  lamb.step = step_count_;
  lamb.bias_correction = o.bias_correction;
  lamb.eps_inside_sqrt = o.eps_inside_sqrt;
  lamb.max_coeff = o.max_coeff;
  lamb.min_coeff = o.min_coeff;
  lamb.grad_scale = grad_scale;
  std::function<void(at::Tensor&)> reduce;
  if (dp_size_ > 1 && (local_ || world_ > 1)) {
    reduce = [this](at::Tensor& sums) { all_reduce_sum(options_.group, sums); };
  }
  // every parameter has a row, on every rank, even one holding none of its elements
  p.push_back(at::empty({0}, masters[0].options()));
  g.push_back(at::empty({0}, grads[0].options()));
  m.push_back(p.back());
  v.push_back(p.back());
  if (!low.empty()) l.push_back(at::empty({0}, low[0].options()));
  param_of.push_back(lamb_rows() - 1);
  lamb_coefficients_ = shardwise::fused_lamb_(p, g, m, v, l, lamb, param_of, reduce);
}

// Partitioned: the model's parameters. Local: the highest parameter a shard names, agreed by
// the group (a rank's shards may not name the last parameter).
int64_t ZeroOptimizer::lamb_rows() {
  if (lamb_rows_ >= 0) return lamb_rows_;
  if (!local_) return lamb_rows_ = static_cast<int64_t>(params_.size());
  int64_t highest = -1;
  for (const PieceInfo& piece : pieces_) highest = std::max(highest, piece.param);
  at::Tensor rows = at::full({1}, highest + 1, masters_[0].options().dtype(at::kLong));
  if (dp_size_ > 1) {
    std::vector<at::Tensor> tensors{rows};
    options_.group->allreduce(tensors, c10d::AllreduceOptions{c10d::ReduceOp::MAX})->wait();
  }
  return lamb_rows_ = rows.item<int64_t>();
}

bool ZeroOptimizer::step() {
  TORCH_CHECK(!in_backward_, "ZeRO: step() called while a backward is still running");
  std::vector<at::Tensor> grads;
  if (local_) {
    grads = local_grads();
  } else {
    if (!reduces_in_backward()) reduce_all_now();
    grads = {grad_partition_};
  }
  const double loss_scale = this->loss_scale();
  const bool skip = scaler_ && scaler_->update(any_overflow(grads));
  if (skip) {
    zero_grad();
    return false;
  }
  double grad_scale = 1.0 / loss_scale;
  if (!local_ && !options_.deterministic) {
    grad_scale *= predivide_factor() / dp_size_;  // the rest of the average
  }
  if (options_.gradient_clipping > 0) {
    last_norm_ = global_norm(grads) * grad_scale;
    const double coef = options_.gradient_clipping / (last_norm_ + 1e-6);
    if (coef < 1.0) grad_scale *= coef;
  }
  ++step_count_;
  if (local_) {
    run_optimizer(masters_, grads, {}, state_, grad_scale);
  } else {
    step_partitioned(grads[0], grad_scale);
  }
  zero_grad();
  return true;
}

void ZeroOptimizer::step_partitioned(const at::Tensor& grads, double grad_scale) {
  const at::Tensor& master = masters_[0];
  const at::Tensor grad = grads.to(master.device());
  const at::ScalarType dtype = params_[0].scalar_type();
  std::vector<at::Tensor> low;
  if (dtype != at::kFloat)
    low.push_back(at::empty({partition_numel_}, master.options().dtype(dtype)));
  run_optimizer({master}, {grad}, low, state_, grad_scale);
  gather_parameters(low.empty() ? master : low[0]);
}

namespace {

// One all-gather of elements [offset, offset + numel) of every rank's shard: `output` holds
// world x numel of them, rank-major, until they are copied into place.
struct GatherPiece {
  int64_t offset = 0;
  int64_t numel = 0;
  at::Tensor output;
  c10::intrusive_ptr<c10d::Work> work;
};

// The pieces a shard of `shard_numel` elements is gathered in (ZeroOptions::
// allgather_bucket_numel's rule), each started now.
std::vector<GatherPiece> start_gather(c10d::ProcessGroup& group,
                                      const at::Tensor& shard,
                                      int world,
                                      int64_t allgather_bucket_numel) {
  const int64_t shard_numel = shard.numel();
  const int64_t count = std::max<int64_t>(1, shard_numel * world / allgather_bucket_numel);
  const int64_t size = shard_numel / count;
  std::vector<GatherPiece> pieces(count);
  for (int64_t i = 0; i < count; ++i) {
    GatherPiece& piece = pieces[i];
    piece.offset = i * size;
    piece.numel = i + 1 == count ? shard_numel - piece.offset : size;
    at::Tensor input = shard.narrow(0, piece.offset, piece.numel);
    piece.output = at::empty({world * piece.numel}, shard.options());
    piece.work = group._allgather_base(piece.output, input);
  }
  return pieces;
}

}  // namespace

// Every bucket's updated shard (in the parameters' dtype) all-gathered and copied out into the
// parameters; the all-gathers are all started before the first is waited for.
void ZeroOptimizer::gather_parameters(const at::Tensor& partition) {
  const at::TensorOptions options = params_[0].options();
  std::vector<at::Tensor> gathered(buckets_.size());
  std::vector<std::vector<GatherPiece>> pieces(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    at::Tensor shard = bucket_view(partition, static_cast<int>(b)).to(options);
    if (world_ == 1) {
      gathered[b] = shard;
      continue;
    }
    gathered[b] = at::empty({buckets_[b].layout.total_numel()}, options);
    pieces[b] =
        start_gather(*options_.group, shard.contiguous(), world_, options_.allgather_bucket_numel);
  }
  at::NoGradGuard no_grad;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const at::Tensor by_rank = gathered[b].view({world_, -1});  // rank r's shard in row r
    for (GatherPiece& piece : pieces[b]) {
      piece.work->wait();
      by_rank.narrow(1, piece.offset, piece.numel).copy_(piece.output.view({world_, -1}));
    }
    std::vector<at::Tensor> outputs;
    std::vector<int64_t> numels;
    for (int64_t i : buckets_[b].params) {
      outputs.push_back(params_[i].detach().view(-1));
      numels.push_back(params_[i].numel());
    }
    shardwise::all_gather_copy_out_(gathered[b], numels, world_, outputs);
  }
}

void ZeroOptimizer::zero_grad() {
  if (local_) {
    for (at::Tensor& master : masters_) master.mutable_grad() = at::Tensor();
    return;
  }
  for (at::Tensor& p : params_) p.mutable_grad() = at::Tensor();
  for (auto& sum : bucket_sums_) sum.clear();  // the next step starts new trees
  if (reduces_in_backward()) {
    grad_partition_.zero_();
  } else {
    grad_partition_ = at::Tensor();
  }
  grads_pending_ = false;
}

}  // namespace shardwise::zero
