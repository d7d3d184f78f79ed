// Builds without CUDA: CUDA storages cannot exist, so this is never reached.
#ifndef SHARDWISE_WITH_CUDA
#include <c10/util/Exception.h>

#include "fsdp/storage.h"

namespace shardwise::fsdp {

void resize_storage_bytes_cuda(const at::Tensor& tensor, int64_t) {
  TORCH_CHECK(false, "FSDP: got a parameter on ", tensor.device(),
              " but this build of shardwise has no CUDA support");
}

}  // namespace shardwise::fsdp
#endif
