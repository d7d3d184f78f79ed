// The fixed summation tree of deterministic training, over a sequence of leaves that arrive one
// by one (a rank's micro-batch gradients, or its shares of a global batch's reduced gradients).
//
// Leaves 0, 1, 2, .. are summed as the balanced binary tree over their index: leaf 2i and leaf
// 2i + 1 first, then those pairs pairwise, and so on; when the count is not a power of two, the
// complete subtrees left over (one per set bit of the count, largest first) are added from the
// newest to the oldest. `push` keeps a stack of the complete subtrees so far, each with its
// `level` (log2 of its leaf count), and merges the two newest while their levels are equal: a
// binary counter, holding at most log2(count) + 1 partial sums.
//
// Why the tree does not depend on the world size: with world W a power of two and the leaves of
// one accumulation step in aligned blocks of W (block j = leaves jW .. jW + W - 1, one per rank,
// reduced over the ranks by the tree over the rank index, collectives/tree_reduce.cc), every
// complete subtree of the count's binary digits is a whole number of blocks, so summing the
// blocks with this same rule gives the same additions, in the same association, as summing all
// the leaves on one rank. Floating-point addition is commutative, so which operand comes first
// does not change a bit; only the association matters, and it is fixed.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <utility>
#include <vector>

namespace shardwise::collectives {

// `add(older, newer)` returns their sum (it may reuse `older`'s storage).
template <typename T, typename Add>
class PairwiseSum {
 public:
  explicit PairwiseSum(Add add) : add_(std::move(add)) {}

  void push(T leaf) {
    stack_.push_back({0, std::move(leaf)});
    ++count_;
    while (stack_.size() >= 2 && stack_[stack_.size() - 2].level == stack_.back().level) {
      Node newer = std::move(stack_.back());
      stack_.pop_back();
      Node& older = stack_.back();
      older.value = add_(std::move(older.value), std::move(newer.value));
      ++older.level;
    }
  }

  // The sum of every leaf pushed; the sum is then reset. Throws std::logic_error when none was.
  T finish() {
    if (stack_.empty()) throw std::logic_error("PairwiseSum::finish: no leaf was pushed");
    T total = std::move(stack_.back().value);
    for (size_t i = stack_.size() - 1; i-- > 0;) {
      total = add_(std::move(stack_[i].value), std::move(total));
    }
    stack_.clear();
    count_ = 0;
    return total;
  }

  // The partial sums from the newest to the oldest, `fn(value, newest)`: what finish adds, in
  // its order, for a caller that needs the total so far without consuming it.
  template <typename Fn>
  void visit_newest_first(Fn fn) const {
    for (size_t i = stack_.size(); i-- > 0;) fn(stack_[i].value, i + 1 == stack_.size());
  }

  void clear() {  // drops every leaf pushed since the last finish
    stack_.clear();
    count_ = 0;
  }

  size_t count() const { return count_; }                // leaves pushed since the last finish
  size_t partial_sums() const { return stack_.size(); }  // held now (memory)

 private:
  struct Node {
    int level;
    T value;
  };
  Add add_;
  std::vector<Node> stack_;
  size_t count_ = 0;
};

}  // namespace shardwise::collectives
