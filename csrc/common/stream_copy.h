// Copies for data the caller will not read again soon: non-temporal (streaming) stores write
// `destination` straight to memory instead of first reading each line into the cache ("read for
// ownership"), so a copy into a buffer larger than the cache moves 2 bytes per byte instead of 3.
// Worth it only when the destination is far larger than the last-level cache; the collectives
// use it above CollectiveOptions::streaming_bytes. Torch-free.
#pragma once

#include <cstddef>

namespace shardwise {

// memcpy(destination, source, bytes) with streaming stores where the CPU has them (x86-64: SSE2,
// always); the stores are fenced before it returns. The ranges must not overlap.
void stream_copy(void* destination, const void* source, size_t bytes);

}  // namespace shardwise
