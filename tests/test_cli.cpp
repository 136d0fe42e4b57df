// The command line as users meet it: help, version, exit codes and one-line errors, and `inspect`.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <utility>

#include "cli_test_util.h"
#include "build_paths.h"

namespace qwen3 {
namespace {

using test::run_cli;

TEST(Cli, HelpAndVersion) {
  auto r = run_cli("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("inspect"), std::string::npos);
  r = run_cli("inspect --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--json"), std::string::npos);
  r = run_cli("--version");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("qwen3-train 0."), std::string::npos);
}

TEST(Cli, UsageErrorsExitWithTwoAndNameTheFlag) {
  auto r = run_cli("");
  EXPECT_EQ(r.code, 2);
  r = run_cli("frobnicate");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("unknown command 'frobnicate' (commands: smoke, train,"), std::string::npos) << r.err;
  r = run_cli("--log-level warn frobnicate x");
  EXPECT_NE(r.err.find("unknown command 'frobnicate'"), std::string::npos) << r.err;
  r = run_cli("inspect x.dat --no-such-flag");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--no-such-flag"), std::string::npos) << r.err;
  r = run_cli("inspect");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("FILE"), std::string::npos) << r.err;
  r = run_cli("--log-level loud inspect x.dat");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--log-level"), std::string::npos) << r.err;
  r = run_cli("train --weights w.dat --config c.json --tokenizer t.json --train-data d.txt --steps 1 --compute-dtype float16");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--compute-dtype"), std::string::npos) << r.err;
}

