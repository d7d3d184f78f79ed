// One FSDP unit: the parameters of one wrapped module, sharded over a process group.
//
// States. Sharded: each parameter's `.data` is this rank's piece of it (1-D, the layout's
// valid(i, rank) elements, a view into one flat shard in the parameters' own dtype: the fp32
// "master" shard), and `.grad`, when set, is this rank's piece of the gradient. Unsharded:
// `.data` is the full parameter in `param_dtype`, a view into one flat buffer that is allocated on
// unshard and whose storage is freed (resized to 0 bytes) on reshard, so tensors saved for
// backward that view it keep pointing at the right memory once it is filled again.
//
// Unshard = all_gather_copy_in (cast to param_dtype) + all-gather over the shard group +
// all_gather_copy_out into the flat buffer. Gradient reduction = reduce_scatter_copy_in (cast to
// reduce_dtype, divided by `pre`) + reduce-scatter (SUM) over the shard group (+ all-reduce over
// the replicate group for hybrid sharding) + reduce_scatter_copy_out_ (accumulated into the
// gradient shard, divided by `post`), with pre * post = the data-parallel size (FSDP1's rule, so
// fp16 neither overflows nor underflows, and every backend works: gloo has no AVG).
//
// While unsharded, `.grad` is either unset or the full gradient autograd accumulated; gradient
// shards are stashed on unshard and restored on reshard, so the optimizer always sees sharded
// gradients beside sharded parameters.
//
// Streams (fsdp/lanes.h): copy-in and all-gather run on the all-gather lane, copy-in and
// reduce-scatter (and the hybrid all-reduce) on the reduce-scatter lane, the copy-outs on the
// caller's compute lane, ordered by events; buffers that cross lanes are kept alive for the lane
// that reads them last.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "distributed/tree_reduce.h"
#include "fsdp/lanes.h"
#include "sharding/flat_layout.h"

namespace shardwise::fsdp {

struct UnitOptions {
  std::string name;                                        // for error messages
  c10::intrusive_ptr<c10d::ProcessGroup> shard_group;      // null: not sharded (no_shard)
  c10::intrusive_ptr<c10d::ProcessGroup> replicate_group;  // null: not replicated
  std::optional<at::ScalarType> param_dtype;   // compute / all-gather dtype; unset: the params'
  std::optional<at::ScalarType> reduce_dtype;  // gradient communication dtype; unset: param_dtype
  // Gradient shards kept in param_dtype, not the parameters' dtype (torch FSDP1's
  // keep_low_precision_grads): half their memory under bf16, for an optimizer that steps
  // low-precision gradients. Without a param_dtype it changes nothing.
  bool keep_low_precision_grads = false;
  bool reshard_after_forward = true;
  // FSDP2's int reshard_after_forward: after forward, keep the share of the full parameters that
  // this rank holds in a smaller group (N consecutive ranks of the shard group, N dividing its
  // size), so backward all-gathers over N ranks, not the whole shard group. Null: reshard to the
  // shard group. A group of the shard group's size is that; a group of one keeps everything
  // (reshard_after_forward = false), as FSDP2 reads 1.
  c10::intrusive_ptr<c10d::ProcessGroup> post_forward_group;
  // ZeRO++'s qwZ: the parameters all-gathered as int8 in blocks with an fp32 scale each
  // (fsdp/quantized_messages.h); the shards keep their precision. The post-forward group's
  // all-gather (within a host, with post_forward_group) is not quantized.
  bool quantized_all_gather = false;
  // ZeRO++'s qgZ: the gradients reduce-scattered as quantized messages (an all-to-all of each
  // owner's chunk as int8 blocks, summed by the owner in fp32); the reduced shard keeps its
  // precision.
  bool quantized_reduce_scatter = false;
  bool reshard_after_backward = true;  // false: stay gathered until the next forward (FSDP2)
  bool requires_gradient_sync = true;  // false: backward accumulates unsharded (no_sync)
  bool offload_to_cpu = false;         // shards and gradient shards live in CPU memory
  // Deterministic training (the same bits at every data-parallel size): gradients summed, not
  // averaged (the caller divides the loss by the global micro-batch count), reduced in the
  // parameters' own dtype by the tree over the rank index (distributed/tree_reduce.h), and each
  // micro-batch's reduced shard added to the earlier ones' by the tree over their index, which
  // a step's zero_grad(set_to_none=True) restarts. Groups of a power-of-two size; refused with
  // no_sync and keep_low_precision_grads.
  bool deterministic = false;
  bool pin_memory = false;       // with offload_to_cpu and CUDA parameters: page-locked shards
  std::shared_ptr<Lanes> lanes;  // null: make_lanes(the parameters' device)
};

// What a rank holds of one parameter (the layout's rule, sharding/flat_layout.h): elements
// [start, start + valid) of the flattened original of `numel` elements. A rank that holds none of
// it has valid 0 and start numel.
struct OwnedSlice {
  int64_t start = 0;
  int64_t valid = 0;
  int64_t numel = 0;
};

class FsdpUnit {
 public:
  // Shards `params` (leaf tensors, same dtype and device, identical on every rank) in place.
  FsdpUnit(std::vector<at::Tensor> params, UnitOptions options);
  ~FsdpUnit();
  FsdpUnit(const FsdpUnit&) = delete;
  FsdpUnit& operator=(const FsdpUnit&) = delete;

