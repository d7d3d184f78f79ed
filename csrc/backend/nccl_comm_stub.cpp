// Builds without CUDA: the NCCL path reports itself unavailable.
#ifndef SHARDWISE_WITH_CUDA
#include <c10/util/Exception.h>

#include "backend/host_staged_comm.hpp"
#include "backend/nccl_comm.hpp"

namespace shardwise::backend {

bool nccl_available() { return false; }

std::unique_ptr<NcclComm> make_nccl_comm(const c10::intrusive_ptr<c10d::Store>&,
                                         int,
                                         int,
                                         const at::Device& device) {
  TORCH_CHECK(false, "shardwise backend: got a tensor on ", device, " but this build of ",
              "shardwise has no CUDA/NCCL support; rebuild with CUDA (SHARDWISE_WITH_CUDA=1) or ",
              "use init_process_group('cpu:shardwise,cuda:nccl')");
}

std::string cuda_device_id(const at::Device& device) {
  TORCH_CHECK(false, "shardwise backend: got a tensor on ", device,
              " but this build of shardwise has no CUDA support");
}

}  // namespace shardwise::backend
#endif
