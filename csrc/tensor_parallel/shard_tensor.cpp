#include "tensor_parallel/shard_tensor.h"

#include <ATen/ATen.h>

#include <stdexcept>

#include "tensor_parallel/tp_shapes.h"

namespace shardwise::tensor_parallel {

at::Tensor shard_tensor(const at::Tensor& full, const ShardSpec& spec) {
  TORCH_CHECK_VALUE(spec.dim >= 0 && spec.dim < full.dim(), "tensor parallel: module '",
                    spec.module, "': ", spec.name, " has shape ", full.sizes(), ", no dimension ",
                    spec.dim, " to split");
  TORCH_CHECK_VALUE(spec.chunks >= 1 && full.size(spec.dim) % spec.chunks == 0,
                    "tensor parallel: module '", spec.module, "': ", spec.name, " dimension ",
                    spec.dim, " (", full.size(spec.dim), ") is not ", spec.chunks,
                    " fused parts of equal size");
  std::vector<at::Tensor> slices;
  for (const at::Tensor& part : full.chunk(spec.chunks, spec.dim)) {
    ShardRange range;
    try {
      range = shard_range(part.size(spec.dim), spec.rank, spec.size, spec.module,
                          spec.name + ".shape[" + std::to_string(spec.dim) + "]" +
                              (spec.chunks > 1 ? " / " + std::to_string(spec.chunks) : ""));
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK_VALUE(false, e.what());
    }
    slices.push_back(part.narrow(spec.dim, range.start, range.size));
  }
  return at::cat(slices, spec.dim).contiguous();
}

at::Tensor gather_shards(const at::Tensor& shard, const ShardSpec& spec, const Group& group) {
  TORCH_CHECK_VALUE(group && group->getSize() == spec.size && group->getRank() == spec.rank,
                    "tensor parallel: module '", spec.module, "': ", spec.name,
                    ": the group is not the one the spec's rank and size describe");
  at::NoGradGuard no_grad;
  const at::Tensor gathered = all_gather_dim(shard.detach().contiguous(), spec.dim, group);
  const auto parts = gathered.chunk(spec.size * spec.chunks, spec.dim);
  std::vector<at::Tensor> ordered;
  for (int64_t c = 0; c < spec.chunks; ++c) {
    for (int r = 0; r < spec.size; ++r) ordered.push_back(parts[r * spec.chunks + c]);
  }
  return at::cat(ordered, spec.dim);
}

std::vector<sharding::TensorSlice> shard_slices(const std::string& name,
                                                const at::Tensor& shard,
                                                const std::vector<int64_t>& full_shape,
                                                const ShardSpec& spec) {
  TORCH_CHECK_VALUE(shard.is_contiguous(), "shard_slices: the shard of '", name,
                    "' is not contiguous");
  std::vector<ShardRun> runs;
  try {
    runs = shard_runs(full_shape, spec.dim, spec.chunks, spec.rank, spec.size);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, "shard_slices: '", name, "': ", e.what());
  }
  int64_t covered = 0;
  for (const ShardRun& run : runs) covered += run.length;
  TORCH_CHECK_VALUE(covered == shard.numel(), "shard_slices: '", name, "' has ", shard.numel(),
                    " elements, but its shard of a ", c10::IntArrayRef(full_shape), " tensor has ",
                    covered);
  std::vector<sharding::TensorSlice> out;
  const at::Tensor flat = shard.view(-1);
  for (const ShardRun& run : runs) {
    out.push_back({name, run.full_start, flat.narrow(0, run.local_start, run.length)});
  }
  return out;
}

}  // namespace shardwise::tensor_parallel
