#include "checkpoint/safetensors.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

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

// Writes all of `data` to `fd`; throws naming `path`.
void write_all(int fd, const char* data, size_t size, const std::string& path) {
  while (size > 0) {
    const ssize_t written = ::write(fd, data, size);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      throw std::runtime_error("safetensors: writing '" + path +
                               "' failed: " + std::strerror(errno));
    }
    data += written;
    size -= static_cast<size_t>(written);
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
  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw std::runtime_error("safetensors: cannot create '" + temporary +
                             "': " + std::strerror(errno) +
                             "; check that the folder exists and is "
                             "writable");
  }
  try {
    write_all(fd, header.data(), header.size(), temporary);
    for (const auto& t : data) {
      write_all(fd, static_cast<const char*>(t.data_ptr()), t.nbytes(), temporary);
    }
    if (::fsync(fd) != 0) {
      throw std::runtime_error("safetensors: flushing '" + temporary +
                               "' failed: " + std::strerror(errno));
    }
  } catch (...) {
    ::close(fd);
    ::unlink(temporary.c_str());
    throw;
  }
  ::close(fd);
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(temporary.c_str());
    throw std::runtime_error("safetensors: cannot move the saved file to '" + path +
                             "': " + reason);
  }
}

}  // namespace shardwise::checkpoint