  const std::string& name() const { return options_.name; }
  const UnitOptions& options() const { return options_; }
  // FSDP2's per-module setters (take effect from the next forward or backward).
  // As FSDP2's setter: a bool, so true reshards to the whole shard group (drops the post-forward
  // group) and false keeps the gathered parameters.
  void set_reshard_after_forward(bool value) {
    options_.reshard_after_forward = value;
    options_.post_forward_group.reset();
  }
  void set_reshard_after_backward(bool value) { options_.reshard_after_backward = value; }
  void set_requires_gradient_sync(bool value) { options_.requires_gradient_sync = value; }
  const sharding::FlatLayout& layout() const { return layout_; }
  const std::vector<at::Tensor>& params() const { return params_; }
  int shard_rank() const { return shard_rank_; }
  int shard_size() const { return shard_size_; }
  int requires_grad_count() const { return requires_grad_count_; }
  bool unsharded() const { return unsharded_; }
  Lanes& lanes() const { return *lanes_; }
  // Declares that compute reads the unsharded parameters (forward, backward) for RecordingLanes.
  void declare_compute(const char* what) const;

  void unshard_async();  // starts the all-gather (nothing if unsharded or already started)
  void unshard();        // finishes it: every parameter is full, in param_dtype
  void reshard();        // back to shards; frees the full buffer (and any post-forward shard)
  // After forward: reshard(), keeping first this rank's post-forward shard when the options name
  // a post-forward group; the next unshard all-gathers it over that group.
  void reshard_post_forward();
  // Drops a post-forward shard nobody gathered (its data would be stale after an optimizer step).
  void drop_post_forward_shard();
  bool holds_post_forward_shard() const { return post_forward_shard_.defined(); }
  // Waits for a started all-gather nobody used and drops it (its data would be stale after an
  // optimizer step).
  void discard_gather();

  // Post-backward: takes the full gradients out of `.grad`; with `sync`, starts their
  // reduce-scatter, else adds them to an unsharded accumulator kept for the next synced backward.
  // `scratch` (bytes, grown as needed; null: a fresh buffer) holds the reduce-scatter input until
  // finish_reduce(): the engine rotates a few of them, so large buffers are not allocated (and
  // page-faulted in) every step.
  void reduce_gradients(bool sync, at::Tensor* scratch = nullptr);
  bool reduce_pending() const { return pending_reduce_; }
  void finish_reduce();  // waits for the reduction and accumulates into the gradient shards

