// The operations of the shardwise backend: each checks its arguments in the caller's thread
// (errors name the argument before anything is queued), then queues a job that calls the
// torch-free collective on contiguous CPU memory.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <numeric>

#include "backend/shardwise_backend.hpp"
#include "backend/tensor_args.hpp"

namespace shardwise::backend {

using collectives::CollectiveOptions;
using collectives::Kind;
using collectives::Transport;

namespace {

CollectiveOptions with(const CollectiveOptions& base,
                       collectives::Datatype dtype,
                       collectives::ReduceOp op = collectives::ReduceOp::kSum) {
  CollectiveOptions options = base;
  options.dtype = dtype;
  options.op = op;
  return options;
}

size_t bytes_of(const at::Tensor& t) { return t.numel() * t.element_size(); }

// The deterministic tree's group: a power-of-two size, refused before anything is queued.
void check_tree_group(int size, const char* op) {
  TORCH_CHECK_VALUE((size & (size - 1)) == 0, "shardwise backend: ", op,
                    ": the deterministic tree needs a power-of-two group size, got ", size,
                    "; use a group of 1, 2, 4, 8, .. ranks");
}

void check_same_shape(const at::Tensor& expected,
                      const at::Tensor& got,
                      const char* op,
                      const char* argument,
                      size_t index) {
  TORCH_CHECK_VALUE(got.sizes() == expected.sizes() && got.scalar_type() == expected.scalar_type(),
                    "shardwise backend: ", op, ": ", argument, "[", index, "] has shape ",
                    got.sizes(), " and dtype ", got.scalar_type(), " but the input has ",
                    expected.sizes(), " and ", expected.scalar_type());
}

}  // namespace

ShardwiseBackend::Work ShardwiseBackend::allreduce(Tensors& tensors,
                                                   const c10d::AllreduceOptions& opts) {
  if (!tensors.empty() && tensors[0].is_sparse()) return sparse_allreduce(tensors, opts);
  if (is_cuda_call(tensors, "all_reduce", "tensors")) {
    return nccl(c10d::OpType::ALLREDUCE, tensors, tensors, [&](NcclComm& comm) {
      for (auto& t : tensors) {
        datatype_of(t, "all_reduce");
        TORCH_CHECK_VALUE(t.is_contiguous(),
                          "shardwise backend: all_reduce: CUDA tensors must be "
                          "contiguous");
        comm.allreduce(t, reduce_op_of(opts.reduceOp, t, "all_reduce"));
      }
    });
  }
  std::vector<std::pair<collectives::Datatype, collectives::ReduceOp>> types;
  for (const auto& t : tensors) {
    types.emplace_back(datatype_of(t, "all_reduce"), reduce_op_of(opts.reduceOp, t, "all_reduce"));
  }
  return collective(c10d::OpType::ALLREDUCE, Kind::kAllreduce, tensors, tensors, opts,
                    [tensors, types](Transport& t, const CollectiveOptions& base) mutable {
                      for (size_t i = 0; i < tensors.size(); ++i) {
                        with_contiguous(tensors[i], [&](at::Tensor& c) {
                          collectives::allreduce(t, c.data_ptr(), c.numel(),
                                                 with(base, types[i].first, types[i].second));
                        });
                      }
                    });
}

ShardwiseBackend::Work ShardwiseBackend::tree_allreduce(at::Tensor& tensor,
                                                        const c10d::AllreduceOptions& opts) {
  check_cpu({tensor}, "tree_all_reduce", "tensor");
  check_tree_group(size_, "tree_all_reduce");
  const auto dtype = datatype_of(tensor, "tree_all_reduce");
  const auto op = reduce_op_of(opts.reduceOp, tensor, "tree_all_reduce");
  Tensors tensors{tensor};
  return collective(c10d::OpType::ALLREDUCE, Kind::kAllreduce, tensors, tensors, opts,
                    [tensor, dtype, op](Transport& t, const CollectiveOptions& base) mutable {
                      with_contiguous(tensor, [&](at::Tensor& c) {
                        collectives::tree_allreduce(t, c.data_ptr(), c.numel(),
                                                    with(base, dtype, op));
                      });
                    });
}

ShardwiseBackend::Work ShardwiseBackend::allreduce_coalesced(
    Tensors& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  c10d::AllreduceOptions single;
  single.reduceOp = opts.reduceOp;
  single.timeout = opts.timeout;
  return allreduce(tensors, single);
}

ShardwiseBackend::Work ShardwiseBackend::broadcast(Tensors& tensors,
                                                   const c10d::BroadcastOptions& opts) {
  const bool cuda = is_cuda_call(tensors, "broadcast", "tensors");
  TORCH_CHECK_VALUE(opts.rootRank >= 0 && opts.rootRank < size_,
                    "shardwise backend: broadcast: ", "root rank ", opts.rootRank,
                    " is outside [0, ", size_, ")");
  const int root = static_cast<int>(opts.rootRank);
  if (cuda) {
    return nccl(c10d::OpType::BROADCAST, tensors, tensors, [&](NcclComm& comm) {
      for (auto& t : tensors) comm.broadcast(t, root);
    });
  }
  return collective(c10d::OpType::BROADCAST, Kind::kBroadcast, tensors, tensors, opts,
                    [tensors, root](Transport& t, const CollectiveOptions& base) mutable {
                      for (auto& tensor : tensors) {
                        with_contiguous(tensor, [&](at::Tensor& c) {
                          collectives::broadcast(t, c.data_ptr(), bytes_of(c), root, base);
                        });
                      }
                    });
}

ShardwiseBackend::Work ShardwiseBackend::reduce(Tensors& tensors, const c10d::ReduceOptions& opts) {
  check_cpu(tensors, "reduce", "tensors");
  TORCH_CHECK_VALUE(tensors.size() == 1, "shardwise backend: reduce takes one tensor");
  const auto dtype = datatype_of(tensors[0], "reduce");
  const auto op = reduce_op_of(opts.reduceOp, tensors[0], "reduce");
  const bool root = opts.rootRank == rank_;
  return collective(
      c10d::OpType::REDUCE, Kind::kReduce, tensors, tensors, opts,
      [tensors, dtype, op, root](Transport& t, const CollectiveOptions& base) mutable {
        at::Tensor work = tensors[0].contiguous().clone();
        collectives::allreduce(t, work.data_ptr(), work.numel(), with(base, dtype, op));
        if (root) tensors[0].copy_(work);
      });
}

ShardwiseBackend::Work ShardwiseBackend::_allgather_base(at::Tensor& output,
                                                         at::Tensor& input,
                                                         const c10d::AllgatherOptions& opts) {
  const bool cuda = is_cuda_call({output, input}, "all_gather_into_tensor", "tensors");
  TORCH_CHECK_VALUE(
      output.numel() == input.numel() * size_ && output.scalar_type() == input.scalar_type(),
      "shardwise backend: all_gather_into_tensor: output has ", output.numel(), " elements of ",
      output.scalar_type(), "; expected world size (", size_, ") x input numel (", input.numel(),
      ") of ", input.scalar_type());
  const auto dtype = datatype_of(input, "all_gather_into_tensor");
  if (cuda) {
    return nccl(c10d::OpType::_ALLGATHER_BASE, {output}, {input},
                [&](NcclComm& comm) { comm.all_gather(output, input.contiguous()); });
  }
  return collective(c10d::OpType::_ALLGATHER_BASE, Kind::kAllGather, {output}, {input}, opts,
                    [output, input, dtype](Transport& t, const CollectiveOptions& base) mutable {
                      const at::Tensor in = input.contiguous();
                      with_contiguous(output, [&](at::Tensor& out) {
                        collectives::all_gather(t, in.data_ptr(), out.data_ptr(), in.numel(),
                                                with(base, dtype));
                      });
                    });
}

ShardwiseBackend::Work ShardwiseBackend::allgather_into_tensor_coalesced(
    Tensors& outputs, Tensors& inputs, const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(),
                    "shardwise backend: all_gather coalesced: ", outputs.size(), " outputs for ",
                    inputs.size(), " inputs");
  Work last;
  for (size_t i = 0; i < inputs.size(); ++i) last = _allgather_base(outputs[i], inputs[i], opts);
  return last;
}

