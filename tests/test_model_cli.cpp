// `generate` and `eval` end to end on a synth model through the real binary.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include <ATen/ATen.h>

#include "cli_test_util.h"
#include "gpu_test.h"
#include "qwen3/convert/safetensors.h"
#include "tokenizer_test_util.h"
#include "build_paths.h"

namespace qwen3 {
namespace {

using test::run_cli;

// One tiny synth model shared by the tests of this file (writing it takes about a second).
class ModelCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    const auto r = run_cli("synth --preset tiny --seed 1 --out-dir " + dir_->file("m"));
    ASSERT_EQ(r.code, 0) << r.err;
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string model_flags() {
    return "--weights " + dir_->file("m/model.dat") + " --config " + dir_->file("m/config.json");
  }
  static test::TempDir* dir_;
};
test::TempDir* ModelCli::dir_ = nullptr;

std::vector<int64_t> ids_of_line(const std::string& line) {
  std::istringstream in(line);
  std::vector<int64_t> ids;
  for (int64_t v; in >> v;) ids.push_back(v);
  return ids;
}

TEST_F(ModelCli, GenerateFromIdsWithoutATokenizer) {
  const std::string base = "generate " + model_flags() + " --prompt-ids '9707 4337 13' --print-ids --ignore-eos";
  auto r = run_cli(base + " --max-new-tokens 6");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(ids_of_line(r.out).size(), 6u) << r.out;
  // Sampling is reproducible from the seed.
  const auto a = run_cli(base + " --max-new-tokens 6 --temperature 0.9 --top-k 50 --top-p 0.9 --seed 4");
  const auto b = run_cli(base + " --max-new-tokens 6 --temperature 0.9 --top-k 50 --top-p 0.9 --seed 4");
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
}

TEST_F(ModelCli, GenerateChecksItsFlags) {
  auto r = run_cli("generate " + model_flags() + " --prompt hello");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--tokenizer"), std::string::npos) << r.err;
  r = run_cli("generate " + model_flags() + " --prompt-ids '1 2' --prompt hi --tokenizer " +
              test::tiny_tokenizer_path());
  EXPECT_EQ(r.code, 2);
  r = run_cli("generate " + model_flags() + " --prompt-ids '1 x' --print-ids");
  EXPECT_EQ(r.code, 2);  // the text of a flag
  EXPECT_NE(r.err.find("'x' is not a token id"), std::string::npos) << r.err;
  r = run_cli("generate " + model_flags() + " --prompt-ids '1 999999' --print-ids");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("outside the vocabulary"), std::string::npos) << r.err;
  // Sampling's flags without sampling (greedy, the default temperature) were ignored silently.
  r = run_cli("generate " + model_flags() + " --prompt-ids 1 --print-ids --top-k 5 --seed 0");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("generate: --top-k, --seed shape(s) sampling, which --temperature above 0 turns on"),
            std::string::npos)
      << r.err;
  r = run_cli("generate " + model_flags() + " --prompt-ids 1 --print-ids --top-p 0");
  EXPECT_EQ(r.code, 2);
  // The range as it is: 0 excluded, 1 included (CLI11's range text quoted 0 as allowed).
  EXPECT_NE(r.err.find("--top-p: a probability in (0, 1]"), std::string::npos) << r.err;
  r = run_cli("generate " + model_flags() + " --prompt-ids 1 --print-ids --top-p 1.5");
  EXPECT_EQ(r.code, 2);
  // What renders a chat prompt applies to one (each was ignored beside ids or --no-chat, silently).
  for (const auto& [flags, named] : std::vector<std::pair<std::string, std::string>>{
           {" --prompt-ids 1 --print-ids --system hi", "generate: --system applies to a chat prompt"},
           {" --prompt-ids 1 --print-ids --chat-template chatml", "--chat-template apply to a chat prompt"},
           {" --prompt hi --no-chat --system hi --tokenizer " + test::tiny_tokenizer_path(),
            "generate: --system applies to a chat prompt"},
           {" --prompt-ids 1 --print-ids --no-chat", "generate: --no-chat applies to --prompt"}}) {
    r = run_cli("generate " + model_flags() + flags);
    EXPECT_EQ(r.code, 2) << flags;
    EXPECT_NE(r.err.find(named), std::string::npos) << flags << "\n" << r.err;
  }
  // The value given, quoted (CLI11's range said "Value 1e30 not in range 0.000000 to 100.000000").
  r = run_cli("generate " + model_flags() + " --prompt-ids 1 --print-ids --temperature 1e30");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--temperature: must be at most 100 (logits divided by more are uniform noise), got '1e30'"),
            std::string::npos)
      << r.err;
}

