// all_reduce of sparse COO tensors (SUM), as gloo's: every rank's coalesced (indices, values)
// are gathered and summed by coalescing their concatenation; each input becomes that sum. The
// ranks' nnz differ, so the `counts` travel first and each rank's pieces are padded to the
// largest (`widest`) for one fixed-size gather of the indices and one of the values' bytes.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "backend/shardwise_backend.hpp"
#include "backend/tensor_args.hpp"

namespace shardwise::backend {

namespace {

using collectives::CollectiveOptions;
using collectives::Datatype;
using collectives::Transport;

CollectiveOptions bytes_options(const CollectiveOptions& base) {
  CollectiveOptions options = base;
  options.dtype = Datatype::kUInt8;
  return options;
}

// `padded` ([widest, ...] on every rank) gathered: [size, widest, ...].
at::Tensor gathered(Transport& t, const at::Tensor& padded, const CollectiveOptions& base) {
  std::vector<int64_t> shape{t.size()};
  shape.insert(shape.end(), padded.sizes().begin(), padded.sizes().end());
  at::Tensor out = at::empty(shape, padded.options());
  const size_t bytes = padded.numel() * padded.element_size();
  collectives::all_gather(t, padded.data_ptr(), out.data_ptr(), bytes, bytes_options(base));
  return out;
}

at::Tensor sparse_sum(Transport& t, const at::Tensor& input, const CollectiveOptions& base) {
  const at::Tensor indices = input._indices().t().contiguous();  // [nnz, sparse_dim]
  const at::Tensor values = input._values().contiguous();        // [nnz, dense...]
  const int64_t nnz = indices.size(0);
  at::Tensor counts = at::empty({t.size()}, at::kLong);
  collectives::all_gather(t, &nnz, counts.data_ptr(), sizeof(int64_t), bytes_options(base));
  const int64_t widest = counts.max().item<int64_t>();
  auto padded = [&](const at::Tensor& rows) {
    std::vector<int64_t> shape(rows.sizes().begin(), rows.sizes().end());
    shape[0] = widest;
    at::Tensor out = at::zeros(shape, rows.options());
    out.narrow(0, 0, nnz).copy_(rows);
    return out;
  };
  const at::Tensor all_indices = gathered(t, padded(indices), base);
  const at::Tensor all_values = gathered(t, padded(values), base);
  std::vector<at::Tensor> index_parts, value_parts;
  for (int64_t r = 0; r < t.size(); ++r) {
    const int64_t n = counts[r].item<int64_t>();
    index_parts.push_back(all_indices[r].narrow(0, 0, n));
    value_parts.push_back(all_values[r].narrow(0, 0, n));
  }
  return at::sparse_coo_tensor(at::cat(index_parts).t(), at::cat(value_parts), input.sizes())
      .coalesce();
}

}  // namespace

ShardwiseBackend::Work ShardwiseBackend::sparse_allreduce(Tensors& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  TORCH_CHECK_VALUE(opts.reduceOp == c10d::ReduceOp::SUM,
                    "shardwise backend: all_reduce of sparse tensors supports ReduceOp.SUM only; "
                    "densify the tensor (to_dense()) for other reductions");
  for (const auto& t : tensors) {
    TORCH_CHECK_VALUE(t.layout() == at::kSparse && t.device().is_cpu(),
                      "shardwise backend: all_reduce: a list mixing sparse and dense tensors (or "
                      "sparse CUDA tensors) is not supported; reduce them in separate calls");
  }
  return collective(c10d::OpType::ALLREDUCE, collectives::Kind::kAllreduce, tensors, tensors, opts,
                    [tensors](Transport& t, const CollectiveOptions& base) mutable {
                      for (auto& tensor : tensors)
                        tensor.copy_(sparse_sum(t, tensor.coalesce(), base));
                    });
}

}  // namespace shardwise::backend
