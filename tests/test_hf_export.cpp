// `export --format hf | nvfp4-hf` (docs/export.md, "Hugging Face and vLLM"): a trained tiny model out to both
// layouts, read back by an independent Node reader (tests/readers/check_hf_export.mjs: headers, shapes, the
// index, and every NVFP4 value against the bf16 export) and by qwen3-train's own loader (the bf16 values are the
// model's), plus sharding, the tied head, and the folder's atomic replacement.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <unistd.h>
#include <fstream>
#include <map>
#include <set>

#include "cli_test_util.h"
#include "dat_test_util.h"
#include "qwen3/convert/safetensors.h"
#include "qwen3/dat/dat_tensor.h"
#include "qwen3/model/model_loader.h"
#include "qwen3/model/synth.h"
#include "qwen3/trainer/trainer.h"
#include "tiny_model_util.h"
#include "build_paths.h"

namespace qwen3 {
namespace {

namespace fs = std::filesystem;
using test::run_cli;

struct HfTrained {
  SynthResult model;
  std::string checkpoints;
};

// The tiny synthetic model in DIR/m.
SynthResult tiny_model(const test::TempDir& dir, bool tied = false) {
  SynthOptions s;
  s.config = test::trainable_tiny_config(tied);
  s.out_dir = dir.file("m");
  return write_synthetic_model(s);
}

// The tiny model trained three steps, all of it (so every tensor of the export comes from the checkpoint).
HfTrained trained_model(const test::TempDir& dir, bool tied) {
  HfTrained t{tiny_model(dir, tied), dir.file("ck")};
  std::ofstream(dir.file("pairs.tsv")) << "hi\tworld\nname?\tqwen\nabc\txyz\ncolor\tblue\n";
  TrainOptions o;
  o.weights = t.model.dat_path;
  o.config = t.model.config_path;
  o.tokenizer = test::tiny_tokenizer_path();
  o.data.path = dir.file("pairs.tsv");
  o.data.seq_len = 32;
  o.data.batch_size = 4;
  o.steps = 3;
  o.schedule.lr = 1e-2;
  o.log_every = 0;
  o.checkpoint_dir = t.checkpoints;
  run_training(o);
  return t;
}

std::string export_cmd(const HfTrained& t, const std::string& format, const std::string& out) {
  return "export --format " + format + " --checkpoint " + t.checkpoints + " --weights " + t.model.dat_path +
         " --config " + t.model.config_path + " --tokenizer " + test::tiny_tokenizer_path() + " --out " + out;
}

// A safetensors folder's tensors by name (one file or shards).
std::map<std::string, at::Tensor> read_folder(const std::string& dir) {
  std::map<std::string, at::Tensor> out;
  for (const auto& f : fs::directory_iterator(dir)) {
    if (f.path().extension() != ".safetensors") continue;
    const SafetensorsFile file(f.path().string());
    for (const SafetensorsTensor& t : file.tensors()) {
      at::Tensor x = at::empty({static_cast<int64_t>(t.nbytes)}, at::kByte);
      file.read_range(t, 0, x.data_ptr(), t.nbytes);
      if (t.dtype == "BF16") x = x.view(at::kBFloat16).reshape(t.shape);
      out[t.name] = x;
    }
  }
  return out;
}

TEST(HfExportCli, TrainedModelOutToHfAndNvfp4HfReadByAnIndependentReader) {
  test::TempDir dir;
  const HfTrained t = trained_model(dir, /*tied=*/false);
  const std::string hf = dir.file("hf"), fp4 = dir.file("fp4");
  auto r = run_cli(export_cmd(t, "hf", hf));
  ASSERT_EQ(r.code, 0) << r.err;
  r = run_cli(export_cmd(t, "nvfp4-hf", fp4));
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"})
    EXPECT_TRUE(fs::exists(fs::path(hf) / f)) << f;
  EXPECT_TRUE(fs::exists(fs::path(fp4) / "hf_quant_config.json"));

  // The bf16 values are the model's: every tensor of the .dat export of the same checkpoint, as the loader reads it
  // (projections dequantized: exact in bf16; dense tensors went through the file's own dtype, so to bf16 rounding).
  ASSERT_EQ(run_cli("export --checkpoint " + t.checkpoints + " --weights " + t.model.dat_path + " --out " +
                    dir.file("out.dat")).code, 0);
  const DatReader dat(dir.file("out.dat"));
  const std::map<std::string, at::Tensor> tensors = read_folder(hf);
  const auto config = load_config(t.model.config_path);
  auto model = load_model(dat, config, at::kFloat, at::kCPU);
  size_t compared = 0;
  for (const auto& [key, w] : model->named_weights()) {
    ASSERT_TRUE(tensors.count(key)) << key;
    const at::Tensor mine = w.to(at::kBFloat16);
    if (dat.find(key + std::string(kQdataSuffix)))
      EXPECT_TRUE(tensors.at(key).equal(mine)) << key;
    else
      EXPECT_TRUE(at::allclose(tensors.at(key).to(at::kFloat), w, 1e-2, 1e-3)) << key;
    ++compared;
  }
  EXPECT_EQ(compared, tensors.size());

  if (!test::command_succeeds("node --version")) GTEST_SKIP() << "node is not installed: the independent reader did not run";
  const test::CliResult node = test::run_shell("node " + test::source_dir() +
                                               "/tests/readers/check_hf_export.mjs " + hf + " " + fp4);
  ASSERT_EQ(node.code, 0) << node.err;
  const nlohmann::json summary = nlohmann::json::parse(node.out);
  EXPECT_EQ(summary["projections"], 7 * config.num_hidden_layers);
  EXPECT_GT(summary["values"].get<int64_t>(), 0);
  EXPECT_EQ(summary["quant_algo"], "W4A16_NVFP4");
  EXPECT_EQ(summary["fused_groups"], 4 * config.num_hidden_layers);  // qkv, o, gate_up, down a layer

  // W4A4 on request: NVFP4 with an input_scale per projection, the same weights.
  const std::string w4a4 = dir.file("w4a4");
  r = run_cli(export_cmd(t, "nvfp4-hf", w4a4) + " --nvfp4-w4a4");
  ASSERT_EQ(r.code, 0) << r.err;
  const test::CliResult node4 = test::run_shell("node " + test::source_dir() + "/tests/readers/check_hf_export.mjs " +
                                                hf + " " + w4a4);
  ASSERT_EQ(node4.code, 0) << node4.err;
  EXPECT_EQ(nlohmann::json::parse(node4.out)["quant_algo"], "NVFP4");
  r = run_cli(export_cmd(t, "hf", dir.file("x")) + " --nvfp4-w4a4");
  EXPECT_EQ(r.code, 2) << r.err;
}

// An export never deletes what it reads or what it did not write: --out that is, holds or lies inside an input
// (the weights' folder, the checkpoint, a parent of it) is refused with or without --overwrite, and --overwrite
// replaces only a folder of export files; "--out new/" (a trailing slash) is the folder new; the folders a killed
// export left beside its target go with the next export to it.
TEST(HfExportCli, OverwriteNeverRemovesInputsOrForeignFiles) {
  test::TempDir dir;
  const HfTrained t = trained_model(dir, /*tied=*/false);
  const std::string base = "export --format hf --checkpoint " + t.checkpoints + " --weights " + t.model.dat_path +
                           " --config " + t.model.config_path + " --tokenizer " + test::tiny_tokenizer_path();
  for (const std::string& out : {dir.file("m"), t.checkpoints, dir.path().string(), t.checkpoints + "/inside"}) {
    const auto r = run_cli(base + " --overwrite --out " + out);
    EXPECT_EQ(r.code, 2) << out << ": " << r.err;
    EXPECT_NE(r.err.find("an export never replaces what it reads"), std::string::npos) << r.err;
  }
  EXPECT_TRUE(fs::exists(t.model.dat_path));
  EXPECT_TRUE(fs::exists(t.checkpoints + "/step-00000003/tensors.dat"));
  // A folder of someone's files is not an export to replace.
  fs::create_directories(dir.file("mine"));
  std::ofstream(dir.file("mine/notes.txt")) << "keep";
  auto r = run_cli(base + " --overwrite --out " + dir.file("mine"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("holds what no export writes (notes.txt)"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(dir.file("mine/notes.txt")));
  // A trailing slash names the folder; an export replaces its own folder.
  r = run_cli(base + " --out " + dir.file("new") + "/");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir.file("new/model.safetensors")));
  r = run_cli(base + " --overwrite --out " + dir.file("new") + "/");
  EXPECT_EQ(r.code, 0) << r.err;
  // What a killed export left beside its target goes with the next export to it, named; a live process's stays.
  const std::string dead_partial = dir.file(".fresh.partial-2147483000"), dead_old = dir.file(".fresh.old-2147483001");
  const std::string live = dir.file(".fresh.partial-" + std::to_string(::getpid()));
  for (const std::string& d : {dead_partial, dead_old, live}) {
    fs::create_directories(d);
    std::ofstream(d + "/model.safetensors") << "half";
  }
  r = run_cli(base + " --out " + dir.file("fresh"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(fs::exists(dead_partial));
  EXPECT_FALSE(fs::exists(dead_old));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_NE(r.err.find("export: removed " + dead_partial + ", left by an export to this target that was killed"),
            std::string::npos) << r.err;
}

// The folder carries what transformers and vLLM read beside the weights: transformers_version, the base model's
// generation_config.json where it sits beside its config.json, and the tokenizer of the checkpoint's run when
// --tokenizer is not given; a folder without a tokenizer only on purpose (--no-tokenizer).
TEST(HfExportCli, TheFolderCarriesTheModelsOwnFiles) {
  test::TempDir dir;
  HfTrained t{tiny_model(dir), dir.file("ck")};
  std::ofstream(dir.file("pairs.tsv")) << "hi\tworld\nname?\tqwen\n";
  auto r = run_cli("train --weights " + t.model.dat_path + " --config " + t.model.config_path + " --tokenizer " +
                   test::tiny_tokenizer_path() + " --train-data " + dir.file("pairs.tsv") +
                   " --steps 1 --seq-len 32 --log-every 0 --checkpoint-dir " + t.checkpoints);
  ASSERT_EQ(r.code, 0) << r.err;
  nlohmann::json generation = {{"do_sample", true}, {"temperature", 0.6}, {"top_p", 0.95}, {"eos_token_id", {151645, 151643}}};
  std::ofstream(fs::path(t.model.config_path).parent_path() / "generation_config.json") << generation.dump();
  const std::string out = dir.file("hf");
  r = run_cli("export --format hf --checkpoint " + t.checkpoints + " --weights " + t.model.dat_path + " --out " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json config = nlohmann::json::parse(test::slurp(out + "/config.json"));
  EXPECT_TRUE(config["transformers_version"].is_string());
  EXPECT_EQ(nlohmann::json::parse(test::slurp(out + "/generation_config.json")), generation);
  EXPECT_EQ(test::slurp(out + "/tokenizer.json"), test::slurp(test::tiny_tokenizer_path()));  // the run's
  // A .dat alone names no tokenizer: refused without one, unless the weights alone are asked for.
  r = run_cli("export --format hf --weights " + t.model.dat_path + " --config " + t.model.config_path + " --out " +
              dir.file("plain"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--no-tokenizer"), std::string::npos) << r.err;
  r = run_cli("export --format hf --weights " + t.model.dat_path + " --config " + t.model.config_path + " --out " +
              dir.file("plain") + " --no-tokenizer");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(fs::exists(dir.file("plain/tokenizer.json")));
}

TEST(HfExportCli, ShardsTiedHeadAndReplacingTheFolder) {
  test::TempDir dir;
  const HfTrained t = trained_model(dir, /*tied=*/true);
  const std::string hf = dir.file("hf"), fp4 = dir.file("fp4");
  auto r = run_cli(export_cmd(t, "hf", hf) + " --max-shard-size 40KB");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json index = nlohmann::json::parse(test::slurp(hf + "/model.safetensors.index.json"));
  EXPECT_GT(std::set<std::string>(index["weight_map"].begin(), index["weight_map"].end()).size(), 2u);
  EXPECT_FALSE(index["weight_map"].contains("lm_head.weight"));  // tied: transformers ties it to the embedding
  EXPECT_EQ(read_folder(hf).size(), index["weight_map"].size());
  // The folder is never replaced unasked; with --overwrite it is, and nothing partial is left beside it.
  r = run_cli(export_cmd(t, "hf", hf));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("pass --overwrite"), std::string::npos) << r.err;
  r = run_cli(export_cmd(t, "hf", hf) + " --overwrite");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(hf + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(hf + "/model.safetensors.index.json"));  // the new export is one file
  for (const auto& f : fs::directory_iterator(dir.path()))
    EXPECT_EQ(f.path().filename().string().find(".hf."), std::string::npos) << f.path();
  r = run_cli(export_cmd(t, "nvfp4-hf", fp4) + " --max-shard-size 30KB");
  ASSERT_EQ(r.code, 0) << r.err;
  r = run_cli(export_cmd(t, "hf", dir.file("x")) + " --max-shard-size 5XB");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--max-shard-size"), std::string::npos) << r.err;
  if (!test::command_succeeds("node --version")) GTEST_SKIP() << "node is not installed";
  const test::CliResult node = test::run_shell("node " + test::source_dir() +
                                               "/tests/readers/check_hf_export.mjs " + hf + " " + fp4);
  ASSERT_EQ(node.code, 0) << node.err;
  EXPECT_GT(nlohmann::json::parse(node.out)["nvfp4_shards"].get<int>(), 1);
}

// A Hugging Face folder given where a .dat is expected says what it is and the one command that makes the .dat;
// after that command, --model-dir of the folder is all train needs (config, tokenizer and weights from it).
TEST(HfExportCli, AHuggingFaceFolderTrainsAfterOneConvert) {
  test::TempDir dir;
  const SynthResult m = tiny_model(dir);
  const std::string folder = dir.file("hf");
  ASSERT_EQ(run_cli("export --format hf --weights " + m.dat_path + " --config " + m.config_path + " --tokenizer " +
                    test::tiny_tokenizer_path() + " --out " + folder).code, 0);
  std::ofstream(dir.file("pairs.tsv")) << "hi\tworld\nname?\tqwen\n";
  const std::string train = "train --train-data " + dir.file("pairs.tsv") + " --steps 1 --seq-len 32 --log-every 0 ";
  auto r = run_cli(train + "--model-dir " + folder);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("holds Hugging Face safetensors and no model.dat: convert it once with `qwen3-train convert "
                       "--hf-dir " + folder),
            std::string::npos) << r.err;
  r = run_cli(train + "--model-dir " + folder + " --weights " + folder + "/model.safetensors");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(folder + "/model.safetensors: a safetensors file (Hugging Face), not a .dat"), std::string::npos)
      << r.err;
  ASSERT_EQ(run_cli("convert --hf-dir " + folder + " --out " + folder + "/model.dat --nvfp4").code, 0);
  r = run_cli(train + "--model-dir " + folder);
  EXPECT_EQ(r.code, 0) << r.err;
}

// `convert` reads a ModelOpt NVFP4 checkpoint: the nvfp4-hf export converts back to the very bytes it came from
// (its power-of-two second level folded back exactly, re-quantized by the canonical quantizer: error 0), and a
// two-level one (a tensor scale 0.3 times the export's written into one projection) is folded in: dense, the
// values are 0.3 times the codes' (to bf16 rounding); NVFP4, re-quantized with its relative error reported.
TEST(HfExportCli, ModelOptCheckpointsConvertWithTheTensorScaleFolded) {
  test::TempDir dir;
  const SynthResult m = tiny_model(dir);
  const std::string fp4 = dir.file("fp4"), hf = dir.file("hf");
  ASSERT_EQ(run_cli("export --format nvfp4-hf --weights " + m.dat_path + " --config " + m.config_path + " --out " + fp4 +
                    " --no-tokenizer").code, 0);
  ASSERT_EQ(run_cli("export --format hf --weights " + m.dat_path + " --config " + m.config_path + " --out " + hf +
                    " --no-tokenizer").code, 0);
  auto r = run_cli("convert --hf-dir " + fp4 + " --out " + dir.file("back/m.dat") + " --nvfp4");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("14 ModelOpt NVFP4 projections re-quantized to single-level blocks: worst relative RMS error 0 "),
            std::string::npos) << r.out;
  const DatReader original(m.dat_path), back(dir.file("back/m.dat"));
  for (const DatEntry& e : original.entries()) {
    if (e.key.find("_proj.weight.") == std::string::npos) continue;
    EXPECT_TRUE(read_tensor(back, back.at(e.key)).equal(read_tensor(original, e))) << e.key;
  }

  // A second level that is no power of two: layer 0's q_proj's weight_scale_2 (the export's power of two) times
  // 0.3, written into the file in place.
  const std::string key = "model.layers.0.self_attn.q_proj";
  {
    const SafetensorsFile file(fp4 + "/model.safetensors");
    const SafetensorsTensor* t = file.find(key + ".weight_scale_2");
    ASSERT_NE(t, nullptr);
    float value = 0;
    file.read_range(*t, 0, &value, 4);
    EXPECT_NE(value, 1.0f);
    std::fstream f(fp4 + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(t->offset));
    value *= 0.3f;
    f.write(reinterpret_cast<const char*>(&value), 4);
  }
  r = run_cli("convert --hf-dir " + fp4 + " --out " + dir.file("dense/m.dat") + " --dtype bfloat16");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::map<std::string, at::Tensor> reference = read_folder(hf);
  const DatReader dense(dir.file("dense/m.dat"));
  const at::Tensor folded = read_tensor(dense, dense.at(key + ".weight")).to(at::kFloat);
  const at::Tensor want = reference.at(key + ".weight").to(at::kFloat) * 0.3f;
  EXPECT_TRUE(at::allclose(folded, want, 1e-2, 1e-6)) << (folded - want).abs().max().item<double>();
  r = run_cli("convert --hf-dir " + fp4 + " --out " + dir.file("q/m.dat") + " --nvfp4");
  ASSERT_EQ(r.code, 0) << r.err;
  const size_t at = r.out.find("worst relative RMS error ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const double error = std::stod(r.out.substr(at + 25));
  std::printf("two-level (tensor scale 0.3) folded into single-level blocks: relative RMS error %.4g\n", error);
  EXPECT_GT(error, 0.0);
  EXPECT_LT(error, 0.1);
  EXPECT_NE(r.out.find("(" + key + ".weight)"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace qwen3
