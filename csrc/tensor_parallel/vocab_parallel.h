// Vocabulary-parallel embedding and cross-entropy: the vocabulary is split into tp contiguous
// ranges, rank r holding rows [vocab_start, vocab_start + V / tp) of the table (and of a tied
// output head, whose logits are then split on the vocabulary too).
//
// vocab_parallel_embedding: ids outside the rank's range are looked up as row 0 and their output
// rows zeroed, then the partial embeddings are all-reduced (with sequence_parallel:
// reduce-scattered along the sequence). Each id is found on exactly one rank, so the sum is that
// rank's row; the backward is the ordinary embedding backward of the kept rows.
//
// vocab_parallel_cross_entropy: the loss of logits split on the vocabulary, never gathered.
// Per token, in float32: the max logit (all-reduce MAX), then the target's logit (zero on ranks
// whose range misses the target) and the sum of exp(logit - max), both summed in one all-reduce
// of [2, tokens]; loss = log(sum_exp) - target_logit. Tokens whose target is ignore_index count
// zero and are left out of the mean. The backward needs no communication: softmax - one_hot on
// the local slice, scaled by the incoming gradient (and 1 / real tokens for the mean).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "tensor_parallel/parallel_linear.h"

namespace shardwise::tensor_parallel {

at::Tensor vocab_parallel_embedding(const at::Tensor& ids,
                                    const at::Tensor& weight,
                                    int64_t vocab_start,
                                    const ParallelOptions& options);

struct CrossEntropyOptions {
  Group group;                     // the tensor-parallel group the vocabulary is split over
  int64_t vocab_start = 0;         // first vocabulary id of this rank's logits
  int64_t ignore_index = -100;     // targets equal to it count nothing (as F.cross_entropy)
  std::string reduction = "mean";  // mean (over the real tokens), sum, none
};

// logits: [..., V / tp] (any leading shape), targets: the leading shape, int64.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits,
                                        const at::Tensor& targets,
                                        const CrossEntropyOptions& options);

}  // namespace shardwise::tensor_parallel
