#include "fsdp/fsdp_unit.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

#include "fsdp/quantized_messages.h"
#include "fsdp/storage.h"
#include "sharding/shard_ops.h"

namespace shardwise::fsdp {
namespace {

int group_rank(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  return group ? group->getRank() : 0;
}

int group_size(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  return group ? group->getSize() : 1;
}

std::vector<int64_t> numels_of(const std::vector<at::Tensor>& params) {
  std::vector<int64_t> numels;
  for (const auto& p : params) numels.push_back(p.numel());
  return numels;
}

void resize_storage(const at::Tensor& tensor, int64_t bytes) {
  resize_storage_bytes(tensor, bytes);
}

}  // namespace

FsdpUnit::FsdpUnit(std::vector<at::Tensor> params, UnitOptions options)
    : options_(std::move(options)),
      params_(std::move(params)),
      numels_(numels_of(params_)),
      layout_({numels_, group_size(options_.shard_group), kShardAlign}),
      shard_rank_(group_rank(options_.shard_group)),
      shard_size_(group_size(options_.shard_group)),
      dtype_(params_.empty() ? at::kFloat : params_[0].scalar_type()),
      device_(params_.empty() ? at::Device(at::kCPU) : params_[0].device()) {
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i];
    TORCH_CHECK_VALUE(p.is_leaf(), "FSDP unit '", options_.name, "': parameter ", i,
                      " is not a leaf tensor; wrap modules before using their parameters");
    TORCH_CHECK_TYPE(p.scalar_type() == dtype_, "FSDP unit '", options_.name, "': parameter ", i,
                     " has dtype ", p.scalar_type(), " but parameter 0 has ", dtype_,
                     "; give one unit parameters of one dtype (wrap the others separately)");
    TORCH_CHECK_VALUE(p.device() == device_, "FSDP unit '", options_.name, "': parameter ", i,
                      " is on ", p.device(), " but parameter 0 is on ", device_);
    shapes_.push_back(p.sizes().vec());
    requires_grad_count_ += p.requires_grad() ? 1 : 0;
  }
  param_dtype_ = options_.param_dtype.value_or(dtype_);
  reduce_dtype_ = options_.reduce_dtype.value_or(param_dtype_);
  const int data_parallel = shard_size_ * group_size(options_.replicate_group);
  pre_divide_ = 1;
  while (data_parallel % static_cast<int>(pre_divide_) == 0 &&
         data_parallel / pre_divide_ > pre_divide_) {
    pre_divide_ *= 2;
  }
  post_divide_ = data_parallel / pre_divide_;
  if (options_.deterministic) check_deterministic(data_parallel);

  const at::Device home = options_.offload_to_cpu ? at::Device(at::kCPU) : device_;
  const bool pinned = options_.offload_to_cpu && options_.pin_memory && device_.is_cuda();
  const auto shard_options = at::TensorOptions().dtype(dtype_).device(home).pinned_memory(pinned);
  const auto grad_options =
      shard_options.dtype(options_.keep_low_precision_grads ? param_dtype_ : dtype_);
  shard_ = at::zeros({layout_.shard_numel()}, shard_options);
  full_ =
      at::empty({layout_.param_numel()}, at::TensorOptions().dtype(param_dtype_).device(device_));
  int64_t full_offset = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t valid = layout_.valid(i, shard_rank_);
    at::Tensor flat = params_[i].detach().reshape(-1);
    shard_views_.push_back(shard_.narrow(0, layout_.offset(i), valid));
    if (valid > 0) shard_views_.back().copy_(flat.narrow(0, layout_.start(i, shard_rank_), valid));
    // Separate tensors, not views of one buffer: LibTorch's zero_grad detaches gradients in
    // place, which views do not allow.
    grad_views_.push_back(at::zeros({valid}, grad_options));
    full_views_.push_back(full_.narrow(0, full_offset, numels_[i]));
    full_offset += numels_[i];
    params_[i].mutable_grad() = at::Tensor();
    params_[i].set_data(shard_views_.back());
  }
  has_grad_.assign(params_.size(), false);
  unsynced_grads_.resize(params_.size());
  check_post_forward_group();
  resize_storage(full_, 0);
  lanes_ = options_.lanes ? options_.lanes : make_lanes(device_);
  lanes_->allocated(shard_, Lane::kCompute, "sharded parameters");
  for (const auto& grad : grad_views_) lanes_->allocated(grad, Lane::kCompute, "gradient shard");
}

