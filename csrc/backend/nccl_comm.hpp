// The NCCL side of the shardwise backend: CUDA tensors go through an NCCL communicator that the
// backend owns, bootstrapped through the c10d Store (rank 0 publishes the ncclUniqueId).
//
// Each call runs on the communicator's own stream after waiting for the caller's current stream
// (an event), and makes the caller's stream wait for it in turn, so the result is ordered before
// anything the caller queues next, without blocking the CPU. Compiled only with CUDA
// (nccl_comm_cuda.cpp); without it, make_nccl_comm errors with the way out.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "collectives/types.h"

namespace shardwise::backend {

class NcclComm {
 public:
  virtual ~NcclComm() = default;
  virtual void allreduce(at::Tensor& tensor, collectives::ReduceOp op) = 0;
  virtual void broadcast(at::Tensor& tensor, int root) = 0;
  virtual void all_gather(at::Tensor& output, const at::Tensor& input) = 0;
  virtual void reduce_scatter(at::Tensor& output,
                              const at::Tensor& input,
                              collectives::ReduceOp op) = 0;
  virtual void alltoall(at::Tensor& output,
                        const at::Tensor& input,
                        const std::vector<size_t>& send_offsets,
                        const std::vector<size_t>& send_bytes,
                        const std::vector<size_t>& recv_offsets,
                        const std::vector<size_t>& recv_bytes) = 0;
  virtual void send(const at::Tensor& tensor, int peer) = 0;
  virtual void recv(at::Tensor& tensor, int peer) = 0;
};

// True when this build has the NCCL path.
bool nccl_available();

// Creates the communicator for `device` (collective: every rank must call it).
std::unique_ptr<NcclComm> make_nccl_comm(const c10::intrusive_ptr<c10d::Store>& store,
                                         int rank,
                                         int size,
                                         const at::Device& device);

}  // namespace shardwise::backend
