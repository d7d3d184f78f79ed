// Token-file layouts (data/token_file.h) from .npy headers written the way NumPy writes them and
// from raw .bin files. Catches: a version-2 header length read as 2 bytes, a big-endian or float
// dtype accepted, a truncated or padded file accepted (its header promising more or fewer tokens
// than the bytes hold), a multi-dimensional Fortran-order array read as if C order, and a .bin
// whose size is not a whole number of tokens.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "data/token_file.h"

namespace shardwise::data {
namespace {

// What numpy.save writes: magic, version, little-endian header length, the dict padded with
// spaces and a newline so the data starts at a multiple of 64.
std::string npy(const std::string& dict, int major = 1) {
  const size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = std::string("\x93NUMPY", 6) + static_cast<char>(major) + '\0';
  const size_t n = header.size();
  out += static_cast<char>(n & 0xFF);
  out += static_cast<char>((n >> 8) & 0xFF);
  if (major != 1) out += std::string(2, '\0');
  return out + header;
}

std::string dict(const std::string& descr, const std::string& shape, bool fortran = false) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
         ", 'shape': " + shape + ", }";
}

std::string write(const std::string& name, const std::string& bytes) {
  const auto path = std::filesystem::temp_directory_path() / ("shardwise_tokfile_" + name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path.string();
}

std::string error_of(const std::string& path, TokenType bin = TokenType::kUInt16) {
  try {
    describe_token_file(path, bin);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(TokenFile, NpyVersionsOneAndTwo) {
  const std::string h1 = npy(dict("<u2", "(5,)"));
  const auto one = parse_npy_header(h1, static_cast<int64_t>(h1.size()) + 10, "a.npy");
  EXPECT_EQ(one.type, TokenType::kUInt16);
  EXPECT_EQ(one.offset, static_cast<int64_t>(h1.size()));
  EXPECT_EQ(one.offset % 64, 0);
  EXPECT_EQ(one.count, 5);
  const std::string h2 = npy(dict("<i4", "(2, 3)"), 2);
  const auto two = parse_npy_header(h2, static_cast<int64_t>(h2.size()) + 24, "b.npy");
  EXPECT_EQ(two.type, TokenType::kInt32);
  EXPECT_EQ(two.offset, static_cast<int64_t>(h2.size()));
  EXPECT_EQ(two.count, 6);
  const std::string h3 = npy(dict("|u1", "(7,)"));
  EXPECT_EQ(parse_npy_header(h3, static_cast<int64_t>(h3.size()) + 7, "c.npy").type,
            TokenType::kUInt8);
}

TEST(TokenFile, NpyRefusesWhatItCannotReadAsTokens) {
  const auto refused = [](const std::string& head, int64_t data, const std::string& needle) {
    try {
      parse_npy_header(head, static_cast<int64_t>(head.size()) + data, "x.npy");
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("x.npy"), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted: " << needle;
  };
  refused(npy(dict(">u2", "(5,)")), 10, "not a little-endian integer");
  refused(npy(dict("<f4", "(5,)")), 20, "not a little-endian integer");
  refused(npy(dict("<u2", "(5,)")), 8, "truncated");
  refused(npy(dict("<u2", "(5,)")), 12, "truncated");
  refused(npy(dict("<u2", "(2, 3)", true)), 12, "Fortran order");
  refused(npy(dict("<u2", "(0,)")), 0, "no tokens");
  refused("PK\x03\x04not numpy at all", 0, "not a .npy file");
  std::string future = npy(dict("<u2", "(5,)"));
  future[6] = 9;
  refused(future, 10, "version 9");
}

TEST(TokenFile, FortranOrderOfOneDimensionIsTheSameArray) {
  const std::string h = npy(dict("<u2", "(4,)", true));
  EXPECT_EQ(parse_npy_header(h, static_cast<int64_t>(h.size()) + 8, "f.npy").count, 4);
}

TEST(TokenFile, BinFilesByTheirWidth) {
  const std::string path = write("six.bin", std::string(12, '\1'));
  EXPECT_EQ(describe_token_file(path).count, 6);
  EXPECT_EQ(describe_token_file(path, TokenType::kUInt32).count, 3);
  const std::string odd = write("odd.bin", std::string(7, '\1'));
  EXPECT_NE(error_of(odd).find("not a whole number of uint16 tokens"), std::string::npos);
  EXPECT_NE(error_of(write("empty.bin", "")).find("is empty"), std::string::npos);
  EXPECT_NE(error_of("/nonexistent/train.bin").find("cannot be read"), std::string::npos);
  std::remove(path.c_str());
  std::remove(odd.c_str());
}

TEST(TokenFile, NpyFilesOnDisk) {
  const std::string path = write("tokens.npy", npy(dict("<u4", "(3,)")) + std::string(12, '\0'));
  const auto layout = describe_token_file(path, TokenType::kUInt8);  // bin_type is ignored
  EXPECT_EQ(layout.type, TokenType::kUInt32);
  EXPECT_EQ(layout.count, 3);
  std::remove(path.c_str());
}

TEST(TokenFile, TypeNames) {
  EXPECT_EQ(token_type_from_name("uint32"), TokenType::kUInt32);
  EXPECT_STREQ(token_type_name(TokenType::kInt64), "int64");
  EXPECT_THROW(token_type_from_name("float16"), std::invalid_argument);
}

}  // namespace
}  // namespace shardwise::data
