// The FSDP engine: a set of units and the hooks that drive them through an iteration, usable
// from LibTorch (call pre_forward / post_forward around each unit's forward) and from Python
// (shardwise.FullyShardedDataParallel registers module hooks that call the same methods).
//
// Forward: pre_forward(u) unshards unit u (waiting for a prefetched all-gather when there is
// one) and, with forward prefetch, starts the all-gather of the unit that ran next in the
// recorded order; post_forward(u, outputs) reshards u if its options say so and hooks u's
// outputs so that its gradient triggers pre_backward(u). Under no-grad (evaluation: no backward
// will come) it reshards u whatever its options, and the root's frees every unit and unused
// prefetch, so the engine is as a finished backward leaves it.
// Backward: pre_backward(u) unshards u again and, with backward prefetch BACKWARD_PRE, starts the
// all-gather of the unit that runs backward next (the previous one in forward order). When
// autograd has accumulated the gradient of every parameter of u that requires one (a
// post-accumulate-grad hook per parameter counts them), post_backward(u) starts u's gradient
// reduce-scatter, reshards u and (BACKWARD_POST) prefetches the next unit. (A unit that also
// holds frozen parameters reduces at the end of backward: a frozen parameter may still be needed
// for an input gradient after the last trainable gradient arrived.) A callback queued on
// the autograd engine runs finalize_backward() after the whole backward: units whose hooks did
// not fire are reduced, every reduction is waited for and copied into the gradient shards,
// every unit is resharded, and after the first iteration the forward order is compared across
// ranks (an error names the first unit that differs). Every unit shares the engine's lanes: one
// all-gather stream and one reduce-scatter stream (fsdp/lanes.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <deque>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "fsdp/fsdp_unit.h"

namespace shardwise::fsdp {

enum class BackwardPrefetch { kNone, kBackwardPre, kBackwardPost };

struct EngineOptions {
  bool forward_prefetch = false;
  BackwardPrefetch backward_prefetch = BackwardPrefetch::kBackwardPre;
  // Every rank of the job; the forward order is checked across it after the first iteration.
  // Null: no check.
  c10::intrusive_ptr<c10d::ProcessGroup> world_group;
  // The streams every unit shares (fsdp/lanes.h); null: make_lanes(the first unit's device).
  std::shared_ptr<Lanes> lanes;
};

class FsdpEngine : public std::enable_shared_from_this<FsdpEngine> {
 public:
  static std::shared_ptr<FsdpEngine> create(EngineOptions options);

  // Shards `params` into a new unit; returns its index. A parameter may belong to one unit only.
  int add_unit(std::vector<at::Tensor> params, UnitOptions options);
  // Adds a unit sharded earlier, outside any engine (per-module FSDP, fully_shard: each module's
  // unit is made when it is wrapped, the engine when its root first runs); returns its index.
  int add_unit(std::shared_ptr<FsdpUnit> unit);
  // The unit whose pre_forward starts an iteration (the outermost module).
  void set_root(int unit) { root_ = unit; }
  int num_units() const { return static_cast<int>(units_.size()); }
  FsdpUnit& unit(int index);
  // Explicit prefetch (FSDP2's set_modules_to_forward_prefetch / _backward_prefetch): after
  // unsharding `unit` in forward (backward), start the all-gathers of `targets`. In backward a
  // non-empty list replaces the default (the unit before in forward order).
  void set_forward_prefetch(int unit, std::vector<int> targets);
  void set_backward_prefetch(int unit, std::vector<int> targets);

  void pre_forward(int unit);
  void post_forward(int unit, const std::vector<at::Tensor>& outputs);
  // Whether the next backward reduces gradients (false: accumulate them unsharded, no_sync);
  // a unit reduces when this and its own UnitOptions::requires_gradient_sync are both true.
  void set_requires_gradient_sync(bool sync) { sync_ = sync; }
  bool requires_gradient_sync() const { return sync_; }

  // Clips the gradient shards of every unit so that their global norm (over the shard group)
  // is at most max_norm; returns the norm before clipping. norm_type: 2.0 or inf.
  double clip_grad_norm_(double max_norm, double norm_type);
  // Reshards every unit (e.g. before a checkpoint taken outside an iteration).
  void reshard_all();
  // The recorded forward order (unit indices), empty before the first backward.
  const std::vector<int>& forward_order() const { return recorded_order_; }

 private:
  explicit FsdpEngine(EngineOptions options) : options_(std::move(options)) {}
  void pre_backward(int unit);
  void on_grad_ready(int unit);
  void post_backward(int unit);
  void finalize_backward();
  void check_order_across_ranks();
  void prefetch(int unit);
  void check_not_taken(const std::vector<at::Tensor>& params, const std::string& name) const;
  int forward_position(int unit) const;

  EngineOptions options_;
  std::shared_ptr<Lanes> lanes_;
  std::vector<std::shared_ptr<FsdpUnit>> units_;
  std::vector<std::vector<int>> forward_targets_;
  std::vector<std::vector<int>> backward_targets_;
  int root_ = -1;
  bool sync_ = true;
  std::vector<int> current_order_;
  std::vector<int> recorded_order_;
  bool order_checked_ = false;
  bool in_backward_ = false;
  std::vector<bool> pre_backward_done_;
  std::vector<bool> post_backward_done_;
  std::vector<int> grads_ready_;
  std::deque<int> reduce_queue_;  // units with a reduction in flight, in issue order
  // Reduce-scatter inputs, reused round-robin within a backward: at most kReduceBuffers
  // reductions are in flight (the oldest is finished before another starts); released after.
  static constexpr size_t kReduceBuffers = 2;
  std::array<at::Tensor, kReduceBuffers> reduce_buffers_;
  size_t reduces_issued_ = 0;
};

}  // namespace shardwise::fsdp
