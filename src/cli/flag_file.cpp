// TOML files of flags (flag_file.h), with toml++ (header-only here: this is its one translation unit).
#include "flag_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "qwen3/base/error.h"
#include "qwen3/base/file_io.h"

#define TOML_HEADER_ONLY 1
#define TOML_EXCEPTIONS 1
#include <toml++/toml.h>

namespace qwen3::cli {
namespace {

// The text a flag takes for one TOML value; empty optional for what no flag takes.
std::optional<std::string> flag_text(const toml::node& node) {
  if (const auto* s = node.as_string()) return s->get();
  if (const auto* i = node.as_integer()) return std::to_string(i->get());
  if (const auto* d = node.as_floating_point()) return fmt::format("{}", d->get());  // shortest text that reads back
  if (const auto* b = node.as_boolean()) return std::string(b->get() ? "true" : "false");
  return std::nullopt;
}

// A line that reads as YAML's "key: value" is the likeliest reason a flags file is not TOML.
bool looks_like_yaml(const std::string& text) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    const size_t colon = line.find(": "), equals = line.find('=');
    if (colon != std::string::npos && (equals == std::string::npos || colon < equals)) return true;
  }
  return false;
}

}  // namespace

std::vector<FlagFileEntry> read_flag_file(const std::string& path,
                                          const std::function<bool(const std::string&)>& is_path_flag) {
  std::ifstream in = open_input_file(path, "--config-file");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  toml::table table;
  try {
    table = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    throw UsageError(fmt::format("{}:{}:{}: not TOML: {}{}", path, where.line, where.column, e.description(),
                                 looks_like_yaml(text) ? " (this looks like YAML; --config-file reads TOML: "
                                                         "seq-len = 48, train-data = \"chat.jsonl\")"
                                                       : ""));
  }
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  std::vector<FlagFileEntry> entries;
  for (const auto& [key, node] : table) {
    FlagFileEntry entry;
    entry.flag = std::string(key.str());
    std::replace(entry.flag.begin(), entry.flag.end(), '_', '-');
    entry.line = static_cast<int64_t>(node.source().begin.line);
    const std::string where = fmt::format("{}:{}: {}", path, entry.line, entry.flag);
    if (node.is_table())
      throw UsageError(fmt::format("{}:{}: [{}]: sections are not read; write the flags at the top", path, entry.line,
                                   key.str()));
    if (const auto* array = node.as_array()) {
      for (const toml::node& element : *array) {
        const auto value = flag_text(element);
        if (!value) throw UsageError(where + ": an array of strings, numbers or booleans is expected");
        entry.values.push_back(*value);
      }
    } else {
      const auto value = flag_text(node);
      if (!value) throw UsageError(where + ": a string, number or boolean is expected (dates are no flag's value)");
      entry.values.push_back(*value);
    }
    if (is_path_flag && is_path_flag(entry.flag))
      for (std::string& value : entry.values)
        if (!value.empty() && std::filesystem::path(value).is_relative()) value = (folder / value).lexically_normal().string();
    entries.push_back(std::move(entry));
  }
  // toml++ keeps a table's keys sorted; the file's order is what a reader of the messages expects.
  std::stable_sort(entries.begin(), entries.end(),
                   [](const FlagFileEntry& a, const FlagFileEntry& b) { return a.line < b.line; });
  return entries;
}

}  // namespace qwen3::cli
