#include "checkpoint/safetensors.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <vector>

#include "checkpoint/atomic_file.h"
#include "checkpoint/safetensors_header.h"

namespace shardwise::checkpoint {
namespace {

std::string dtype_name(const std::string& name, at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return "F32";
    case at::kBFloat16:
      return "BF16";
    case at::kHalf:
      return "F16";
    case at::kDouble:
      return "F64";
    case at::kLong:
      return "I64";
    case at::kInt:
      return "I32";
    case at::kShort:
      return "I16";
    case at::kChar:
      return "I8";
    case at::kByte:
      return "U8";
    case at::kBool:
      return "BOOL";
    default:
      throw std::invalid_argument("safetensors: tensor '" + name + "' has dtype " +
                                  std::string(c10::toString(type)) + ", which it cannot store");
  }
}

}  // namespace

void save_safetensors(const std::string& path,
                      const torch::OrderedDict<std::string, at::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsEntry> entries;
  std::vector<at::Tensor> data;
  for (const auto& item : tensors) {
    at::Tensor cpu = item.value().detach().to(at::kCPU).contiguous();
    entries.push_back({item.key(), dtype_name(item.key(), cpu.scalar_type()), cpu.sizes().vec(),
                       static_cast<int64_t>(cpu.nbytes())});
    data.push_back(std::move(cpu));
  }
  const std::string header = safetensors_header(entries, metadata);
  std::vector<std::pair<const void*, size_t>> parts{{header.data(), header.size()}};
  for (const auto& t : data) parts.push_back({t.data_ptr(), t.nbytes()});
  atomic_write(path, parts, "safetensors");
}

}  // namespace shardwise::checkpoint
