// Bounds for JSON read from files (config.json, checkpoint.json, tokenizer.json, safetensors headers): a nesting
// depth past which parsing stops with a clear error (deeply nested input exhausts the stack in parsing, in
// destruction and in dump), and a short excerpt of a value for error messages instead of its whole dump.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

#include "qwen3/base/error.h"

namespace qwen3 {

// Far deeper than any file this tool reads (a tokenizer.json nests about 6 levels).
constexpr int kMaxJsonDepth = 64;

// A parser callback that refuses nesting deeper than kMaxJsonDepth with an Error naming `origin`; `also` runs
// for every event.
template <typename Also>
auto depth_limited(const std::string& origin, Also also) {
  return [origin, also](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) mutable {
    if (depth > kMaxJsonDepth)
      throw Error(origin + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    return also(depth, event, parsed);
  };
}
inline auto depth_limited(const std::string& origin) {
  return depth_limited(origin, [](int, nlohmann::json::parse_event_t, nlohmann::json&) { return true; });
}

// At most 60 characters of a value's JSON text, for messages.
inline std::string json_excerpt(const nlohmann::json& value) {
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return text.size() <= 60 ? text : text.substr(0, 57) + "...";
}

// nlohmann's message without its "[json.exception.type_error.302] " tag: what went wrong, in words.
inline std::string json_error_text(const nlohmann::json::exception& e) {
  const std::string what = e.what();
  const size_t tag_end = what.find("] ");
  return what.rfind("[json.exception.", 0) == 0 && tag_end != std::string::npos ? what.substr(tag_end + 2) : what;
}

// Member `key` of object `j` as a T, or an Error naming `origin`, the field and what it holds instead.
template <typename T>
T json_field(const nlohmann::json& j, const char* key, const std::string& origin, const char* expected) {
  if (!j.is_object() || !j.contains(key)) throw Error(origin + ": field \"" + key + "\" is missing");
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw Error(origin + ": field \"" + key + "\" must be " + expected + ", got " + json_excerpt(j.at(key)));
  }
}

}  // namespace qwen3
