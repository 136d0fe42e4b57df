// The probe sweep over every command's numeric flags (issue 30's hostile-input rounds, kept as a test): each
// command's --help is read for its flags and their types, and every integer and floating-point flag is given the
// values a careless or hostile user gives (past its type, past its range, empty, a fraction, an exponent, NaN).
// Each must be a usage error (exit 2) on one line that names the flag; the bounds themselves must be accepted.
// A new integer flag without a range (CLI11's own conversion saturates "99999999999999999999") fails the sweep.
//
// Each probe runs the program's entry (command_line.h) in a forked child: a process of the binary costs 0.5 s of
// libtorch start-up and the sweep is ~500 probes. The children only parse flags (no tensor op runs), so forking
// a process whose libtorch may hold thread pools is safe here.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command_line.h"
#include "dat_test_util.h"

namespace qwen3 {
namespace {

struct ProbeResult {
  int code = -1;  // the exit code, or 128 + the signal that ended the child
  std::string out, err;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ProbeResult probe(const std::vector<std::string>& args) {
  test::TempDir dir;
  const std::string out_path = dir.file("out"), err_path = dir.file("err");
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(20);  // a probe that got past parsing and started work ends here, and fails the test
    if (::chdir(dir.path().c_str()) != 0) ::_exit(99);  // and what it wrote lands in the probe's own folder
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(out, 1);
    ::dup2(err, 2);
    std::vector<std::string> argv_text = {"qwen3-train"};
    argv_text.insert(argv_text.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_text) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int code = cli::run_command_line(static_cast<int>(argv_text.size()), argv.data());
    std::fflush(stdout);
    std::fflush(stderr);
    ::_exit(code);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ProbeResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(out_path);
  r.err = read_file(err_path);
  return r;
}

// A numeric flag as --help shows it: "  --seq-len INT:[1, 1048576]=256   tokens per row".
struct NumericFlag {
  std::string command, name, type, rule;  // type INT, UINT or FLOAT; rule: what follows the type's ':'
};

std::vector<std::string> commands() {
  const ProbeResult help = probe({"--help"});
  std::vector<std::string> names;
  std::istringstream in(help.out);
  bool listing = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("Subcommands:", 0) == 0) {
      listing = true;
      continue;
    }
    std::smatch m;
    if (listing && std::regex_search(line, m, std::regex("^  ([a-z][a-z-]*)\\s"))) names.push_back(m[1]);
  }
  return names;
}

std::vector<NumericFlag> numeric_flags(const std::string& command) {
  const ProbeResult help = probe({command, "--help"});
  EXPECT_EQ(help.code, 0) << command;
  std::vector<NumericFlag> flags;
  // Names, one space, TYPE, then an integer's range as ":[lo, hi]" (integer_in's name in cli_common.cpp).
  const std::regex line_rule("^\\s+(?:-\\w,)?(--[\\w-]+)(?:,--[\\w-]+)* (INT|UINT|FLOAT)(?::(\\[-?\\d+, -?\\d+\\]))?");
  std::istringstream in(help.out);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, line_rule)) flags.push_back({command, m[1], m[2], m[3]});
  }
  return flags;
}

// The values a flag of this type and rule must refuse, and the ones (its bounds) it must take.
struct Values {
  std::vector<std::string> refused, accepted;
};

Values values_for(const NumericFlag& flag) {
  Values v;
  if (flag.type == "FLOAT") {
    v.refused = {"nan", "inf", "-inf", "1e999", "", "abc"};
    return v;
  }
  v.refused = {"99999999999999999999", "-99999999999999999999", "", "1.5", "1e3", "2^64", "abc"};
  if (flag.type == "UINT") {
    v.refused.insert(v.refused.end(), {"-1", "18446744073709551616"});
    v.accepted = {"0", "18446744073709551615"};
    return v;
  }
  std::smatch m;
  if (std::regex_match(flag.rule, m, std::regex("\\[(-?\\d+), (-?\\d+)\\]"))) {
    const long long lo = std::stoll(m[1]), hi = std::stoll(m[2]);
    v.refused.push_back(std::to_string(lo - 1));
    v.refused.push_back(std::to_string(hi + 1));
    v.accepted = {std::to_string(lo), std::to_string(hi)};
  }
  return v;
}