FsdpUnit::~FsdpUnit() = default;

// FSDP2's reading of an int reshard_after_forward N: a factor of the shard group's size; N = 1
// keeps the gathered parameters, N = the size reshards as usual. The group is N consecutive ranks
// of the shard group, so position j of it is shard rank j (mod N).
void FsdpUnit::check_post_forward_group() {
  const auto& group = options_.post_forward_group;
  if (!group) return;
  const int n = group->getSize();
  TORCH_CHECK_VALUE(n >= 1 && n <= shard_size_ && shard_size_ % n == 0, "FSDP unit '",
                    options_.name, "': the post-forward group (reshard_after_forward) has ", n,
                    " ranks, which does not divide the shard group's ", shard_size_,
                    "; pass a factor of ", shard_size_);
  TORCH_CHECK_VALUE(group->getRank() == shard_rank_ % n, "FSDP unit '", options_.name,
                    "': this rank is shard rank ", shard_rank_, " but rank ", group->getRank(),
                    " of its post-forward group; make the group of ", n,
                    " consecutive ranks of the shard group, in their order");
  if (n == 1) options_.reshard_after_forward = false;
  if (n == 1 || n == shard_size_) options_.post_forward_group.reset();
}

at::Tensor FsdpUnit::to_compute_device(const at::Tensor& tensor) const {
  return tensor.device() == device_ ? tensor : tensor.to(device_, /*non_blocking=*/true);
}

void FsdpUnit::declare_compute(const char* what) const {
  if (unsharded_) lanes_->accessed(Lane::kCompute, what, {full_}, {});
}

// Copy-in and all-gather on the all-gather lane, after the compute lane's writes to the shard
// (the optimizer step); gather_event_ marks their end.
void FsdpUnit::unshard_async() {
  if (unsharded_ || pending_gather_ || params_.empty()) return;
  Lanes& lanes = *lanes_;
  lanes.wait(Lane::kAllGather, lanes.record(Lane::kCompute));
  LaneGuard on_gather_lane = lanes.use(Lane::kAllGather);
  if (post_forward_shard_.defined()) {  // backward after an int reshard_after_forward
    gathered_ = at::empty({layout_.total_numel()}, post_forward_shard_.options());
    lanes.allocated(gathered_, Lane::kAllGather, "all-gather output");
    gather_input_ = std::exchange(post_forward_shard_, at::Tensor());
    lanes.keep_alive(gather_input_, Lane::kAllGather);  // written on compute
    gather_work_ = options_.post_forward_group->_allgather_base(gathered_, gather_input_);
    lanes.accessed(Lane::kAllGather, "post-forward all-gather", {gather_input_}, {gathered_});
    gather_event_ = lanes.record(Lane::kAllGather);
    pending_gather_ = true;
    return;
  }
  at::Tensor input = to_compute_device(
      shardwise::all_gather_copy_in(shard_views_, numels_, shard_size_, shard_rank_, param_dtype_));
  lanes.allocated(input, Lane::kAllGather, "all-gather input");
  lanes.accessed(Lane::kAllGather, "all-gather copy-in", {shard_}, {input});
  if (shard_size_ == 1) {
    gathered_ = input;
  } else if (options_.quantized_all_gather) {
    gather_input_ = quantize_rows(input.view({1, -1})).view(-1);
    lanes.allocated(gather_input_, Lane::kAllGather, "quantized all-gather input");
    lanes.accessed(Lane::kAllGather, "quantize", {input}, {gather_input_});
    lanes.freed(input);
    gathered_ = at::empty({gather_input_.numel() * shard_size_}, gather_input_.options());
    lanes.allocated(gathered_, Lane::kAllGather, "quantized all-gather output");
    gather_work_ = options_.shard_group->_allgather_base(gathered_, gather_input_);
    lanes.accessed(Lane::kAllGather, "quantized all-gather", {gather_input_}, {gathered_});
    gathered_quantized_ = true;
  } else {
    gathered_ = at::empty({layout_.total_numel()}, input.options());
    lanes.allocated(gathered_, Lane::kAllGather, "all-gather output");
    gather_input_ = input;
    gather_work_ = options_.shard_group->_allgather_base(gathered_, gather_input_);
    lanes.accessed(Lane::kAllGather, "all-gather", {gather_input_}, {gathered_});
  }
  gather_event_ = lanes.record(Lane::kAllGather);
  pending_gather_ = true;
}

