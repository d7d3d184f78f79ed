#include "fsdp/fully_shard.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/modules/container/sequential.h>

#include <set>
#include <unordered_map>

#include "distributed/broadcast_module.h"

namespace shardwise::fsdp {
namespace {

using ModulePtr = std::shared_ptr<torch::nn::Module>;

// The dotted name of `target` in `root` (e.g. "blocks"); throws when it is not a submodule.
std::string module_name(torch::nn::Module& root, const torch::nn::Module* target) {
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    if (item.value().get() == target) return item.key();
  }
  TORCH_CHECK(false,
              "FullyShardedDataParallel: a Sequential in `wrap` is not a submodule of the "
              "wrapped model; pass the model's own members (e.g. {&model->blocks})");
}

// The parent of submodule `name` and the child's last name component.
std::pair<ModulePtr, std::string> parent_of(const ModulePtr& root, const std::string& name) {
  ModulePtr parent = root;
  std::string rest = name;
  for (auto dot = rest.find('.'); dot != std::string::npos; dot = rest.find('.')) {
    parent = parent->named_children()[rest.substr(0, dot)];
    rest = rest.substr(dot + 1);
  }
  return {parent, rest};
}

}  // namespace

FullyShardedModuleImpl::FullyShardedModuleImpl(torch::nn::AnyModule inner,
                                               std::shared_ptr<FsdpEngine> engine,
                                               int unit)
    : inner_(std::move(inner)), engine_(std::move(engine)), unit_(unit) {
  register_module("module", inner_.ptr());
}

at::Tensor FullyShardedModuleImpl::forward(at::Tensor x) {
  engine_->pre_forward(unit_);
  at::Tensor out = inner_.forward(std::move(x));
  engine_->post_forward(unit_, {out});
  return out;
}

FullyShardedState::FullyShardedState(std::shared_ptr<torch::nn::Module> root,
                                     const FullyShardOptions& options,
                                     const std::vector<torch::nn::Sequential*>& wrap)
    : param_dtype_(options.param_dtype) {
  TORCH_CHECK(root != nullptr, "FullyShardedDataParallel: the module is null");
  TORCH_CHECK(options.shard_group,
              "FullyShardOptions.shard_group is null: pass the group to "
              "shard over (e.g. the world group from init_from_env())");
  if (options.sync_module_states) distributed::broadcast_module(*root, *options.shard_group);
  EngineOptions engine_options = options.engine;
  if (!engine_options.world_group) engine_options.world_group = options.shard_group;
  engine_ = FsdpEngine::create(engine_options);

  // Each parameter's first name in the unwrapped model (tied parameters appear once).
  std::unordered_map<const void*, std::string> name_of;
  for (const auto& item : root->named_parameters()) {
    name_of.emplace(item.value().unsafeGetTensorImpl(), item.key());
  }
  auto unit_options = [&](const std::string& name, bool reshard) {
    UnitOptions unit;
    unit.name = name;
    unit.shard_group = options.shard_group;
    unit.replicate_group = options.replicate_group;
    unit.param_dtype = options.param_dtype;
    unit.reduce_dtype = options.reduce_dtype ? options.reduce_dtype : options.param_dtype;
    unit.reshard_after_forward = reshard;
    return unit;
  };
  std::set<const void*> taken;
  auto add_unit = [&](const std::string& name, const std::vector<at::Tensor>& candidates,
                      bool reshard) {
    std::vector<at::Tensor> params;
    std::vector<std::string> names;
    for (const auto& p : candidates) {
      if (!taken.insert(p.unsafeGetTensorImpl()).second) continue;
      params.push_back(p);
      names.push_back(name_of.at(p.unsafeGetTensorImpl()));
    }
    unit_names_.push_back(std::move(names));
    return engine_->add_unit(std::move(params), unit_options(name, reshard));
  };

  for (torch::nn::Sequential* sequential : wrap) {
    TORCH_CHECK(sequential != nullptr && !sequential->is_empty(),
                "FullyShardedDataParallel: `wrap` holds an empty Sequential holder");
    const std::string name = module_name(*root, sequential->ptr().get());
    torch::nn::Sequential wrapped;
    size_t index = 0;
    for (const auto& child : **sequential) {
      const std::string child_name = name + "." + std::to_string(index++);
      const int unit =
          add_unit(child_name, child.ptr()->parameters(), options.reshard_after_forward);
      wrapped->push_back(FullyShardedModule(child, engine_, unit));
    }
    auto [parent, last] = parent_of(root, name);
    parent->replace_module(last, wrapped.ptr());
    *sequential = wrapped;
  }
  // The root unit keeps its parameters gathered from forward to backward (as torch FSDP does).
  root_unit_ = add_unit("root", root->parameters(), /*reshard=*/false);
  engine_->set_root(root_unit_);
}

std::vector<at::Tensor> FullyShardedState::parameters() const {
  std::vector<at::Tensor> out;
  for (int u = 0; u < engine_->num_units(); ++u) {
    for (const auto& p : engine_->unit(u).params()) out.push_back(p);
  }
  return out;
}

torch::OrderedDict<std::string, at::Tensor> FullyShardedState::full_state_dict() {
  torch::OrderedDict<std::string, at::Tensor> out;
  for (int u = 0; u < engine_->num_units(); ++u) {
    const auto full = engine_->unit(u).full_parameters();
    for (size_t i = 0; i < full.size(); ++i) out.insert(unit_names_[u][i], full[i]);
  }
  return out;
}

void FullyShardedState::load_full_state_dict(
    const torch::OrderedDict<std::string, at::Tensor>& full) {
  for (int u = 0; u < engine_->num_units(); ++u) {
    FsdpUnit& unit = engine_->unit(u);
    std::vector<at::Tensor> tensors;
    for (size_t i = 0; i < unit_names_[u].size(); ++i) {
      const std::string& name = unit_names_[u][i];
      const at::Tensor* found = full.find(name);
      TORCH_CHECK(found != nullptr, "load_full_state_dict: no tensor named '", name,
                  "'; pass a state dict saved from this model (full_state_dict())");
      TORCH_CHECK(found->sizes() == at::IntArrayRef(unit.shape(static_cast<int64_t>(i))),
                  "load_full_state_dict: '", name, "' has shape ", found->sizes(),
                  " but the model's is ", at::IntArrayRef(unit.shape(static_cast<int64_t>(i))));
      tensors.push_back(*found);
    }
    unit.load_full_parameters(tensors);
  }
}

std::vector<sharding::TensorSlice> FullyShardedState::shard_slices() const {
  std::vector<sharding::TensorSlice> out;
  for (int u = 0; u < engine_->num_units(); ++u) {
    const FsdpUnit& unit = engine_->unit(u);
    const auto views = unit.shard_views();
    for (size_t i = 0; i < views.size(); ++i) {
      out.push_back({unit_names_[u][i],
                     unit.layout().start(static_cast<int64_t>(i), unit.shard_rank()), views[i]});
    }
  }
  return out;
}

std::vector<sharding::TensorSlice> FullyShardedState::sharded_state_dict() const {
  auto pieces = shard_slices();
  for (auto& piece : pieces) piece.values = piece.values.detach().clone();
  return pieces;
}

void FullyShardedState::load_sharded_state_dict(const std::vector<sharding::TensorSlice>& pieces) {
  at::NoGradGuard no_grad;
  sharding::fill_from_pieces(shard_slices(), pieces, /*strict=*/true);
}

double FullyShardedState::clip_grad_norm_(double max_norm, double norm_type) {
  return engine_->clip_grad_norm_(max_norm, norm_type);
}

}  // namespace shardwise::fsdp
