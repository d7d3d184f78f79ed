#include "common/json.h"

#include <cstdlib>
#include <stdexcept>

namespace shardwise::json {
namespace {

class Parser {
 public:
  explicit Parser(const std::string& text) : s_(text) {}

  Value document() {
    Value v = value(0);
    skip_space();
    if (pos_ != s_.size()) fail("trailing content");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument("JSON: " + what + " at byte " + std::to_string(pos_));
  }
  void skip_space() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool consume(const std::string& word) {
    if (s_.compare(pos_, word.size(), word) != 0) return false;
    pos_ += word.size();
    return true;
  }
  void expect(char c) {
    skip_space();
    if (pos_ >= s_.size() || s_[pos_] != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }

  Value value(int depth) {
    if (depth > 512) fail("nesting deeper than 512");
    skip_space();
    if (pos_ >= s_.size()) fail("unexpected end");
    Value v;
    const char c = s_[pos_];
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') {
      v.kind = Value::Kind::kString;
      v.string = string();
    } else if (consume("true")) {
      v.kind = Value::Kind::kBool;
      v.boolean = true;
    } else if (consume("false")) {
      v.kind = Value::Kind::kBool;
    } else if (consume("null")) {
      v.kind = Value::Kind::kNull;
    } else {
      v = number();
    }
    return v;
  }

  Value object(int depth) {
    Value v;
    v.kind = Value::Kind::kObject;
    ++pos_;  // {
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == '}') return ++pos_, v;
    while (true) {
      skip_space();
      if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected a member name");
      std::string key = string();
      expect(':');
      v.object[key] = value(depth + 1);
      skip_space();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      expect('}');
      return v;
    }
  }

  Value array(int depth) {
    Value v;
    v.kind = Value::Kind::kArray;
    ++pos_;  // [
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == ']') return ++pos_, v;
    while (true) {
      v.array.push_back(value(depth + 1));
      skip_space();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      expect(']');
      return v;
    }
  }

  Value number() {
    const size_t begin = pos_;
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    bool integral = true;
    while (pos_ < s_.size() && std::string("0123456789.eE+-").find(s_[pos_]) != std::string::npos) {
      if (s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E') integral = false;
      ++pos_;
    }
    const std::string text = s_.substr(begin, pos_ - begin);
    if (text.empty() || text == "-") fail("unexpected character");
    char* end = nullptr;
    Value v;
    v.kind = Value::Kind::kNumber;
    v.number = std::strtod(text.c_str(), &end);
    if (end != text.c_str() + text.size()) pos_ = begin, fail("malformed number");
    if (integral) {
      v.integer = std::strtoll(text.c_str(), &end, 10);
      v.is_integer = end == text.c_str() + text.size();
    }
    return v;
  }

  unsigned hex4() {
    if (pos_ + 4 > s_.size()) fail("short \\u escape");
    unsigned code = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = s_[pos_++];
      code <<= 4;
      if (h >= '0' && h <= '9') {
        code |= h - '0';
      } else if (h >= 'a' && h <= 'f') {
        code |= h - 'a' + 10;
      } else if (h >= 'A' && h <= 'F') {
        code |= h - 'A' + 10;
      } else {
        fail("bad hex digit in \\u escape");
      }
    }
    return code;
  }

  static void append_utf8(std::string& out, unsigned code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xc0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3f));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xe0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (code & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (code & 0x3f));
    }
  }

  std::string string() {
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail("unterminated string");
      const char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) fail("unterminated escape");
      const char e = s_[pos_++];
      const std::string simple = "\"\\/bfnrt", value = "\"\\/\b\f\n\r\t";
      if (const size_t k = simple.find(e); k != std::string::npos) {
        out += value[k];
      } else if (e == 'u') {
        unsigned code = hex4();
        if (code >= 0xd800 && code < 0xdc00) {  // a high surrogate: its low half must follow
          if (!consume("\\u")) fail("unpaired surrogate");
          const unsigned low = hex4();
          if (low < 0xdc00 || low >= 0xe000) fail("unpaired surrogate");
          code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
        }
        append_utf8(out, code);
      } else {
        fail(std::string("unknown escape \\") + e);
      }
    }
  }

  const std::string& s_;
  size_t pos_ = 0;
};

}  // namespace

const Value& Value::at(const std::string& key, const std::string& where) const {
  if (kind != Kind::kObject) throw std::invalid_argument(where + ": not a JSON object");
  auto it = object.find(key);
  if (it == object.end()) throw std::invalid_argument(where + ": no \"" + key + "\"");
  return it->second;
}

int64_t Value::as_integer(const std::string& where) const {
  if (kind != Kind::kNumber || !is_integer) throw std::invalid_argument(where + ": not an integer");
  return integer;
}

const std::string& Value::as_string(const std::string& where) const {
  if (kind != Kind::kString) throw std::invalid_argument(where + ": not a string");
  return string;
}

Value parse(const std::string& text) { return Parser(text).document(); }

std::string quote(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          static const char* digits = "0123456789abcdef";
          out += "\\u00";
          out += digits[(c >> 4) & 0xf];
          out += digits[c & 0xf];
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

}  // namespace shardwise::json
