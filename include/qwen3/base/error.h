// The two kinds of failure the program reports. `UsageError` is a bad flag or value (exit code 2);
// `Error` is everything found at run time (exit code 1): a bad file, key, offset, config or dataset line.
// Messages name what and where, so the CLI can print them as one `error: ...` line.
#pragma once
#include <stdexcept>
#include <string>

namespace qwen3 {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class UsageError : public Error {
 public:
  using Error::Error;
};

}  // namespace qwen3
