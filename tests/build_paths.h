// Where the tests find the checkout and the binary. Defined in build_paths.cpp, the one translation unit compiled
// with those paths: as definitions on every test file they differ per clone, and each CI run (a fresh clone)
// missed ccache on the whole suite.
#pragma once
#include <string>

namespace qwen3::test {

// The source tree's root (absolute).
const std::string& source_dir();
// The command that starts qwen3-train (its absolute path; in a cross build, behind the emulator).
const std::string& binary_command();

// The hand-made tokenizer of tests/data (no download needed), which the tiny test models are sized to.
inline std::string tiny_tokenizer_path() { return source_dir() + "/tests/data/tiny_tokenizer.json"; }

}  // namespace qwen3::test
