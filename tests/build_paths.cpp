#include "build_paths.h"

namespace qwen3::test {

const std::string& source_dir() {
  static const std::string dir = QWEN3_SOURCE_DIR;
  return dir;
}

const std::string& binary_command() {
  static const std::string command = QWEN3_BINARY;
  return command;
}

}  // namespace qwen3::test
