#include "backend/host_staged_comm.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <numeric>
#include <set>

namespace shardwise::backend {
namespace {

c10d::ReduceOp c10d_op(collectives::ReduceOp op) {
  switch (op) {
    case collectives::ReduceOp::kSum:
      return c10d::ReduceOp::SUM;
    case collectives::ReduceOp::kAvg:
      return c10d::ReduceOp::AVG;
    case collectives::ReduceOp::kProduct:
      return c10d::ReduceOp::PRODUCT;
    case collectives::ReduceOp::kMin:
      return c10d::ReduceOp::MIN;
    case collectives::ReduceOp::kMax:
      return c10d::ReduceOp::MAX;
  }
  return c10d::ReduceOp::SUM;
}

// The host copy of `tensor` (itself when it is on the host already), contiguous.
at::Tensor to_host(const at::Tensor& tensor) { return tensor.to(at::kCPU).contiguous(); }

// Copies a host result back unless it is the tensor itself.
void copy_back(at::Tensor& tensor, const at::Tensor& host) {
  if (!host.is_same(tensor)) tensor.copy_(host);
}

// A byte split given as offsets and lengths must be the dense prefix sums the CPU op takes.
std::vector<int64_t> dense_splits(const std::vector<size_t>& offsets,
                                  const std::vector<size_t>& bytes,
                                  const char* side) {
  std::vector<int64_t> splits;
  size_t next = 0;
  for (size_t p = 0; p < bytes.size(); ++p) {
    TORCH_CHECK(offsets[p] == next, "shardwise backend (host-staged): all_to_all ", side, " block ",
                p, " starts at byte ", offsets[p], ", expected ", next);
    splits.push_back(static_cast<int64_t>(bytes[p]));
    next += bytes[p];
  }
  return splits;
}

}  // namespace

void HostStagedComm::allreduce(at::Tensor& tensor, collectives::ReduceOp op) {
  std::vector<at::Tensor> host{to_host(tensor)};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d_op(op);
  cpu_.allreduce(host, options)->wait();
  copy_back(tensor, host[0]);
}

void HostStagedComm::broadcast(at::Tensor& tensor, int root) {
  std::vector<at::Tensor> host{to_host(tensor)};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  cpu_.broadcast(host, options)->wait();
  copy_back(tensor, host[0]);
}

void HostStagedComm::all_gather(at::Tensor& output, const at::Tensor& input) {
  at::Tensor in = to_host(input);
  at::Tensor out = output.is_cpu() && output.is_contiguous()
                       ? output
                       : at::empty(output.sizes(), output.options().device(at::kCPU));
  cpu_._allgather_base(out, in)->wait();
  copy_back(output, out);
}

void HostStagedComm::reduce_scatter(at::Tensor& output,
                                    const at::Tensor& input,
                                    collectives::ReduceOp op) {
  at::Tensor in = to_host(input);
  at::Tensor out = output.is_cpu() && output.is_contiguous()
                       ? output
                       : at::empty(output.sizes(), output.options().device(at::kCPU));
  c10d::ReduceScatterOptions options;
  options.reduceOp = c10d_op(op);
  cpu_._reduce_scatter_base(out, in, options)->wait();
  copy_back(output, out);
}

void HostStagedComm::alltoall(at::Tensor& output,
                              const at::Tensor& input,
                              const std::vector<size_t>& send_offsets,
                              const std::vector<size_t>& send_bytes,
                              const std::vector<size_t>& recv_offsets,
                              const std::vector<size_t>& recv_bytes) {
  std::vector<int64_t> input_splits = dense_splits(send_offsets, send_bytes, "send");
  std::vector<int64_t> output_splits = dense_splits(recv_offsets, recv_bytes, "receive");
  at::Tensor in = to_host(input).view(at::kByte).reshape({-1});
  const int64_t out_bytes = std::accumulate(output_splits.begin(), output_splits.end(), int64_t{0});
  at::Tensor out = at::empty({out_bytes}, in.options());
  c10d::AllToAllOptions options;
  cpu_.alltoall_base(out, in, output_splits, input_splits, options)->wait();
  at::Tensor target = output.view(at::kByte).reshape({-1});
  target.narrow(0, 0, out_bytes).copy_(out);
}

void HostStagedComm::send(const at::Tensor& tensor, int peer) {
  std::vector<at::Tensor> host{to_host(tensor)};
  cpu_.send(host, peer, /*tag=*/0)->wait();
}

void HostStagedComm::recv(at::Tensor& tensor, int peer) {
  std::vector<at::Tensor> host{at::empty(tensor.sizes(), tensor.options().device(at::kCPU))};
  cpu_.recv(host, peer, /*tag=*/0)->wait();
  tensor.copy_(host[0]);
}

bool ranks_share_a_device(const c10::intrusive_ptr<c10d::Store>& store,
                          int rank,
                          int size,
                          const std::string& device_id) {
  const std::string prefix = "shardwise/cuda_device/";
  store->set(prefix + std::to_string(rank),
             std::vector<uint8_t>(device_id.begin(), device_id.end()));
  std::set<std::string> seen;
  for (int r = 0; r < size; ++r) {
    const std::vector<uint8_t> bytes = store->get(prefix + std::to_string(r));
    if (!seen.insert(std::string(bytes.begin(), bytes.end())).second) return true;
  }
  return false;
}

}  // namespace shardwise::backend