// Generation is bounded by the model's positions, not by --max-new-tokens (1e9 allocated a cache of 1e9
// positions and died with a raw allocation error); half precision on CPU is a usage error, not a raw libtorch one.
TEST_F(ModelCli, GenerateStopsAtTheModelsPositions) {
  nlohmann::json config = nlohmann::json::parse(std::ifstream(dir_->file("m/config.json")));
  config["max_position_embeddings"] = 12;
  const std::string short_config = dir_->file("short_config.json");
  std::ofstream(short_config) << config.dump();
  const std::string base = "generate --weights " + dir_->file("m/model.dat") + " --config " + short_config;
  auto r = run_cli(base + " --prompt-ids '1 2 3 4' --print-ids --ignore-eos --max-new-tokens 1048576");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(ids_of_line(r.out).size(), 8u) << r.out;
  EXPECT_NE(r.err.find("at most 8 new tokens"), std::string::npos) << r.err;
  r = run_cli(base + " --prompt-ids '1 2 3 4 5 6 7 8 9 10 11 12' --print-ids");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("max_position_embeddings 12 leaves no room"), std::string::npos) << r.err;
  r = run_cli("generate " + model_flags() + " --prompt-ids '1 2' --print-ids --dtype float16");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--dtype float16 runs on CUDA only"), std::string::npos) << r.err;
}

TEST_F(ModelCli, GenerateChatPromptAndExpect) {
  const std::string base = "generate " + model_flags() + " --tokenizer " + test::tiny_tokenizer_path() +
                           " --prompt 'hello world' --max-new-tokens 4";
  auto r = run_cli(base + " --expect '.*'");
  EXPECT_EQ(r.code, 0) << r.err;
  r = run_cli(base + " --expect 'this reply cannot appear from four tokens of a tiny vocabulary'");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("does not match --expect"), std::string::npos) << r.err;
  r = run_cli(base + " --expect '('");
  EXPECT_EQ(r.code, 2);
}

// stdout and stderr into one pipe (as `2>&1 | tee` gives): the reply and the ids end with their newline before the
// log line that follows them, not after it (a buffered stdout used to land after the log).
TEST_F(ModelCli, GenerateEndsItsReplyBeforeTheLogLine) {
  const auto r = test::run_shell("{ " + test::binary_command() + " generate " + model_flags() + " --tokenizer " +
                                 test::tiny_tokenizer_path() +
                                 " --prompt 'hello world' --max-new-tokens 4 --print-ids 2>&1; }");
  ASSERT_EQ(r.code, 0) << r.out;
  const size_t log = r.out.find("generate: load");
  ASSERT_NE(log, std::string::npos) << r.out;
  // The line before the log line is the ids, and the reply's line comes before it.
  const size_t log_line = r.out.rfind('\n', log);
  ASSERT_NE(log_line, std::string::npos) << r.out;
  const size_t ids_line = r.out.rfind('\n', log_line - 1);
  const std::string ids = r.out.substr(ids_line == std::string::npos ? 0 : ids_line + 1, log_line - ids_line - 1);
  EXPECT_FALSE(ids.empty()) << r.out;
  EXPECT_EQ(ids.find_first_not_of("0123456789 "), std::string::npos) << "not the ids line: '" << ids << "'\n" << r.out;
}

TEST_F(ModelCli, EvalPrintsPerSequenceAndTokenWeightedMean) {
  const std::string ids = dir_->file("ids.txt");
  std::ofstream(ids) << "# comment\n9707 4337 13 151645\n\n1 2 3 4 5 6 7 8\n";
  auto r = run_cli("eval " + model_flags() + " --token-ids-file " + ids + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["sequences"].size(), 2u);
  EXPECT_EQ(j["sequences"][0]["tokens"], 3);
  EXPECT_EQ(j["sequences"][1]["tokens"], 7);
  const double l0 = j["sequences"][0]["loss"], l1 = j["sequences"][1]["loss"];
  EXPECT_NEAR(j["mean_loss"].get<double>(), (3 * l0 + 7 * l1) / 10, 1e-9);
  // A random model over 151936 tokens is close to uniform: loss near ln(151936) = 11.93.
  EXPECT_NEAR(l1, 11.93, 1.5);

  std::ofstream(ids) << "1 2 3\n4 five 6\n";
  r = run_cli("eval " + model_flags() + " --token-ids-file " + ids);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("ids.txt:2"), std::string::npos) << r.err;

  const std::string tsv = dir_->file("pairs.tsv");
  std::ofstream(tsv) << "hello\tworld\nplain text line\n";
  r = run_cli("eval " + model_flags() + " --data " + tsv + " --tokenizer " + test::tiny_tokenizer_path());
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("mean loss"), std::string::npos) << r.out;
  r = run_cli("eval " + model_flags() + " --data " + tsv + " --tokenizer " + test::tiny_tokenizer_path() +
              " --data-format text --system be");
  EXPECT_EQ(r.code, 2);  // it was ignored, silently
  EXPECT_NE(r.err.find("--system applies to pairs and chat records"), std::string::npos) << r.err;
  // Found from the data as well, where --data-format is auto: plain text lines.
  std::ofstream(dir_->file("plain.txt")) << "just some text\n";
  r = run_cli("eval " + model_flags() + " --data " + dir_->file("plain.txt") + " --tokenizer " +
              test::tiny_tokenizer_path() + " --system be");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("plain.txt' is text: plain text"), std::string::npos) << r.err;
}