  // The full parameters in their own dtype (all-gathered), for full state dicts.
  std::vector<at::Tensor> full_parameters();
  // Sets every shard from full parameters (each rank keeps its piece); no communication.
  void load_full_parameters(const std::vector<at::Tensor>& full);
  // This rank's valid pieces (views of the master shard), and the gradient pieces (or undefined).
  std::vector<at::Tensor> shard_views() const { return shard_views_; }
  // This rank's slice of each parameter, in params() order (the shard views hold exactly these).
  std::vector<OwnedSlice> owned_slices() const;
  std::vector<at::Tensor> grad_shard_views() const;
  const std::vector<int64_t>& shape(int64_t i) const { return shapes_[i]; }

  // Bytes held now by this unit's parameter, gradient and buffer storages.
  int64_t sharded_param_bytes() const;
  int64_t sharded_grad_bytes() const;

 private:
  void stash_gradients();
  void restore_gradients();
  void check_deterministic(int data_parallel);
  void add_micro_batch(const at::Tensor& reduced, bool first);
  at::Tensor to_compute_device(const at::Tensor& tensor) const;
  at::Tensor reduce_buffer(at::Tensor* scratch) const;
  void start_reduce_scatter(std::vector<std::optional<at::Tensor>> grads, at::Tensor* scratch);
  void drop_gather_buffers();
  void sum_quantized_rows();
  void check_post_forward_group();
  at::Tensor post_forward_shard() const;

  UnitOptions options_;
  std::shared_ptr<Lanes> lanes_;
  std::vector<at::Tensor> params_;
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<int64_t> numels_;
  sharding::FlatLayout layout_;
  int shard_rank_ = 0;
  int shard_size_ = 1;
  int requires_grad_count_ = 0;
  at::ScalarType dtype_;        // the parameters' own (master) dtype
  at::ScalarType param_dtype_;  // compute dtype
  at::ScalarType reduce_dtype_;
  at::Device device_;  // where compute happens
  double pre_divide_ = 1.0;
  double post_divide_ = 1.0;

  at::Tensor shard_;  // flat master shard (shard_numel elements)
  std::vector<at::Tensor> shard_views_;
  std::vector<at::Tensor> grad_views_;  // gradient shards, one tensor per parameter
  std::vector<bool> has_grad_;
  // Blocks j*W/N .. (j+1)*W/N - 1 of the all-gather's output (block r: rank r's shard in
  // param_dtype), for the rank at position j of a post-forward group of N out of W ranks.
  at::Tensor post_forward_shard_;
  at::Tensor full_;  // flat unsharded buffer in param_dtype (storage freed while sharded)
  std::vector<at::Tensor> full_views_;
  std::vector<at::Tensor> unsynced_grads_;  // accumulated full gradients (no_sync)
  // deterministic: this step's reduced gradient shards, summed as the tree over micro-batches
  distributed::PairwiseGradients micro_batch_sums_;

  bool unsharded_ = false;
  bool pending_gather_ = false;
  bool gathered_quantized_ = false;  // gathered_ holds quantized messages (quantized_all_gather)
  at::Tensor gathered_;
  at::Tensor gather_input_;
  c10::intrusive_ptr<c10d::Work> gather_work_;
  LaneEventPtr gather_event_;
  bool pending_reduce_ = false;
  bool owns_reduce_input_ = false;  // false: the engine's scratch, reused
  at::Tensor reduce_input_;
  at::Tensor reduce_output_;
  bool reduce_quantized_ = false;  // reduce_output_ holds quantized rows (qgZ)
  at::Tensor reduce_messages_;     // qgZ: this rank's quantized rows, until the all-to-all ends
  c10::intrusive_ptr<c10d::Work> reduce_work_;
  LaneEventPtr reduce_event_;
};

}  // namespace shardwise::fsdp
