#include "data/token_file.h"

#include <sys/stat.h>

#include <cctype>
#include <fstream>
#include <stdexcept>
#include <vector>

namespace shardwise::data {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

struct TypeName {
  TokenType type;
  const char* name;
  const char* descr;  // NumPy's type string, without the byte-order character
  int itemsize;
};

constexpr TypeName kTypes[] = {
    {TokenType::kUInt8, "uint8", "u1", 1},   {TokenType::kInt8, "int8", "i1", 1},
    {TokenType::kUInt16, "uint16", "u2", 2}, {TokenType::kInt16, "int16", "i2", 2},
    {TokenType::kUInt32, "uint32", "u4", 4}, {TokenType::kInt32, "int32", "i4", 4},
    {TokenType::kUInt64, "uint64", "u8", 8}, {TokenType::kInt64, "int64", "i8", 8},
};

const TypeName& info(TokenType type) {
  for (const auto& t : kTypes) {
    if (t.type == type) return t;
  }
  throw std::logic_error("token_file: unknown TokenType");
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::invalid_argument("token file '" + path + "': " + what);
}

// The text after "'key':" in the header dict, leading spaces skipped.
size_t value_at(const std::string& dict, const std::string& key, const std::string& path) {
  const size_t at = dict.find("'" + key + "'");
  if (at == std::string::npos) fail(path, "the .npy header has no '" + key + "'");
  size_t pos = dict.find(':', at);
  if (pos == std::string::npos) fail(path, "the .npy header's '" + key + "' has no value");
  ++pos;
  while (pos < dict.size() && std::isspace(static_cast<unsigned char>(dict[pos]))) ++pos;
  return pos;
}

TokenType npy_type(const std::string& dict, const std::string& path) {
  size_t pos = value_at(dict, "descr", path);
  const size_t end = dict.find('\'', pos + 1);
  if (dict[pos] != '\'' || end == std::string::npos) fail(path, "the .npy 'descr' is not a string");
  const std::string descr = dict.substr(pos + 1, end - pos - 1);
  if (descr.size() == 3 && (descr[0] == '<' || descr[0] == '|')) {
    for (const auto& t : kTypes) {
      // '|' only for one-byte types, '<' for any (NumPy writes '|u1' and '<u2')
      if (descr.substr(1) == t.descr && (descr[0] == '<' || t.itemsize == 1)) return t.type;
    }
  }
  fail(path, "dtype '" + descr +
                 "' is not a little-endian integer type; save the tokens as uint16, uint32 or "
                 "int32 (numpy.asarray(tokens, dtype=numpy.uint16))");
}

// product(shape) of the 'shape' tuple; 'fortran_order' True is fine only for one dimension.
int64_t npy_count(const std::string& dict, const std::string& path) {
  size_t pos = value_at(dict, "shape", path);
  if (dict[pos] != '(') fail(path, "the .npy 'shape' is not a tuple");
  const size_t end = dict.find(')', pos);
  if (end == std::string::npos) fail(path, "the .npy 'shape' is not closed");
  int64_t count = 1;
  int dims = 0;
  for (size_t i = pos + 1; i < end;) {
    if (std::isdigit(static_cast<unsigned char>(dict[i]))) {
      int64_t dim = 0;
      for (; i < end && std::isdigit(static_cast<unsigned char>(dict[i])); ++i) {
        if (dim > (int64_t{1} << 50)) fail(path, "the .npy 'shape' is too large");
        dim = dim * 10 + (dict[i] - '0');
      }
      count *= dim;
      if (count > (int64_t{1} << 50)) fail(path, "the .npy 'shape' is too large");
      ++dims;
    } else if (dict[i] == ',' || dict[i] == ' ' || dict[i] == 'L') {
      ++i;
    } else {
      fail(path, "the .npy 'shape' holds '" + std::string(1, dict[i]) + "'");
    }
  }
  const size_t order = value_at(dict, "fortran_order", path);
  if (dict.compare(order, 4, "True") == 0 && dims > 1) {
    fail(path, "the array is in Fortran order; save numpy.ascontiguousarray(tokens)");
  }
  return count;
}

}  // namespace

int TokenFileLayout::itemsize() const { return info(type).itemsize; }

TokenType token_type_from_name(const std::string& name) {
  std::string choices;
  for (const auto& t : kTypes) {
    if (name == t.name) return t.type;
    choices += std::string(choices.empty() ? "" : ", ") + t.name;
  }
  throw std::invalid_argument("token dtype '" + name + "' is unknown; use one of " + choices);
}

const char* token_type_name(TokenType type) { return info(type).name; }

TokenFileLayout parse_npy_header(const std::string& head,
                                 int64_t file_size,
                                 const std::string& path) {
  if (head.size() < kMagicSize + 4 || head.compare(0, kMagicSize, kMagic, kMagicSize) != 0) {
    fail(path, "not a .npy file (no \\x93NUMPY magic)");
  }
  const auto byte = [&](size_t i) { return static_cast<int64_t>(static_cast<uint8_t>(head[i])); };
  const int major = static_cast<int>(byte(6));
  if (major < 1 || major > 3) fail(path, ".npy version " + std::to_string(major) + " is unknown");
  const size_t length_bytes = major == 1 ? 2 : 4;
  int64_t header_len = 0;
  for (size_t i = 0; i < length_bytes; ++i) header_len |= byte(8 + i) << (8 * i);
  const int64_t offset = 8 + static_cast<int64_t>(length_bytes) + header_len;
  if (offset > static_cast<int64_t>(head.size()) || offset > file_size) {
    fail(path, "the .npy header is cut short");
  }
  const std::string dict = head.substr(8 + length_bytes, header_len);
  TokenFileLayout layout;
  layout.type = npy_type(dict, path);
  layout.offset = offset;
  layout.count = npy_count(dict, path);
  const int64_t expected = layout.count * layout.itemsize();
  if (file_size - offset != expected) {
    fail(path, "holds " + std::to_string(file_size - offset) + " data bytes but its header says " +
                   std::to_string(layout.count) + " tokens of " +
                   std::to_string(layout.itemsize()) + " bytes (" + std::to_string(expected) +
                   "); the file is truncated or not what its header says");
  }
  if (layout.count == 0) fail(path, "holds no tokens");
  return layout;
}

TokenFileLayout describe_token_file(const std::string& path, TokenType bin_type) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) fail(path, "cannot be read (does it exist?)");
  if (!S_ISREG(st.st_mode)) fail(path, "is not a regular file");
  const auto size = static_cast<int64_t>(st.st_size);
  const bool npy = path.size() > 4 && path.compare(path.size() - 4, 4, ".npy") == 0;
  if (npy) {
    std::ifstream file(path, std::ios::binary);
    std::string head(static_cast<size_t>(std::min<int64_t>(size, 65536 + 12)), '\0');
    if (!file.read(head.data(), static_cast<std::streamsize>(head.size()))) {
      fail(path, "cannot be read");
    }
    return parse_npy_header(head, size, path);
  }
  TokenFileLayout layout;
  layout.type = bin_type;
  const int width = layout.itemsize();
  if (size == 0) fail(path, "is empty");
  if (size % width != 0) {
    fail(path, "is " + std::to_string(size) + " bytes, not a whole number of " +
                   token_type_name(bin_type) + " tokens; give the dtype it was written with " +
                   "(data.dtype: uint16 for nanoGPT's files, uint32 for vocabularies over 65536)");
  }
  layout.count = size / width;
  return layout;
}

}  // namespace shardwise::data
