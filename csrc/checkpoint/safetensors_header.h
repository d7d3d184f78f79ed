// The header of a safetensors file (https://github.com/huggingface/safetensors), torch-free: an
// 8-byte little-endian length, then a JSON object naming each tensor's dtype, shape and byte
// range in the data that follows, padded with spaces to a multiple of 8 bytes. Tensors are laid
// out in the order given, back to back.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace shardwise::checkpoint {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // safetensors' spelling: F32, BF16, F16, F64, I64, I32, I16, I8, U8, BOOL
  std::vector<int64_t> shape;
  int64_t nbytes = 0;
};

// The 8-byte length followed by the padded JSON header. Throws std::invalid_argument naming the
// entry when a name is empty, repeated or "__metadata__", a dtype is not one of the above, or
// nbytes is negative.
std::string safetensors_header(const std::vector<SafetensorsEntry>& entries,
                               const std::map<std::string, std::string>& metadata = {});

}  // namespace shardwise::checkpoint
