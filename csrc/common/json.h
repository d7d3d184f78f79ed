// A small JSON reader and string quoting, torch-free: enough for the files shardwise exchanges
// with Python (checkpoint manifests, which Python's json module writes). parse_json reads
// RFC 8259 text: objects, arrays, strings (with \u escapes, surrogate pairs to UTF-8), numbers,
// true/false/null; anything else is an error naming the byte offset.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace shardwise::json {

struct Value {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0.0;
  int64_t integer = 0;  // the number, when it was written without fraction or exponent
  bool is_integer = false;
  std::string string;
  std::vector<Value> array;
  std::map<std::string, Value> object;

  // The member `key` of an object; throws std::invalid_argument naming `key` (and `where`) when
  // this is not an object or has no such member.
  const Value& at(const std::string& key, const std::string& where = "JSON") const;
  int64_t as_integer(const std::string& where = "JSON") const;  // throws unless an integer
  const std::string& as_string(const std::string& where = "JSON") const;
};

// Throws std::invalid_argument("JSON: ... at byte N") on malformed text or trailing content.
Value parse(const std::string& text);

// `text` as a JSON string literal (quotes included; control characters, quotes and backslashes
// escaped; other bytes, UTF-8 included, as they are).
std::string quote(const std::string& text);

}  // namespace shardwise::json
