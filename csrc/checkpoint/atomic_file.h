// Crash-safe file writes, torch-free: the bytes go to a temporary file beside `path`, which is
// flushed (fsync), renamed onto `path` and its folder flushed, so a reader sees the old file or
// the complete new one, never a torn one; a failed write removes the temporary file. The same
// rule as Python's checkpoint.atomic_write.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace shardwise::checkpoint {

// Writes the `parts` (pointer, size) back to back. Throws std::runtime_error naming `what`, the
// path and the reason.
void atomic_write(const std::string& path,
                  const std::vector<std::pair<const void*, size_t>>& parts,
                  const std::string& what);

inline void atomic_write(const std::string& path,
                         const std::string& text,
                         const std::string& what) {
  atomic_write(path, {{text.data(), text.size()}}, what);
}

}  // namespace shardwise::checkpoint
