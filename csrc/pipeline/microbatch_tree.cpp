#include "pipeline/microbatch_tree.h"

#include <ATen/ATen.h>

#include <utility>

namespace shardwise::pipeline {
namespace {

// `parameter`'s gradient in float32 (zeros when autograd left none), its `.grad` undefined.
at::Tensor take_gradient(const at::Tensor& parameter) {
  at::Tensor grad = parameter.grad();
  at::Tensor out = grad.defined()
                       ? grad.to(at::kFloat)
                       : at::zeros(parameter.sizes(), parameter.options().dtype(at::kFloat));
  at::Tensor(parameter).mutable_grad() = at::Tensor();
  return out;
}

bool same(const at::Tensor& x, const at::Tensor& y) {
  return x.unsafeGetTensorImpl() == y.unsafeGetTensorImpl();
}

}  // namespace

MicrobatchTree::MicrobatchTree(std::map<int, std::vector<at::Tensor>> parameters,
                               std::vector<TiedParameter> tied,
                               TiedContext context)
    : tied_(std::move(tied)), context_(std::move(context)) {
  std::vector<at::Tensor> tied_here;
  for (size_t t = 0; t < tied_.size(); ++t) {
    const TiedParameter& tie = tied_[t];
    const bool a_here = context_.schedule->rank_of(tie.stage_a) == context_.rank;
    const bool b_here = context_.schedule->rank_of(tie.stage_b) == context_.rank;
    at::Tensor a = a_here ? context_.parameter(tie.stage_a, tie.name_a) : at::Tensor();
    at::Tensor b = b_here ? context_.parameter(tie.stage_b, tie.name_b) : at::Tensor();
    if (a_here && b_here && same(a, b)) continue;  // one tensor: autograd adds both uses
    if (a_here) copies_[tie.stage_a].push_back({static_cast<int>(t), true, a, {}});
    if (b_here) copies_[tie.stage_b].push_back({static_cast<int>(t), false, b, {}});
    for (const at::Tensor& p : {a, b}) {
      if (p.defined()) tied_here.push_back(p);
    }
  }
  for (auto& [stage, list] : parameters) {
    std::vector<at::Tensor>& kept = parameters_[stage];
    for (const at::Tensor& p : list) {
      const bool is_copy = std::any_of(tied_here.begin(), tied_here.end(),
                                       [&](const at::Tensor& c) { return same(c, p); });
      if (!is_copy) kept.push_back(p);
    }
  }
}

void MicrobatchTree::take(int stage) {
  std::vector<at::Tensor> leaf;
  for (const at::Tensor& p : parameters_[stage]) leaf.push_back(take_gradient(p));
  if (!leaf.empty()) trees_[stage].push(std::move(leaf));
  for (Copy& c : copies_[stage]) c.by_microbatch.push_back(take_gradient(c.parameter));
}

void MicrobatchTree::finish() {
  for (auto& [stage, list] : parameters_) {
    auto tree = trees_.find(stage);
    if (tree == trees_.end() || tree->second.count() == 0) continue;
    std::vector<at::Tensor> sums = tree->second.finish();
    for (size_t i = 0; i < list.size(); ++i) list[i].mutable_grad() = sums[i];
  }
  for (size_t t = 0; t < tied_.size(); ++t) {
    std::vector<at::Tensor> a, b;
    std::vector<Copy*> here;
    for (auto& [stage, copies] : copies_) {
      for (Copy& c : copies) {
        if (c.tie != static_cast<int>(t)) continue;
        (c.is_a ? a : b) = std::move(c.by_microbatch);
        c.by_microbatch.clear();
        here.push_back(&c);
      }
    }
    if (here.empty()) continue;
    const at::Tensor sum = sum_tied_gradients_by_microbatch(tied_[t], context_, a, b);
    for (Copy* c : here) c->parameter.mutable_grad() = here.size() > 1 ? sum.clone() : sum;
  }
}

}  // namespace shardwise::pipeline
