// AVX-512 loops of the fused optimizer steps, compiled with function target attributes so the rest
// of the binary stays portable; called only when common/cpu_features.h reports support. Internal
// to fused_optim.cc.
#pragma once

#include "optim/fused_optim.h"

namespace shardwise::optim::avx512 {

void adamw(const AdamWSpan& span, const AdamWScalars& scalars);
void sgd(const SgdSpan& span, const SgdScalars& scalars);

}  // namespace shardwise::optim::avx512