ShardwiseBackend::Work ShardwiseBackend::allgather(std::vector<Tensors>& outputs,
                                                   Tensors& inputs,
                                                   const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(
      inputs.size() == 1 && outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(size_),
      "shardwise backend: all_gather takes one input and a list of world size (", size_,
      ") outputs");
  Tensors every = outputs[0];
  every.insert(every.begin(), inputs[0]);
  const bool cuda = is_cuda_call(every, "all_gather", "input and outputs");
  for (size_t i = 0; i < outputs[0].size(); ++i) {
    check_same_shape(inputs[0], outputs[0][i], "all_gather", "output", i);
  }
  const auto dtype = datatype_of(inputs[0], "all_gather");
  const at::Tensor input = inputs[0];
  Tensors list = outputs[0];
  if (cuda) {  // gathered flat on the device (NCCL or host-staged), then cut into the list
    return nccl(c10d::OpType::ALLGATHER, list, {input}, [&](NcclComm& comm) {
      const at::Tensor in = input.contiguous();
      at::Tensor flat = at::empty({size_ * in.numel()}, in.options());
      comm.all_gather(flat, in);
      for (int r = 0; r < size_; ++r) {
        list[r].copy_(flat.narrow(0, r * in.numel(), in.numel()).view(in.sizes()));
      }
    });
  }
  return collective(
      c10d::OpType::ALLGATHER, Kind::kAllGather, list, {input}, opts,
      [input, list, dtype, this](Transport& t, const CollectiveOptions& base) mutable {
        const at::Tensor in = input.contiguous();
        at::Tensor flat = at::empty({size_ * in.numel()}, in.options());
        collectives::all_gather(t, in.data_ptr(), flat.data_ptr(), in.numel(), with(base, dtype));
        for (int r = 0; r < size_; ++r) {
          list[r].copy_(flat.narrow(0, r * in.numel(), in.numel()).view(in.sizes()));
        }
      });
}

