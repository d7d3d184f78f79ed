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

UnitOptions unit_options(const FullyShardOptions& options, const std::string& name, bool reshard) {
  UnitOptions unit;
  unit.name = name;
  unit.shard_group = options.shard_group;
  unit.replicate_group = options.replicate_group;
  unit.param_dtype = options.param_dtype;
  unit.reduce_dtype = options.reduce_dtype ? options.reduce_dtype : options.param_dtype;
  unit.keep_low_precision_grads = options.keep_low_precision_grads;
  unit.deterministic = options.deterministic;
  unit.reshard_after_forward = reshard;
  unit.post_forward_group = options.post_forward_group;
  return unit;
}

void add_unwrapped(const torch::nn::Module& module,
                   const std::string& prefix,
                   std::set<const void*>& seen,
                   torch::OrderedDict<std::string, at::Tensor>& out) {
  if (const auto* wrapper = dynamic_cast<const FullyShardedModuleImpl*>(&module)) {
    return add_unwrapped(*wrapper->inner().ptr(), prefix, seen, out);
  }
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) {
      out.insert(prefix + item.key(), item.value());
    }
  }
  for (const auto& child : module.named_children()) {
    add_unwrapped(*child.value(), prefix + child.key() + ".", seen, out);
  }
}

// The units fully_shard made beneath `module` (outermost first).
std::vector<FullyShardedModuleImpl*> wrappers_in(const torch::nn::Module& module) {
  std::vector<FullyShardedModuleImpl*> out;
  for (const auto& sub : module.modules(/*include_self=*/false)) {
    if (auto* wrapper = dynamic_cast<FullyShardedModuleImpl*>(sub.get())) out.push_back(wrapper);
  }
  return out;
}

void check_options(const FullyShardOptions& options, const char* who) {
  TORCH_CHECK(options.shard_group, who,
              ": FullyShardOptions.shard_group is null: pass the group to "
              "shard over (e.g. the world group from init_from_env())");
}

}  // namespace

torch::OrderedDict<std::string, at::Tensor> unwrapped_parameters(const torch::nn::Module& root) {
  torch::OrderedDict<std::string, at::Tensor> out;
  std::set<const void*> seen;
  add_unwrapped(root, "", seen, out);
  return out;
}

FullyShardedModuleImpl::FullyShardedModuleImpl(torch::nn::AnyModule inner,
                                               std::shared_ptr<FsdpUnit> unit)
    : inner_(std::move(inner)), unit_(std::move(unit)) {
  register_module("module", inner_.ptr());
}

void FullyShardedModuleImpl::adopt(std::shared_ptr<FsdpEngine> engine, int index) {
  TORCH_CHECK(!engine_, "fully_shard: unit '", unit_->name(),
              "' already belongs to a FullyShardedDataParallel; wrap each model once");
  engine_ = std::move(engine);
  index_ = index;
}

at::Tensor FullyShardedModuleImpl::forward(at::Tensor x) {
  TORCH_CHECK(engine_, "fully_shard: unit '", unit_->name(),
              "' ran before any root adopted it; wrap the model in FullyShardedDataParallel "
              "after the fully_shard calls and run it through the wrapper");
  engine_->pre_forward(index_);
  at::Tensor out = inner_.forward(std::move(x));
  engine_->post_forward(index_, {out});
  return out;
}

FullyShardedModule fully_shard(const torch::nn::AnyModule& module,
                               const FullyShardOptions& options,
                               const std::string& name) {
  check_options(options, "fully_shard");
  TORCH_CHECK(!dynamic_cast<FullyShardedModuleImpl*>(module.ptr().get()), "fully_shard: '", name,
              "' is already sharded; call fully_shard once per module");
  std::set<const void*> taken;
  for (FullyShardedModuleImpl* inner : wrappers_in(*module.ptr())) {
    for (const auto& p : inner->unit()->params()) taken.insert(p.unsafeGetTensorImpl());
  }
  std::vector<at::Tensor> params;
  for (const auto& p : module.ptr()->parameters()) {
    if (taken.insert(p.unsafeGetTensorImpl()).second) params.push_back(p);
  }
  if (options.sync_module_states) distributed::broadcast_tensors(params, *options.shard_group);
  UnitOptions unit = unit_options(options, name, options.reshard_after_forward);
  unit.lanes = shared_lanes(params.empty() ? at::Device(at::kCPU) : params[0].device());
  return FullyShardedModule(module, std::make_shared<FsdpUnit>(std::move(params), unit));
}

FullyShardedState::FullyShardedState(std::shared_ptr<torch::nn::Module> root,
                                     const FullyShardOptions& options,
                                     const std::vector<torch::nn::Sequential*>& wrap)
    : param_dtype_(options.param_dtype) {
  TORCH_CHECK(root != nullptr, "FullyShardedDataParallel: the module is null");
  check_options(options, "FullyShardedDataParallel");
  EngineOptions engine_options = options.engine;
  if (!engine_options.world_group) engine_options.world_group = options.shard_group;
  engine_ = FsdpEngine::create(engine_options);

  for (torch::nn::Sequential* sequential : wrap) {
    TORCH_CHECK(sequential != nullptr && !sequential->is_empty(),
                "FullyShardedDataParallel: `wrap` holds an empty Sequential holder");
    const std::string name = module_name(*root, sequential->ptr().get());
    torch::nn::Sequential wrapped;
    size_t index = 0;
    for (const auto& child : **sequential) {
      wrapped->push_back(fully_shard(child, options, name + "." + std::to_string(index++)));
    }
    auto [parent, last] = parent_of(root, name);
    parent->replace_module(last, wrapped.ptr());
    *sequential = wrapped;
  }
  adopt_units(*root, options);
}

void FullyShardedState::adopt_units(torch::nn::Module& root, const FullyShardOptions& options) {
  // Each parameter's name in the unwrapped model (tied parameters appear once).
  std::unordered_map<const void*, std::string> name_of;
  std::vector<at::Tensor> rest;
  for (const auto& item : unwrapped_parameters(root)) {
    name_of.emplace(item.value().unsafeGetTensorImpl(), item.key());
  }
  std::set<const void*> taken;
  auto names_of = [&](const std::vector<at::Tensor>& params) {
    std::vector<std::string> names;
    for (const auto& p : params) {
      names.push_back(name_of.at(p.unsafeGetTensorImpl()));
      taken.insert(p.unsafeGetTensorImpl());
    }
    return names;
  };
  for (FullyShardedModuleImpl* wrapper : wrappers_in(root)) {
    unit_names_.push_back(names_of(wrapper->unit()->params()));
    wrapper->adopt(engine_, engine_->add_unit(wrapper->unit()));
  }
  for (const auto& p : root.parameters()) {
    if (taken.insert(p.unsafeGetTensorImpl()).second) rest.push_back(p);
  }
  if (options.sync_module_states) {  // the units' parameters were broadcast by fully_shard
    std::vector<at::Tensor> unsharded = rest;
    for (const auto& b : root.buffers()) unsharded.push_back(b);
    distributed::broadcast_tensors(unsharded, *options.shard_group);
  }
  // The root unit keeps its parameters gathered from forward to backward (as torch FSDP does).
  unit_names_.push_back(names_of(rest));
  root_unit_ = engine_->add_unit(std::move(rest), unit_options(options, "root", false));
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
