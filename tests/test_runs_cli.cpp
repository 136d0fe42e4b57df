// Runs as files (docs/trainer.md "Runs as files"): --config-file, --output-dir, run.json / run.toml, the metrics'
// time, epoch and MFU, and --resume refusing other training data.
#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <vector>

#include "cli_test_util.h"
#include "gpu_test.h"
#include "qwen3/base/remove_tree.h"
#include "qwen3/config/config.h"
#include "qwen3/model/synth.h"
#include "qwen3/trainer/step_time_model.h"
#include "tiny_model_util.h"
#include "trainer/product_sm_carveout.h"
#include "trainer/tensorboard_writer.h"

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
  EXPECT_NE(r.err.find(s.dir.file("bad.toml") + ":1: 'seq-lenght' is not a flag of train; did you mean seq-len?"),
            std::string::npos) << r.err;
  std::ofstream(s.dir.file("value.toml")) << "seq-len = \"many\"\n";
  r = run_cli(s.base + " --steps 1 --config-file " + s.dir.file("value.toml"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("seq-len"), std::string::npos) << r.err;
  r = run_cli(s.base + " --steps 1 --config-file " + s.dir.file("missing.toml"));
  EXPECT_EQ(r.code, 1) << r.err;
  // Values a flag does not take are named as such: an array for a flag of one value (CLI11 kept one element),
  // a word a switch does not take (CLI11's "Could not convert"), a file that names another.
  for (const auto& [text, named] : std::vector<std::pair<std::string, std::string>>{
           {"lr = [0.001, 0.002]\n", ":1: lr: one value, not an array of 2"},
           {"pack = \"maybe\"\n", ":1: pack: 'maybe' is not true or false"},
           {"steps = 1\nconfig-file = \"other.toml\"\n", ":2: config-file: a flags file does not read another"}}) {
    std::ofstream(s.dir.file("values.toml")) << text;
    r = run_cli(s.base + " --steps 1 --config-file " + s.dir.file("values.toml"));
    EXPECT_EQ(r.code, 2) << text;
    EXPECT_NE(r.err.find(s.dir.file("values.toml") + named), std::string::npos) << text << r.err;
  }
  r = run_cli(s.base + " --steps 1 --pack maybe");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--pack: 'maybe' is not true or false (true, false, 1, 0, yes, no)"), std::string::npos)
      << r.err;
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
  // Achieved model TFLOP/s on every device: the model FLOPs of the step's tokens over its time.
  const double flops_per_token =
      model_flops_per_token(load_config(s.model.config_path), run["options"]["seq_len"].get<int64_t>());
  for (const auto& m : metrics)
    EXPECT_NEAR(m["tflops"].get<double>(), flops_per_token * m["tok_per_s"].get<double>() * 1e-12,
                1e-9 * m["tflops"].get<double>()) << m.dump();
  EXPECT_EQ(metrics[0]["time"].get<std::string>().size(), 24u);  // 2026-11-24T08:15:03.123Z
  // The same run from run.toml, into another folder.
  r = run_cli("train --config-file " + out + "/run.toml --output-dir " + s.dir.file("runs/again"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto again = jsonl(s.dir.file("runs/again/metrics.jsonl"));
  ASSERT_EQ(again.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(again[i]["loss"], metrics[i]["loss"]) << i;
  // The new --output-dir wins over the first run's: nothing of the first folder was written again (run.toml saves
  // no path derived from --output-dir).
  EXPECT_EQ(jsonl(out + "/metrics.jsonl").size(), 3u);
  EXPECT_TRUE(fs::exists(s.dir.file("runs/again/checkpoints/run.json")));
  EXPECT_EQ(test::slurp(out + "/run.toml").find("checkpoint-dir"), std::string::npos);
  // A file where the folder should be.
  std::ofstream(s.dir.file("afile")) << "x";
  r = run_cli(s.base + " --steps 1 --output-dir " + s.dir.file("afile"));
  EXPECT_EQ(r.code, 2) << r.err;
}

// run.toml reads back as written, every flag: a '#' inside a quoted value is the value's (CLI11's reader cut it
// there), relative paths are the file's folder's (run.toml records absolute ones), snake_case keys are the same
// flags; the run repeated from its run.toml, from another working folder, has the same flags and losses. A file
// that is not TOML (YAML's "key: value") names the line.
TEST(RunsCli, EveryFlagRoundTripsThroughRunToml) {
  RunSetup s;
  std::ofstream(s.dir.file("text.txt")) << "# a comment line, skipped\nalpha beta gamma\n#1 is not a comment here\n"
                                          "delta epsilon zeta\n";
  // Pairs, so that the system prompt (with its '#', which a TOML writer must quote) is the run's.
  std::ofstream(s.dir.file("pairs-commented.tsv")) << "# a comment line, skipped\nalpha\tbeta gamma\n"
                                                      "#1 is not a comment here\tnor this\ndelta\tepsilon zeta\n";
  const std::string out = s.dir.file("first");
  // Relative paths from the test's folder: the data and the output folder.
  const std::string flags = " --train-data pairs-commented.tsv --data-format tsv --comment-prefix '# '"
                            " --system 'be #1, always'"
                            " --seq-len 24 --batch-size 2 --steps 3 --lr 0.003 --warmup-steps 1 --weight-decay 0.05"
                            " --seed 7 --grad-clip 0.5 --output-dir first";
  const std::string model = "train --weights " + s.model.dat_path + " --config " + s.model.config_path +
                            " --tokenizer " + test::tiny_tokenizer_path() + " --log-every 0";
  auto r = test::run_shell("cd " + s.dir.path().string() + " && " + test::binary_command() + " " + model + flags);
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json first = nlohmann::json::parse(test::slurp(out + "/run.json"));
  EXPECT_EQ(first["flags"]["comment-prefix"], "# ");
  EXPECT_EQ(first["flags"]["system"], "be #1, always");
  const std::string toml = test::slurp(out + "/run.toml");
  EXPECT_NE(toml.find("train-data = \"" + s.dir.file("pairs-commented.tsv") + "\""), std::string::npos) << toml;
  // Repeated from its run.toml, from another folder, into another output folder.
  fs::create_directories(s.dir.file("elsewhere"));
  r = test::run_shell("cd " + s.dir.file("elsewhere") + " && " + test::binary_command() + " train --config-file " + out +
                      "/run.toml --output-dir " + s.dir.file("again"));
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json again = nlohmann::json::parse(test::slurp(s.dir.file("again/run.json")));
  for (const auto& [name, value] : first["flags"].items()) {
    if (name == "output-dir" || name == "train-data") continue;  // another folder; the same file, now absolute
    EXPECT_EQ(again["flags"][name], value) << name;
  }
  EXPECT_EQ(again["flags"]["train-data"], s.dir.file("pairs-commented.tsv"));
  EXPECT_EQ(again["options"], first["options"]);
  const auto losses = jsonl(out + "/metrics.jsonl"), repeated = jsonl(s.dir.file("again/metrics.jsonl"));
  ASSERT_EQ(losses.size(), 3u);
  ASSERT_EQ(repeated.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(repeated[i]["loss"], losses[i]["loss"]) << i;
  // A hand-written file: snake_case keys, a path relative to the file's folder, a number and a boolean.
  fs::create_directories(s.dir.file("conf"));
  std::ofstream(s.dir.file("conf/run.toml")) << "train_data = \"../text.txt\"\ndata_format = \"text\"\n"
                                                 "seq_len = 24\nsteps = 1\npack = false\nlr = 2e-3\n";
  r = run_cli(model + " --config-file " + s.dir.file("conf/run.toml") + " --output-dir " + s.dir.file("third"));
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json third = nlohmann::json::parse(test::slurp(s.dir.file("third/run.json")));
  EXPECT_EQ(third["options"]["seq_len"], 24);
  EXPECT_DOUBLE_EQ(third["options"]["lr"].get<double>(), 0.002);
  // YAML is named as such, with its line.
  std::ofstream(s.dir.file("conf/yaml.toml")) << "# a run\nseq_len: 24\n";
  r = run_cli(model + " --config-file " + s.dir.file("conf/yaml.toml"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(s.dir.file("conf/yaml.toml") + ":2:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("this looks like YAML"), std::string::npos) << r.err;
}

// --tensorboard: an event file TensorBoard reads, one event a step holding the metrics' scalars; read back by an
// independent reader (tests/readers/read_tfevents.mjs: its own CRC-32C, generic protobuf decoding). The metrics
// carry the step's memory.
TEST(RunsCli, TensorBoardEventsHoldEachStepsMetrics) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // CRC-32C's check value
  RunSetup s;
  const std::string out = s.dir.file("run"), tb = s.dir.file("run/tb");
  auto r = run_cli(s.base + " --steps 3 --batch-size 2 --output-dir " + out + " --tensorboard " + tb);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto metrics = jsonl(out + "/metrics.jsonl");
  ASSERT_EQ(metrics.size(), 3u);
  for (const auto& m : metrics) EXPECT_GT(m["rss_mib"].get<double>(), 0) << m.dump();
  std::string events;
  for (const auto& e : fs::directory_iterator(tb))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) events = e.path().string();
  ASSERT_FALSE(events.empty());
  // Another run into the same folder would draw as one run with this one: refused unless resumed or replaced.
  r = run_cli(s.base + " --steps 1 --tensorboard " + tb);
  EXPECT_EQ(r.code, 2) << r.err;
  if (!test::command_succeeds("node --version")) GTEST_SKIP() << "node is not installed: the reader did not run";
  const test::CliResult node = test::run_shell("node " + test::source_dir() + "/tests/readers/read_tfevents.mjs " + events);
  ASSERT_EQ(node.code, 0) << node.err;
  const nlohmann::json read = nlohmann::json::parse(node.out);
  ASSERT_EQ(read["events"].size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const nlohmann::json& e = read["events"][i];
    const nlohmann::json& m = metrics[i];
    EXPECT_EQ(e["step"], m["step"]);
    EXPECT_EQ(e["scalars"]["train/loss"].get<float>(), m["loss"].get<float>()) << i;
    EXPECT_EQ(e["scalars"]["train/grad_norm"].get<float>(), m["grad_norm"].get<float>()) << i;
    EXPECT_EQ(e["scalars"]["train/learning_rate"].get<float>(), m["lr"].get<float>()) << i;
    EXPECT_TRUE(e["scalars"].contains("train/tokens_per_second")) << e.dump();
    EXPECT_TRUE(e["scalars"].contains("train/rss_mib")) << e.dump();
  }
}

// A run stopped after its last checkpoint (killed: step 3's records written, its checkpoint not, a line cut) and
// resumed holds each step once: the metrics lose the stopped run's records past the checkpoint (step 3 is trained
// again, to the same loss) and the torn line; the new event file starts with SessionLog START at step 3, by which
// TensorBoard drops the old file's step 3 (tests/readers/read_tfevents.mjs reads it; TensorBoard's own reader
// below, where installed).
TEST(RunsCli, AResumeAfterAKillLogsEachStepOnce) {
  RunSetup s;
  const std::string ck = s.dir.file("ck"), metrics = s.dir.file("m.jsonl"), tb = s.dir.file("tb");
  const std::string run = s.base + " --batch-size 2 --save-every-steps 2 --keep-checkpoints 5 --checkpoint-dir " + ck +
                          " --metrics-jsonl " + metrics + " --tensorboard " + tb;
  auto r = run_cli(run + " --steps 3");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto first = jsonl(metrics);
  ASSERT_EQ(first.size(), 3u);
  std::error_code ec;
  remove_tree(ck + "/step-00000003", ec);
  ASSERT_FALSE(ec) << ec.message();
  std::ofstream(metrics, std::ios::app) << R"({"step": 4, "loss": 2.)";
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // the event files are named by the second
  r = run_cli(run + " --steps 4 --resume");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("--resume: removed 2 line(s) after step 2 from " + metrics), std::string::npos) << r.err;
  const auto after = jsonl(metrics);
  std::vector<int64_t> steps;
  for (const auto& m : after) steps.push_back(m["step"].get<int64_t>());
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(after[2]["loss"], first[2]["loss"]);
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(tb)) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  ASSERT_EQ(files.size(), 2u);
  if (!test::command_succeeds("node --version")) GTEST_SKIP() << "node is not installed: the reader did not run";
  const auto read = [](const std::string& file) {
    const test::CliResult node =
        test::run_shell("node " + test::source_dir() + "/tests/readers/read_tfevents.mjs " + file);
    EXPECT_EQ(node.code, 0) << node.err;
    return nlohmann::json::parse(node.out);
  };
  EXPECT_EQ(read(files[0])["session_starts"].size(), 0u);
  const nlohmann::json resumed = read(files[1]);
  EXPECT_EQ(resumed["session_starts"], nlohmann::json::array({3}));
  EXPECT_EQ(resumed["events"].size(), 2u);
}

// TensorBoard's own reader (the tensorboard Python package, where installed: the GPU machine's PyTorch has it
// more often than this machine) loads the events, and after a resume past a lost step shows each step once.
TEST(RunsCli, TensorBoardsOwnReaderLoadsTheEvents) {
  if (!test::command_succeeds("python3 -c 'import tensorboard'"))
    GTEST_SKIP() << "the tensorboard package is not installed: TensorBoard's own reader did not run";
  RunSetup s;
  const std::string tb = s.dir.file("tb"), ck = s.dir.file("ck");
  const std::string run = s.base + " --batch-size 2 --save-every-steps 2 --keep-checkpoints 5 --checkpoint-dir " + ck +
                          " --tensorboard " + tb;
  auto r = run_cli(run + " --steps 3");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string steps_read =
      "python3 -c \"from tensorboard.backend.event_processing.event_accumulator import EventAccumulator as A; "
      "a = A('" + tb + "'); a.Reload(); print([e.step for e in a.Scalars('train/loss')])\"";
  test::CliResult tensorboard = test::run_shell(steps_read);
  ASSERT_EQ(tensorboard.code, 0) << tensorboard.err;
  EXPECT_EQ(tensorboard.out, "[1, 2, 3]\n");
  std::error_code ec;
  remove_tree(ck + "/step-00000003", ec);  // killed before step 3's checkpoint: the resume takes step 3 again
  ASSERT_FALSE(ec) << ec.message();
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // the event files are named by the second
  r = run_cli(run + " --steps 4 --resume");
  ASSERT_EQ(r.code, 0) << r.err;
  tensorboard = test::run_shell(steps_read);
  ASSERT_EQ(tensorboard.code, 0) << tensorboard.err;
  EXPECT_EQ(tensorboard.out, "[1, 2, 3, 4]\n");
}

// A folder holds one run: a new run into a folder another run left files in is refused (nothing touched), unless it
// resumes that run or --overwrite removes the old files (named in the log) before its first step; the run's own
// inputs are never among them.
TEST(RunsCli, ANewRunNeverMixesWithAnotherRunsFolder) {
  RunSetup s;
  const std::string out = s.dir.file("run");
  auto r = run_cli(s.base + " --steps 3 --save-every-steps 1 --keep-checkpoints 5 --output-dir " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_EQ(jsonl(out + "/metrics.jsonl").size(), 3u);
  fs::remove(out + "/model.dat");  // as a run stopped before its export leaves it
  // Refused, naming what is there; nothing changes.
  r = run_cli(s.base + " --steps 2 --output-dir " + out);
  EXPECT_EQ(r.code, 2) << r.err;
  for (const char* name : {"run.json", "metrics.jsonl", "checkpoints/step-00000003"})
    EXPECT_NE(r.err.find(out + "/" + name), std::string::npos) << name << ": " << r.err;
  EXPECT_NE(r.err.find("--overwrite"), std::string::npos) << r.err;
  EXPECT_EQ(jsonl(out + "/metrics.jsonl").size(), 3u);
  // A checkpoint folder alone is a run folder too.
  r = run_cli(s.base + " --steps 2 --checkpoint-dir " + out + "/checkpoints");
  EXPECT_EQ(r.code, 2) << r.err;
  // --resume continues it.
  r = run_cli(s.base + " --steps 4 --save-every-steps 1 --keep-checkpoints 5 --output-dir " + out + " --resume");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(jsonl(out + "/metrics.jsonl").size(), 4u);
  // --overwrite: the old run's files go before the first step; only the new run's remain. Training data kept in
  // the folder is an input, never removed.
  fs::copy_file(s.dir.file("pairs.tsv"), out + "/data.tsv");
  const std::string base_here = "train --weights " + s.model.dat_path + " --config " + s.model.config_path +
                                " --tokenizer " + test::tiny_tokenizer_path() + " --train-data " + out + "/data.tsv";
  r = run_cli(base_here + " --steps 2 --output-dir " + out + " --overwrite");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("--overwrite: removed the previous run's " + out + "/metrics.jsonl"), std::string::npos) << r.err;
  const auto metrics = jsonl(out + "/metrics.jsonl");
  ASSERT_EQ(metrics.size(), 2u);
  EXPECT_EQ(metrics[0]["step"], 1);
  std::vector<std::string> checkpoints;
  for (const auto& e : fs::directory_iterator(out + "/checkpoints"))
    if (e.path().filename().string().rfind("step-", 0) == 0) checkpoints.push_back(e.path().filename().string());
  EXPECT_EQ(checkpoints, std::vector<std::string>{"step-00000002"});
  EXPECT_TRUE(fs::exists(out + "/data.tsv"));
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
  // Another tokenizer.json: the same lines would be other ids (it resumed silently on another vocabulary).
  const std::string other = s.dir.file("other-tokenizer.json");
  std::ofstream(other) << test::slurp(test::tiny_tokenizer_path()) << "\n";  // other bytes, the same vocabulary
  std::string with_other = s.base;
  with_other.replace(with_other.find(test::tiny_tokenizer_path()), test::tiny_tokenizer_path().size(), other);
  r = run_cli(with_other + " --steps 5 --checkpoint-dir " + ck + " --resume");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("was trained with another tokenizer"), std::string::npos) << r.err;
  r = run_cli(with_other + " --steps 5 --checkpoint-dir " + ck + " --resume --allow-data-change");
  EXPECT_EQ(r.code, 0) << r.err;
}

// The same command again after its run finished (a script repeating it until it succeeds, a requeued job): the
// export there is that run's, so it is left as it is and the command succeeds with nothing to train. Where the
// resume would train (a longer run; the newest checkpoint damaged, so an older one is resumed) the existing
// export is refused as any existing file is, before anything is written.
TEST(RunsCli, TheSameCommandAfterItsRunFinishedLeavesItsExport) {
  RunSetup s;
  const std::string out = s.dir.file("run");
  const std::string run = s.base + " --batch-size 2 --save-every-steps 1 --keep-checkpoints 5 --output-dir " + out;
  auto r = run_cli(run + " --steps 2 --resume-if-present");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string exported = test::slurp(out + "/model.dat");
  const auto written = fs::last_write_time(out + "/model.dat");
  r = run_cli(run + " --steps 2 --resume-if-present");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("nothing to train: the run is at step 2 and ends at step 2"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("nothing trained: --output-dat " + out + "/model.dat, there already, is left as it is"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(fs::last_write_time(out + "/model.dat"), written);
  r = run_cli(run + " --steps 3 --resume");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--output-dat " + out + "/model.dat exists; pass --overwrite"), std::string::npos) << r.err;
  {  // step 2's tensors changed on disk: the resume passes over it to step 1, and would train step 2 again
    std::fstream tensors(out + "/checkpoints/step-00000002/tensors.dat",
                         std::ios::in | std::ios::out | std::ios::binary);
    tensors.seekp(-16, std::ios::end);
    tensors.put('\x5a');
  }
  r = run_cli(run + " --steps 2 --resume");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--output-dat " + out + "/model.dat exists; pass --overwrite"), std::string::npos) << r.err;
  EXPECT_EQ(test::slurp(out + "/model.dat"), exported);
  EXPECT_EQ(jsonl(out + "/metrics.jsonl").size(), 2u);  // refused before the metrics were cut back
}

// inspect takes a checkpoint as export --checkpoint does (a step-N folder, or the folder of them: the newest) and
// lists its tensors.dat, named on stderr so that --json stays one document; another folder is named.
TEST(RunsCli, InspectListsACheckpointsTensors) {
  RunSetup s;
  const std::string ck = s.dir.file("ck");
  ASSERT_EQ(run_cli(s.base + " --steps 2 --save-every-steps 1 --keep-checkpoints 5 --checkpoint-dir " + ck).code, 0);
  auto r = run_cli("inspect " + ck + "/step-00000001");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("master/"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("inspect: " + ck + "/step-00000001/tensors.dat"), std::string::npos) << r.err;
  r = run_cli("inspect " + ck + " --json");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("inspect: " + ck + "/step-00000002/tensors.dat"), std::string::npos) << r.err;
  EXPECT_FALSE(nlohmann::json::parse(r.out, nullptr, false).is_discarded()) << r.out;
  r = run_cli("inspect " + s.dir.file("m"));  // the synthetic model's folder: model.dat and config.json
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("inspect: " + s.dir.file("m") + " is a folder holding model.dat, not a checkpoint: give the "
                       "file (" + s.dir.file("m") + "/model.dat) or a checkpoint folder"),
            std::string::npos)
      << r.err;
  std::filesystem::create_directories(s.dir.file("empty"));
  r = run_cli("inspect " + s.dir.file("empty"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(s.dir.file("empty") + ": neither a checkpoint"), std::string::npos) << r.err;
}

// export --checkpoint takes a run's --output-dir for its newest checkpoint (checkpoints/, as --resume finds it):
// the file it writes is the run's own export, byte for byte.
TEST(RunsCli, ExportTakesARunFolderForItsNewestCheckpoint) {
  RunSetup s;
  const std::string out = s.dir.file("run");
  ASSERT_EQ(run_cli(s.base + " --steps 2 --output-dir " + out).code, 0);
  const auto r = run_cli("export --checkpoint " + out + " --weights " + s.model.dat_path + " --out " +
                         s.dir.file("again.dat"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("exported " + out + "/checkpoints/step-00000002 (step 2,"), std::string::npos) << r.out;
  EXPECT_EQ(test::slurp(s.dir.file("again.dat")), test::slurp(out + "/model.dat"));
}

// The same with --epochs, whose length is its data's: the checkpoint's run record keeps the steps it had
// (total_steps), so the command again finds its run finished. Another --epochs is a longer run, whose export
// exists; so is the same --epochs over more data (the trainer counts the steps again: 3 where the run had 2).
TEST(RunsCli, TheSameEpochsCommandAfterItsRunFinishedLeavesItsExport) {
  RunSetup s;
  const std::string out = s.dir.file("run");
  const std::string run = s.base + " --batch-size 2 --output-dir " + out;
  auto r = run_cli(run + " --epochs 1 --resume-if-present");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string exported = test::slurp(out + "/model.dat");
  r = run_cli(run + " --epochs 1 --resume-if-present");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("nothing trained: --output-dat " + out + "/model.dat, there already, is left as it is"),
            std::string::npos)
      << r.err;
  r = run_cli(run + " --epochs 2 --resume");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--output-dat " + out + "/model.dat exists; pass --overwrite"), std::string::npos) << r.err;
  std::ofstream(s.dir.file("pairs.tsv"), std::ios::app) << "up\tdown\nleft\tright\n";
  r = run_cli(run + " --epochs 1 --resume --allow-data-change");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--output-dat " + out + "/model.dat exists; pass --overwrite"), std::string::npos) << r.err;
  EXPECT_EQ(test::slurp(out + "/model.dat"), exported);
}

// What a resume may change (the learning rate, its schedule) it never changes silently: a warning names each
// option against the checkpoint's run, and run.json keeps them; the memory-for-time choices are not named, nor
// the run's length under a constant rate. Under a cosine or linear decay the length is named: every later step's
// rate is drawn over it (a 3-step cosine resumed as a 4-step one jumps back up its curve). A resume at or past the
// run's end says there is nothing to train (it said "stopped by signal 0").
TEST(RunsCli, ResumeSaysWhatItChangedAndWhenNothingIsLeft) {
  RunSetup s;
  const std::string ck = s.dir.file("ck");
  ASSERT_EQ(run_cli(s.base + " --steps 2 --lr 1e-4 --checkpoint-dir " + ck).code, 0);
  auto r = run_cli(s.base + " --steps 3 --lr 1e-4 --checkpoint-dir " + ck + " --resume");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("options changed"), std::string::npos) << "a constant rate's length changed\n" << r.err;
  r = run_cli(s.base + " --steps 4 --lr 2e-4 --lr-schedule cosine --checkpoint-dir " + ck + " --resume");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("--resume: options changed since the checkpoint's run: lr 0.0001 -> 0.0002, lr_schedule "
                       "\"constant\" -> \"cosine\", steps 3 -> 4\n"),
            std::string::npos)
      << r.err;
  const nlohmann::json run = nlohmann::json::parse(test::slurp(ck + "/run.json"));
  EXPECT_DOUBLE_EQ(run["changed_on_resume"]["lr"]["checkpoint"].get<double>(), 1e-4);
  EXPECT_EQ(run["changed_on_resume"]["lr_schedule"]["now"], "cosine");
  r = run_cli(s.base + " --steps 5 --lr 2e-4 --lr-schedule cosine --checkpoint-dir " + ck + " --resume");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("--resume: options changed since the checkpoint's run: steps 4 -> 5\n"), std::string::npos)
      << "a cosine's length changed\n" << r.err;
  // Eval data where there was none: the eval loss from here measures samples it did not before.
  r = run_cli(s.base + " --steps 5 --lr 2e-4 --lr-schedule cosine --checkpoint-dir " + ck + " --resume --eval-data " +
              s.dir.file("pairs.tsv"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("options changed since the checkpoint's run: eval_data_content \"\" -> \""), std::string::npos)
      << r.err;
  // The template that renders the pairs, however chosen (a tokenizer_config.json replaced beside the tokenizer
  // changes it with no flag changed; here the flag does).
  r = run_cli(s.base + " --steps 5 --lr 2e-4 --lr-schedule cosine --checkpoint-dir " + ck +
              " --resume --chat-template qwen3-thinking");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("chat_template_rendered \"chatml\" -> \"qwen3-thinking\""), std::string::npos) << r.err;
  r = run_cli(s.base + " --steps 2 --lr 2e-4 --lr-schedule cosine --checkpoint-dir " + ck + " --resume");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("nothing to train: the run is at step 5 and ends at step 2, checkpoint " + ck +
                       "/step-00000005"),
            std::string::npos)
      << r.out;
  // A flag given twice is named so (CLI11: "--steps: At Most 1 required but received 2").
  r = run_cli(s.base + " --steps 2 --steps 3");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("error: --steps is given 2 times; give it once"), std::string::npos) << r.err;
}