// all_gather_coalesced: the inputs' bytes joined into one buffer (copied now: the caller may
// reuse its inputs), gathered once, and cut back into output_lists[r][i], rank r's input i: any
// mix of dtypes and shapes, the same on every rank.
ShardwiseBackend::Work ShardwiseBackend::allgather_coalesced(std::vector<Tensors>& output_lists,
                                                             Tensors& inputs,
                                                             const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather_coalesced";
  TORCH_CHECK_VALUE(output_lists.size() == static_cast<size_t>(size_), "shardwise backend: ", op,
                    ": output_tensor_lists has ", output_lists.size(),
                    " lists; pass one per rank (", size_, ")");
  check_cpu(inputs, op, "input_tensor_list");
  Tensors outputs, pieces;
  for (size_t r = 0; r < output_lists.size(); ++r) {
    TORCH_CHECK_VALUE(output_lists[r].size() == inputs.size(), "shardwise backend: ", op,
                      ": output_tensor_lists[", r, "] has ", output_lists[r].size(),
                      " tensors for ", inputs.size(), " inputs");
    check_cpu(output_lists[r], op, "output_tensor_lists");
    for (size_t i = 0; i < inputs.size(); ++i) {
      check_same_shape(inputs[i], output_lists[r][i], op, "output_tensor_lists[r]", i);
      outputs.push_back(output_lists[r][i]);
    }
  }
  for (const auto& t : inputs) pieces.push_back(t.contiguous().reshape({-1}).view(at::kByte));
  const at::Tensor joined = pieces.empty() ? at::empty({0}, at::kByte) : at::cat(pieces);  // a copy
  return collective(
      c10d::OpType::ALLGATHER_COALESCED, Kind::kAllGather, outputs, inputs, opts,
      [joined, outputs, this](Transport& t, const CollectiveOptions& base) mutable {
        at::Tensor gathered = at::empty({size_ * joined.numel()}, joined.options());
        collectives::all_gather(t, joined.data_ptr(), gathered.data_ptr(), joined.numel(),
                                with(base, collectives::Datatype::kUInt8));
        const auto* bytes = static_cast<const uint8_t*>(gathered.data_ptr());
        size_t offset = 0;
        for (auto& out : outputs) {  // rank-major, input order within a rank: as joined
          with_contiguous(out, [&](at::Tensor& c) {
            std::memcpy(c.data_ptr(), bytes + offset, bytes_of(c));
            offset += bytes_of(c);
          });
        }
      });
}

