#include "checkpoint/safetensors_header.h"

#include <cstdio>
#include <set>
#include <stdexcept>

namespace shardwise::checkpoint {
namespace {

// `text` as a JSON string literal.
std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      out += escaped;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

void check(const SafetensorsEntry& entry, std::set<std::string>& names) {
  static const std::set<std::string> dtypes{"F32", "BF16", "F16", "F64", "I64",
                                            "I32", "I16",  "I8",  "U8",  "BOOL"};
  if (entry.name.empty() || entry.name == "__metadata__") {
    throw std::invalid_argument("safetensors: a tensor may not be named '" + entry.name + "'");
  }
  if (!names.insert(entry.name).second) {
    throw std::invalid_argument("safetensors: two tensors are named '" + entry.name + "'");
  }
  if (!dtypes.count(entry.dtype)) {
    throw std::invalid_argument("safetensors: tensor '" + entry.name + "' has dtype " +
                                entry.dtype + ", which safetensors cannot store");
  }
  if (entry.nbytes < 0) {
    throw std::invalid_argument("safetensors: tensor '" + entry.name + "' has negative size");
  }
}

}  // namespace

std::string safetensors_header(const std::vector<SafetensorsEntry>& entries,
                               const std::map<std::string, std::string>& metadata) {
  std::set<std::string> names;
  std::string json = "{";
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      json += (first ? "" : ",") + quoted(key) + ":" + quoted(value);
      first = false;
    }
    json += "}";
  }
  int64_t offset = 0;
  for (const auto& entry : entries) {
    check(entry, names);
    if (json.size() > 1) json += ",";
    json += quoted(entry.name) + ":{\"dtype\":" + quoted(entry.dtype) + ",\"shape\":[";
    for (size_t i = 0; i < entry.shape.size(); ++i) {
      json += (i ? "," : "") + std::to_string(entry.shape[i]);
    }
    json += "],\"data_offsets\":[" + std::to_string(offset) + "," +
            std::to_string(offset + entry.nbytes) + "]}";
    offset += entry.nbytes;
  }
  json += "}";
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t length = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return out + json;
}

}  // namespace shardwise::checkpoint