// The evaluation data is scored every --eval-every steps and after the last step, whatever the interval: one
// longer than the run scored nothing (and one that does not divide it left the run's end unscored).
TEST(RunsCli, EvalDataIsScoredAfterTheLastStepWhateverTheInterval) {
  RunSetup s;
  for (const auto& [every, scored] : std::vector<std::pair<int, std::vector<int64_t>>>{
           {5, {3}}, {2, {2, 3}}, {0, {3}}}) {
    const std::string metrics = s.dir.file("eval-" + std::to_string(every) + ".jsonl");
    const auto r = run_cli(s.base + " --steps 3 --eval-data " + s.dir.file("pairs.tsv") +
                           (every > 0 ? " --eval-every " + std::to_string(every) : std::string()) +
                           " --metrics-jsonl " + metrics);
    ASSERT_EQ(r.code, 0) << r.err;
    std::vector<int64_t> steps;
    for (const auto& m : jsonl(metrics))
      if (m.contains("eval_loss") && m["eval_loss"].is_number()) steps.push_back(m["step"].get<int64_t>());
    EXPECT_EQ(steps, scored) << "--eval-every " << every;
  }
}

// --pack-strategy (best-fit by default) is part of what a run is: recorded, compared on resume, and never
// silently changed for a run from before it, whose packed rows were cut from the stream.
TEST(RunsCli, PackStrategyIsRecordedAndOldPackedRunsAreNotSilentlyChanged) {
  RunSetup s;
  std::ofstream(s.dir.file("old.toml")) << "pack = true\nseq-len = 24\n";
  auto r = run_cli(s.base + " --steps 1 --config-file " + s.dir.file("old.toml"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("pack = true without pack-strategy"), std::string::npos) << r.err;
  std::ofstream(s.dir.file("stream.toml")) << "pack = true\nseq-len = 24\npack-strategy = \"stream\"\n";
  r = run_cli(s.base + " --steps 1 --config-file " + s.dir.file("stream.toml") + " --output-dir " + s.dir.file("out"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(test::slurp(s.dir.file("out/run.json")))["options"]["pack_strategy"], "stream");
  EXPECT_NE(test::slurp(s.dir.file("out/run.toml")).find("pack-strategy = \"stream\""), std::string::npos);
  r = run_cli(s.base + " --steps 1 --pack-strategy stream");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--pack-strategy applies with --pack only"), std::string::npos) << r.err;

  // A checkpoint of a packed run from before the flag (no pack_strategy among its flags) resumes as stream only.
  const std::string ck = s.dir.file("ck");
  ASSERT_EQ(run_cli(s.base + " --steps 2 --pack --pack-strategy stream --checkpoint-dir " + ck).code, 0);
  for (const auto& step : fs::directory_iterator(ck)) {
    if (!fs::exists(step.path() / "checkpoint.json")) continue;
    nlohmann::json meta = nlohmann::json::parse(test::slurp((step.path() / "checkpoint.json").string()));
    ASSERT_EQ(meta["flags"]["pack_strategy"], "stream");
    meta["flags"].erase("pack_strategy");
    std::ofstream(step.path() / "checkpoint.json") << meta.dump(2);
  }
  r = run_cli(s.base + " --steps 3 --pack --checkpoint-dir " + ck + " --resume");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("pack_strategy (checkpoint \"stream\", now \"best-fit\")"), std::string::npos) << r.err;
  r = run_cli(s.base + " --steps 3 --pack --pack-strategy stream --checkpoint-dir " + ck + " --resume");
  EXPECT_EQ(r.code, 0) << r.err;
}

// Runs a and b (a.jsonl / a.dat, b.jsonl / b.dat in dir) trained the same bytes: each step's loss and norm, and the
// exported weights.
void expect_same_training(const test::TempDir& dir, size_t steps) {
  const auto a = jsonl(dir.file("a.jsonl")), b = jsonl(dir.file("b.jsonl"));
  ASSERT_EQ(a.size(), steps);
  ASSERT_EQ(b.size(), steps);
  for (size_t i = 0; i < steps; ++i) {
    EXPECT_EQ(a[i]["loss"], b[i]["loss"]) << "step " << i + 1;
    EXPECT_EQ(a[i]["grad_norm"], b[i]["grad_norm"]) << "step " << i + 1;
  }
  EXPECT_EQ(test::slurp(dir.file("a.dat")), test::slurp(dir.file("b.dat"))) << "the exported weights";
}

// --overlap-update applies to the in-backward update on CUDA in one process; elsewhere it is refused, naming why.
TEST(RunsCli, OverlapUpdateNeedsTheFusedOptimizerOnCuda) {
  RunSetup s;
  auto r = run_cli(s.base + " --steps 1 --overlap-update");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--overlap-update"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("needs --fused-optimizer"), std::string::npos) << r.err;
  r = run_cli(s.base + " --steps 1 --fused-optimizer --overlap-update --device cpu");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("needs --device cuda"), std::string::npos) << r.err;
}