// eval and generate on a GPU warn of the slower paths their forward passes took, as training does (docs/trainer.md,
// "Slow paths"): none in bfloat16, attention off the flash node in float32. On a CPU nothing is recorded.
TEST_F(ModelCli, GpuEvalAndGenerateWarnOfTheirSlowerPaths) {
  QWEN3_GPU_TEST(at::hasCUDA());
  const std::string ids = dir_->file("gpu-ids.txt");
  std::ofstream(ids) << "9707 4337 13 151645 1 2 3 4\n";
  for (const char* dtype : {"bfloat16", "float32"}) {
    const std::string device = std::string(" --device cuda --dtype ") + dtype;
    const auto eval = run_cli("eval " + model_flags() + " --token-ids-file " + ids + device);
    const auto gen = run_cli("generate " + model_flags() + " --prompt-ids '9707 4337 13' --print-ids --ignore-eos"
                             " --max-new-tokens 4" + device);
    for (const auto* r : {&eval, &gen}) {
      ASSERT_EQ(r->code, 0) << dtype << "\n" << r->err;
      const bool warned = r->err.find("slower path: causal attention") != std::string::npos;
      EXPECT_EQ(warned, std::string(dtype) == "float32") << dtype << "\n" << r->err;
    }
    if (std::string(dtype) == "float32") {
      EXPECT_NE(eval.err.find("eval: slower path:"), std::string::npos) << eval.err;
      EXPECT_NE(gen.err.find("generate: slower path:"), std::string::npos) << gen.err;
    }
  }
  const auto cpu = run_cli("eval " + model_flags() + " --token-ids-file " + ids);
  ASSERT_EQ(cpu.code, 0) << cpu.err;
  EXPECT_EQ(cpu.err.find("slower path"), std::string::npos) << cpu.err;
}

// One definition (issue 14 point 13): `eval --data` scores what training's eval_loss scores — a pair's target
// and its <|im_end|>, never the prompt, with the --system prompt rendered — and gives the same figure for the
// same file, weights and --seq-len (a 1-step run at lr 0 leaves the weights as they are).
TEST_F(ModelCli, EvalDataEqualsTrainingsEvalLoss) {
  const std::string tsv = dir_->file("held_out.tsv");
  std::ofstream(tsv) << "# format: prompt<TAB>target\nhello\tworld\nwhat is two and two\tfour\n";
  const std::string common = " --tokenizer " + test::tiny_tokenizer_path() + " --system 'be brief' --seq-len 96";
  auto r = run_cli("eval " + model_flags() + " --data " + tsv + common + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["sequences"].size(), 2u);
  EXPECT_EQ(j["sequences"][0]["line"], 2);
  EXPECT_EQ(j["sequences"][0]["tokens"], 4);  // "world" (3 tokens of the tiny tokenizer) and <|im_end|>
  EXPECT_EQ(j["sequences"][1]["tokens"], 5);  // "four" (4) and <|im_end|>

  // The figures differ by the head only: this tied model's file also stores an NVFP4 lm_head, which inference
  // uses, while training ties the head to the fp16 embedding (as HF does; docs/data.md) — 4e-5 relative here.
  const std::string metrics = dir_->file("eval_metrics.jsonl");
  r = run_cli("train " + model_flags() + " --train-data " + tsv + " --eval-data " + tsv + common +
              " --steps 1 --lr 0 --eval-every 1 --metrics-jsonl " + metrics);
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream in(metrics);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const double train_eval = nlohmann::json::parse(line)["eval_loss"];
  EXPECT_NEAR(train_eval, j["mean_loss"].get<double>(), 1e-4 * train_eval);
}

