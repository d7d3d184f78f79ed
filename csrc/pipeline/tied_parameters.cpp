#include "pipeline/tied_parameters.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <vector>

#include "distributed/tree_reduce.h"

namespace shardwise::pipeline {
namespace {

constexpr int kTiedTag = 1;  // apart from the executor's activations (tag 0)

struct Sides {
  bool here = false;       // this rank holds stage a or stage b
  bool is_a = false;       // ... stage a
  bool both_here = false;  // both stages are on this rank
  int peer = -1;           // the other stage's rank in the group
};

Sides sides_of(const TiedParameter& tied, const TiedContext& context) {
  const int rank_a = context.schedule->rank_of(tied.stage_a);
  const int rank_b = context.schedule->rank_of(tied.stage_b);
  Sides s;
  s.here = context.rank == rank_a || context.rank == rank_b;
  s.is_a = context.rank == rank_a;
  s.both_here = rank_a == rank_b;
  s.peer = s.is_a ? rank_b : rank_a;
  if (s.here && !s.both_here) {
    TORCH_CHECK_VALUE(context.group, "tied parameters ", tied.name_a, " / ", tied.name_b,
                      ": stages ", tied.stage_a, " and ", tied.stage_b,
                      " are on different ranks, so the pipeline needs a process group");
  }
  return s;
}

at::Tensor mine(const TiedParameter& tied, const TiedContext& context, const Sides& s) {
  return s.is_a ? context.parameter(tied.stage_a, tied.name_a)
                : context.parameter(tied.stage_b, tied.name_b);
}

}  // namespace

void copy_tied_values(const TiedParameter& tied, const TiedContext& context) {
  const Sides s = sides_of(tied, context);
  if (!s.here) return;
  at::NoGradGuard no_grad;
  if (s.both_here) {
    context.parameter(tied.stage_b, tied.name_b)
        .copy_(context.parameter(tied.stage_a, tied.name_a));
    return;
  }
  at::Tensor param = mine(tied, context, s);
  if (s.is_a) {
    std::vector<at::Tensor> out{param.detach().contiguous()};
    context.group->send(out, s.peer, kTiedTag)->wait();
  } else {
    std::vector<at::Tensor> in{at::empty_like(param, at::MemoryFormat::Contiguous)};
    context.group->recv(in, s.peer, kTiedTag)->wait();
    param.copy_(in[0]);
  }
}

void sum_tied_gradients(const TiedParameter& tied, const TiedContext& context) {
  const Sides s = sides_of(tied, context);
  if (!s.here) return;
  if (s.both_here) {
    at::Tensor a = context.parameter(tied.stage_a, tied.name_a);
    at::Tensor b = context.parameter(tied.stage_b, tied.name_b);
    if (!a.grad().defined() || !b.grad().defined()) return;
    const at::Tensor total = a.grad() + b.grad();
    a.mutable_grad().copy_(total);
    b.mutable_grad().copy_(total);
    return;
  }
  at::Tensor param = mine(tied, context, s);
  const at::Tensor grad =
      param.grad().defined() ? param.grad().contiguous() : at::zeros_like(param);
  std::vector<at::Tensor> out{grad};
  std::vector<at::Tensor> in{at::empty_like(grad)};
  auto sent = context.group->send(out, s.peer, kTiedTag);
  context.group->recv(in, s.peer, kTiedTag)->wait();
  sent->wait();
  param.mutable_grad() = grad + in[0];
}

at::Tensor sum_tied_gradients_by_microbatch(const TiedParameter& tied,
                                            const TiedContext& context,
                                            const std::vector<at::Tensor>& a,
                                            const std::vector<at::Tensor>& b) {
  const Sides s = sides_of(tied, context);
  if (!s.here) return {};
  at::Tensor mine = at::stack(s.is_a ? a : b);
  at::Tensor theirs;
  if (s.both_here) {
    theirs = at::stack(b);
  } else {
    std::vector<at::Tensor> out{mine};
    std::vector<at::Tensor> in{at::empty_like(mine)};
    auto sent = context.group->send(out, s.peer, kTiedTag);
    context.group->recv(in, s.peer, kTiedTag)->wait();
    sent->wait();
    theirs = in[0];
  }
  TORCH_CHECK(theirs.sizes() == mine.sizes(), "tied parameters ", tied.name_a, " / ", tied.name_b,
              ": ", theirs.size(0), " microbatch gradients from the other stage, ", mine.size(0),
              " here");
  distributed::PairwiseGradients tree;
  for (int64_t k = 0; k < mine.size(0); ++k) tree.push({mine[k] + theirs[k]});
  return tree.finish()[0];
}

}  // namespace shardwise::pipeline
