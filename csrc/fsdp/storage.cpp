#include "fsdp/storage.h"

#include <ATen/native/Resize.h>
#include <c10/util/Exception.h>

namespace shardwise::fsdp {

void resize_storage_bytes(const at::Tensor& tensor, int64_t bytes) {
  TORCH_CHECK_VALUE(bytes >= 0, "resize_storage_bytes: negative size ", bytes);
  if (tensor.is_cuda()) {
    resize_storage_bytes_cuda(tensor, bytes);
    return;
  }
  TORCH_CHECK_VALUE(tensor.is_cpu(), "FSDP: parameters on ", tensor.device(),
                    " are not supported; use CPU or CUDA");
  at::native::resize_bytes_cpu(tensor.storage().unsafeGetStorageImpl(), static_cast<size_t>(bytes));
}

}  // namespace shardwise::fsdp
