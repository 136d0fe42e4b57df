// Runs as files (docs/trainer.md "Runs as files"): --config-file, --output-dir, run.json / run.toml, the metrics'
// time, epoch and MFU, and --resume refusing other training data.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "cli_test_util.h"
#include "qwen3/model/synth.h"
#include "tiny_model_util.h"

namespace qwen3 {
namespace {

namespace fs = std::filesystem;
using test::run_cli;

struct RunSetup {
  test::TempDir dir;
  SynthResult model;
  std::string base;  // train with the model, the tokenizer and the pairs
  RunSetup() {
    SynthOptions s;
    s.config = test::trainable_tiny_config();
    s.out_dir = dir.file("m");
    model = write_synthetic_model(s);
    std::ofstream(dir.file("pairs.tsv")) << "hi\tworld\nname?\tqwen\nabc\txyz\ncolor\tblue\n";
    base = "train --weights " + model.dat_path + " --config " + model.config_path + " --tokenizer " +
           test::tiny_tokenizer_path() + " --train-data " + dir.file("pairs.tsv") + " --log-every 0";
  }
};

std::vector<nlohmann::json> jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(RunsCli, ConfigFileGivesFlagsAndTheCommandLineWins) {
  RunSetup s;
  std::ofstream(s.dir.file("run.toml")) << "# a run\nseq-len = 24\nbatch-size = 2\nsteps = 5\nlr = 0.002\n";
  auto r = run_cli(s.base + " --config-file " + s.dir.file("run.toml") + " --steps 2 --output-dir " + s.dir.file("out"));
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json run = nlohmann::json::parse(test::slurp(s.dir.file("out/run.json")));
  EXPECT_EQ(run["options"]["seq_len"], 24);   // from the file
  EXPECT_EQ(run["options"]["batch_size"], 2);
  EXPECT_EQ(run["options"]["steps"], 2);      // the command line's, not the file's 5
  EXPECT_DOUBLE_EQ(run["options"]["lr"].get<double>(), 0.002);
  std::ofstream(s.dir.file("bad.toml")) << "seq-lenght = 24\n";
  r = run_cli(s.base + " --steps 1 --config-file " + s.dir.file("bad.toml"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(s.dir.file("bad.toml") + ": 'seq-lenght' is not a flag of train"), std::string::npos) << r.err;
  std::ofstream(s.dir.file("value.toml")) << "seq-len = \"many\"\n";
  r = run_cli(s.base + " --steps 1 --config-file " + s.dir.file("value.toml"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("seq-len"), std::string::npos) << r.err;
  r = run_cli(s.base + " --steps 1 --config-file " + s.dir.file("missing.toml"));
  EXPECT_EQ(r.code, 1) << r.err;
}

// One folder holds the run; run.json says what ran and on what; run.toml repeats it, loss for loss.
TEST(RunsCli, OutputDirHoldsTheRunAndRunTomlRepeatsIt) {
  RunSetup s;
  const std::string out = s.dir.file("runs/first");  // parents are made
  auto r = run_cli(s.base + " --steps 3 --batch-size 2 --output-dir " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* f : {"run.json", "run.toml", "metrics.jsonl", "model.dat", "checkpoints/run.json"})
    EXPECT_TRUE(fs::exists(fs::path(out) / f)) << f;
  const nlohmann::json run = nlohmann::json::parse(test::slurp(out + "/run.json"));
  EXPECT_EQ(run["tool"].get<std::string>().rfind("qwen3-train ", 0), 0u);
  EXPECT_TRUE(run["git"].is_string());
  EXPECT_TRUE(run["libtorch"].is_string());
  EXPECT_EQ(run["device"], "cpu");
  EXPECT_EQ(run["command_line"][1], "train");
  EXPECT_EQ(run["flags"]["batch-size"], "2");
  EXPECT_EQ(run["data"]["train"]["path"], s.dir.file("pairs.tsv"));
  EXPECT_EQ(run["data"]["train"]["hash"].get<std::string>().size(), 16u);
  const auto metrics = jsonl(out + "/metrics.jsonl");
  ASSERT_EQ(metrics.size(), 3u);
  EXPECT_DOUBLE_EQ(metrics[2]["epoch"].get<double>(), 1.5);  // 4 pairs, 2 a step
  EXPECT_TRUE(metrics[0]["mfu"].is_null());                  // CPU: no meaningful peak
  EXPECT_EQ(metrics[0]["time"].get<std::string>().size(), 24u);  // 2026-11-24T08:15:03.123Z
  // The same run from run.toml, into another folder.
  r = run_cli("train --config-file " + out + "/run.toml --output-dir " + s.dir.file("runs/again"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto again = jsonl(s.dir.file("runs/again/metrics.jsonl"));
  ASSERT_EQ(again.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(again[i]["loss"], metrics[i]["loss"]) << i;
  // A file where the folder should be.
  std::ofstream(s.dir.file("afile")) << "x";
  r = run_cli(s.base + " --steps 1 --output-dir " + s.dir.file("afile"));
  EXPECT_EQ(r.code, 2) << r.err;
}

TEST(RunsCli, ResumeRefusesOtherTrainingDataUnlessAllowed) {
  RunSetup s;
  const std::string ck = s.dir.file("ck");
  ASSERT_EQ(run_cli(s.base + " --steps 2 --checkpoint-dir " + ck).code, 0);
  std::ofstream(s.dir.file("pairs.tsv"), std::ios::app) << "one\tmore\n";
  auto r = run_cli(s.base + " --steps 4 --checkpoint-dir " + ck + " --resume");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("was trained on other data"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--allow-data-change"), std::string::npos) << r.err;
  r = run_cli(s.base + " --steps 4 --checkpoint-dir " + ck + " --resume --allow-data-change");
  EXPECT_EQ(r.code, 0) << r.err;
}

}  // namespace
}  // namespace qwen3