// The compute lane waits for the gather, then copies out into the full buffer; the gather's
// output is kept alive for compute before it is dropped.
void FsdpUnit::unshard() {
  if (unsharded_ || params_.empty()) return;
  unshard_async();
  if (gather_work_) {
    gather_work_->wait();
    gather_work_.reset();
  }
  lanes_->wait(Lane::kCompute, gather_event_);
  resize_storage(full_, layout_.param_numel() * static_cast<int64_t>(full_.element_size()));
  lanes_->allocated(full_, Lane::kCompute, "unsharded parameters");
  at::Tensor values = gathered_;
  if (gathered_quantized_) {
    values = dequantize_rows(gathered_, layout_.shard_numel(), param_dtype_).view(-1);
    lanes_->allocated(values, Lane::kCompute, "dequantized all-gather output");
    lanes_->accessed(Lane::kCompute, "dequantize", {gathered_}, {values});
  }
  shardwise::all_gather_copy_out_(values, numels_, shard_size_, full_views_);
  lanes_->accessed(Lane::kCompute, "all-gather copy-out", {values}, {full_});
  if (gathered_quantized_) lanes_->freed(values);
  lanes_->keep_alive(gathered_, Lane::kCompute);
  drop_gather_buffers();
  stash_gradients();
  for (size_t i = 0; i < params_.size(); ++i) params_[i].set_data(full_views_[i].view(shapes_[i]));
  unsharded_ = true;
}

void FsdpUnit::drop_gather_buffers() {
  lanes_->freed(gathered_);
  if (gather_input_.defined()) lanes_->freed(gather_input_);
  gathered_ = at::Tensor();
  gather_input_ = at::Tensor();
  gather_event_.reset();
  pending_gather_ = false;
  gathered_quantized_ = false;
}

void FsdpUnit::reshard() {
  drop_post_forward_shard();
  if (!unsharded_) return;
  for (size_t i = 0; i < params_.size(); ++i) params_[i].set_data(shard_views_[i]);
  restore_gradients();
  lanes_->freed(full_);  // used on compute only: its next user, on compute, comes after
  resize_storage(full_, 0);
  unsharded_ = false;
}

// The blocks the rank at position j of the post-forward group contributes to its all-gather:
// block r holds rank r's shard (the flat layout's rule), cut from the full parameters.
at::Tensor FsdpUnit::post_forward_shard() const {
  const int n = options_.post_forward_group->getSize();
  const int blocks = shard_size_ / n;
  const int first = (shard_rank_ % n) * blocks;
  std::vector<at::Tensor> shards;
  for (int r = first; r < first + blocks; ++r) {
    std::vector<at::Tensor> pieces;
    for (size_t i = 0; i < params_.size(); ++i) {
      const int64_t start = std::min(layout_.start(i, r), numels_[i]);
      pieces.push_back(full_views_[i].narrow(0, start, layout_.valid(i, r)));
    }
    shards.push_back(shardwise::all_gather_copy_in(pieces, numels_, shard_size_, r, param_dtype_));
  }
  return at::cat(shards);
}

void FsdpUnit::reshard_post_forward() {
  if (unsharded_ && options_.post_forward_group) {
    at::Tensor kept = post_forward_shard();
    lanes_->allocated(kept, Lane::kCompute, "post-forward shard");
    lanes_->accessed(Lane::kCompute, "post-forward copy", {full_}, {kept});
    reshard();
    post_forward_shard_ = std::move(kept);
    return;
  }
  reshard();
}