// A refusal is exit 2 with one `error:` line naming the flag and no library text.
void expect_refused(const NumericFlag& flag, const std::string& value, const ProbeResult& r) {
  const std::string what = flag.command + " " + flag.name + " '" + value + "'";
  EXPECT_EQ(r.code, 2) << what << ": " << r.err;
  EXPECT_NE(r.err.find(flag.name), std::string::npos) << what << ": " << r.err;
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << what << ": " << r.err;
  size_t error_lines = 0;
  std::istringstream in(r.err);
  for (std::string line; std::getline(in, line);) error_lines += line.rfind("error:", 0) == 0;
  EXPECT_EQ(error_lines, 1u) << what << ": " << r.err;
  for (const char* raw : {"terminate", "what()", "Could not convert", "exception"})
    EXPECT_EQ(r.err.find(raw), std::string::npos) << what << ": " << r.err;
}

TEST(FlagSweepCli, EveryNumericFlagRefusesWhatIsNotInItsRange) {
  const std::vector<std::string> names = commands();
  ASSERT_GE(names.size(), 12u);
  size_t flags_seen = 0, probes = 0;
  std::set<std::string> integer_flags;
  for (const std::string& command : names) {
    for (const NumericFlag& flag : numeric_flags(command)) {
      ++flags_seen;
      if (flag.type != "FLOAT") integer_flags.insert(command + " " + flag.name);
      // Every integer flag states its range (an unbounded one is what this sweep exists to catch).
      if (flag.type == "INT") {
        EXPECT_TRUE(std::regex_match(flag.rule, std::regex("\\[-?\\d+, -?\\d+\\]")))
            << command << " " << flag.name << " has no range: '" << flag.rule << "'";
      }
      const Values values = values_for(flag);
      for (const std::string& value : values.refused) {
        expect_refused(flag, value, probe({command, flag.name, value}));
        ++probes;
      }
      // A bound is taken: what fails then (the unknown flag after it, a missing file) is never this flag.
      for (const std::string& value : values.accepted) {
        const ProbeResult r = probe({command, flag.name, value, "--sweep-probe-unknown"});
        EXPECT_EQ(r.code, 2) << command << " " << flag.name << " " << value << ": " << r.err;
        EXPECT_EQ(r.err.find(flag.name + ": "), std::string::npos)
            << command << " " << flag.name << " " << value << ": " << r.err;
        ++probes;
      }
    }
  }
  // The sweep saw the flags it is about (a help format it no longer reads would pass with nothing probed).
  for (const char* expected : {"train --steps", "train --seed", "train --grad-accum-steps", "generate --top-k",
                               "generate --max-new-tokens", "eval --seq-len", "smoke --seed", "vram-report --world-size"})
    EXPECT_EQ(integer_flags.count(expected), 1u) << expected;
  EXPECT_GE(flags_seen, 50u);
  RecordProperty("probes", static_cast<int>(probes));

  // The global --threads, before a command.
  const NumericFlag threads{"", "--threads", "INT", "[1, 4096]"};
  for (const char* value : {"0", "4097", "99999999999999999999", ""})
    expect_refused(threads, value, probe({"--threads", value, "inspect", "x.dat"}));
}

// The same ranges hold for a --config-file's values, named with the file and line.
TEST(FlagSweepCli, ConfigFileValuesAreCheckedAsFlagsAre) {
  test::TempDir dir;
  for (const NumericFlag& flag : numeric_flags("train")) {
    const std::string key = flag.name.substr(2);
    const std::string path = dir.file(key + ".toml");
    std::ofstream(path) << "# probe\n" << key << " = " << (flag.type == "FLOAT" ? "nan" : "1e20") << "\n";
    const ProbeResult r = probe({"train", "--config-file", path});
    EXPECT_EQ(r.code, 2) << key << ": " << r.err;
    EXPECT_NE(r.err.find(path + ":2: " + key + ": must be"), std::string::npos) << key << ": " << r.err;
  }
}

}  // namespace
}  // namespace qwen3
