// ZB-H1, the zero-bubble schedule with 1F1B's memory (Qi et al., ICLR 2024, "Zero Bubble
// Pipeline Parallelism", arXiv 2401.10241, section 2.1).
//
// The backward of a stage is split into I (the gradient of the stage input, which the previous
// stage waits for) and W (the weight gradients, which nobody waits for). Rank r runs 1F1B's order
// with every B replaced by I (warm-up min(p - r - 1, m) forwards, then F, I pairs, then the
// remaining Is), and delays its weight gradients by `delay` = r microbatches: W(j) goes right
// after I(j + r), and the last r of them end the step. The gradient therefore travels upstream
// without weight-gradient work in its way, and rank r's r delayed Ws fill the r time units it
// would otherwise wait at the end for the gradients coming back through the ranks before it.
// With F = I = W = 1 the makespan is 3m + p - 1 for m >= p: a bubble of (p - 1)(F + I - W),
// a third of 1F1B's (p - 1)(F + I + W). In flight (forwarded, W not done) stay at most
// min(m, p - r) + r <= p microbatches, 1F1B's worst rank. The validator checks all of this.
#include <algorithm>
#include <vector>

#include "pipeline/schedule.h"

namespace shardwise::pipeline {

std::vector<std::vector<Action>> zero_bubble_h1_order(int num_ranks, int num_microbatches) {
  const int p = num_ranks, m = num_microbatches;
  std::vector<std::vector<Action>> order(p);
  for (int r = 0; r < p; ++r) {
    std::vector<Action>& out = order[r];
    const int warmup = std::min(p - r - 1, m), delay = r;
    int next_weight = 0;
    auto input = [&](int i) {
      out.push_back({ActionKind::kBackwardInput, r, i});
      if (i >= delay) out.push_back({ActionKind::kBackwardWeight, r, next_weight++});
    };
    for (int i = 0; i < warmup; ++i) out.push_back({ActionKind::kForward, r, i});
    for (int k = 0; k < m - warmup; ++k) {
      out.push_back({ActionKind::kForward, r, warmup + k});
      input(k);
    }
    for (int k = m - warmup; k < m; ++k) input(k);
    while (next_weight < m) out.push_back({ActionKind::kBackwardWeight, r, next_weight++});
  }
  return order;
}

}  // namespace shardwise::pipeline