// --overlap-update-sms leaves SMs to the updates that --overlap-update runs beside backward: without it, or below
// zero, it is refused as a usage error naming the flag.
TEST(RunsCli, OverlapUpdateSmsNeedsOverlapUpdate) {
  RunSetup s;
  auto r = run_cli(s.base + " --steps 1 --fused-optimizer --overlap-update-sms 8");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--overlap-update-sms leaves SMs to the updates that run beside backward: it needs "
                       "--overlap-update"),
            std::string::npos)
      << r.err;
  r = run_cli(s.base + " --steps 1 --fused-optimizer --overlap-update --overlap-update-sms -1");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--overlap-update-sms"), std::string::npos) << r.err;
}

// On CUDA, --overlap-update-sms N: the products of backward target N fewer SMs (said once at the start), more SMs
// than the device has are refused naming its count, and the run trains as without the carveout up to the
// rounding of other product kernels (cuBLASLt's, picked for fewer SMs). A libtorch before 2.8 refuses the flag.
TEST(RunsCli, GpuOverlapUpdateSmsLeavesSmsToTheUpdates) {
  QWEN3_GPU_TEST(at::hasCUDA());
  RunSetup s;
  const std::string base = s.base + " --device cuda --steps 3 --fused-optimizer --overlap-update --grad-clip 0.5";
  if (!train_detail::product_sm_carveout_supported()) {
    const auto r = run_cli(base + " --overlap-update-sms 8");
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("--overlap-update-sms needs libtorch 2.8 or newer"), std::string::npos) << r.err;
    return;
  }
  auto r = run_cli(base + " --overlap-update-sms 4096");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--overlap-update-sms 4096: cuda:0 has "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" SMs, and backward's products need at least one of them"), std::string::npos) << r.err;
  r = run_cli(base + " --metrics-jsonl " + s.dir.file("a.jsonl"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ((r.out + r.err).find("--overlap-update-sms"), std::string::npos) << r.out << r.err;
  r = run_cli(base + " --overlap-update-sms 8 --metrics-jsonl " + s.dir.file("b.jsonl"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE((r.out + r.err).find("--overlap-update-sms 8: backward's products target "), std::string::npos)
      << r.out << r.err;
  EXPECT_NE((r.out + r.err).find(" SMs, leaving 8 to the updates beside them"), std::string::npos) << r.out << r.err;
  const auto a = jsonl(s.dir.file("a.jsonl")), b = jsonl(s.dir.file("b.jsonl"));
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(b[i]["loss"].get<double>(), a[i]["loss"].get<double>(), 1e-2 * a[i]["loss"].get<double>())
        << "step " << i + 1;
    EXPECT_NEAR(b[i]["grad_norm"].get<double>(), a[i]["grad_norm"].get<double>(),
                5e-2 * a[i]["grad_norm"].get<double>())
        << "step " << i + 1;
  }
}

// On CUDA the updates on their own stream train the same bytes: the losses and norms of three steps, and the
// exported weights.
TEST(RunsCli, GpuOverlapUpdateTrainsTheSameBytes) {
  QWEN3_GPU_TEST(at::hasCUDA());
  RunSetup s;
  const std::string base = s.base + " --device cuda --steps 3 --fused-optimizer --grad-clip 0.5";
  auto r = run_cli(base + " --metrics-jsonl " + s.dir.file("a.jsonl") + " --output-dat " + s.dir.file("a.dat"));
  ASSERT_EQ(r.code, 0) << r.err;
  r = run_cli(base + " --overlap-update --metrics-jsonl " + s.dir.file("b.jsonl") + " --output-dat " +
              s.dir.file("b.dat"));
  ASSERT_EQ(r.code, 0) << r.err;
  expect_same_training(s.dir, 3);
}

// The same run twice on CUDA trains the same bytes: the losses and norms of three steps, and the exported weights.
// Nothing on the GPU path may add by atomics in no fixed order (the embedding's gradient sums a token's rows in
// order: BlockRunner.GpuEmbeddingGradientIsTheSameEveryRun). Full rows of 256 tokens, so that attention's backward
// spans several blocks of keys, and the text repeats its words, so that the embedding sees each token many times.
TEST(RunsCli, GpuTrainingIsTheSameBytesRunToRun) {
  QWEN3_GPU_TEST(at::hasCUDA());
  RunSetup s;
  {
    std::ofstream text(s.dir.file("long.txt"));
    for (int line = 0; line < 8; ++line) {
      for (int word = 0; word < 400; ++word) text << (word % 7 == 0 ? "the " : "cat sat ") << ((line + word) % 5 ? "on " : "mat ");
      text << "\n";
    }
  }
  const std::string base = "train --weights " + s.model.dat_path + " --config " + s.model.config_path + " --tokenizer " +
                           test::tiny_tokenizer_path() + " --train-data " + s.dir.file("long.txt") +
                           " --log-every 0 --device cuda --steps 3 --seq-len 256 --batch-size 2";
  for (const char* run : {"a", "b"}) {
    const auto r = run_cli(base + " --metrics-jsonl " + s.dir.file(std::string(run) + ".jsonl") + " --output-dat " +
                           s.dir.file(std::string(run) + ".dat"));
    ASSERT_EQ(r.code, 0) << r.err;
  }
  expect_same_training(s.dir, 3);
}

// --keep-weight-operands names one of auto, off, backward, recompute, always; the last three hold the CUDA quantize
// pass's operands, so a CPU run refuses them, and recompute names the operands of checkpointing's recompute, so a
// run without --grad-checkpoint refuses it first; run.json records the flag as given and what was decided.
// --grad-checkpoint-blocks: all, auto or a count, with --grad-checkpoint only; the decision is logged and run.json
// records the flag as given and the blocks recomputed.
TEST(RunsCli, GradCheckpointBlocksNeedCheckpointingAndAreRecorded) {
  RunSetup s;
  auto r = run_cli(s.base + " --steps 1 --grad-checkpoint-blocks 1");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--grad-checkpoint-blocks 1 says how many blocks --grad-checkpoint recomputes: it needs "
                       "--grad-checkpoint"),
            std::string::npos)
      << r.err;
  for (const char* bad : {"some", "-1", "1.5"}) {
    r = run_cli(s.base + " --steps 1 --grad-checkpoint --grad-checkpoint-blocks " + bad);
    EXPECT_EQ(r.code, 2) << bad;
    EXPECT_NE(r.err.find("--grad-checkpoint-blocks"), std::string::npos) << r.err;
  }
  r = run_cli(s.base + " --steps 1 --grad-checkpoint --grad-checkpoint-blocks 1 --output-dir " + s.dir.file("one"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("activation checkpointing: the first 1 of "), std::string::npos) << r.err;
  nlohmann::json run = nlohmann::json::parse(test::slurp(s.dir.file("one/run.json")));
  EXPECT_EQ(run["options"]["grad_checkpoint_blocks"], 1);
  EXPECT_EQ(run["recomputed_blocks"], 1);
  r = run_cli(s.base + " --steps 1 --grad-checkpoint --grad-checkpoint-blocks auto --output-dir " + s.dir.file("auto"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("(auto: the fewest whose step fits"), std::string::npos) << r.err;
  run = nlohmann::json::parse(test::slurp(s.dir.file("auto/run.json")));
  EXPECT_EQ(run["options"]["grad_checkpoint_blocks"], "auto");
  EXPECT_EQ(run["recomputed_blocks"], 0) << "a tiny model's step fits this machine whole";
  r = run_cli(s.base + " --steps 1 --grad-checkpoint --output-dir " + s.dir.file("all"));
  ASSERT_EQ(r.code, 0) << r.err;
  run = nlohmann::json::parse(test::slurp(s.dir.file("all/run.json")));
  EXPECT_EQ(run["options"]["grad_checkpoint_blocks"], "all");
  EXPECT_GT(run["recomputed_blocks"].get<int64_t>(), 1);
}

TEST(RunsCli, KeepWeightOperandsIsACudaChoice) {
  RunSetup s;
  auto r = run_cli(s.base + " --steps 1 --keep-weight-operands sometimes");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--keep-weight-operands"), std::string::npos) << r.err;
  for (const char* keep : {"backward", "always"}) {
    r = run_cli(s.base + " --steps 1 --keep-weight-operands " + keep);
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find(std::string("--keep-weight-operands ") + keep), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("needs --device cuda"), std::string::npos) << r.err;
  }
  r = run_cli(s.base + " --steps 1 --keep-weight-operands recompute");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--keep-weight-operands recompute holds the operands each block's recompute makes: it needs "
                       "--grad-checkpoint"),
            std::string::npos)
      << r.err;
  r = run_cli(s.base + " --steps 1 --grad-checkpoint --keep-weight-operands recompute");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("needs --device cuda"), std::string::npos) << r.err;
  r = run_cli(s.base + " --steps 1 --keep-weight-operands off --output-dir " + s.dir.file("out"));
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json run = nlohmann::json::parse(test::slurp(s.dir.file("out/run.json")));
  EXPECT_EQ(run["options"]["keep_weight_operands"], "off");
  EXPECT_EQ(run["weight_operands"], "codes");
  r = run_cli(s.base + " --steps 1 --output-dir " + s.dir.file("auto"));
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json auto_run = nlohmann::json::parse(test::slurp(s.dir.file("auto/run.json")));
  EXPECT_EQ(auto_run["options"]["keep_weight_operands"], "auto");
  EXPECT_EQ(auto_run["weight_operands"], "codes") << "a CPU keeps nothing";
}