void FsdpUnit::drop_post_forward_shard() {
  if (!post_forward_shard_.defined()) return;
  lanes_->freed(post_forward_shard_);  // used on compute only
  post_forward_shard_ = at::Tensor();
}

void FsdpUnit::discard_gather() {
  if (!pending_gather_) return;
  if (gather_work_) {
    gather_work_->wait();
    gather_work_.reset();
  }
  // Compute's next writes to the shard (the optimizer) come after the copy-in that read it.
  lanes_->wait(Lane::kCompute, gather_event_);
  drop_gather_buffers();  // used on the all-gather lane only
}

void FsdpUnit::stash_gradients() {
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& grad = params_[i].grad();
    has_grad_[i] = grad.defined();
    if (grad.defined() && !grad.is_same(grad_views_[i])) {  // set by the user: take its values
      TORCH_CHECK_VALUE(grad.numel() == grad_views_[i].numel(), "FSDP unit '", options_.name,
                        "': parameter ", i, " has a .grad of ", grad.numel(),
                        " elements but its shard has ", grad_views_[i].numel(),
                        "; set gradients of sharded parameters to shard-shaped tensors or None");
      grad_views_[i].copy_(grad.reshape(-1));
    }
    params_[i].mutable_grad() = at::Tensor();
  }
}

void FsdpUnit::restore_gradients() {
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].mutable_grad() = has_grad_[i] ? grad_views_[i] : at::Tensor();
  }
}

void FsdpUnit::check_deterministic(int data_parallel) {
  TORCH_CHECK_VALUE(
      (data_parallel & (data_parallel - 1)) == 0 && (shard_size_ & (shard_size_ - 1)) == 0,
      "FSDP unit '", options_.name, "': deterministic=True needs power-of-two ",
      "groups (the gradients' summation tree); the shard group has ", shard_size_,
      " ranks and the data-parallel world ", data_parallel, ": use 1, 2, 4, 8, .. ranks");
  TORCH_CHECK_VALUE(!options_.keep_low_precision_grads, "FSDP unit '", options_.name,
                    "': deterministic=True with keep_low_precision_grads: the micro-batches' "
                    "gradients are added in the parameters' dtype; drop keep_low_precision_grads");
  TORCH_CHECK_VALUE(!options_.quantized_all_gather && !options_.quantized_reduce_scatter,
                    "FSDP unit '", options_.name, "': deterministic=True with quantized ",
                    "collectives: their blocks follow the shard size, so the bits would change ",
                    "with the data-parallel size; drop the quantization or deterministic");
  pre_divide_ = post_divide_ = 1;  // sums: the loss is divided by the global micro-batch count
  reduce_dtype_ = dtype_;          // one dtype for every addition of the tree
}

void FsdpUnit::reduce_gradients(bool sync, at::Tensor* scratch) {
  if (params_.empty()) return;
  TORCH_CHECK_VALUE(sync || !options_.deterministic, "FSDP unit '", options_.name,
                    "': no_sync (or requires_gradient_sync=False) with deterministic=True: the "
                    "deterministic mode reduces every micro-batch; leave no_sync out");
  std::vector<std::optional<at::Tensor>> grads(params_.size());
  bool any = false;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor grad = params_[i].grad();
    params_[i].mutable_grad() = at::Tensor();
    if (grad.defined()) {
      grad = grad.reshape(-1);
      if (unsynced_grads_[i].defined()) {
        unsynced_grads_[i].add_(grad);
        grad = unsynced_grads_[i];
      } else if (!sync) {
        unsynced_grads_[i] = grad.to(reduce_dtype_, /*non_blocking=*/false, /*copy=*/true);
      }
    } else if (unsynced_grads_[i].defined()) {
      grad = unsynced_grads_[i];
    }
    if (grad.defined()) {
      grads[i] = grad;
      any = true;
    }
  }
  if (!sync) return;
  if (!any) {  // every rank must still join the collective
    grads[0] = at::zeros({numels_[0]}, at::TensorOptions().dtype(param_dtype_).device(device_));
  }
  start_reduce_scatter(std::move(grads), scratch);
}

