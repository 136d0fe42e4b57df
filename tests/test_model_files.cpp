// config.json handling, `synth` and `quantize`: the commands that make model files.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <tuple>

#include "cli_test_util.h"
#include "qwen3/base/remove_tree.h"
#include "qwen3/model/layout.h"
#include "qwen3/config/config.h"
#include "qwen3/dat/dat_tensor.h"
#include "qwen3/nvfp4/nvfp4.h"
#include "qwen3/export/quantize_dat.h"
#include "qwen3/model/synth.h"
#include "qwen3/model/model_loader.h"
#include "qwen3/dat/dat.h"
#include "tiny_model_util.h"

namespace qwen3 {
namespace {

using nlohmann::json;

TEST(Config, PresetsMatchTheDocsAndRoundTrip) {
  const Qwen3Config big = preset_config("qwen3-4b");
  EXPECT_EQ(big.hidden_size, 2560);
  EXPECT_EQ(big.head_dim, 128);
  EXPECT_EQ(big.rope_theta, 5000000);
  const auto tensors = qwen3_tensors(big.shape());
  uint64_t params = 0;
  for (const auto& t : tensors) params += t.shape.size() == 1 ? t.shape[0] : t.shape[0] * t.shape[1];
  // 4.02 B with the tied lm_head counted once (qwen3.md); the file stores lm_head as well.
  EXPECT_NEAR((params - 151936.0 * 2560) / 1e9, 4.02, 0.005);
  EXPECT_EQ(qwen3_dat_entries(big.shape(), true, ElemType::Float16).size(), 652u);

  const Qwen3Config tiny = preset_config("tiny");
  EXPECT_NE(tiny.head_dim * tiny.num_attention_heads, tiny.hidden_size);
  EXPECT_LT(tiny.num_key_value_heads, tiny.num_attention_heads);
  const Qwen3Config back = config_from_json(tiny.to_json(), "round trip");
  EXPECT_EQ(back.to_json(), tiny.to_json());
}

TEST(Config, InvalidConfigsNameTheField) {
  const json good = preset_config("tiny").to_json();
  auto expect_error = [&](json j, const char* fragment) {
    try {
      config_from_json(j, "c.json");
      ADD_FAILURE() << "accepted: " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("c.json"), std::string::npos) << e.what();
    }
  };
  json j = good;
  j.erase("hidden_size");
  expect_error(j, "missing field \"hidden_size\"");
  j = good;
  j["num_key_value_heads"] = 3;
  expect_error(j, "multiple of num_key_value_heads");
  j = good;
  j["intermediate_size"] = 100;
  expect_error(j, "intermediate_size (100) must be a multiple of 16");
  j = good;
  j["rope_scaling"] = {{"type", "yarn"}};
  expect_error(j, "rope_scaling");
  j = good;
  j["hidden_size"] = "96";
  expect_error(j, "must be an integer");
  j = good;
  j["eos_token_id"] = 999999999;
  expect_error(j, "outside the vocabulary");
  j = good;
  j["hidden_act"] = "gelu";
  expect_error(j, "hidden_act");
  // Sizes whose products would overflow (2^60 heads made synth divide by zero; 2^62 tokens of vocabulary gave
  // vram-report nonsense with exit 0): named, before anything multiplies them.
  j = good;
  j["num_attention_heads"] = int64_t{1} << 60;
  expect_error(j, "num_attention_heads 1152921504606846976 is beyond 2^16");
  j = good;
  j["vocab_size"] = int64_t{1} << 62;
  expect_error(j, "vocab_size 4611686018427387904 is beyond 2^24");
  j = good;
  j["num_attention_heads"] = 4096;
  j["num_key_value_heads"] = 4096;
  j["head_dim"] = 8192;
  expect_error(j, "num_attention_heads * head_dim (33554432) is beyond 2^24");
  EXPECT_THROW(preset_config("huge"), UsageError);
  // A value is quoted in a message by an excerpt, never whole.
  j = good;
  j["hidden_size"] = json::array();
  for (int i = 0; i < 1000; ++i) j["hidden_size"].push_back(i);
  try {
    config_from_json(j, "c.json");
    ADD_FAILURE() << "accepted an array size";
  } catch (const Error& e) {
    EXPECT_LT(std::string(e.what()).size(), 160u) << e.what();
    EXPECT_NE(std::string(e.what()).find("..."), std::string::npos) << e.what();
  }
}

TEST(Layout, LayerOfKey) {
  EXPECT_EQ(layer_of_key("model.layers.0.self_attn.q_proj.weight"), 0);
  EXPECT_EQ(layer_of_key("model.layers.35.mlp.down_proj.weight.qdata"), 35);
  EXPECT_EQ(layer_of_key("model.norm.weight"), std::nullopt);
  EXPECT_EQ(layer_of_key("model.layers.x.mlp.up_proj.weight"), std::nullopt);
  EXPECT_EQ(layer_of_key("model.layers..weight"), std::nullopt);
  EXPECT_EQ(layer_of_key("model.layers.12345678901.weight"), std::nullopt);  // no overflow: refused
}

// train --synthetic's model: written once into its folder, then found there again while its config and seed are
// the ones asked for (a resume trains the same weights); another seed's or config's are refused, or drawn anew
// where asked (a new run over an old one); no folder: a fresh temporary one each time.
TEST(Synth, TrainingModelIsWrittenOnceAndReusedOnlyForItsConfigAndSeed) {
  test::TempDir dir;
  const Qwen3Config config = test::trainable_tiny_config();
  const std::string folder = dir.file("synthetic-model");
  const SynthResult first = synthetic_training_model(config, 3, folder);
  EXPECT_GT(first.entries, 0u);
  const std::string bytes = test::slurp(first.dat_path);
  const SynthResult again = synthetic_training_model(config, 3, folder);
  EXPECT_EQ(again.entries, 0u) << "found, not written";
  EXPECT_EQ(again.dat_path, first.dat_path);
  EXPECT_EQ(test::slurp(again.dat_path), bytes);
  Qwen3Config wider = config;
  wider.intermediate_size *= 2;
  for (const auto& [other, seed, what] : {std::tuple{config, uint64_t{4}, std::string("seed 3, not 4")},
                                          std::tuple{wider, uint64_t{3}, std::string("another config")}}) {
    try {
      synthetic_training_model(other, seed, folder);
      ADD_FAILURE() << what << ": trained the other run's weights";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    EXPECT_EQ(test::slurp(first.dat_path), bytes) << "refused before anything was written";
  }
  const SynthResult redrawn = synthetic_training_model(config, 4, folder, /*replace_other=*/true);
  EXPECT_GT(redrawn.entries, 0u);
  EXPECT_NE(test::slurp(redrawn.dat_path), bytes);
  EXPECT_EQ(synthetic_training_model(config, 4, folder).entries, 0u) << "the new record is found";
  std::filesystem::remove(folder + "/synthetic.json");  // weights nothing says the origin of are not taken
  EXPECT_THROW(synthetic_training_model(config, 4, folder), UsageError);
  const SynthResult fresh = synthetic_training_model(config, 3, "");
  EXPECT_NE(fresh.dat_path, first.dat_path);
  EXPECT_GT(fresh.entries, 0u);
  std::error_code removed;
  remove_tree(std::filesystem::path(fresh.dat_path).parent_path(), removed);
  EXPECT_FALSE(removed) << removed.message();
}

TEST(Synth, WritesTheRealLayoutDeterministically) {
  test::TempDir dir;
  SynthOptions opt;
  opt.config = preset_config("tiny");
  opt.out_dir = dir.file("a");
  opt.seed = 3;
  const SynthResult a = write_synthetic_model(opt);
  DatReader r(a.dat_path);
  const auto want = qwen3_dat_entries(opt.config.shape(), true, ElemType::Float16);
  ASSERT_EQ(r.entries().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(r.entries()[i].key, want[i].key);
    EXPECT_EQ(r.entries()[i].type, want[i].type) << want[i].key;
    EXPECT_EQ(r.entries()[i].shape, want[i].shape) << want[i].key;
  }
  EXPECT_EQ(load_config(a.config_path).to_json(), opt.config.to_json());

  // Realistic scales: norms near 1, projections ~ 1/sqrt(in) after the NVFP4 round trip.
  const at::Tensor norm = read_tensor(r, r.at("model.layers.1.input_layernorm.weight")).to(at::kFloat);
  EXPECT_NEAR(norm.mean().item<float>(), 1.0f, 0.05f);
  const at::Tensor codes = read_tensor(r, r.at("model.layers.0.mlp.down_proj.weight.qdata"));
  const at::Tensor scales = read_tensor(r, r.at("model.layers.0.mlp.down_proj.weight.scale"));
  std::vector<float> w(codes.size(0) * codes.size(1) * 2);
  nvfp4::dequantize_rows_cpu(codes.data_ptr<uint8_t>(), scales.data_ptr<uint8_t>(), codes.size(0), codes.size(1) * 2,
                             w.data());
  double ss = 0;
  for (float v : w) ss += double(v) * v;
  EXPECT_NEAR(std::sqrt(ss / w.size()), 1.0 / std::sqrt(256.0), 0.01);

  opt.out_dir = dir.file("b");
  const SynthResult b = write_synthetic_model(opt);
  EXPECT_EQ(test::read_file(a.dat_path), test::read_file(b.dat_path));
  opt.out_dir = dir.file("c");
  opt.seed = 4;
  EXPECT_NE(test::read_file(a.dat_path), test::read_file(write_synthetic_model(opt).dat_path));
}

TEST(Quantize, DenseFileBecomesPairsAndTheRestIsCopied) {
  test::TempDir dir;
  SynthOptions opt;
  opt.config = preset_config("tiny");
  opt.config.num_hidden_layers = 1;
  opt.out_dir = dir.file("dense");
  opt.dense = true;
  const SynthResult dense = write_synthetic_model(opt);
  const std::string out = dir.file("q.dat");
  const QuantizeReport rep = quantize_dat_file(dense.dat_path, out, nvfp4::ScaleMode::search);
  EXPECT_EQ(rep.quantized, 8u);  // 7 projections + lm_head
  EXPECT_EQ(rep.entries_out, rep.entries_in + 8);
  for (const auto& f : rep.families) EXPECT_LT(f.relative(), 0.11) << f.family;

  DatReader in(dense.dat_path), q(out);
  const auto want = qwen3_dat_entries(opt.config.shape(), true, ElemType::Float16);
  ASSERT_EQ(q.entries().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(q.entries()[i].key, want[i].key);
  for (const auto& e : in.entries()) {
    if (is_quantizable_weight(e.key, e.shape.size())) {
      const at::Tensor x = read_tensor(in, e).to(at::kFloat).contiguous();
      std::vector<uint8_t> codes(x.numel() / 2), scales(x.numel() / 16);
      nvfp4::quantize_rows_cpu(x.data_ptr<float>(), x.size(0), x.size(1), codes.data(), scales.data(),
                               nvfp4::ScaleMode::search);
      const at::Tensor got_codes = read_tensor(q, q.at(e.key + ".qdata"));
      const at::Tensor got_scales = read_tensor(q, q.at(e.key + ".scale"));
      EXPECT_EQ(0, std::memcmp(got_codes.data_ptr(), codes.data(), codes.size())) << e.key;
      EXPECT_EQ(0, std::memcmp(got_scales.data_ptr(), scales.data(), scales.size())) << e.key;
    } else {
      EXPECT_TRUE(read_tensor(q, q.at(e.key)).equal(read_tensor(in, e))) << e.key;
    }
  }
  EXPECT_THROW(quantize_dat_file(out, out, nvfp4::ScaleMode::rne), UsageError);
}

TEST(Quantize, FamilySelectionFollowsTheOriginalScript) {
  EXPECT_EQ(quantizable_family("model.layers.3.self_attn.k_proj.weight"), "k_proj");
  EXPECT_TRUE(is_quantizable_weight("lm_head.weight", 2));
  EXPECT_FALSE(is_quantizable_weight("model.embed_tokens.weight", 2));
  EXPECT_FALSE(is_quantizable_weight("model.layers.0.self_attn.q_norm.weight", 1));
  EXPECT_FALSE(is_quantizable_weight("model.layers.0.self_attn.q_proj.bias", 1));
}

TEST(Cli, SynthAndQuantizeFlags) {
  test::TempDir dir;
  auto r = test::run_cli("synth --out-dir " + dir.file("x"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--preset or --config"), std::string::npos) << r.err;
  r = test::run_cli("synth --preset huge --out-dir " + dir.file("x"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--preset"), std::string::npos) << r.err;
  r = test::run_cli("synth --preset tiny --seed -1 --out-dir " + dir.file("x"));
  EXPECT_EQ(r.code, 2);
  r = test::run_cli("synth --preset tiny --scale-mode best --out-dir " + dir.file("x"));
  EXPECT_EQ(r.code, 2);
  r = test::run_cli("synth --preset tiny --dense false --out-dir " + dir.file("m"));
  ASSERT_EQ(r.code, 0) << r.err;
  r = test::run_cli("inspect " + dir.file("m/model.dat"));
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("nvfp4 pairs: 22"), std::string::npos) << r.out;
  r = test::run_cli("quantize --in " + dir.file("m/model.dat") + " --out " + dir.file("m/model.dat"));
  EXPECT_EQ(r.code, 2) << r.err;
  // An NVFP4 file has nothing to quantize: it is copied, and the run says so.
  r = test::run_cli("quantize --in " + dir.file("m/model.dat") + " --out " + dir.file("copy.dat"));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("holds no dense projection or head to quantize (NVFP4 already?)"), std::string::npos) << r.err;
  // A model already in --out-dir is not replaced unasked (nor half-replaced: refused before anything is written),
  // and --config is never the file written.
  const auto bytes = [&](const std::string& name) {
    std::ifstream in(dir.file(name), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string dat = bytes("m/model.dat"), config = bytes("m/config.json");
  r = test::run_cli("synth --preset tiny --seed 7 --out-dir " + dir.file("m"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("synth: --out-dir " + dir.file("m/model.dat") + " exists; pass --overwrite"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(bytes("m/model.dat") == dat && bytes("m/config.json") == config);
  std::filesystem::remove(dir.file("m/model.dat"));
  r = test::run_cli("synth --preset tiny --seed 7 --out-dir " + dir.file("m"));  // the config alone is a model too
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("config.json exists; pass --overwrite"), std::string::npos) << r.err;
  r = test::run_cli("synth --config " + dir.file("m/config.json") + " --out-dir " + dir.file("m") + " --overwrite");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("is the input file"), std::string::npos) << r.err;
  r = test::run_cli("synth --preset tiny --seed 7 --out-dir " + dir.file("m") + " --overwrite");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(bytes("m/model.dat"), dat);  // another seed's weights
}


// Deeply nested JSON (which exhausted the stack while parsing or while a message dumped it) stops at 64 levels
// with an error naming the file.
TEST(Config, DeeplyNestedJsonIsAnErrorNamingTheFile) {
  test::TempDir dir;
  const std::string path = dir.file("config.json");
  std::ofstream(path) << "{\"hidden_size\": " << std::string(1000000, '[') << std::string(1000000, ']') << "}";
  try {
    load_config(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), path + ": JSON nested deeper than 64 levels");
  }
}

// A NaN E4M3 scale code (0x7F/0xFF) is refused at load, naming the entry and the first bad block, instead of
// decoding to NaN (generate printed garbage, eval nan, exit 0).
TEST(Loader, NanScaleCodesAreRefusedNamingTheBlock) {
  test::TempDir dir;
  SynthOptions opt;
  opt.config = test::trainable_tiny_config();
  opt.out_dir = dir.file("m");
  const SynthResult m = write_synthetic_model(opt);
  const std::string key = "model.layers.0.mlp.up_proj.weight";
  uint64_t offset = 0;
  int64_t per_row = 0;
  {
    const DatReader r(m.dat_path);
    const DatEntry& e = r.at(key + std::string(kScaleSuffix));
    per_row = e.shape.back();
    offset = e.payload_offset + 2 * per_row + 3;  // row 2, block 3
  }
  {
    std::fstream f(m.dat_path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(offset));
    f.put(static_cast<char>(0xFF));
  }
  const DatReader r(m.dat_path);
  try {
    load_model(r, load_config(m.config_path), at::kFloat, at::kCPU);
    FAIL() << "a NaN scale code was loaded";
  } catch (const DatError& e) {
    // The loader and inspect share one rule and one wording (nvfp4::NanScaleCodes).
    EXPECT_NE(std::string(e.what()).find(key + ".scale' holds 1 NaN E4M3 scale code (the first is row 2, block 3)"),
              std::string::npos)
        << e.what();
  }
  const auto g = test::run_cli("generate --weights " + m.dat_path + " --config " + m.config_path +
                               " --prompt-ids '1 2 3' --max-new-tokens 2 --print-ids");
  EXPECT_EQ(g.code, 1);
  EXPECT_NE(g.err.find("NaN E4M3 scale code"), std::string::npos) << g.err;
  // inspect (which validates) lists the file and then names the entry and block: exit 1.
  const auto i = test::run_cli("inspect " + m.dat_path);
  EXPECT_EQ(i.code, 1);
  EXPECT_NE(i.out.find(key + ".scale"), std::string::npos) << "the listing is printed";
  EXPECT_NE(i.err.find("entry '" + key + ".scale' holds 1 NaN E4M3 scale code (the first is row 2, block 3)"),
            std::string::npos)
      << i.err;
  EXPECT_EQ(test::run_cli("inspect " + dir.file("m/model.dat") + " --json").code, 1);
}

}  // namespace
}  // namespace qwen3