// On CUDA at training shapes (bf16, 64 rows a product) the operands kept until backward, or across steps and
// written by the update, train the same bytes as the codes: the losses and norms of three steps, and the exported
// weights; the log says which ran. Both fused and not (the update in backward, or after it), both scale modes; under
// --grad-checkpoint also the recompute's operands (recompute) and the first forward's held through the recompute
// (backward), whose buffers the trainer marks stale after each update (without that the second step's forward
// would multiply the first step's weights), with an fp32 master and with a bf16 one and int8 moments; always with
// int8 moments (the int8 kernel writes the operand), with and without checkpointing, both scale modes, and with
// nvfp4 moments.
TEST(RunsCli, GpuKeptWeightOperandsTrainTheSameBytes) {
  QWEN3_GPU_TEST(at::hasCUDA());
  struct Case {
    const char* flags;
    std::vector<const char*> keeps;
  };
  for (const Case& c : {Case{"", {"backward", "always"}}, Case{" --fused-optimizer --scale-mode search", {"backward", "always"}},
                        Case{" --grad-checkpoint", {"backward", "recompute", "always"}},
                        Case{" --grad-checkpoint --fused-optimizer --master-dtype bfloat16 --optimizer-state-mode int8",
                             {"backward", "recompute", "always"}},
                        // The int8 kernel's operand (its lane pairs' block scales) after the backward, both modes.
                        Case{" --master-dtype bfloat16 --optimizer-state-mode int8", {"always"}},
                        Case{" --optimizer-state-mode int8 --scale-mode search", {"always"}},
                        // The nvfp4 kernel's (four lanes a block): the leanest configuration.
                        Case{" --grad-checkpoint --fused-optimizer --master-dtype bfloat16"
                             " --optimizer-state-mode nvfp4",
                             {"always"}},
                        // The first block recomputed (its operands in buffers under backward), the others saved by
                        // their nodes.
                        Case{" --grad-checkpoint --grad-checkpoint-blocks 1 --fused-optimizer", {"backward", "recompute"}}}) {
    RunSetup s;
    const std::string base = s.base + " --device cuda --steps 3 --seq-len 32 --batch-size 2 --log-every 1" + c.flags;
    auto r = run_cli(base + " --keep-weight-operands off --metrics-jsonl " + s.dir.file("a.jsonl") + " --output-dat " +
                     s.dir.file("a.dat"));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE((r.out + r.err).find("backward: codes (--keep-weight-operands off)"), std::string::npos) << r.out << r.err;
    for (const char* keep : c.keeps) {
      r = run_cli(base + " --keep-weight-operands " + keep + " --metrics-jsonl " + s.dir.file("b.jsonl") +
                  " --output-dat " + s.dir.file("b.dat") + " --overwrite");
      ASSERT_EQ(r.code, 0) << r.err;
      EXPECT_NE((r.out + r.err).find(std::string("(--keep-weight-operands ") + keep + ")"), std::string::npos)
          << r.out << r.err;
      expect_same_training(s.dir, 3);
      std::filesystem::remove(s.dir.file("b.jsonl"));
    }
  }
}

