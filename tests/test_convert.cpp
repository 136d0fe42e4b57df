// `convert` from Hugging Face safetensors: tiny checkpoints written here (one shard or two with an index, F32,
// BF16 and F16 tensors, with and without lm_head), converted and evaluated against a model built from the same
// tensors; every malformed header is a clean error naming the file; inspect and generate run on the output.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/utils.h>

#include "cli_test_util.h"
#include "qwen3/model/layout.h"
#include "qwen3/dat/dat_tensor.h"
#include "qwen3/model/generate.h"
#include "qwen3/convert/hf_convert.h"
#include "qwen3/model/model_loader.h"
#include "qwen3/nvfp4/nvfp4_ops.h"
#include "qwen3/export/quantize_dat.h"
#include "qwen3/convert/safetensors.h"

#include "tiny_model_util.h"

namespace qwen3 {
namespace {

Qwen3Config tiny_config(bool tied) { return test::trainable_tiny_config(tied); }

const char* dtype_name(at::ScalarType t) {
  return t == at::kFloat ? "F32" : t == at::kHalf ? "F16" : t == at::kBFloat16 ? "BF16" : "I32";
}

// Bytes of one safetensors file holding `tensors` (stored in each tensor's own dtype), header as given or built.
std::vector<uint8_t> safetensors_bytes(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                       std::string header = "") {
  nlohmann::json j = {{"__metadata__", {{"format", "pt"}}}};
  std::vector<uint8_t> data;
  for (const auto& [name, t] : tensors) {
    const at::Tensor c = t.contiguous();
    const auto* p = static_cast<const uint8_t*>(c.data_ptr());
    j[name] = {{"dtype", dtype_name(c.scalar_type())}, {"shape", c.sizes().vec()},
               {"data_offsets", {data.size(), data.size() + c.nbytes()}}};
    data.insert(data.end(), p, p + c.nbytes());
  }
  if (header.empty()) header = j.dump();
  // Sized once and filled (growing an 8-byte vector by insert trips GCC 12's -Warray-bounds on aarch64).
  std::vector<uint8_t> out(8 + header.size() + data.size());
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
  std::copy(header.begin(), header.end(), out.begin() + 8);
  std::copy(data.begin(), data.end(), out.begin() + 8 + static_cast<std::ptrdiff_t>(header.size()));
  return out;
}

// Random weights of the config's shape, in HF order; `dtype_of` picks each tensor's stored dtype.
std::vector<std::pair<std::string, at::Tensor>> hf_weights(const Qwen3Config& c, bool lm_head,
                                                           at::ScalarType (*dtype_of)(const TensorSpec&)) {
  at::manual_seed(3);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& spec : qwen3_tensors(c.shape(), lm_head)) {
    at::Tensor t = at::randn(spec.shape);
    t = spec.shape.size() == 1 ? t.mul(0.05).add(1) : t.mul(spec.quantizable ? 1.0 / std::sqrt(spec.shape[1]) : 0.02);
    out.emplace_back(spec.key, t.to(dtype_of(spec)));
  }
  return out;
}

at::ScalarType all_f32(const TensorSpec&) { return at::kFloat; }
at::ScalarType mixed(const TensorSpec& s) {
  return s.shape.size() == 1 ? at::kHalf : s.quantizable ? at::kBFloat16 : at::kFloat;
}

// An HF directory: config.json plus the tensors in `shards` files (split in order), with an index if asked.
std::string write_hf_dir(const test::TempDir& dir, const std::string& name, const Qwen3Config& c,
                         const std::vector<std::pair<std::string, at::Tensor>>& weights, int shards, bool index) {
  const std::string d = dir.file(name);
  std::filesystem::create_directories(d);
  save_config(c, d + "/config.json");
  nlohmann::json map;
  const size_t per = (weights.size() + shards - 1) / shards;
  for (int s = 0; s < shards; ++s) {
    const std::string file = "model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(shards) + ".safetensors";
    std::vector<std::pair<std::string, at::Tensor>> part(weights.begin() + s * per,
                                                         weights.begin() + std::min(weights.size(), (s + 1) * per));
    test::write_file(d + "/" + file, safetensors_bytes(part));
    for (const auto& [k, t] : part) map[k] = file;
  }
  if (index) std::ofstream(d + "/model.safetensors.index.json") << nlohmann::json{{"metadata", {}}, {"weight_map", map}}.dump();
  return d;
}

// The model those tensors make: rounded to the dense type, projections and head through Q/deQ with --nvfp4.
double reference_loss(const Qwen3Config& c, const std::vector<std::pair<std::string, at::Tensor>>& weights,
                      bool lm_head, bool nvfp4, const std::vector<int64_t>& ids) {
  Qwen3Model model(c, at::kFloat, at::kCPU, lm_head);
  std::map<std::string, at::Tensor> by_key(weights.begin(), weights.end());
  torch::NoGradGuard no_grad;
  for (auto& [key, param] : model.named_weights()) {
    at::Tensor v = by_key.at(key).to(at::kHalf).to(at::kFloat);
    if (nvfp4 && v.dim() == 2 && key != "model.embed_tokens.weight") {
      const auto q = nvfp4::quantize(v);
      v = nvfp4::dequantize(q.codes, q.scales, at::kFloat);
    }
    param.copy_(v);
  }
  return sequence_loss(model, ids).loss;
}

const std::vector<int64_t> kIds = {272, 10, 55, 200, 31, 99, 7, 250, 3, 120, 64, 17};

double converted_loss(const std::string& dat, const std::string& config) {
  const DatReader r(dat);
  auto model = load_model(r, load_config(config), at::kFloat, at::kCPU);
  return sequence_loss(*model, kIds).loss;
}

TEST(Convert, OneShardF32TiedWithoutHeadEvaluatesAsTheSameWeights) {
  test::TempDir dir;
  const Qwen3Config c = tiny_config(true);
  const auto w = hf_weights(c, false, all_f32);
  const std::string hf = write_hf_dir(dir, "hf", c, w, 1, false);
  ConvertOptions o;
  o.hf_dir = hf;
  o.out = dir.file("out/model.dat");
  std::filesystem::create_directories(dir.file("out"));
  const ConvertReport r = convert_hf_checkpoint(o);
  EXPECT_FALSE(r.lm_head);
  // The tied head is written as its own entry, from the embedding, as the original pipeline did.
  EXPECT_EQ(r.entries, qwen3_tensors(c.shape(), true).size());
  EXPECT_EQ(r.config_path, dir.file("out/config.json"));
  EXPECT_EQ(test::slurp(r.config_path), test::slurp(hf + "/config.json"));
  EXPECT_EQ(converted_loss(o.out, r.config_path), reference_loss(c, w, false, false, kIds));
  const DatReader out(o.out);
  size_t i = 0;
  for (const auto& spec : qwen3_tensors(c.shape(), true)) {
    EXPECT_EQ(out.entries()[i].key, spec.key);
    EXPECT_EQ(out.entries()[i++].type, ElemType::Float16);
  }
  std::vector<uint8_t> head(out.at("lm_head.weight").nbytes), embed(out.at("model.embed_tokens.weight").nbytes);
  out.read(out.at("lm_head.weight"), head.data(), head.size());
  out.read(out.at("model.embed_tokens.weight"), embed.data(), embed.size());
  EXPECT_EQ(head, embed);
  const auto inspect = test::run_cli("inspect " + o.out);
  EXPECT_EQ(inspect.code, 0) << inspect.err;
}

TEST(Convert, TwoShardsMixedDtypesUntiedToNvfp4EqualsConvertThenQuantize) {
  test::TempDir dir;
  const Qwen3Config c = tiny_config(false);
  const auto w = hf_weights(c, true, mixed);
  for (bool index : {true, false}) {
    SCOPED_TRACE(index ? "with index" : "without index");
    const std::string hf = write_hf_dir(dir, index ? "hf-index" : "hf-glob", c, w, 2, index);
    ConvertOptions o;
    o.hf_dir = hf;
    o.out = dir.file("nvfp4.dat");
    o.nvfp4 = true;
    const ConvertReport r = convert_hf_checkpoint(o);
    EXPECT_EQ(r.shards.size(), 2u);
    EXPECT_TRUE(r.lm_head);
    EXPECT_EQ(r.quantized, 7u * c.num_hidden_layers + 1);
    EXPECT_EQ(converted_loss(o.out, hf + "/config.json"), reference_loss(c, w, true, true, kIds));
    o.out = dir.file("dense.dat");
    o.nvfp4 = false;
    convert_hf_checkpoint(o);
    EXPECT_EQ(converted_loss(o.out, hf + "/config.json"), reference_loss(c, w, true, false, kIds));
    quantize_dat_file(o.out, dir.file("quantized.dat"), nvfp4::ScaleMode::rne);
    EXPECT_TRUE(test::read_file(dir.file("quantized.dat")) == test::read_file(dir.file("nvfp4.dat")));
  }
  const auto inspect = test::run_cli("inspect " + dir.file("nvfp4.dat"));
  EXPECT_EQ(inspect.code, 0) << inspect.err;
  const auto gen = test::run_cli("generate --weights " + dir.file("nvfp4.dat") + " --config " + dir.file("config.json") +
                                 " --prompt-ids '272 10 55' --max-new-tokens 4 --print-ids --ignore-eos");
  EXPECT_EQ(gen.code, 0) << gen.err;
  EXPECT_FALSE(gen.out.empty());
}

TEST(ConvertCli, TiedWithHeadBfloat16AndFlags) {
  test::TempDir dir;
  const Qwen3Config c = tiny_config(true);
  const std::string hf = write_hf_dir(dir, "hf", c, hf_weights(c, true, mixed), 1, false);
  auto r = test::run_cli("convert --hf-dir " + hf + " --out " + dir.file("m.dat") + " --dtype bfloat16");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("lm_head written"), std::string::npos) << r.out;
  const DatReader out(dir.file("m.dat"));
  EXPECT_EQ(out.at("lm_head.weight").type, ElemType::BFloat16);
  EXPECT_EQ(out.entries().back().key, "lm_head.weight");
  EXPECT_EQ(test::run_cli("convert --out " + dir.file("x.dat")).code, 2);
  EXPECT_EQ(test::run_cli("convert --hf-dir " + hf + " --out " + dir.file("x.dat") + " --dtype float32").code, 2);
  // Block scales without --nvfp4 quantize nothing (the flag was ignored, silently).
  r = test::run_cli("convert --hf-dir " + hf + " --out " + dir.file("x.dat") + " --scale-mode search");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("convert: --scale-mode applies with --nvfp4"), std::string::npos) << r.err;
  // The config.json written beside the first output is not replaced unasked (nor the .dat).
  r = test::run_cli("convert --hf-dir " + hf + " --out " + dir.file("x.dat"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("config.json exists; pass --overwrite"), std::string::npos) << r.err;
  r = test::run_cli("convert --hf-dir " + hf + " --out " + dir.file("m.dat") + " --overwrite");
  EXPECT_EQ(r.code, 0) << r.err;
  r = test::run_cli("convert --hf-dir " + dir.file("none") + " --out " + dir.file("x.dat") + " --overwrite");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("none"), std::string::npos) << r.err;
  r = test::run_cli("convert --hf-dir " + hf + " --out " + hf + "/model-00001-of-00001.safetensors");
  EXPECT_EQ(r.code, 2) << r.err;
  // A value past float16's range: a clean error that names the tensor and suggests bfloat16.
  auto big = hf_weights(c, true, all_f32);
  big[3].second[0][0] = 1e6;
  const std::string hf_big = write_hf_dir(dir, "big", c, big, 1, false);
  r = test::run_cli("convert --hf-dir " + hf_big + " --out " + dir.file("x.dat") + " --overwrite");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("'" + big[3].first + "'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--dtype bfloat16"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("x.dat")));
}