// An unknown flag names itself and what it most likely meant: a Hugging Face / TRL habit, a snake_case spelling, a
// typo; nothing when nothing is close. A YAML --config-file is refused as such.
TEST(Cli, UnknownFlagsSuggestTheNearestFlag) {
  const std::string train = "train --weights w.dat --config c.json --tokenizer t.json --train-data d.txt ";
  const std::pair<const char*, const char*> cases[] = {
      {"--learning-rate 1e-4", "--learning-rate is not a flag of train; did you mean --lr?"},
      {"--max-steps 3", "--max-steps is not a flag of train; did you mean --steps?"},
      {"--per-device-train-batch-size 2", "did you mean --batch-size?"},
      {"--gradient_accumulation_steps 4", "did you mean --grad-accum-steps?"},
      {"--weight_decay 0.1", "--weight_decay is not a flag of train; did you mean --weight-decay?"},
      {"--seq-lne 64", "did you mean --seq-len?"},
      {"--bf16", "did you mean --compute-dtype bfloat16?"},
  };
  for (const auto& [flag, message] : cases) {
    const auto r = run_cli(train + flag);
    EXPECT_EQ(r.code, 2) << flag;
    EXPECT_NE(r.err.find(message), std::string::npos) << flag << ": " << r.err;
  }
  auto r = run_cli(train + "--frobnicate 1");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--frobnicate is not a flag of train\n"), std::string::npos) << r.err;
  r = run_cli("inspect x.dat --jsn");
  EXPECT_NE(r.err.find("--jsn is not a flag of inspect; did you mean --json?"), std::string::npos) << r.err;
  test::TempDir dir;
  std::ofstream(dir.file("run.yaml")) << "lr: 0.1\n";
  r = run_cli(train + "--config-file " + dir.file("run.yaml"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--config-file reads TOML, not yaml"), std::string::npos) << r.err;
}

TEST(Cli, RuntimeErrorsAreOneLineWithExitOne) {
  test::TempDir dir;
  auto r = run_cli(dir.file("missing.dat"));
  EXPECT_EQ(r.code, 2);  // not a subcommand
  r = run_cli("inspect " + dir.file("missing.dat"));
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("missing.dat"), std::string::npos);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;

  auto bytes = test::build_dat(test::sample_entries());
  bytes[bytes.size() / 2] = 0xFF;  // usually breaks a header; if not, truncation below does
  bytes.resize(bytes.size() - 3);
  test::write_file(dir.file("bad.dat"), bytes);
  r = run_cli("inspect " + dir.file("bad.dat"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("bad.dat"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("byte"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << "no partial listing on failure";
}

TEST(Cli, InspectPrintsTableAndJson) {
  test::TempDir dir;
  const auto entries = test::sample_entries();
  test::write_file(dir.file("m.dat"), test::build_dat(entries));
  auto r = run_cli("inspect " + dir.file("m.dat"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("model.layers.0.self_attn.q_proj.weight.qdata"), std::string::npos);
  EXPECT_NE(r.out.find("float8_e4m3fn"), std::string::npos);
  EXPECT_NE(r.out.find("nvfp4 pairs: 1"), std::string::npos) << r.out;

  r = run_cli("inspect --json " + dir.file("m.dat"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["entry_count"], entries.size());
  ASSERT_EQ(j["entries"].size(), entries.size());
  const auto& q = j["entries"][1];
  EXPECT_EQ(q["key"], "model.layers.0.self_attn.q_proj.weight.qdata");
  EXPECT_EQ(q["elem_type"], 0);
  EXPECT_EQ(q["shape"], nlohmann::json::array({4, 16}));
  EXPECT_EQ(q["nbytes"], 64);
  // Offsets point at the payload: the first entry's payload follows its header.
  const auto& e0 = j["entries"][0];
  EXPECT_EQ(e0["offset"], 1 + 1 + 25 + 1 + 1 + 1 + 1);
  EXPECT_EQ(j["nvfp4_pairs"], 1);
  // 8*16 embed + 4*32 unpacked codes + 16 norm + 3 counts + 1 scalar
  EXPECT_EQ(j["parameters"], 128 + 128 + 16 + 3 + 1);
}


// Messages name the cause in a line: a range error quotes the value (not DBL_MAX's 309 digits), a learning rate
// of 1e300 is a usage error, a directory given as a file says so, a file that cannot be opened gives the OS's
// reason, and a checkpoint.json field of the wrong type is named.
TEST(Cli, MessagesNameTheirCauseBriefly) {
  test::TempDir dir;
  auto r = run_cli("train --lr -1");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--lr: must be at least 0, got '-1'"), std::string::npos) << r.err;
  EXPECT_LT(r.err.size(), 200u) << r.err;
  r = run_cli("train --steps -3");
  EXPECT_LT(r.err.size(), 200u) << r.err;
  r = run_cli("train --lr 1e30");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--lr: must be at most 1"), std::string::npos) << r.err;
  r = run_cli("train --grad-clip 1e39");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("float32's range"), std::string::npos) << r.err;
  r = run_cli("train --beta2 1");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("must be in [0, 1)"), std::string::npos) << r.err;
  r = run_cli("tokenize --tokenizer " + dir.path().string() + " --text hi");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("tokenizer " + dir.path().string() + ": is a directory, not a file"), std::string::npos) << r.err;
  r = run_cli("generate --weights w.dat --config " + dir.file("none.json") + " --prompt-ids 1 --print-ids");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("none.json: cannot open (No such file or directory)"), std::string::npos) << r.err;
}

// A FIFO or a device given as an input is refused at once, named as what it is: opening a FIFO without a writer
// blocked (train and convert hung there), and /dev/zero never ends. `timeout` turns a hang into exit 124.
TEST(Cli, FifosAndDevicesAreRefusedNotWaitedOn) {
  test::TempDir dir;
  const std::string fifo = dir.file("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ASSERT_EQ(run_cli("synth --preset tiny --out-dir " + dir.file("m")).code, 0);
  const auto run = [](const std::string& args) { return test::run_shell("timeout 60 " + test::binary_command() + " " + args); };
  auto r = run("inspect " + fifo);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find(fifo + ": is a FIFO (a pipe), not a regular file"), std::string::npos) << r.err;
  r = run("tokenize --tokenizer " + fifo + " --text hi");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("tokenizer " + fifo + ": is a FIFO (a pipe), not a regular file"), std::string::npos) << r.err;
  const std::string train = "train --model-dir " + dir.file("m") + " --tokenizer " + test::tiny_tokenizer_path() +
                            " --steps 1 --train-data ";
  for (const std::string& data : {fifo, std::string("/dev/zero")}) {
    r = run(train + data);
    EXPECT_EQ(r.code, 1) << data << ": " << r.err;
    EXPECT_NE(r.err.find(data + ": is a " + (data == fifo ? "FIFO (a pipe)" : "character device") +
                         ", not a regular file"),
              std::string::npos)
        << r.err;
  }
  std::ofstream(dir.file("pairs.tsv")) << "hi\tworld\n";
  r = run("train --weights " + fifo + " --config " + dir.file("m/config.json") + " --tokenizer " +
          test::tiny_tokenizer_path() + " --steps 1 --train-data " + dir.file("pairs.tsv"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("is a FIFO (a pipe)"), std::string::npos) << r.err;
  // A Hugging Face folder whose shard is a FIFO.
  std::filesystem::create_directories(dir.file("hf"));
  std::filesystem::copy_file(dir.file("m/config.json"), dir.file("hf/config.json"));
  ASSERT_EQ(::mkfifo(dir.file("hf/model.safetensors").c_str(), 0600), 0);
  r = run("convert --hf-dir " + dir.file("hf") + " --out " + dir.file("c.dat"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("model.safetensors: is a FIFO (a pipe), not a regular file"), std::string::npos) << r.err;
}

// Results that cannot be written (a full device) are an error, exit 1, not a silent success.
TEST(Cli, AFullDeviceIsAnErrorNotASuccess) {
  const std::string tokenize = "tokenize --tokenizer " + test::tiny_tokenizer_path() + " --text 'hello world'";
  auto r = test::run_cli(tokenize + " >/dev/null");
  EXPECT_EQ(r.code, 0) << r.err;
  r = test::run_cli(tokenize + " >/dev/full");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("cannot write the results to standard output"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace qwen3