// On a GPU the step the tool is built for takes no slower path (docs/trainer.md, "Slow paths"): bf16 activations,
// full and packed rows, the default and the lean flags. Float32 activations send packed rows' attention to a
// [B, 1, T, T] mask, and the run says so.
TEST(RunsCli, GpuBf16StepsTakeNoSlowerPath) {
  QWEN3_GPU_TEST(at::hasCUDA());
  RunSetup s;
  const std::string base = s.base + " --device cuda --steps 2 --seq-len 32 --batch-size 2";
  for (const char* flags : {"", " --pack", " --pack --grad-checkpoint --fused-optimizer --master-dtype bfloat16"
                                           " --optimizer-state-mode int8 --keep-weight-operands always"}) {
    const auto r = run_cli(base + flags);
    ASSERT_EQ(r.code, 0) << flags << "\n" << r.err;
    EXPECT_EQ((r.out + r.err).find("slower path"), std::string::npos) << flags << "\n" << r.out << r.err;
  }
  const auto r = run_cli(base + " --pack --compute-dtype float32");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("slower path: attention of packed rows"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("step 1: slower path: attention of packed rows"), std::string::npos) << r.err;
}

// On CUDA the profiler reports each phase scope twice (the host's range and a device-side annotation): the trace
// and the table have each phase once, and the table's total is the phases' own time.
TEST(RunsCli, GpuProfileStepHasEachPhaseOnce) {
  QWEN3_GPU_TEST(at::hasCUDA());
  RunSetup s;
  const std::string trace = s.dir.file("gpu-step2.json");
  const auto r = run_cli(s.base + " --device cuda --steps 2 --profile-step 2 --profile-out " + trace);
  ASSERT_EQ(r.code, 0) << r.err;
  std::map<std::string, int> phases;
  for (const auto& e : nlohmann::json::parse(test::slurp(trace))["traceEvents"])
    if (e["ph"] == "X" && e["cat"] == "phase") ++phases[e["name"].get<std::string>()];
  EXPECT_EQ(phases, (std::map<std::string, int>{{"backward", 1}, {"batch", 1}, {"forward", 1}, {"optimizer", 1}}));
  size_t table_rows = 0;
  for (size_t at = r.err.find(" info forward "); at != std::string::npos; at = r.err.find(" info forward ", at + 1))
    ++table_rows;
  EXPECT_EQ(table_rows, 1u) << r.err;
}

