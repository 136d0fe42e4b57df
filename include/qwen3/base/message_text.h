// Pieces of error messages that several modules build the same way: a shape, and a list of problems found
// before failing (all reported at once, the first dozen spelled out).
#pragma once
#include <c10/core/ScalarType.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include <string>
#include <vector>

namespace qwen3 {

// "[4096, 2560]" for any range of integers (a std::vector<int64_t>, an at::IntArrayRef).
template <typename Dims>
std::string shape_text(const Dims& dims) {
  return fmt::format("[{}]", fmt::join(dims, ", "));
}

// "WHAT (N problems): first; second; ...": at most the first 12 problems, then "...".
inline std::string problems_text(const std::string& what, const std::vector<std::string>& problems) {
  constexpr size_t kShown = 12;
  std::string text = fmt::format("{} ({} problem{}): ", what, problems.size(), problems.size() == 1 ? "" : "s");
  for (size_t i = 0; i < problems.size() && i < kShown; ++i) text += (i ? "; " : "") + problems[i];
  if (problems.size() > kShown) text += "; ...";
  return text;
}

// A tensor dtype as the command line names dtypes ("float32", "bfloat16", "float16"); another by libtorch's name.
inline std::string dtype_text(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Float: return "float32";
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Half: return "float16";
    default: return c10::toString(dtype);
  }
}

}  // namespace qwen3