ShardwiseBackend::Work ShardwiseBackend::gather(std::vector<Tensors>& outputs,
                                                Tensors& inputs,
                                                const c10d::GatherOptions& opts) {
  TORCH_CHECK_VALUE(inputs.size() == 1, "shardwise backend: gather takes one input tensor");
  check_cpu(inputs, "gather", "input");
  const bool root = opts.rootRank == rank_;
  TORCH_CHECK_VALUE(
      !root || (outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(size_)),
      "shardwise backend: gather: the root needs a list of world size outputs");
  const auto dtype = datatype_of(inputs[0], "gather");
  const at::Tensor input = inputs[0];
  Tensors list = root ? outputs[0] : Tensors{};
  return collective(
      c10d::OpType::GATHER, Kind::kGather, list, {input}, opts,
      [input, list, dtype, this](Transport& t, const CollectiveOptions& base) mutable {
        const at::Tensor in = input.contiguous();
        at::Tensor flat = at::empty({size_ * in.numel()}, in.options());
        collectives::all_gather(t, in.data_ptr(), flat.data_ptr(), in.numel(), with(base, dtype));
        for (size_t r = 0; r < list.size(); ++r) {
          list[r].copy_(flat.narrow(0, r * in.numel(), in.numel()).view(in.sizes()));
        }
      });
}

ShardwiseBackend::Work ShardwiseBackend::scatter(Tensors& outputs,
                                                 std::vector<Tensors>& inputs,
                                                 const c10d::ScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == 1, "shardwise backend: scatter takes one output tensor");
  check_cpu(outputs, "scatter", "output");
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK_VALUE(
      root != rank_ || (inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(size_)),
      "shardwise backend: scatter: the root needs a list of world size inputs");
  at::Tensor output = outputs[0];
  Tensors list = root == rank_ ? inputs[0] : Tensors{};
  return collective(
      c10d::OpType::SCATTER, Kind::kScatter, outputs, list, opts,
      [output, list, root, this](Transport& t, const CollectiveOptions& base) mutable {
        // The root's inputs travel as one broadcast; each rank keeps its block.
        at::Tensor flat = list.empty() ? at::empty({size_ * output.numel()}, output.options())
                                       : at::cat(list).contiguous().view({-1});
        collectives::broadcast(t, flat.data_ptr(), bytes_of(flat), root, base);
        output.copy_(flat.narrow(0, rank_ * output.numel(), output.numel()).view(output.sizes()));
      });
}

}  // namespace shardwise::backend

