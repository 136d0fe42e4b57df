// Output targets: nothing a user saved is replaced unasked, and no command writes over its own inputs
// (include/qwen3/export/output_target.h), through the function and through the commands that write files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>
#include <string>

#include "cli_test_util.h"
#include "qwen3/base/error.h"
#include "qwen3/export/output_target.h"

namespace qwen3 {
namespace {

TEST(OutputTarget, RefusesExistingFilesUnlessAskedAndInputsAlways) {
  test::TempDir dir;
  const std::string in = dir.file("in.dat"), out = dir.file("out.dat");
  std::ofstream(in) << "input";
  EXPECT_NO_THROW(prepare_output_target("--out", out, false, {in}));  // a new file
  std::ofstream(out) << "old";
  EXPECT_THROW(prepare_output_target("--out", out, false, {in}), UsageError);
  EXPECT_NO_THROW(prepare_output_target("--out", out, true, {in}));
  // The input itself, by another spelling, through a symbolic link, through a hard link: never.
  EXPECT_THROW(prepare_output_target("--out", dir.file("./in.dat"), true, {in}), UsageError);
  std::filesystem::create_symlink(in, dir.file("sym.dat"));
  EXPECT_THROW(prepare_output_target("--out", dir.file("sym.dat"), true, {in}), UsageError);
  ASSERT_EQ(::link(in.c_str(), dir.file("hard.dat").c_str()), 0);
  EXPECT_THROW(prepare_output_target("--out", dir.file("hard.dat"), true, {in}), UsageError);
  // Inside a folder being read (a checkpoint), new or not: never. A directory is never a file target.
  std::filesystem::create_directories(dir.file("ckpt/step-3"));
  EXPECT_THROW(prepare_output_target("--out", dir.file("ckpt/step-3/new.dat"), true, {}, {dir.file("ckpt")}), UsageError);
  EXPECT_NO_THROW(prepare_output_target("--out", dir.file("ckpt2.dat"), false, {}, {dir.file("ckpt")}));
  EXPECT_THROW(prepare_output_target("--out", dir.file("ckpt"), true, {}), UsageError);
  // A missing folder is made; one that cannot be is a runtime error (exit 1), before anything runs.
  EXPECT_NO_THROW(prepare_output_target("--out", dir.file("new/sub/out.dat"), false, {}));
  EXPECT_TRUE(std::filesystem::is_directory(dir.file("new/sub")));
  try {
    prepare_output_target("--out", "/proc/qwen3-no-such/out.dat", false, {});
    FAIL();
  } catch (const UsageError&) {
    FAIL() << "a folder that cannot be made is not a usage error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot create its folder"), std::string::npos) << e.what();
  }
  try {
    prepare_output_target("--output-dat", out, false, {});
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--output-dat " + out + " exists; pass --overwrite"), std::string::npos);
  }
}

TEST(OutputTarget, QuantizeAndTrainCheckBeforeTheyStart) {
  test::TempDir dir;
  auto r = test::run_cli("synth --preset tiny --dense --out-dir " + dir.file("m"));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string dense = dir.file("m/model.dat");
  std::ofstream(dir.file("q.dat")) << "precious";
  r = test::run_cli("quantize --in " + dense + " --out " + dir.file("q.dat"));
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(test::slurp(dir.file("q.dat")), "precious");
  r = test::run_cli("quantize --in " + dense + " --out " + dense + " --overwrite");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("is the input file"), std::string::npos) << r.err;
  r = test::run_cli("quantize --in " + dense + " --out " + dir.file("q.dat") + " --overwrite");
  EXPECT_EQ(r.code, 0) << r.err;
  // train: refused at once (before loading anything), the file untouched; the weights never.
  std::ofstream(dir.file("t.dat")) << "precious";
  const std::string train = "train --weights " + dir.file("q.dat") + " --config " + dir.file("m/config.json") +
                            " --tokenizer t.json --train-data d.tsv --steps 1";
  r = test::run_cli(train + " --output-dat " + dir.file("t.dat"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--output-dat"), std::string::npos) << r.err;
  EXPECT_EQ(test::slurp(dir.file("t.dat")), "precious");
  r = test::run_cli(train + " --output-dat " + dir.file("q.dat") + " --overwrite");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("is the input file"), std::string::npos) << r.err;
  r = test::run_cli(train + " --output-dat /proc/qwen3-no-such/t.dat");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("cannot create its folder"), std::string::npos) << r.err;
}

// What a run writes besides its model never replaces an input: --metrics-jsonl once appended to the training data
// it named, and the memory report replaced the config; an existing report is replaced only with --overwrite
// (train's --vram-report and vram-report's --out alike). All refused before anything loads.
TEST(OutputTarget, ARunsMetricsAndReportNeverReplaceItsInputs) {
  test::TempDir dir;
  auto r = test::run_cli("synth --preset tiny --out-dir " + dir.file("m"));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string data = dir.file("d.tsv"), config = dir.file("m/config.json");
  std::ofstream(data) << "hi\tworld\n";
  std::ofstream(dir.file("old.json")) << "precious";
  const std::string config_bytes = test::slurp(config);
  const std::string run = " --weights " + dir.file("m/model.dat") + " --config " + config + " --tokenizer " +
                          test::tiny_tokenizer_path() + " --train-data " + data;
  const std::string train = "train" + run + " --steps 1";
  for (const auto& [flags, named] : std::vector<std::pair<std::string, std::string>>{
           {" --metrics-jsonl " + data, "--metrics-jsonl " + data + " is the input file"},
           {" --metrics-jsonl " + data + " --overwrite", "--metrics-jsonl " + data + " is the input file"},
           {" --vram-report " + config + " --overwrite", "--vram-report " + config + " is the input file"},
           {" --vram-report " + dir.file("old.json"), "--vram-report " + dir.file("old.json") + " exists"}}) {
    r = test::run_cli(train + flags);
    EXPECT_EQ(r.code, 2) << flags << "\n" << r.err;
    EXPECT_NE(r.err.find(named), std::string::npos) << flags << "\n" << r.err;
  }
  r = test::run_cli("vram-report" + run + " --out " + dir.file("old.json"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("vram-report: --out " + dir.file("old.json") + " exists; pass --overwrite"), std::string::npos)
      << r.err;
  r = test::run_cli("vram-report" + run + " --out " + config + " --overwrite");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(test::slurp(data), "hi\tworld\n");
  EXPECT_EQ(test::slurp(config), config_bytes);
  EXPECT_EQ(test::slurp(dir.file("old.json")), "precious");
  r = test::run_cli("vram-report" + run + " --out " + dir.file("old.json") + " --overwrite");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(test::slurp(dir.file("old.json")).find("Samples"), std::string::npos);
}

}  // namespace
}  // namespace qwen3
