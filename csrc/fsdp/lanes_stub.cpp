// Builds without CUDA: CUDA parameters cannot exist, so this is never reached.
#ifndef SHARDWISE_WITH_CUDA
#include <c10/util/Exception.h>

#include "fsdp/lanes.h"

namespace shardwise::fsdp {

std::shared_ptr<Lanes> make_cuda_lanes(const at::Device& device) {
  TORCH_CHECK(false, "FSDP: got parameters on ", device,
              " but this build of shardwise has no CUDA support");
}

}  // namespace shardwise::fsdp
#endif
