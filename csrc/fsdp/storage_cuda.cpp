#include <ATen/native/cuda/Resize.h>

#include "fsdp/storage.h"

namespace shardwise::fsdp {

void resize_storage_bytes_cuda(const at::Tensor& tensor, int64_t bytes) {
  at::native::resize_bytes_cuda(tensor.storage().unsafeGetStorageImpl(),
                                static_cast<size_t>(bytes));
}

}  // namespace shardwise::fsdp