TEST(Convert, MissingMisShapedAndNonFloatTensorsAreListedInOneError) {
  test::TempDir dir;
  const Qwen3Config c = tiny_config(false);
  auto w = hf_weights(c, true, all_f32);
  w.erase(w.begin() + 1);                                         // layer 0 q_proj
  w[5].second = at::zeros({17});                                  // layer 0 k_norm
  w[6].second = at::zeros(w[6].second.sizes(), at::kInt);         // layer 0 gate_proj, integers
  ConvertOptions o;
  o.hf_dir = write_hf_dir(dir, "hf", c, w, 1, false);
  o.out = dir.file("x.dat");
  try {
    convert_hf_checkpoint(o);
    ADD_FAILURE();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("3 problems"), std::string::npos) << msg;
    EXPECT_NE(msg.find("missing 'model.layers.0.self_attn.q_proj.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'model.layers.0.self_attn.k_norm.weight' is [17]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("is I32"), std::string::npos) << msg;
  }
  EXPECT_FALSE(std::filesystem::exists(o.out));
}

// Each malformed header is an Error that names the file and what is wrong with it.
TEST(Safetensors, MalformedHeadersAreCleanErrors) {
  test::TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  auto expect_error = [&](const std::vector<uint8_t>& bytes, const std::string& needle) {
    test::write_file(path, bytes);
    try {
      SafetensorsFile f(path);
      ADD_FAILURE() << "accepted; expected: " << needle;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(path, 0), 0u) << msg;
      EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    }
  };
  const std::vector<std::pair<std::string, at::Tensor>> two = {{"a", at::ones({2, 3})}, {"b", at::ones({4}, at::kHalf)}};
  // a: F32 [2,3] at [0,24); b: F16 [4] at [24,32). 32 data bytes follow the header.
  auto with_header = [&](const std::string& h) { return safetensors_bytes(two, h); };
  const std::string a = R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})";
  const std::string b = R"("b":{"dtype":"F16","shape":[4],"data_offsets":[24,32]})";
  {
    test::write_file(path, safetensors_bytes(two));
    SafetensorsFile ok(path);
    ASSERT_EQ(ok.tensors().size(), 2u);
    EXPECT_EQ(ok.find("b")->nbytes, 8u);
    test::write_file(path, with_header("{" + b + "," + a + "}  "));  // any order; trailing spaces are padding
    EXPECT_EQ(SafetensorsFile(path).tensors().front().name, "a");
  }
  expect_error({1, 2, 3}, "under the 8-byte header length");
  auto huge = with_header("{}");
  huge[5] = 1;  // a length of 2^40 + 2
  expect_error(huge, "exceeds the 100 MB bound");
  auto past = with_header("{" + a + "," + b + "}");
  past[0] = static_cast<uint8_t>(past.size());
  past[1] = 0;
  expect_error(past, "runs past the end");
  expect_error(with_header("[" + a + "]"), "does not start with '{'");
  expect_error(with_header("{" + a + "," + b), "not valid JSON");
  expect_error(with_header("{" + a + "," + b + "} x"), "not valid JSON");
  expect_error(with_header("{\"a\xff\":1}"), "not valid JSON");
  expect_error(with_header("{" + a + "," + a + "," + b + "}"), "names tensor 'a' twice");
  expect_error(with_header(R"({"a":[1]})"), "tensor 'a': entry is not a JSON object");
  expect_error(with_header(R"({"a":{"dtype":"F32","shape":[2,3]},)" + b + "}"), "tensor 'a': no \"data_offsets\"");
  expect_error(with_header(R"({"a":{"dtype":"Q4","shape":[2,3],"data_offsets":[0,24]},)" + b + "}"),
               "unknown dtype 'Q4'");
  expect_error(with_header(R"({"a":{"dtype":"F32","shape":[-2,3],"data_offsets":[0,24]},)" + b + "}"),
               "shape dimension is not a non-negative integer: -2");
  expect_error(with_header(R"({"a":{"dtype":"F32","shape":[2.5,3],"data_offsets":[0,24]},)" + b + "}"),
               "shape dimension is not a non-negative integer");
  expect_error(with_header(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,24]},)" + b + "}"),
               "overflows 64-bit byte counts");
  expect_error(with_header(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0]},)" + b + "}"),
               "data_offsets is not [begin, end]");
  expect_error(with_header(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[24,0]},)" + b + "}"),
               "end before they begin");
  expect_error(with_header(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"b":{"dtype":"F16","shape":[4],"data_offsets":[24,40]}})"),
               "run past the 32-byte data section");
  expect_error(with_header(R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,24]},)" + b + "}"),
               "hold 24 bytes; F32 [2,2] needs 16");
  expect_error(with_header(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"b":{"dtype":"F16","shape":[4],"data_offsets":[20,28]}})"),
               "overlap another tensor's bytes");
  expect_error(with_header(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"b":{"dtype":"F16","shape":[2],"data_offsets":[28,32]}})"),
               "leaving a gap after byte 24");
  expect_error(with_header("{" + a + "}"), "cover 24 of the data section's 32 bytes");
  expect_error(with_header(R"({"__metadata__":{"format":1},)" + a + "," + b + "}"), "__metadata__ value of 'format'");
}

