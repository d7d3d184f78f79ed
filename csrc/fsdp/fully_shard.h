// FSDP for torch::nn modules, with no hand-written pre/post-forward calls: the LibTorch face of
// the engine (fsdp_engine.h), as shardwise.FullyShardedDataParallel is its Python face.
//
//   shardwise::fsdp::FullyShardOptions options;
//   options.shard_group = world.group;
//   shardwise::fsdp::FullyShardedDataParallel<GPT> fsdp(model, options, {&model->blocks});
//   auto logits = fsdp.forward(tokens);       // unshards, runs, reshards each unit
//   torch::optim::AdamW optimizer(fsdp.parameters(), ...);   // the shards
//
// Auto-wrap: every child of each listed torch::nn::Sequential becomes its own unit by
// fully_shard (the per-module call below, which a caller may also make, bottom-up, as with
// FSDP2), wrapped in a FullyShardedModule (which drives the engine around the child's forward),
// in place: the holder the caller passed and the parent's registered child both point at the new
// Sequential, so the model's own forward (x = blocks->forward(x)) runs the units without
// knowing. The root adopts the unit of every FullyShardedModule beneath it; every other
// parameter (embeddings, final norm, tied head) forms the root unit, driven by
// FullyShardedDataParallel::forward.
//
// Parameters become this rank's shards in place (FsdpUnit), so any torch::optim optimizer over
// parameters() updates the shards; gradients arrive reduced and sharded after backward.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/ordered_dict.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/fsdp_engine.h"
#include "fsdp/fsdp_unit.h"
#include "sharding/checkpoint_pieces.h"

namespace shardwise::fsdp {

struct FullyShardOptions {
  c10::intrusive_ptr<c10d::ProcessGroup> shard_group;      // required
  c10::intrusive_ptr<c10d::ProcessGroup> replicate_group;  // hybrid sharding; null: none
  std::optional<at::ScalarType> param_dtype;               // e.g. at::kBFloat16
  std::optional<at::ScalarType> reduce_dtype;
  bool keep_low_precision_grads = false;  // gradient shards in param_dtype (UnitOptions)
  bool deterministic = false;             // the same bits at every data-parallel size (UnitOptions)
  bool reshard_after_forward = true;  // false: SHARD_GRAD_OP (keep units gathered until backward)
  // FSDP2's int reshard_after_forward: N consecutive ranks of shard_group, this rank's (e.g. one
  // node's); backward all-gathers over them (UnitOptions::post_forward_group). Null: none.
  c10::intrusive_ptr<c10d::ProcessGroup> post_forward_group;
  bool sync_module_states = true;  // broadcast rank 0's parameters (each unit's before
                                   // sharding it) and buffers
  EngineOptions engine;            // prefetching; engine.world_group checks forward order
};

// One wrapped module: forward(x) = pre_forward, the module's forward(x), post_forward. Its unit
// is made (and the module's parameters sharded) by fully_shard; the root
// FullyShardedDataParallel's engine adopts it, and forward before that is an error.
class FullyShardedModuleImpl : public torch::nn::Module {
 public:
  FullyShardedModuleImpl(torch::nn::AnyModule inner, std::shared_ptr<FsdpUnit> unit);
  at::Tensor forward(at::Tensor x);
  const torch::nn::AnyModule& inner() const { return inner_; }
  const std::shared_ptr<FsdpUnit>& unit() const { return unit_; }
  void adopt(std::shared_ptr<FsdpEngine> engine, int index);

 private:
  torch::nn::AnyModule inner_;
  std::shared_ptr<FsdpUnit> unit_;
  std::shared_ptr<FsdpEngine> engine_;
  int index_ = -1;
};
TORCH_MODULE(FullyShardedModule);

// FSDP2's per-module call (Python: shardwise.fully_shard), bottom-up: shards the parameters of
// `module` that no fully_shard beneath it took into one unit, now, and returns the wrapper to put
// where the module was (e.g. blocks->push_back(fully_shard(Block(), options))). The root
// FullyShardedDataParallel then adopts every such unit beneath it; its own unit is the rest.
// `options.reshard_after_forward`, `param_dtype`, `reduce_dtype` and the groups apply to the unit.
FullyShardedModule fully_shard(const torch::nn::AnyModule& module,
                               const FullyShardOptions& options,
                               const std::string& name = "module");

// Every parameter of `root` by its name in the unwrapped model: a FullyShardedModule adds no
// name component ("blocks.0.fc.weight", not "blocks.0.module.fc.weight"); tied parameters once.
torch::OrderedDict<std::string, at::Tensor> unwrapped_parameters(const torch::nn::Module& root);

// The untyped part of the wrapper (fully_shard.cpp): planning units, sharding, state dicts.
class FullyShardedState {
 public:
  FullyShardedState(std::shared_ptr<torch::nn::Module> root,
                    const FullyShardOptions& options,
                    const std::vector<torch::nn::Sequential*>& wrap);