// A line far longer than the window is scored in windows of --seq-len + 1 tokens (each target once), not in one
// forward of the whole line; a window beyond the model's positions is refused up front.
TEST_F(ModelCli, EvalScoresLongLinesInWindows) {
  const std::string text = dir_->file("long.txt");
  std::ofstream(text) << std::string(1000, 'a') << "\n";  // 250 tokens of the tiny tokenizer
  auto r = run_cli("eval " + model_flags() + " --data " + text + " --tokenizer " + test::tiny_tokenizer_path() +
                   " --seq-len 32 --batch-size 3 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["sequences"].size(), 8u);  // 249 targets in windows of 32
  int64_t scored = 0;
  for (const auto& s : j["sequences"]) {
    EXPECT_EQ(s["line"], 1);
    scored += s["tokens"].get<int64_t>();
  }
  EXPECT_EQ(scored, 249);
  r = run_cli("eval " + model_flags() + " --data " + text + " --tokenizer " + test::tiny_tokenizer_path() +
              " --seq-len 100000");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("max_position_embeddings"), std::string::npos) << r.err;
}

// --logits-out: every window's fp32 logits and ids, in a safetensors file an independent implementation can read
// (bench/hf_peer.py). The logits must be the ones eval scored: their cross-entropy is eval's loss.
TEST_F(ModelCli, EvalWritesTheLogitsItScores) {
  const std::string ids = dir_->file("logit_ids.txt");
  std::ofstream(ids) << "9707 4337 13 151645\n1 2 3 4 5 6 7 8 9 10\n";
  const std::string out = dir_->file("logits/out.safetensors");
  auto r = run_cli("eval " + model_flags() + " --token-ids-file " + ids + " --seq-len 6 --json --logits-out " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["sequences"].size(), 3u);  // line 2 in windows of 7 ids overlapping by one: 1..7, 7..10

  const SafetensorsFile file(out);
  const int64_t vocab = 151936;
  const std::vector<std::vector<int64_t>> expected_ids = {{9707, 4337, 13, 151645}, {1, 2, 3, 4, 5, 6, 7}, {7, 8, 9, 10}};
  for (size_t k = 0; k < expected_ids.size(); ++k) {
    const auto* id_tensor = file.find("ids." + std::to_string(k));
    const auto* logit_tensor = file.find("logits." + std::to_string(k));
    ASSERT_TRUE(id_tensor && logit_tensor) << k;
    const auto n = static_cast<int64_t>(expected_ids[k].size());
    EXPECT_EQ(id_tensor->dtype, "I64");
    EXPECT_EQ(logit_tensor->dtype, "F32");
    EXPECT_EQ(logit_tensor->shape, (std::vector<int64_t>{n - 1, vocab}));
    std::vector<int64_t> got(static_cast<size_t>(n));
    file.read_range(*id_tensor, 0, got.data(), id_tensor->nbytes);
    EXPECT_EQ(got, expected_ids[k]);
    at::Tensor logits = at::empty({n - 1, vocab}, at::kFloat);
    file.read_range(*logit_tensor, 0, logits.data_ptr<float>(), logit_tensor->nbytes);
    const at::Tensor targets = at::tensor(std::vector<int64_t>(got.begin() + 1, got.end()), at::kLong);
    const double loss = at::cross_entropy_loss(logits, targets).item<double>();
    EXPECT_NEAR(loss, j["sequences"][k]["loss"].get<double>(), 1e-5) << "window " << k;
  }
  // The metadata says where each window came from.
  std::ifstream raw(out, std::ios::binary);
  uint64_t header_len = 0;
  raw.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, ' ');
  raw.read(header.data(), static_cast<std::streamsize>(header_len));
  const auto windows = nlohmann::json::parse(nlohmann::json::parse(header)["__metadata__"]["windows"].get<std::string>());
  EXPECT_EQ(windows, nlohmann::json::parse(R"([{"line":1,"start":0},{"line":2,"start":0},{"line":2,"start":6}])"));

  // Never a silent overwrite, never an input; --logits-out reads ids only.
  r = run_cli("eval " + model_flags() + " --token-ids-file " + ids + " --logits-out " + out);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--overwrite"), std::string::npos) << r.err;
  r = run_cli("eval " + model_flags() + " --token-ids-file " + ids + " --logits-out " + ids + " --overwrite");
  EXPECT_EQ(r.code, 2);
  r = run_cli("eval " + model_flags() + " --data " + ids + " --tokenizer " + test::tiny_tokenizer_path() +
              " --logits-out " + dir_->file("x.safetensors"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--logits-out needs --token-ids-file"), std::string::npos) << r.err;
  // A bad line of ids is always an error, so --strict-data would change nothing there: refused, not ignored.
  r = run_cli("eval " + model_flags() + " --token-ids-file " + ids + " --strict-data");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("eval: --strict-data applies to --data only"), std::string::npos) << r.err;
  r = run_cli("eval " + model_flags() + " --token-ids-file " + ids + " --batch-size 4");  // one window a forward
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("eval: --batch-size applies to --data only"), std::string::npos) << r.err;
  r = run_cli("eval " + model_flags() + " --token-ids-file " + ids + " --logits-out " + out + " --overwrite");
  EXPECT_EQ(r.code, 0) << r.err;
}