// Copy-in and reduce-scatter on the reduce-scatter lane, after the compute lane's backward wrote
// the gradients (kept alive for that lane, then dropped); reduce_event_ marks their end.
void FsdpUnit::start_reduce_scatter(std::vector<std::optional<at::Tensor>> grads,
                                    at::Tensor* scratch) {
  Lanes& lanes = *lanes_;
  std::vector<at::Tensor> written;
  for (const auto& grad : grads) {
    if (!grad) continue;
    lanes.allocated(*grad, Lane::kCompute, "full gradient");
    written.push_back(*grad);
  }
  lanes.accessed(Lane::kCompute, "backward", {}, written);
  lanes.wait(Lane::kReduceScatter, lanes.record(Lane::kCompute));
  LaneGuard on_reduce_lane = lanes.use(Lane::kReduceScatter);
  owns_reduce_input_ = scratch == nullptr;
  reduce_input_ = reduce_buffer(scratch);
  if (owns_reduce_input_) lanes.allocated(reduce_input_, Lane::kReduceScatter, "reduce input");
  shardwise::reduce_scatter_copy_in_(grads, numels_, shard_size_, 1.0 / pre_divide_, reduce_input_);
  lanes.accessed(Lane::kReduceScatter, "reduce-scatter copy-in", written, {reduce_input_});
  for (const auto& grad : written) {
    lanes.keep_alive(grad, Lane::kReduceScatter);
    lanes.freed(grad);
  }
  for (auto& unsynced : unsynced_grads_) unsynced = at::Tensor();
  if (shard_size_ == 1) {
    reduce_output_ = reduce_input_;
  } else if (options_.quantized_reduce_scatter) {
    // qgZ: row r of the input is the chunk rank r owns; it goes to its owner quantized, and the
    // owner sums the rows it receives in fp32 (finish_reduce)
    reduce_messages_ = quantize_rows(reduce_input_.view({shard_size_, -1}));
    lanes.allocated(reduce_messages_, Lane::kReduceScatter, "quantized reduce input");
    lanes.accessed(Lane::kReduceScatter, "quantize", {reduce_input_}, {reduce_messages_});
    reduce_output_ = at::empty_like(reduce_messages_);
    lanes.allocated(reduce_output_, Lane::kReduceScatter, "quantized all-to-all output");
    std::vector<int64_t> equal_splits;
    reduce_work_ = options_.shard_group->alltoall_base(reduce_output_, reduce_messages_,
                                                       equal_splits, equal_splits);
    lanes.accessed(Lane::kReduceScatter, "quantized all-to-all", {reduce_messages_},
                   {reduce_output_});
    reduce_quantized_ = true;
  } else {
    reduce_output_ = at::empty({layout_.shard_numel()}, reduce_input_.options());
    lanes.allocated(reduce_output_, Lane::kReduceScatter, "reduce-scatter output");
    c10d::ReduceScatterOptions reduce;
    reduce.reduceOp = c10d::ReduceOp::SUM;
    reduce_work_ =
        options_.deterministic
            ? distributed::tree_reduce_scatter(*options_.shard_group, reduce_output_, reduce_input_)
            : options_.shard_group->_reduce_scatter_base(reduce_output_, reduce_input_, reduce);
    lanes.accessed(Lane::kReduceScatter, "reduce-scatter", {reduce_input_}, {reduce_output_});
  }
  reduce_event_ = lanes.record(Lane::kReduceScatter);
  pending_reduce_ = true;
}

