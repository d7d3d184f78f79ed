// The safetensors header byte for byte (Hugging Face's format: an 8-byte little-endian length,
// JSON padded with spaces to 8 bytes), and bad entries named. tests/python/test_safetensors.py
// reads whole files back with the safetensors library itself.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "checkpoint/safetensors_header.h"

namespace {

using shardwise::checkpoint::safetensors_header;
using shardwise::checkpoint::SafetensorsEntry;

std::string json_of(const std::string& header) {
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= uint64_t{static_cast<unsigned char>(header[i])} << (8 * i);
  EXPECT_EQ(length, header.size() - 8);
  EXPECT_EQ(length % 8, 0u);
  return header.substr(8);
}

TEST(SafetensorsHeader, LaysTensorsOutBackToBackWithPadding) {
  const std::string json = json_of(safetensors_header(
      {{"a", "F32", {2}, 8}, {"b.c", "BF16", {1, 3}, 6}, {"s", "I64", {}, 8}}, {{"k", "v"}}));
  EXPECT_EQ(json,
            "{\"__metadata__\":{\"k\":\"v\"},"
            "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
            "\"b.c\":{\"dtype\":\"BF16\",\"shape\":[1,3],\"data_offsets\":[8,14]},"
            "\"s\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[14,22]}}");
  // 53 bytes of JSON: three spaces pad it to 56.
  EXPECT_EQ(json_of(safetensors_header({{"x", "U8", {1}, 1}})),
            "{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}   ");
}

TEST(SafetensorsHeader, EscapesNames) {
  const std::string json = json_of(safetensors_header({{"q\"\\\n", "U8", {1}, 1}}));
  EXPECT_NE(json.find("\"q\\\"\\\\\\u000a\""), std::string::npos) << json;
}

TEST(SafetensorsHeader, BadEntriesAreNamed) {
  auto error = [](const std::vector<SafetensorsEntry>& entries) -> std::string {
    try {
      safetensors_header(entries);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error({{"w", "F32", {1}, 4}, {"w", "F32", {1}, 4}}).find("two tensors are named 'w'"),
            std::string::npos);
  EXPECT_NE(error({{"", "F32", {1}, 4}}).find("may not be named ''"), std::string::npos);
  EXPECT_NE(error({{"__metadata__", "F32", {1}, 4}}).find("__metadata__"), std::string::npos);
  EXPECT_NE(error({{"z", "C64", {1}, 8}}).find("'z' has dtype C64"), std::string::npos);
}

}  // namespace