// The offline smoke (the built-in tiny tokenizer, which tests/data holds too): its replies take many more
// tokens, and 20 steps left "I am Qwen." half learned; it now trains long enough to pass.
// The README's main job as it runs after scripts/fetch-tokenizer.sh: the real tokenizer, whose hybrid chat
// template (an empty think block before every reply) once made 20 steps too few for the reply.
TEST(SmokeCli, PassesWithTheRealTokenizer) {
  QWEN3_REQUIRE_REAL_TOKENIZER(tok);
  test::TempDir dir;
  const auto r = test::run_cli("smoke --out-dir " + dir.file("smoke") + " --tokenizer " + test::real_tokenizer_path());
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("-> \"I am Qwen.\" (expected \"I am Qwen.\") ok"), std::string::npos) << r.out;
}

// The same run on the tiny mixture-of-experts model (smoke --moe): trained, exported, reloaded, it replies.
TEST(SmokeCli, PassesOnTheMixtureOfExpertsModel) {
  QWEN3_REQUIRE_REAL_TOKENIZER(tok);
  test::TempDir dir;
  const auto r =
      test::run_cli("smoke --moe --out-dir " + dir.file("smoke") + " --tokenizer " + test::real_tokenizer_path());
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("-> \"I am Qwen.\" (expected \"I am Qwen.\") ok"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("load-balancing loss: trained with coefficient 0.001"), std::string::npos) << r.err;
}

// smoke owns its --out-dir: a re-run replaces its own files there, and a folder holding anything else (a mistyped
// path to someone's model) is refused before anything in it is written.
TEST(SmokeCli, RefusesAFolderHoldingFilesItDoesNotWrite) {
  test::TempDir dir;
  std::filesystem::create_directories(dir.file("theirs/model"));
  std::ofstream(dir.file("theirs/model/model.dat")) << "precious";
  std::ofstream(dir.file("theirs/notes.txt")) << "mine";
  const std::string flags = " --steps 1 --tokenizer " + test::tiny_tokenizer_path();
  auto r = test::run_cli("smoke --out-dir " + dir.file("theirs") + flags);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("smoke: --out-dir " + dir.file("theirs") + " holds files smoke does not write (notes.txt)"),
            std::string::npos)
      << r.err;
  std::ifstream in(dir.file("theirs/model/model.dat"));
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "precious");
  // Only smoke's own names (a previous smoke's folder): it runs (one step is too few to reply: exit 1, not 2).
  std::filesystem::remove(dir.file("theirs/notes.txt"));
  r = test::run_cli("smoke --out-dir " + dir.file("theirs") + flags);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("smoke: export"), std::string::npos) << r.out;
  std::ofstream(dir.file("file")) << "x";
  r = test::run_cli("smoke --out-dir " + dir.file("file") + flags);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("is a file; give a folder"), std::string::npos) << r.err;
}

// A device the machine lacks is named before anything is written (smoke wrote its model first, and then libtorch's
// own "Could not run 'aten::empty.memory_format' with arguments from the 'CUDA' backend" came out). cuda:99: no
// CUDA on this machine, or no such GPU on one with CUDA; either way the same line.
TEST(SmokeCli, AMissingDeviceIsNamedBeforeAnythingIsWritten) {
  test::TempDir dir;
  const auto r = test::run_cli("smoke --device cuda:99 --out-dir " + dir.file("smoke") + " --tokenizer " +
                               test::tiny_tokenizer_path());
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_EQ(r.err.rfind("error: --device cuda:99: ", 0), 0u) << r.err;
  EXPECT_EQ(r.err.find("aten::"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("smoke")));
}

TEST(SmokeCli, PassesWithTheTinyTokenizer) {
  test::TempDir dir;
  const auto r = test::run_cli("smoke --out-dir " + dir.file("smoke") + " --tokenizer " + test::tiny_tokenizer_path());
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("-> \"I am Qwen.\" (expected \"I am Qwen.\") ok"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace qwen3
