// ATen glue of data/token_file.h: token files memory-mapped as tensors, and their id range.
#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>

#include "data/token_file_tensor.h"

namespace shardwise::data {
namespace {

at::ScalarType scalar_type(TokenType type) {
  switch (type) {
    case TokenType::kUInt8:
      return at::kByte;
    case TokenType::kInt8:
      return at::kChar;
    case TokenType::kUInt16:
      return at::kUInt16;
    case TokenType::kInt16:
      return at::kShort;
    case TokenType::kUInt32:
      return at::kUInt32;
    case TokenType::kInt32:
      return at::kInt;
    case TokenType::kUInt64:
      return at::kUInt64;
    case TokenType::kInt64:
      return at::kLong;
  }
  throw std::logic_error("token_file: unknown TokenType");
}

constexpr int64_t kRangeChunk = int64_t{1} << 22;  // tokens widened to int64 at a time

}  // namespace

at::Tensor read_token_file(const std::string& path, TokenType bin_type) {
  const TokenFileLayout layout = describe_token_file(path, bin_type);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::invalid_argument("token file '" + path + "': cannot be opened");
  const auto bytes = static_cast<size_t>(layout.offset + layout.count * layout.itemsize());
  void* base = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) throw std::invalid_argument("token file '" + path + "': mmap failed");
  const auto dtype = at::TensorOptions().dtype(scalar_type(layout.type));
  auto* first = static_cast<char*>(base) + layout.offset;
  const auto unmap = [base, bytes](void*) { ::munmap(base, bytes); };
  if (layout.offset % layout.itemsize() == 0) {
    return at::from_blob(first, {layout.count}, unmap, dtype);
  }
  // A header length that misaligns the tokens: copy them (rare; NumPy pads to 64 bytes).
  at::Tensor copy = at::empty({layout.count}, dtype);
  std::memcpy(copy.data_ptr(), first, bytes - layout.offset);
  unmap(nullptr);
  return copy;
}

at::Tensor token_ids(const at::Tensor& tokens) {
  switch (tokens.scalar_type()) {
    case at::kUInt16:
      return tokens.view(at::kShort).to(at::kLong).bitwise_and_(0xFFFF);
    case at::kUInt32:
      return tokens.view(at::kInt).to(at::kLong).bitwise_and_(0xFFFFFFFFLL);
    case at::kUInt64:
      return tokens.view(at::kLong);
    default:
      return tokens.to(at::kLong);
  }
}

at::Tensor signed_view(const at::Tensor& tokens) {
  switch (tokens.scalar_type()) {
    case at::kUInt16:
      return tokens.view(at::kShort);
    case at::kUInt32:
      return tokens.view(at::kInt);
    case at::kUInt64:
      return tokens.view(at::kLong);
    default:
      return tokens;
  }
}

std::pair<int64_t, int64_t> token_range(const at::Tensor& tokens) {
  if (tokens.numel() == 0) throw std::invalid_argument("token_range: no tokens");
  const at::Tensor flat = tokens.reshape(-1);
  int64_t low = INT64_MAX, high = INT64_MIN;
  for (int64_t start = 0; start < flat.numel(); start += kRangeChunk) {
    const at::Tensor ids =
        token_ids(flat.narrow(0, start, std::min(kRangeChunk, flat.numel() - start)));
    low = std::min(low, ids.min().item<int64_t>());
    high = std::max(high, ids.max().item<int64_t>());
  }
  return {low, high};
}

}  // namespace shardwise::data