// --profile-step: the step runs under libtorch's profiler; its phases are scopes of their own in a Chrome trace
// and the log has the time per phase and per op. Without the flag nothing is written.
TEST(RunsCli, ProfileStepWritesATraceOfItsPhases) {
  RunSetup s;
  const std::string trace = s.dir.file("prof/step2.json");
  auto r = run_cli(s.base + " --steps 3 --profile-step 2 --profile-out " + trace);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("profile of step 2:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("aten::mm"), std::string::npos) << r.err;
  const nlohmann::json t = nlohmann::json::parse(test::slurp(trace));
  EXPECT_EQ(t["otherData"]["step"], 2);
  std::map<std::string, std::pair<double, double>> phases;  // name -> [start, end)
  std::vector<double> products;                              // aten::mm start times
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] != "X") continue;
    if (e["cat"] == "phase") phases[e["name"]] = {e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()};
    if (e["name"] == "aten::mm") products.push_back(e["ts"].get<double>());
  }
  ASSERT_EQ(phases.size(), 4u) << t.dump().substr(0, 2000);
  for (const char* name : {"batch", "forward", "backward", "optimizer"}) {
    ASSERT_TRUE(phases.count(name)) << name;
    EXPECT_NE(r.err.find(std::string(name) + " "), std::string::npos) << name << "\n" << r.err;
  }
  // In order; the trace's start and duration are each rounded (to a quarter microsecond, as the profiler reports
  // them), so one phase's end may pass the next one's start by that much (a clean-clone CI run saw 60 vs 59.75).
  const double rounding = 1.0;
  EXPECT_LE(phases["batch"].second, phases["forward"].first + rounding);
  EXPECT_LE(phases["forward"].second, phases["backward"].first + rounding);
  EXPECT_LE(phases["backward"].second, phases["optimizer"].first + rounding);
  // Products run in forward and in backward, never outside the phases.
  int in_forward = 0, in_backward = 0;
  for (double ts : products) {
    in_forward += ts >= phases["forward"].first && ts < phases["forward"].second;
    in_backward += ts >= phases["backward"].first && ts < phases["backward"].second;
  }
  EXPECT_GT(in_forward, 0);
  EXPECT_GT(in_backward, 0);
  EXPECT_EQ(in_forward + in_backward, static_cast<int>(products.size()));

  // Off unless asked; the output is checked before the first step and never replaced.
  r = run_cli(s.base + " --steps 1 --output-dir " + s.dir.file("plain"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("profile of step"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(s.dir.file("plain/profile-step-1.json")));
  r = run_cli(s.base + " --steps 1 --profile-step 1 --output-dir " + s.dir.file("profiled"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(s.dir.file("profiled/profile-step-1.json")));
  r = run_cli(s.base + " --steps 3 --profile-step 2 --profile-out " + trace);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--profile-out"), std::string::npos) << r.err;
  r = run_cli(s.base + " --steps 3 --profile-step 4 --profile-out " + s.dir.file("late.json"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--profile-step 4 is beyond the run's 3 steps"), std::string::npos) << r.err;
  r = run_cli(s.base + " --steps 3 --profile-step 2");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--profile-step needs --profile-out"), std::string::npos) << r.err;
  r = run_cli(s.base + " --steps 3 --profile-out " + s.dir.file("x.json"));
  EXPECT_EQ(r.code, 2);
}

}  // namespace
}  // namespace qwen3
