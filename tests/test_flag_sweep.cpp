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
#include <filesystem>
#include <fcntl.h>
#include <sys/stat.h>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command_line.h"
#include "build_paths.h"
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

// The input sweep: every file a command reads, given as what a careless user gives (nothing there, a folder, a
// FIFO, an empty file, binary garbage, truncated JSON). Each is one `error:` line that names the file, exit 1 or
// 2; never a hang (the probe's alarm), a signal, or a library's own text. The other inputs of each probe are
// good ones, so the probed file is the one that fails. Children run with --threads 1: ATen enters no OpenMP
// region after the fork.
TEST(FlagSweepCli, EveryInputFileIsCheckedBeforeUse) {
  test::TempDir dir;
  const auto run = [&](const std::string& line) {
    std::vector<std::string> args = {"--threads", "1", "--log-level", "warn"};
    std::istringstream in(line);
    for (std::string word; in >> word;) args.push_back(word);
    return probe(args);
  };
  const std::string m = dir.file("m"), tok = test::tiny_tokenizer_path(), ck = dir.file("ck");
  ASSERT_EQ(run("synth --preset tiny --out-dir " + m).code, 0);
  std::ofstream(dir.file("pairs.tsv")) << "hi\tworld\nname?\tqwen\n";
  std::ofstream(dir.file("ids.txt")) << "1 2 3 4\n";
  const std::string weights = m + "/model.dat", config = m + "/config.json";
  const ProbeResult trained = run("train --weights " + weights + " --config " + config + " --tokenizer " + tok +
                                  " --train-data " + dir.file("pairs.tsv") + " --steps 1 --seq-len 16 --checkpoint-dir " +
                                  ck + " --metrics-jsonl " + dir.file("metrics.jsonl"));
  ASSERT_EQ(trained.code, 0) << trained.err;
  const ProbeResult dense = run("synth --preset tiny --dense --out-dir " + dir.file("dense"));
  ASSERT_EQ(dense.code, 0) << dense.err;

  // The hostile files.
  std::filesystem::create_directories(dir.file("a-folder"));
  ASSERT_EQ(::mkfifo(dir.file("a-fifo").c_str(), 0600), 0);
  std::ofstream(dir.file("empty"));
  std::string garbage;
  for (int i = 0; i < 256; ++i) garbage += std::string("\xff\xfe\x00\x80garbage\x81\n", 13);
  std::ofstream(dir.file("garbage"), std::ios::binary) << garbage;
  std::ofstream(dir.file("truncated")) << "{\"model\": {\"vocab\": [";
  const std::vector<std::string> hostile = {dir.file("missing"), dir.file("a-folder"), dir.file("a-fifo"),
                                            dir.file("empty"), dir.file("garbage"), dir.file("truncated")};

  // Each command line with {} where the probed file goes.
  const std::string model = " --weights " + weights + " --config " + config;
  const std::string train = "train" + model + " --tokenizer " + tok + " --train-data " + dir.file("pairs.tsv") +
                            " --steps 1 --seq-len 16";
  const std::vector<std::string> lines = {
      "inspect {}",
      "tokenize --tokenizer {} --text hi",
      "tokenize --tokenizer " + tok + " --file {}",  // an empty file and a text line are inputs (below)
      "tokenize --tokenizer " + tok + " --chat {}",
      "tokenize --tokenizer " + tok + " --tokenizer-config {} --chat " + dir.file("pairs.tsv"),
      "generate --weights {} --config " + config + " --tokenizer " + tok + " --prompt hi --max-new-tokens 1",
      "generate --weights " + weights + " --config {} --tokenizer " + tok + " --prompt hi --max-new-tokens 1",
      "generate" + model + " --tokenizer {} --prompt hi --max-new-tokens 1",
      "generate" + model + " --tokenizer " + tok + " --tokenizer-config {} --prompt hi --max-new-tokens 1",
      "eval" + model + " --tokenizer " + tok + " --data {}",
      "eval" + model + " --token-ids-file {}",
      "train --weights {} --config " + config + " --tokenizer " + tok + " --train-data " + dir.file("pairs.tsv") +
          " --steps 1",
      "train --weights " + weights + " --config {} --tokenizer " + tok + " --train-data " + dir.file("pairs.tsv") +
          " --steps 1",
      "train" + model + " --tokenizer {} --train-data " + dir.file("pairs.tsv") + " --steps 1",
      "train" + model + " --tokenizer " + tok + " --train-data {} --steps 1",
      train + " --eval-data {}",
      train + " --tokenizer-config {}",
      "train --config-file {}",
      "vram-report --predict-only --config {}",
      "synth --config {} --out-dir " + dir.file("synth-out"),
      "quantize --in {} --out " + dir.file("q.dat"),
      "export --checkpoint {} --weights " + weights + " --out " + dir.file("x.dat"),
      "export --checkpoint " + ck + " --weights {} --out " + dir.file("x.dat"),
      "export --format hf --checkpoint " + ck + " --weights " + weights + " --config {} --out " + dir.file("hf") +
          " --overwrite",
      "export --format hf --checkpoint " + ck + " --weights " + weights + " --tokenizer {} --out " + dir.file("hf") +
          " --overwrite",
      "convert --hf-dir {} --out " + dir.file("c.dat"),
      "plot {} --out " + dir.file("p.svg"),
  };
  // What is no hostile input there: a file of inputs may be empty or hold any line, a chat file may hold no
  // record, and an empty TOML file gives no flag (the command then asks for its own).
  const std::set<std::pair<std::string, std::string>> fine = {
      {lines[2], dir.file("empty")}, {lines[2], dir.file("truncated")}, {lines[3], dir.file("empty")},
      {"train --config-file {}", dir.file("empty")}};
  size_t probes = 0;
  for (const std::string& line : lines)
    for (const std::string& file : hostile) {
      if (fine.count({line, file})) continue;
      std::string command = line;
      command.replace(command.find("{}"), 2, file);
      const ProbeResult r = run(command);
      ++probes;
      const std::string what = command.substr(0, command.find(' ')) + " with " + file + ": " + r.err;
      EXPECT_TRUE(r.code == 1 || r.code == 2) << "exit " << r.code << ": " << what;
      size_t error_lines = 0;
      std::istringstream err(r.err);
      for (std::string l; std::getline(err, l);) error_lines += l.rfind("error:", 0) == 0;
      EXPECT_EQ(error_lines, 1u) << what;
      const std::string name = std::filesystem::path(file).filename().string();
      EXPECT_NE(r.err.find(name), std::string::npos) << "the file is not named: " << what;
      for (const char* raw : {"json.exception", "terminate", "what()", "filesystem error", "std::", "basic_string"})
        EXPECT_EQ(r.err.find(raw), std::string::npos) << what;
    }
  RecordProperty("probes", static_cast<int>(probes));
}

}  // namespace
}  // namespace qwen3
