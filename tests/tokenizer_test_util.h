// Shared by the tokenizer tests: where the tokenizer files are, loaded once per test program.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "qwen3/tokenizer/tokenizer.h"
#include "build_paths.h"

namespace qwen3::test {

inline std::string tokenizer_fixture_path() {
  return test::source_dir() + "/tests/data/tokenizer_fixture.json";
}

// The real Qwen3 tokenizer.json: $QWEN3_TOKENIZER_JSON, else where scripts/fetch-tokenizer.sh puts it.
inline std::string real_tokenizer_path() {
  if (const char* env = std::getenv("QWEN3_TOKENIZER_JSON"); env && *env) return env;
  return test::source_dir() + "/.deps/tokenizer-qwen3/models/tokenizer.json";
}

inline const Tokenizer& tiny_tokenizer() {
  static const Tokenizer t = Tokenizer::from_file(tiny_tokenizer_path());
  return t;
}

// Null when the file is not there (the caller skips).
inline const Tokenizer* real_tokenizer() {
  static const Tokenizer* t = std::filesystem::exists(real_tokenizer_path())
                                  ? new Tokenizer(Tokenizer::from_file(real_tokenizer_path()))
                                  : nullptr;
  return t;
}

#define QWEN3_REQUIRE_REAL_TOKENIZER(var)                                                                    \
  const ::qwen3::Tokenizer* var = ::qwen3::test::real_tokenizer();                                            \
  if (!var)                                                                                                  \
  GTEST_SKIP() << "the real Qwen3 tokenizer.json is not at " << ::qwen3::test::real_tokenizer_path()        \
               << " (run scripts/fetch-tokenizer.sh, or set QWEN3_TOKENIZER_JSON)"

}  // namespace qwen3::test
