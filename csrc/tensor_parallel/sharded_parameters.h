// A model's parameters cut over a tensor-parallel group by a split rule, kept by the full model's
// names in its order: a split parameter is this rank's shard of the full tensor (shard_tensor,
// so every tp size starts from the same weights), a replicated one a copy; every tensor a leaf
// that requires a gradient. A model written with the tensor-parallel layers reads its weights
// from here, and the training rules read what they need: which parameters are split (the mesh
// clip, the checkpoint writer), the full shapes (checkpoint slots, the full state) and the whole
// tensors back (gather: collective over the group for a split parameter).
//
//   auto rule = split_by_suffix({{"up.weight", SplitDim{0}},     // column parallel
//                                {"down.weight", SplitDim{1}}}); // row parallel; the rest
//                                replicated
//   ShardedParameters params(model->named_parameters(), rule, tp_group);
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/ordered_dict.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tensor_parallel/regions.h"
#include "tensor_parallel/shard_tensor.h"

namespace shardwise::tensor_parallel {

struct SplitDim {
  int64_t dim = 0;     // the split dimension
  int64_t chunks = 1;  // fused parts along it (3 for QKV)
};

// How parameter `name` is split; nullopt: replicated over the group.
using SplitRule = std::function<std::optional<SplitDim>(const std::string& name)>;

// The rule of a table of name suffixes: a parameter is split as the first entry whose suffix is
// its whole name or follows a '.' in it ("up.weight" matches "blocks.0.up.weight", not
// "blocks.0.setup.weight"); replicated when none does.
SplitRule split_by_suffix(std::vector<std::pair<std::string, SplitDim>> table);

class ShardedParameters {
 public:
  // `full`: the full model's named parameters (copied; the model is left as it is).
  ShardedParameters(const std::vector<std::pair<std::string, at::Tensor>>& full,
                    const SplitRule& rule,
                    Group group);
  // The same from a module's named_parameters().
  ShardedParameters(const torch::OrderedDict<std::string, at::Tensor>& full,
                    const SplitRule& rule,
                    Group group);

  // This rank's tensor of `name` (an error naming it when there is none).
  const at::Tensor& at(const std::string& name) const;
  // The names in the full model's order, and the tensors in that order.
  const std::vector<std::string>& names() const { return names_; }
  std::vector<at::Tensor> tensors() const;
  std::vector<std::pair<std::string, at::Tensor>> named() const;
  // Those whose names start with `prefix` ("blocks.0."): one module's parameters.
  std::vector<std::pair<std::string, at::Tensor>> named(const std::string& prefix) const;
  // How `name` is split over the group (this rank's spec); nullopt: replicated.
  std::optional<ShardSpec> spec(const std::string& name) const;
  bool split(const std::string& name) const { return spec(name).has_value(); }
  const std::vector<int64_t>& full_shape(const std::string& name) const;
  // The whole tensor of `name` from `value` (this rank's tensor of it, or a copy of that):
  // gathered over the group when split (collective), else a detached copy.
  at::Tensor gather(const std::string& name, const at::Tensor& value) const;
  // Every whole tensor by the full model's names, from this rank's tensors (collective).
  torch::OrderedDict<std::string, at::Tensor> full_state() const;
  const Group& group() const { return group_; }

 private:
  struct Entry {
    at::Tensor value;
    std::optional<ShardSpec> spec;
    std::vector<int64_t> full_shape;
  };
  const Entry& entry(const std::string& name) const;

  Group group_;
  std::vector<std::string> names_;
  std::map<std::string, Entry> entries_;
};

}  // namespace shardwise::tensor_parallel
