// The tensor-parallel parameter set of sharded_parameters.h.
#include "tensor_parallel/sharded_parameters.h"

#include <ATen/ATen.h>

#include <stdexcept>

namespace shardwise::tensor_parallel {

SplitRule split_by_suffix(std::vector<std::pair<std::string, SplitDim>> table) {
  return [table = std::move(table)](const std::string& name) -> std::optional<SplitDim> {
    for (const auto& [suffix, split] : table) {
      if (name == suffix) return split;
      const size_t n = suffix.size();
      if (name.size() > n && name.compare(name.size() - n, n, suffix) == 0 &&
          name[name.size() - n - 1] == '.') {
        return split;
      }
    }
    return std::nullopt;
  };
}

ShardedParameters::ShardedParameters(const std::vector<std::pair<std::string, at::Tensor>>& full,
                                     const SplitRule& rule,
                                     Group group)
    : group_(std::move(group)) {
  if (!group_) {
    throw std::invalid_argument("ShardedParameters: group is null; pass the tensor-parallel group");
  }
  for (const auto& [name, tensor] : full) {
    std::optional<ShardSpec> spec;
    if (const auto split = rule(name)) {
      const auto dot = name.rfind('.');  // errors name the module and the tensor in it
      spec = ShardSpec{split->dim,
                       split->chunks,
                       group_->getRank(),
                       group_->getSize(),
                       dot == std::string::npos ? name : name.substr(0, dot),
                       dot == std::string::npos ? name : name.substr(dot + 1)};
    }
    const at::Tensor detached = tensor.detach();
    at::Tensor value = spec ? shard_tensor(detached, *spec) : detached.clone();
    entries_[name] = {value.requires_grad_(true), spec, tensor.sizes().vec()};
    names_.push_back(name);
  }
}

namespace {
std::vector<std::pair<std::string, at::Tensor>> pairs(
    const torch::OrderedDict<std::string, at::Tensor>& named) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : named) out.emplace_back(item.key(), item.value());
  return out;
}
}  // namespace

ShardedParameters::ShardedParameters(const torch::OrderedDict<std::string, at::Tensor>& full,
                                     const SplitRule& rule,
                                     Group group)
    : ShardedParameters(pairs(full), rule, std::move(group)) {}

const ShardedParameters::Entry& ShardedParameters::entry(const std::string& name) const {
  const auto found = entries_.find(name);
  if (found == entries_.end()) {
    throw std::invalid_argument("ShardedParameters: no parameter named '" + name +
                                "'; names are the full model's (named_parameters())");
  }
  return found->second;
}

const at::Tensor& ShardedParameters::at(const std::string& name) const { return entry(name).value; }

std::vector<at::Tensor> ShardedParameters::tensors() const {
  std::vector<at::Tensor> out;
  for (const auto& name : names_) out.push_back(entries_.at(name).value);
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> ShardedParameters::named() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& name : names_) out.emplace_back(name, entries_.at(name).value);
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> ShardedParameters::named(
    const std::string& prefix) const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& name : names_) {
    if (name.compare(0, prefix.size(), prefix) == 0)
      out.emplace_back(name, entries_.at(name).value);
  }
  return out;
}

std::optional<ShardSpec> ShardedParameters::spec(const std::string& name) const {
  return entry(name).spec;
}

const std::vector<int64_t>& ShardedParameters::full_shape(const std::string& name) const {
  return entry(name).full_shape;
}

at::Tensor ShardedParameters::gather(const std::string& name, const at::Tensor& value) const {
  const auto& s = entry(name).spec;
  return s ? gather_shards(value.detach(), *s, group_) : value.detach().clone();
}

torch::OrderedDict<std::string, at::Tensor> ShardedParameters::full_state() const {
  torch::OrderedDict<std::string, at::Tensor> out;
  for (const auto& name : names_) out.insert(name, gather(name, entries_.at(name).value));
  return out;
}

}  // namespace shardwise::tensor_parallel
