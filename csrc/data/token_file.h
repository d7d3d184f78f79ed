// Pre-tokenized training data as nanoGPT and NumPy write it, described without reading the tokens
// (the torch glue, token_file.cpp, memory-maps them).
//
// `.bin`: raw little-endian token ids of one width, nanoGPT's format (uint16; uint32 when the
// vocabulary exceeds 65536). The file size must be a multiple of the width.
// `.npy`: NumPy's format, versions 1-3: the magic "\x93NUMPY", a version, a header length (2 bytes
// in version 1, 4 after), and a Python-literal dict with 'descr' (a little-endian or
// byte-order-free integer type: |u1 |i1 <u2 <i2 <u4 <i4 <u8 <i8), 'fortran_order' (False, or any
// order for 1-D) and 'shape' (any rank; the tokens are read flattened). The data must be exactly
// product(shape) * itemsize bytes after the header, so a truncated or padded file is refused.
#pragma once

#include <cstdint>
#include <string>

namespace shardwise::data {

enum class TokenType : uint8_t { kUInt8, kInt8, kUInt16, kInt16, kUInt32, kInt32, kUInt64, kInt64 };

struct TokenFileLayout {
  TokenType type = TokenType::kUInt16;
  int64_t offset = 0;  // bytes before the first token
  int64_t count = 0;   // tokens
  int itemsize() const;
};

// The layout of a `.bin` file of `bin_type` tokens, or (when `path` ends in .npy) of a .npy file.
// Throws std::invalid_argument naming the path and what is wrong: missing, empty, a size that is
// not a whole number of tokens, a bad .npy header, a non-integer or big-endian dtype.
TokenFileLayout describe_token_file(const std::string& path,
                                    TokenType bin_type = TokenType::kUInt16);

// The layout of a .npy file from its first bytes (`head`, at least the whole header) and its
// total size; what describe_token_file uses, exposed for tests.
TokenFileLayout parse_npy_header(const std::string& head,
                                 int64_t file_size,
                                 const std::string& path);

// "uint16" etc.; throws std::invalid_argument naming `name` and the choices when unknown.
TokenType token_type_from_name(const std::string& name);
const char* token_type_name(TokenType type);

}  // namespace shardwise::data
