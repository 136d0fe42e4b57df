// Options as types: the enumerator a flag's text names, by the enum's own to_string (found by argument-dependent
// lookup), so each enum spells its names once. A name that is none of them is a UsageError listing the choices.
#pragma once
#include <cstddef>
#include <string>

#include "qwen3/base/error.h"

namespace qwen3 {

template <typename E, size_t N>
E enum_from_name(const std::string& name, const E (&all)[N], const std::string& what) {
  std::string choices;
  for (size_t i = 0; i < N; ++i) {
    if (name == to_string(all[i])) return all[i];
    choices += (i == 0 ? "" : (i + 1 == N ? " or " : ", ")) + std::string(to_string(all[i]));
  }
  throw UsageError("unknown " + what + " '" + name + "' (" + choices + ")");
}

}  // namespace qwen3