namespace shardwise::backend {

ShardwiseBackend::Work ShardwiseBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const bool cuda = is_cuda_call({output, input}, "reduce_scatter_tensor", "tensors");
  TORCH_CHECK_VALUE(
      input.numel() == output.numel() * size_ && output.scalar_type() == input.scalar_type(),
      "shardwise backend: reduce_scatter_tensor: input has ", input.numel(), " elements of ",
      input.scalar_type(), "; expected world size (", size_, ") x output numel (", output.numel(),
      ") of ", output.scalar_type());
  const auto dtype = datatype_of(input, "reduce_scatter_tensor");
  const auto op = reduce_op_of(opts.reduceOp, input, "reduce_scatter_tensor");
  if (cuda) {
    return nccl(c10d::OpType::_REDUCE_SCATTER_BASE, {output}, {input},
                [&](NcclComm& comm) { comm.reduce_scatter(output, input.contiguous(), op); });
  }
  return collective(
      c10d::OpType::_REDUCE_SCATTER_BASE, Kind::kReduceScatter, {output}, {input}, opts,
      [output, input, dtype, op](Transport& t, const CollectiveOptions& base) mutable {
        const at::Tensor in = input.contiguous();
        with_contiguous(output, [&](at::Tensor& out) {
          collectives::reduce_scatter(t, in.data_ptr(), out.data_ptr(), out.numel(),
                                      with(base, dtype, op));
        });
      });
}

ShardwiseBackend::Work ShardwiseBackend::tree_reduce_scatter(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  check_cpu({output, input}, "tree_reduce_scatter", "tensors");
  check_tree_group(size_, "tree_reduce_scatter");
  TORCH_CHECK_VALUE(
      input.numel() == output.numel() * size_ && output.scalar_type() == input.scalar_type(),
      "shardwise backend: tree_reduce_scatter: input has ", input.numel(), " elements of ",
      input.scalar_type(), "; expected world size (", size_, ") x output numel (", output.numel(),
      ") of ", output.scalar_type());
  const auto dtype = datatype_of(input, "tree_reduce_scatter");
  const auto op = reduce_op_of(opts.reduceOp, input, "tree_reduce_scatter");
  return collective(
      c10d::OpType::_REDUCE_SCATTER_BASE, Kind::kReduceScatter, {output}, {input}, opts,
      [output, input, dtype, op](Transport& t, const CollectiveOptions& base) mutable {
        const at::Tensor in = input.contiguous();
        with_contiguous(output, [&](at::Tensor& out) {
          collectives::tree_reduce_scatter(t, in.data_ptr(), out.data_ptr(), out.numel(),
                                           with(base, dtype, op));
        });
      });
}

ShardwiseBackend::Work ShardwiseBackend::reduce_scatter_tensor_coalesced(
    Tensors& outputs, Tensors& inputs, const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "shardwise backend: reduce_scatter ",
                    "coalesced: ", outputs.size(), " outputs for ", inputs.size(), " inputs");
  Work last;
  for (size_t i = 0; i < inputs.size(); ++i)
    last = _reduce_scatter_base(outputs[i], inputs[i], opts);
  return last;
}

ShardwiseBackend::Work ShardwiseBackend::reduce_scatter(Tensors& outputs,
                                                        std::vector<Tensors>& inputs,
                                                        const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(
      outputs.size() == 1 && inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(size_),
      "shardwise backend: reduce_scatter takes one output and a list of world size (", size_,
      ") inputs");
  check_cpu(outputs, "reduce_scatter", "output");
  check_cpu(inputs[0], "reduce_scatter", "input");
  for (size_t i = 0; i < inputs[0].size(); ++i) {
    check_same_shape(outputs[0], inputs[0][i], "reduce_scatter", "input", i);
  }
  at::Tensor flat = at::cat(inputs[0]).view({-1});  // copied now: the caller may reuse inputs
  return _reduce_scatter_base(outputs[0], flat, opts);
}

