// Runs the real qwen3-train binary and captures its exit code, stdout and stderr.
#pragma once
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "dat_test_util.h"
#include "build_paths.h"

namespace qwen3::test {

struct CliResult {
  int code = -1;
  std::string out;
  std::string err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A shell command line, as-is (quote paths with spaces yourself).
inline CliResult run_shell(const std::string& command) {
  TempDir dir;
  const std::string err_path = dir.file("stderr");
  const std::string cmd = command + " 2>" + err_path;
  CliResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.err = slurp(err_path);
  return r;
}

// `args` is appended to the binary path as-is.
inline CliResult run_cli(const std::string& args) { return run_shell(test::binary_command() + " " + args); }

}  // namespace qwen3::test
