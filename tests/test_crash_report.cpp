// The test process's crash report (crash_report.cpp): a fatal signal names the running test and, when the
// program counter is 0, the caller through the word at the stack pointer.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>

namespace qwen3::test {

// External linkage and never inlined: the report's [sp] line must point into this function's body.
__attribute__((noinline)) int call_through(int (*volatile target)()) {
  const int r = target();  // the call whose return address the report reads
  return r + 1;            // work after the call: no tail call, the return address stays here
}

namespace {

TEST(CrashReport, NamesTheTestAndTheCallerOfANullCall) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  std::fflush(stdout);  // the child would write gtest's buffered lines a second time
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::dup2(fds[1], STDERR_FILENO);
    ::close(fds[0]);
    int (*volatile null_target)() = nullptr;
    std::_Exit(call_through(null_target));
  }
  ::close(fds[1]);
  std::string report;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) report.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  // The default action ran after the report: the exit status is the signal's.
  ASSERT_TRUE(WIFSIGNALED(status)) << report;
  EXPECT_EQ(WTERMSIG(status), SIGSEGV);
  EXPECT_NE(report.find("fatal SIGSEGV"), std::string::npos) << report;
  EXPECT_NE(report.find("in test CrashReport.NamesTheTestAndTheCallerOfANullCall"), std::string::npos) << report;
#if defined(__x86_64__)
  EXPECT_NE(report.find("pc 0x0: in no loaded module"), std::string::npos) << report;
  // "[sp] 0x...: MODULE+0xOFFSET (...)": the offset lies within call_through, in this executable.
  Dl_info self{};
  ASSERT_NE(::dladdr(reinterpret_cast<void*>(&call_through), &self), 0);
  const uintptr_t start = reinterpret_cast<uintptr_t>(&call_through) - reinterpret_cast<uintptr_t>(self.dli_fbase);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(report, m, std::regex(R"(\[sp\] 0x[0-9a-f]+: (\S*)\+0x([0-9a-f]+)\n)"))) << report;
  const uintptr_t offset = std::stoull(m[2].str(), nullptr, 16);
  EXPECT_GT(offset, start) << report;
  EXPECT_LT(offset, start + 64) << report;  // a return address a few instructions into the function
#endif
}

}  // namespace
}  // namespace qwen3::test
