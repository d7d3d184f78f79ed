// Frees and re-allocates a tensor's storage in place (its bytes go, the StorageImpl stays), so
// views of it (e.g. tensors autograd saved for backward) see the memory again once it is back.
#pragma once

#include <ATen/core/Tensor.h>

namespace shardwise::fsdp {

void resize_storage_bytes(const at::Tensor& tensor, int64_t bytes);
// The CUDA half, defined in storage_cuda.cpp (CUDA builds) or storage_stub.cpp.
void resize_storage_bytes_cuda(const at::Tensor& tensor, int64_t bytes);

}  // namespace shardwise::fsdp