TEST(Convert, IndexProblemsNameTheIndexOrShard) {
  test::TempDir dir;
  const Qwen3Config c = tiny_config(true);
  const std::string hf = write_hf_dir(dir, "hf", c, hf_weights(c, false, all_f32), 2, true);
  const std::string index = hf + "/model.safetensors.index.json";
  ConvertOptions o;
  o.hf_dir = hf;
  o.out = dir.file("x.dat");
  auto expect_error = [&](const nlohmann::json& j, const std::string& needle) {
    std::ofstream(index) << j.dump();
    try {
      convert_hf_checkpoint(o);
      ADD_FAILURE() << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const nlohmann::json good = nlohmann::json::parse(test::slurp(index));
  nlohmann::json j = good;
  j["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors";
  expect_error(j, "not a file in the checkpoint directory");
  j = good;
  j["weight_map"]["model.norm.weight"] = "model-00003-of-00002.safetensors";
  expect_error(j, "model-00003-of-00002.safetensors: cannot open");
  j = good;
  j["weight_map"]["extra.weight"] = "model-00001-of-00002.safetensors";
  expect_error(j, "index.json: tensors listed but not in their shard: extra.weight");
  expect_error(nlohmann::json{{"metadata", {}}}, "no \"weight_map\" object");
  // A malformed shard names itself.
  test::write_file(hf + "/model-00002-of-00002.safetensors", {2, 0, 0, 0, 0, 0, 0, 0, '{', 'x'});
  expect_error(good, "model-00002-of-00002.safetensors: safetensors header is not valid JSON");
}

}  // namespace
}  // namespace qwen3
