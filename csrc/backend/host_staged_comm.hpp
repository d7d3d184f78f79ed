// CUDA tensors through host memory, for ranks that share one GPU (NCCL refuses two ranks on one
// device, and single-GPU test machines are common): each call copies the tensors to the host
// (the copy waits for the caller's stream), runs the backend's own CPU collective on them
// (shared memory or TCP), waits for it, and copies the results back on the caller's stream.
// Slower than NCCL (two copies and a host synchronization per call), but every op the backend
// offers on CUDA works, in the same stream order as the NCCL path.
//
// ranks_share_a_device() decides, once per backend, collectively: every rank publishes its
// device's identity (host name and PCI bus id) in the store and reads the others'.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "backend/nccl_comm.hpp"

namespace shardwise::backend {

class HostStagedComm : public NcclComm {
 public:
  // `cpu` runs the collectives on host tensors (the shardwise backend itself); it must outlive
  // this object.
  explicit HostStagedComm(c10d::Backend& cpu) : cpu_(cpu) {}
  void allreduce(at::Tensor& tensor, collectives::ReduceOp op) override;
  void broadcast(at::Tensor& tensor, int root) override;
  void all_gather(at::Tensor& output, const at::Tensor& input) override;
  void reduce_scatter(at::Tensor& output,
                      const at::Tensor& input,
                      collectives::ReduceOp op) override;
  void alltoall(at::Tensor& output,
                const at::Tensor& input,
                const std::vector<size_t>& send_offsets,
                const std::vector<size_t>& send_bytes,
                const std::vector<size_t>& recv_offsets,
                const std::vector<size_t>& recv_bytes) override;
  void send(const at::Tensor& tensor, int peer) override;
  void recv(at::Tensor& tensor, int peer) override;

 private:
  c10d::Backend& cpu_;
};

// True on every rank when any two ranks of the group name the same device; `device_id` is this
// rank's (cuda_device_id()). Collective: every rank must call it.
bool ranks_share_a_device(const c10::intrusive_ptr<c10d::Store>& store,
                          int rank,
                          int size,
                          const std::string& device_id);

// "hostname/PCI bus id" of a CUDA device (nccl_comm_cuda.cpp; builds without CUDA: an error).
std::string cuda_device_id(const at::Device& device);

}  // namespace shardwise::backend