// The hybrid all-reduce follows on the reduce-scatter lane; the compute lane waits for the
// reduction, then accumulates into the gradient shards.
void FsdpUnit::finish_reduce() {
  if (!pending_reduce_) return;
  Lanes& lanes = *lanes_;
  if (reduce_work_) {
    reduce_work_->wait();
    reduce_work_.reset();
  }
  if (reduce_quantized_) sum_quantized_rows();
  if (group_size(options_.replicate_group) > 1) {  // hybrid: average across the replicas too
    LaneGuard on_reduce_lane = lanes.use(Lane::kReduceScatter);
    if (options_.deterministic) {  // the tree's upper levels: replicas hold whole subtrees
      distributed::tree_all_reduce_(*options_.replicate_group, reduce_output_);
    } else {
      std::vector<at::Tensor> tensors{reduce_output_};
      c10d::AllreduceOptions reduce;
      reduce.reduceOp = c10d::ReduceOp::SUM;
      options_.replicate_group->allreduce(tensors, reduce)->wait();
    }
    lanes.accessed(Lane::kReduceScatter, "all-reduce over replicas", {reduce_output_},
                   {reduce_output_});
    reduce_event_ = lanes.record(Lane::kReduceScatter);
  }
  lanes.wait(Lane::kCompute, reduce_event_);
  const at::Tensor reduced = reduce_output_.device() == grad_views_[0].device()
                                 ? reduce_output_
                                 : reduce_output_.to(grad_views_[0].device());
  // Gradient shards without a gradient yet are overwritten, the others accumulated: one pass.
  std::vector<at::Tensor> fresh, accumulated;
  for (size_t i = 0; i < params_.size(); ++i) {
    (has_grad_[i] ? accumulated : fresh).push_back(grad_views_[i]);
  }
  if (options_.deterministic) {
    add_micro_batch(reduced, accumulated.empty());
  } else if (accumulated.empty() || fresh.empty()) {
    shardwise::reduce_scatter_copy_out_(reduced, numels_, shard_size_, shard_rank_,
                                        1.0 / post_divide_, grad_views_,
                                        /*accumulate=*/fresh.empty());
  } else {  // a mix (a parameter unused in an earlier accumulation step): rare, two passes
    for (auto& grad : fresh) grad.zero_();
    shardwise::reduce_scatter_copy_out_(reduced, numels_, shard_size_, shard_rank_,
                                        1.0 / post_divide_, grad_views_, /*accumulate=*/true);
  }
  lanes.accessed(Lane::kCompute, "reduce-scatter copy-out", {reduce_output_}, grad_views_);
  for (size_t i = 0; i < params_.size(); ++i) has_grad_[i] = params_[i].requires_grad();
  lanes.keep_alive(reduce_output_, Lane::kCompute);
  if (shard_size_ > 1) lanes.freed(reduce_output_);
  if (owns_reduce_input_) lanes.freed(reduce_input_);
  reduce_input_ = reduce_output_ = at::Tensor();
  reduce_event_.reset();
  pending_reduce_ = false;
  if (!unsharded_) restore_gradients();
}

// qgZ's owner side: the rows every rank sent for this rank's chunk, dequantized and summed in
// fp32, become the reduce-scatter's output.
void FsdpUnit::sum_quantized_rows() {
  Lanes& lanes = *lanes_;
  LaneGuard on_reduce_lane = lanes.use(Lane::kReduceScatter);
  at::Tensor summed =
      dequantize_rows(reduce_output_, layout_.shard_numel(), at::kFloat).sum(0).to(reduce_dtype_);
  lanes.allocated(summed, Lane::kReduceScatter, "dequantized reduce-scatter output");
  lanes.accessed(Lane::kReduceScatter, "dequantize and sum", {reduce_output_}, {summed});
  lanes.freed(reduce_output_);
  lanes.freed(reduce_messages_);
  reduce_messages_ = at::Tensor();
  reduce_output_ = summed;
  reduce_quantized_ = false;
  reduce_event_ = lanes.record(Lane::kReduceScatter);
}

// deterministic: this micro-batch's reduced shard as a leaf of the tree over micro-batches (a
// new tree when no gradient was held: the step's first), the sum so far into the gradients.
void FsdpUnit::add_micro_batch(const at::Tensor& reduced, bool first) {
  std::vector<at::Tensor> leaf;
  for (const auto& grad : grad_views_) leaf.push_back(at::empty_like(grad));
  shardwise::reduce_scatter_copy_out_(reduced, numels_, shard_size_, shard_rank_, 1.0, leaf,
                                      /*accumulate=*/false);
  if (first) micro_batch_sums_.clear();
  micro_batch_sums_.push(std::move(leaf));
  micro_batch_sums_.total_into(grad_views_);
}