ShardwiseBackend::Work ShardwiseBackend::alltoall_base(at::Tensor& output,
                                                       at::Tensor& input,
                                                       std::vector<int64_t>& output_splits,
                                                       std::vector<int64_t>& input_splits,
                                                       const c10d::AllToAllOptions& opts) {
  const bool cuda = is_cuda_call({output, input}, "all_to_all_single", "tensors");
  datatype_of(input, "all_to_all_single");
  auto byte_layout = [this](const at::Tensor& t, const std::vector<int64_t>& splits,
                            const char* name) {
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    const size_t row_bytes = rows == 0 ? 0 : bytes_of(t) / rows;
    std::vector<size_t> offsets(size_), bytes(size_);
    TORCH_CHECK_VALUE(splits.empty() || splits.size() == static_cast<size_t>(size_),
                      "shardwise backend: all_to_all_single: ", name, " has ", splits.size(),
                      " entries; pass world size (", size_, ") or none");
    TORCH_CHECK_VALUE(!splits.empty() || rows % size_ == 0,
                      "shardwise backend: ", "all_to_all_single: dim 0 (", rows,
                      ") does not divide by the world size; ", "pass ", name);
    size_t offset = 0;
    for (int p = 0; p < size_; ++p) {
      offsets[p] = offset;
      bytes[p] = (splits.empty() ? rows / size_ : splits[p]) * row_bytes;
      offset += bytes[p];
    }
    TORCH_CHECK_VALUE(offset == bytes_of(t), "shardwise backend: all_to_all_single: ", name,
                      " sum to ", offset / std::max<size_t>(row_bytes, 1),
                      " rows but the tensor has ", rows);
    return std::make_pair(offsets, bytes);
  };
  auto [send_offsets, send_bytes] = byte_layout(input, input_splits, "input_split_sizes");
  auto [recv_offsets, recv_bytes] = byte_layout(output, output_splits, "output_split_sizes");
  if (cuda) {
    return nccl(c10d::OpType::ALLTOALL_BASE, {output}, {input}, [&](NcclComm& comm) {
      comm.alltoall(output, input.contiguous(), send_offsets, send_bytes, recv_offsets, recv_bytes);
    });
  }
  return collective(c10d::OpType::ALLTOALL_BASE, Kind::kAlltoall, {output}, {input}, opts,
                    [=](Transport& t, const CollectiveOptions& base) mutable {
                      const at::Tensor in = input.contiguous();
                      with_contiguous(output, [&](at::Tensor& out) {
                        collectives::alltoall(t, in.data_ptr(), send_offsets.data(),
                                              send_bytes.data(), out.data_ptr(),
                                              recv_offsets.data(), recv_bytes.data(), base);
                      });
                    });
}

ShardwiseBackend::Work ShardwiseBackend::alltoall(Tensors& outputs,
                                                  Tensors& inputs,
                                                  const c10d::AllToAllOptions& opts) {
  TORCH_CHECK_VALUE(
      outputs.size() == static_cast<size_t>(size_) && inputs.size() == static_cast<size_t>(size_),
      "shardwise backend: all_to_all takes world size (", size_, ") inputs and outputs");
  check_cpu(inputs, "all_to_all", "input");
  check_cpu(outputs, "all_to_all", "output");
  std::vector<int64_t> in_splits, out_splits;
  for (int p = 0; p < size_; ++p) {
    in_splits.push_back(inputs[p].numel());
    out_splits.push_back(outputs[p].numel());
  }
  at::Tensor in = at::cat(inputs).view({-1});
  at::Tensor out =
      at::empty({std::accumulate(out_splits.begin(), out_splits.end(), int64_t{0})}, in.options());
  Work work = alltoall_base(out, in, out_splits, in_splits, opts);
  work->wait();  // the list form copies out; keep it simple and synchronous
  int64_t offset = 0;
  for (int p = 0; p < size_; ++p) {
    outputs[p].copy_(out.narrow(0, offset, out_splits[p]).view(outputs[p].sizes()));
    offset += out_splits[p];
  }
  return work;
}

ShardwiseBackend::Work ShardwiseBackend::barrier(const c10d::BarrierOptions& opts) {
  return collective(
      c10d::OpType::BARRIER, Kind::kBarrier, {}, {}, opts,
      [](Transport& t, const CollectiveOptions& base) { collectives::barrier(t, base); });
}

