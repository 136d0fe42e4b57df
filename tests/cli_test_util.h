// Runs the real qwen3-train binary and captures its exit code, stdout and stderr.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
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

// A shell command line, as-is (quote paths with spaces yourself), run by /bin/sh in a forked child. In the second
// GPU round (H200, PyTorch 2.11, Ubuntu 24.04, 2026-11-26) every test process died of SIGSEGV at pc 0 in the first
// test that made a TempDir and started a child through popen (glibc's posix_spawn). The likelier cause is the
// TempDir's std::filesystem calls bound to libtorch's exported copies (cmake/Dependencies.cmake, LinkOrder tests);
// until a GPU round says which (gpu-check's spawn probe tries each step), children start by fork and exec, the
// path the tests that fork already take, with no posix_spawn involved.
inline CliResult run_shell(const std::string& command) {
  TempDir dir;
  const std::string cmd = command + " 2>" + dir.file("stderr");
  CliResult r;
  int fds[2];
  if (::pipe(fds) != 0) return r;
  std::fflush(nullptr);  // nothing buffered here is written twice
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return r;
  }
  if (pid == 0) {  // only async-signal-safe calls until exec: the parent may have threads
    ::dup2(fds[1], STDOUT_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(fds[1]);
  std::array<char, 4096> buf;
  for (ssize_t n; (n = ::read(fds[0], buf.data(), buf.size())) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    r.out.append(buf.data(), static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.err = slurp(dir.file("stderr"));
  return r;
}

// Whether a shell command succeeds (a tool is installed, a Python module imports), its output discarded.
inline bool command_succeeds(const std::string& command) { return run_shell(command + " >/dev/null").code == 0; }

// `args` is appended to the binary path as-is.
inline CliResult run_cli(const std::string& args) { return run_shell(test::binary_command() + " " + args); }

}  // namespace qwen3::test