at::Tensor FsdpUnit::reduce_buffer(at::Tensor* scratch) const {
  const int64_t numel = layout_.total_numel();
  const at::TensorOptions options = at::TensorOptions().dtype(reduce_dtype_).device(device_);
  if (scratch == nullptr) return at::empty({numel}, options);
  const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(reduce_dtype_));
  if (!scratch->defined() || scratch->numel() < bytes || scratch->device() != device_) {
    if (scratch->defined()) lanes_->freed(*scratch);
    *scratch = at::empty({bytes}, options.dtype(at::kByte));
    lanes_->allocated(*scratch, Lane::kReduceScatter, "reduce-scatter input");
  }
  return scratch->narrow(0, 0, bytes).view(reduce_dtype_);
}

std::vector<OwnedSlice> FsdpUnit::owned_slices() const {
  std::vector<OwnedSlice> slices;
  for (int64_t i = 0; i < layout_.num_params(); ++i) {
    const int64_t numel = layout_.numel(i);
    slices.push_back(
        {std::min(layout_.start(i, shard_rank_), numel), layout_.valid(i, shard_rank_), numel});
  }
  return slices;
}

std::vector<at::Tensor> FsdpUnit::grad_shard_views() const {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.push_back(has_grad_[i] ? grad_views_[i] : at::Tensor());
  }
  return out;
}

std::vector<at::Tensor> FsdpUnit::full_parameters() {
  if (params_.empty()) return {};
  at::Tensor input = to_compute_device(
      shardwise::all_gather_copy_in(shard_views_, numels_, shard_size_, shard_rank_, dtype_));
  at::Tensor gathered = input;
  if (shard_size_ > 1) {
    gathered = at::empty({layout_.total_numel()}, input.options());
    options_.shard_group->_allgather_base(gathered, input)->wait();
  }
  std::vector<at::Tensor> full = shardwise::all_gather_copy_out(gathered, numels_, shard_size_);
  for (size_t i = 0; i < full.size(); ++i) full[i] = full[i].view(shapes_[i]);
  return full;
}

void FsdpUnit::load_full_parameters(const std::vector<at::Tensor>& full) {
  drop_post_forward_shard();  // would be stale
  TORCH_CHECK_VALUE(!unsharded_, "FSDP unit '", options_.name,
                    "': load parameters between steps, not while the unit is unsharded");
  TORCH_CHECK_VALUE(full.size() == params_.size(), "FSDP unit '", options_.name, "': got ",
                    full.size(), " tensors for ", params_.size(), " parameters");
  for (size_t i = 0; i < params_.size(); ++i) {
    TORCH_CHECK_VALUE(full[i].numel() == numels_[i], "FSDP unit '", options_.name, "': tensor ", i,
                      " has ", full[i].numel(), " elements, the parameter ", numels_[i]);
    const at::Tensor flat = full[i].detach().reshape(-1);
    const int64_t valid = shard_views_[i].numel();
    if (valid > 0) shard_views_[i].copy_(flat.narrow(0, layout_.start(i, shard_rank_), valid));
  }
}

int64_t FsdpUnit::sharded_param_bytes() const {
  const size_t kept = post_forward_shard_.defined() ? post_forward_shard_.storage().nbytes() : 0;
  return static_cast<int64_t>(shard_.storage().nbytes() + full_.storage().nbytes() + kept);
}

int64_t FsdpUnit::sharded_grad_bytes() const {
  int64_t bytes = 0;
  for (const auto& grad : grad_views_) bytes += static_cast<int64_t>(grad.storage().nbytes());
  for (const auto& unsynced : unsynced_grads_) {
    if (unsynced.defined()) bytes += static_cast<int64_t>(unsynced.storage().nbytes());
  }
  return bytes;
}

}  // namespace shardwise::fsdp