ShardwiseBackend::Work ShardwiseBackend::send(Tensors& tensors, int dst_rank, int /*tag*/) {
  const bool cuda = is_cuda_call(tensors, "send", "tensors");
  TORCH_CHECK_VALUE(dst_rank >= 0 && dst_rank < size_ && dst_rank != rank_,
                    "shardwise backend: send: destination rank ", dst_rank, " is not another rank",
                    " of this group of ", size_);
  if (cuda) {
    return nccl(c10d::OpType::SEND, tensors, tensors, [&](NcclComm& comm) {
      for (const auto& t : tensors) comm.send(t.contiguous(), dst_rank);
    });
  }
  uint64_t sequence;
  {
    std::lock_guard<std::mutex> lock(p2p_mutex_);
    sequence = sends_to_[dst_rank]++;
  }
  return enqueue(send_lane_, c10d::OpType::SEND, Kind::kSendRecv, sequence, tensors, tensors,
                 c10d::kUnsetTimeout,
                 [tensors, dst_rank](Transport& t, const CollectiveOptions& base) {
                   for (const auto& tensor : tensors) {
                     const at::Tensor c = tensor.contiguous();
                     collectives::send(t, dst_rank, c.data_ptr(), bytes_of(c), base);
                   }
                 });
}

ShardwiseBackend::Work ShardwiseBackend::recv(Tensors& tensors, int src_rank, int /*tag*/) {
  const bool cuda = is_cuda_call(tensors, "recv", "tensors");
  TORCH_CHECK_VALUE(src_rank >= 0 && src_rank < size_ && src_rank != rank_,
                    "shardwise backend: recv: source rank ", src_rank, " is not another rank",
                    " of this group of ", size_);
  if (cuda) {
    return nccl(c10d::OpType::RECV, tensors, tensors, [&](NcclComm& comm) {
      for (auto& t : tensors) {
        TORCH_CHECK_VALUE(t.is_contiguous(),
                          "shardwise backend: recv: CUDA tensors must be "
                          "contiguous");
        comm.recv(t, src_rank);
      }
    });
  }
  return enqueue(recv_lane_, c10d::OpType::RECV, Kind::kSendRecv, 0, tensors, tensors,
                 c10d::kUnsetTimeout,
                 [this, tensors, src_rank](Transport& t, const CollectiveOptions& base) mutable {
                   receive_from(t, src_rank, tensors, base);
                 });
}

// Runs on the receive lane: the next message of `peer`, its sequence number taken now.
void ShardwiseBackend::receive_from(Transport& t,
                                    int peer,
                                    Tensors& tensors,
                                    const CollectiveOptions& base) {
  CollectiveOptions options = base;
  {
    std::lock_guard<std::mutex> lock(p2p_mutex_);
    options.tag.sequence = receives_from_[peer]++;
  }
  for (auto& tensor : tensors) {
    with_contiguous(tensor, [&](at::Tensor& c) {
      collectives::recv(t, peer, c.data_ptr(), bytes_of(c), options);
    });
  }
}

ShardwiseBackend::Work ShardwiseBackend::recvAnysource(Tensors& tensors, int /*tag*/) {
  const bool cuda = is_cuda_call(tensors, "recv (any source)", "tensors");
  TORCH_CHECK_VALUE(!cuda,
                    "shardwise backend: recv from any source needs CPU tensors (NCCL has no "
                    "receive from any source); name the source rank, or receive into a CPU tensor");
  TORCH_CHECK_VALUE(size_ > 1, "shardwise backend: recv from any source in a group of 1");
  std::vector<int> peers;
  for (int r = 0; r < size_; ++r)
    if (r != rank_) peers.push_back(r);
  auto source = std::make_shared<std::atomic<int>>(-1);
  Work work =
      enqueue(recv_lane_, c10d::OpType::RECVANYSOURCE, Kind::kSendRecv, 0, tensors, tensors,
              c10d::kUnsetTimeout,
              [this, tensors, peers, source](Transport& t, const CollectiveOptions& base) mutable {
                const int peer = collectives::wait_for_any(t, peers, base.deadline);
                source->store(peer);
                receive_from(t, peer, tensors, base);
              });
  static_cast<ShardwiseWork*>(work.get())->set_source(std::move(source));
  return work;
}

}  // namespace shardwise::backend
