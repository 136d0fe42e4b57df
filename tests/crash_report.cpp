// A crash of the test process names the test and where it was. Without it a SIGSEGV loses the test's name
// (ctest --gtest_brief, stdout buffered into a pipe) and its place: the second GPU round (H200, 2026-11-26)
// stopped every test process at its first child process with "Segmentation fault" and nothing else, and a
// backtrace taken at the fault ends at once when the program counter is 0 (a call through a null pointer, or a
// signal handler returning nowhere): the caller is then only in the word at the stack pointer, which this report
// prints beside the backtrace.
//
// Installed before main (a static object): SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT, on an alternate stack,
// one-shot; after the report the signal is raised again with its default action, so the exit status is what it
// would have been. Children (fork) inherit it. What a handler may safely call is little; a crashing process is
// past caring, and the report uses write(2), backtrace and dladdr, and demangles names only where it can.
#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

char current_test[512] = "(no test running)";

class TestNameKeeper : public ::testing::EmptyTestEventListener {
  void OnTestStart(const ::testing::TestInfo& info) override {
    std::snprintf(current_test, sizeof current_test, "%s.%s", info.test_suite_name(), info.name());
  }
  void OnTestEnd(const ::testing::TestInfo&) override {
    std::snprintf(current_test, sizeof current_test, "(between tests)");
  }
};

void say(const char* text) {
  const size_t n = std::strlen(text);
  for (size_t done = 0; done < n;) {
    const ssize_t w = ::write(STDERR_FILENO, text + done, n - done);
    if (w <= 0) return;
    done += static_cast<size_t>(w);
  }
}

// "module+0xoffset (symbol+0xoffset)": the module offset is what addr2line or nm take for a PIE.
void describe(const char* label, uintptr_t address) {
  char line[1024];
  Dl_info info{};
  if (address != 0 && ::dladdr(reinterpret_cast<void*>(address), &info) && info.dli_fname) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(info.dli_fbase);
    const size_t module_offset = static_cast<size_t>(address - base);
    char* demangled = nullptr;
    int status = -1;
    if (info.dli_sname && info.dli_saddr) {
      demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
      const size_t symbol_offset = static_cast<size_t>(address - reinterpret_cast<uintptr_t>(info.dli_saddr));
      std::snprintf(line, sizeof line, "  %s 0x%zx: %s+0x%zx (%s+0x%zx)\n", label, static_cast<size_t>(address),
                    info.dli_fname, module_offset, status == 0 && demangled ? demangled : info.dli_sname,
                    symbol_offset);
    } else {  // a symbol the module does not export: nm or addr2line on the module offset names it
      std::snprintf(line, sizeof line, "  %s 0x%zx: %s+0x%zx\n", label, static_cast<size_t>(address),
                    info.dli_fname, module_offset);
    }
    std::free(demangled);
  } else {
    std::snprintf(line, sizeof line, "  %s 0x%zx: in no loaded module\n", label, static_cast<size_t>(address));
  }
  say(line);
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGILL: return "SIGILL";
    case SIGFPE: return "SIGFPE";
    case SIGABRT: return "SIGABRT";
  }
  return "signal";
}

void on_fatal_signal(int sig, siginfo_t* info, void* context) {
  std::fflush(stdout);  // gtest's lines so far, in order before the report
  char line[768];
  std::snprintf(line, sizeof line, "\nqwen3_tests: fatal %s (si_code %d, address %p) in test %s, pid %d\n",
                signal_name(sig), info->si_code, info->si_addr, current_test, static_cast<int>(::getpid()));
  say(line);
#if defined(__x86_64__)
  const auto* uc = static_cast<const ucontext_t*>(context);
  const uintptr_t pc = static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
  const uintptr_t sp = static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RSP]);
  describe("pc", pc);
  // At a fault on the first instruction of a callee (pc 0 from a null call) this is the caller's return address.
  if (sp != 0 && sp % sizeof(uintptr_t) == 0) describe("[sp]", *reinterpret_cast<const uintptr_t*>(sp));
#elif defined(__aarch64__)
  const auto* uc = static_cast<const ucontext_t*>(context);
  describe("pc", static_cast<uintptr_t>(uc->uc_mcontext.pc));
  describe("lr", static_cast<uintptr_t>(uc->uc_mcontext.regs[30]));  // the caller, at a fault on entry
#else
  (void)context;
#endif
  say("  backtrace:\n");
  void* frames[64];
  const int depth = ::backtrace(frames, 64);
  for (int i = 0; i < depth; ++i) describe("frame", reinterpret_cast<uintptr_t>(frames[i]));
  ::raise(sig);  // SA_RESETHAND: the default action now
}

struct CrashReportInstaller {
  CrashReportInstaller() {
    static char alternate_stack[1 << 16];
    stack_t ss{};
    ss.ss_sp = alternate_stack;
    ss.ss_size = sizeof alternate_stack;
    ::sigaltstack(&ss, nullptr);
    struct sigaction sa {};
    sa.sa_sigaction = on_fatal_signal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) ::sigaction(sig, &sa, nullptr);
    ::testing::UnitTest::GetInstance()->listeners().Append(new TestNameKeeper);
  }
};
const CrashReportInstaller installer;

}  // namespace