  FsdpEngine& engine() { return *engine_; }
  std::shared_ptr<FsdpEngine> engine_ptr() { return engine_; }
  int root_unit() const { return root_unit_; }
  // This rank's parameter shards (each parameter once), for the optimizer.
  std::vector<at::Tensor> parameters() const;
  // The full parameters by their names in the unwrapped model (e.g. "blocks.0.qkv.weight"),
  // gathered on every rank (collective).
  torch::OrderedDict<std::string, at::Tensor> full_state_dict();
  // Sets every shard from full parameters named as full_state_dict() names them; every name must
  // be present with its shape (an error names the first that is not). No communication.
  void load_full_state_dict(const torch::OrderedDict<std::string, at::Tensor>& full);
  // This rank's pieces: (name, first element of the flattened full tensor, values), the format
  // of sharding/checkpoint_pieces.h, so they load at any world size with fill_from_pieces.
  std::vector<sharding::TensorSlice> sharded_state_dict() const;
  void load_sharded_state_dict(const std::vector<sharding::TensorSlice>& pieces);
  // Gradient clipping over all shards (FsdpEngine::clip_grad_norm_); returns the norm before.
  double clip_grad_norm_(double max_norm, double norm_type = 2.0);
  // The compute dtype floating inputs are cast to (FullyShardOptions::param_dtype), if any.
  std::optional<at::ScalarType> param_dtype() const { return param_dtype_; }
  // Every parameter's shard as a slot (name, first element, a view of the shard), in the order
  // of parameters(): slot i views parameters()[i].
  std::vector<sharding::TensorSlice> shard_slices() const;

 private:
  void adopt_units(torch::nn::Module& root, const FullyShardOptions& options);

  std::optional<at::ScalarType> param_dtype_;
  std::shared_ptr<FsdpEngine> engine_;
  int root_unit_ = -1;
  std::vector<std::vector<std::string>> unit_names_;  // per unit, its parameters' names
};

// The root wrapper: forward(args...) runs the model's forward between the root unit's
// pre_forward and post_forward, floating tensor arguments cast to param_dtype first (as torch's
// FSDP does). ModuleHolder: a TORCH_MODULE holder type (e.g. GPT).
template <typename ModuleHolder>
class FullyShardedDataParallel : public FullyShardedState {
 public:
  FullyShardedDataParallel(ModuleHolder module,
                           const FullyShardOptions& options,
                           const std::vector<torch::nn::Sequential*>& wrap = {})
      : FullyShardedState(module.ptr(), options, wrap), module_(std::move(module)) {}

  template <typename... Args>
  decltype(auto) forward(Args&&... args) {
    engine().pre_forward(root_unit());
    auto output = module_->forward(to_compute_dtype(std::forward<Args>(args))...);
    engine().post_forward(root_unit(), output_tensors(output));
    return output;
  }
  ModuleHolder& module() { return module_; }

 private:
  template <typename T>
  decltype(auto) to_compute_dtype(T&& arg) const {
    if constexpr (std::is_same_v<std::decay_t<T>, at::Tensor>) {
      const auto dtype = param_dtype();
      return dtype && arg.is_floating_point() ? arg.to(*dtype) : at::Tensor(arg);
    } else {
      return std::forward<T>(arg);
    }
  }
  static std::vector<at::Tensor> output_tensors(const at::Tensor& t) { return {t}; }
  static std::vector<at::Tensor> output_tensors(const std::vector<at::Tensor>& ts) { return ts; }
  template <typename... Ts>
  static std::vector<at::Tensor> output_tensors(const std::tuple<Ts...>& tuple) {
    std::vector<at::Tensor> out;
    std::apply([&](const auto&... items) { (add_if_tensor(out, items), ...); }, tuple);
    return out;
  }
  template <typename T>
  static void add_if_tensor(std::vector<at::Tensor>& out, const T& item) {
    if constexpr (std::is_same_v<T, at::Tensor>) out.push_back(item);
  }
  ModuleHolder module_;
};

}  // namespace shardwise::fsdp
