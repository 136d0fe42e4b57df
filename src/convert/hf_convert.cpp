#include "qwen3/base/file_io.h"
#include "qwen3/convert/hf_convert.h"
#include "qwen3/dat/durable_file.h"
#include "qwen3/base/file_io.h"
#include "qwen3/base/json_limits.h"
#include "qwen3/base/message_text.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (only here from fmt 11 on)
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <optional>
#include <fstream>
#include <sstream>
#include <map>
#include <set>

#include "qwen3/config/config.h"
#include "qwen3/dat/dat_tensor.h"
#include "qwen3/model/layout.h"
#include "qwen3/nvfp4/nvfp4_pair_writer.h"
#include "qwen3/export/quantize_dat.h"
#include "qwen3/convert/safetensors.h"

namespace qwen3 {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kChunkBytes = 16 << 20;  // source bytes read per row chunk
constexpr const char* kIndexName = "model.safetensors.index.json";

struct Located {
  const SafetensorsFile* file = nullptr;
  const SafetensorsTensor* tensor = nullptr;
};

// The shards of a checkpoint directory and where each tensor lives.
struct HfCheckpoint {
  std::vector<SafetensorsFile> files;
  std::map<std::string, Located> tensors;
};

std::vector<std::string> shard_names_from_index(const fs::path& index_path, std::map<std::string, std::string>& map) {
  std::ifstream f = open_input_file(index_path.string(), "safetensors index");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f, depth_limited(index_path.string()));
  } catch (const nlohmann::json::exception& e) {
    throw Error(index_path.string() + ": invalid JSON: " + json_error_text(e));
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw Error(index_path.string() + ": no \"weight_map\" object");
  std::set<std::string> shards;
  for (auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) throw Error(index_path.string() + ": weight_map entry '" + name + "' is not a file name");
    const std::string shard = file.get<std::string>();
    // Shards sit beside the index: a path elsewhere is refused rather than followed.
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
      throw Error(index_path.string() + ": weight_map entry '" + name + "' names '" + shard +
                  "', not a file in the checkpoint directory");
    map[name] = shard;
    shards.insert(shard);
  }
  if (shards.empty()) throw Error(index_path.string() + ": weight_map is empty");
  return {shards.begin(), shards.end()};
}

HfCheckpoint open_checkpoint(const fs::path& dir, ConvertReport& rep) {
  HfCheckpoint ck;
  std::map<std::string, std::string> index_map;
  std::vector<std::string> shard_names;
  const fs::path index_path = dir / kIndexName;
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    shard_names = shard_names_from_index(index_path, index_map);
  } else {
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().extension() == ".safetensors") shard_names.push_back(e.path().filename().string());
    if (ec) throw Error(dir.string() + ": cannot list: " + ec.message());
    std::sort(shard_names.begin(), shard_names.end());
    if (shard_names.empty()) throw Error(dir.string() + ": no *.safetensors file and no " + kIndexName);
  }
  ck.files.reserve(shard_names.size());  // Located points into it
  for (const auto& name : shard_names) {
    ck.files.emplace_back((dir / name).string());
    rep.shards.push_back(ck.files.back().path());
  }
  for (const auto& file : ck.files)
    for (const auto& t : file.tensors()) {
      if (!index_map.empty()) {
        auto it = index_map.find(t.name);
        if (it == index_map.end() || (dir / it->second).string() != file.path()) continue;  // the index decides
      }
      auto [pos, fresh] = ck.tensors.emplace(t.name, Located{&file, &t});
      if (!fresh)
        throw Error(dir.string() + ": tensor '" + t.name + "' is in both " + pos->second.file->path() + " and " +
                    file.path());
    }
  std::string missing;
  for (const auto& [name, shard] : index_map)
    if (!ck.tensors.count(name)) missing += (missing.empty() ? "" : ", ") + name + " (" + shard + ")";
  if (!missing.empty()) throw Error(index_path.string() + ": tensors listed but not in their shard: " + missing);
  return ck;
}

at::ScalarType source_scalar_type(const std::string& dtype) {
  if (dtype == "F16") return at::kHalf;
  if (dtype == "BF16") return at::kBFloat16;
  if (dtype == "F32") return at::kFloat;
  if (dtype == "F64") return at::kDouble;
  return at::kByte;  // not a float: refused by check_against_config
}

// A ModelOpt NVFP4 projection (docs/export.md): `NAME.weight` U8 [out, in/2] (E2M1 codes, element 2j in the low
// nibble), `NAME.weight_scale` F8_E4M3 [out, in/16], `NAME.weight_scale_2` F32 (one value): w = e2m1 x e4m3 x s2.
struct ModelOptPair {
  Located codes, scales, scale2;
};

std::optional<ModelOptPair> modelopt_pair(const HfCheckpoint& ck, const std::string& key) {
  const auto codes = ck.tensors.find(key);
  if (codes == ck.tensors.end() || codes->second.tensor->dtype != "U8") return std::nullopt;
  const std::string base = key.substr(0, key.size() - std::string(".weight").size());
  const auto scales = ck.tensors.find(base + ".weight_scale"), scale2 = ck.tensors.find(base + ".weight_scale_2");
  if (scales == ck.tensors.end() || scale2 == ck.tensors.end()) return std::nullopt;
  return ModelOptPair{codes->second, scales->second, scale2->second};
}

// Its problems against the spec's shape [out, in], or none.
void check_modelopt_pair(const ModelOptPair& p, const TensorSpec& spec, const HfCheckpoint& ck,
                         std::vector<std::string>& problems) {
  const std::string base = spec.key.substr(0, spec.key.size() - std::string(".weight").size());
  const int64_t out = spec.shape[0], in = spec.shape.size() == 2 ? spec.shape[1] : 0;
  if (spec.shape.size() != 2 || in % 16 != 0 || p.codes.tensor->shape != std::vector<int64_t>{out, in / 2})
    problems.push_back(fmt::format("'{}' is U8 {} in {}: NVFP4 codes of the config's {} are [{}, {}]", spec.key,
                                   shape_text(p.codes.tensor->shape), p.codes.file->path(), shape_text(spec.shape),
                                   out, in / 2));
  if (p.scales.tensor->dtype != "F8_E4M3" || p.scales.tensor->shape != std::vector<int64_t>{out, in / 16})
    problems.push_back(fmt::format("'{}.weight_scale' is {} {}, F8_E4M3 [{}, {}] expected", base,
                                   p.scales.tensor->dtype, shape_text(p.scales.tensor->shape), out, in / 16));
  if (p.scale2.tensor->dtype != "F32" || p.scale2.tensor->numel() != 1)
    problems.push_back(fmt::format("'{}.weight_scale_2' is {} {}, one F32 value expected", base,
                                   p.scale2.tensor->dtype, shape_text(p.scale2.tensor->shape)));
  if (ck.tensors.count(base + ".pre_quant_scale"))
    problems.push_back("'" + base + ".pre_quant_scale': NVFP4_AWQ checkpoints scale the activations, which the "
                       ".dat format cannot express");
}

// Every model tensor present, float (or a ModelOpt NVFP4 projection) and of the config's shape; all problems in
// one message.
void check_against_config(const HfCheckpoint& ck, const std::vector<TensorSpec>& specs, const std::string& dir) {
  std::vector<std::string> problems;
  for (const auto& spec : specs) {
    auto it = ck.tensors.find(spec.key);
    if (it == ck.tensors.end()) {
      problems.push_back("missing '" + spec.key + "'");
      continue;
    }
    if (const auto pair = modelopt_pair(ck, spec.key)) {
      check_modelopt_pair(*pair, spec, ck, problems);
      continue;
    }
    const SafetensorsTensor& t = *it->second.tensor;
    if (t.shape != spec.shape)
      problems.push_back(fmt::format("'{}' is {} in {}, the config needs {}", spec.key, shape_text(t.shape),
                                     it->second.file->path(), shape_text(spec.shape)));
    if (source_scalar_type(t.dtype) == at::kByte)
      problems.push_back("'" + spec.key + "' is " + t.dtype + " in " + it->second.file->path() +
                         " (F16, BF16, F32 or F64 expected)");
  }
  if (problems.empty()) return;
  throw Error(problems_text(dir + ": the checkpoint does not match its config.json", problems));
}

// Rows [r, r + n) of a ModelOpt NVFP4 projection as fp32: the codes times the block scales (exact), times the
// tensor scale.
at::Tensor modelopt_rows(const ModelOptPair& p, int64_t cols, int64_t r, int64_t n, float scale2) {
  std::vector<uint8_t> codes(static_cast<size_t>(n * cols / 2)), scales(static_cast<size_t>(n * cols / 16));
  p.codes.file->read_range(*p.codes.tensor, static_cast<uint64_t>(r * cols / 2), codes.data(), codes.size());
  p.scales.file->read_range(*p.scales.tensor, static_cast<uint64_t>(r * cols / 16), scales.data(), scales.size());
  at::Tensor x = at::empty({n, cols}, at::kFloat);
  nvfp4::dequantize_rows_cpu(codes.data(), scales.data(), n, cols, x.data_ptr<float>());
  return scale2 == 1.0f ? x : x * scale2;
}

// A ModelOpt projection to the output: dense, or re-quantized to single-level NVFP4 blocks with the canonical
// quantizer (the fp32 tensor scale folded into the values first); the re-quantization's relative RMS error
// against the two-level values goes into the report.
void convert_modelopt(const ModelOptPair& p, const TensorSpec& spec, const ConvertOptions& o, DatWriter& out,
                      ConvertReport& rep) {
  const int64_t rows = spec.shape[0], cols = spec.shape[1];
  float scale2 = 0;
  p.scale2.file->read_range(*p.scale2.tensor, 0, &scale2, 4);
  if (!std::isfinite(scale2)) throw Error(p.scale2.file->path() + ": '" + p.scale2.tensor->name + "' is not finite");
  const int64_t chunk_rows = std::max<int64_t>(1, static_cast<int64_t>(kChunkBytes / 4) / cols);
  const bool quantize = o.nvfp4 && spec.quantizable;
  std::optional<Nvfp4PairWriter> pair;
  if (quantize) pair.emplace(out, spec.key, rows, cols, o.scale_mode, ElemType::UInt8);
  else out.begin_entry(spec.key, o.dense_type, spec.shape);
  double error = 0, norm = 0;
  std::vector<uint8_t> codes, scales;
  for (int64_t r = 0; r < rows; r += chunk_rows) {
    const int64_t n = std::min(chunk_rows, rows - r);
    const at::Tensor x = modelopt_rows(p, cols, r, n, scale2);
    if (!at::isfinite(x).all().item<bool>())
      throw Error(fmt::format("{}: '{}' (rows {}..{}) dequantizes to a value that is not finite", p.codes.file->path(),
                              spec.key, r, r + n - 1));
    if (!quantize) {
      const at::Tensor d = x.to(scalar_type_of(o.dense_type));
      out.write_payload(d.data_ptr(), static_cast<uint64_t>(d.numel()) * d.element_size());
      continue;
    }
    pair->add_rows(x.data_ptr<float>(), n);
    // The same canonical quantizer the pair writer runs, to measure what folding the tensor scale cost.
    codes.resize(static_cast<size_t>(n * cols / 2));
    scales.resize(static_cast<size_t>(n * cols / 16));
    nvfp4::quantize_rows_cpu(x.data_ptr<float>(), n, cols, codes.data(), scales.data(), o.scale_mode);
    at::Tensor back = at::empty({n, cols}, at::kFloat);
    nvfp4::dequantize_rows_cpu(codes.data(), scales.data(), n, cols, back.data_ptr<float>());
    error += (back - x).pow(2).sum().item<double>();
    norm += x.pow(2).sum().item<double>();
  }
  if (pair) pair->finish();
  ++rep.modelopt_tensors;
  const double relative = norm > 0 ? std::sqrt(error / norm) : 0;
  if (quantize && relative >= rep.modelopt_worst_error) {
    rep.modelopt_worst_error = relative;
    rep.modelopt_worst_tensor = spec.key;
  }
}

// One tensor, row chunk by row chunk: read with pread, rounded to the dense type, then written as it is or
// quantized. `buf` is the one reused read buffer.
void convert_tensor(const Located& src, const TensorSpec& spec, const ConvertOptions& o, DatWriter& out,
                    std::vector<uint8_t>& buf) {
  const SafetensorsTensor& t = *src.tensor;
  const int64_t rows = spec.shape.size() == 1 ? 1 : spec.shape[0];
  const int64_t cols = spec.shape.size() == 1 ? spec.shape[0] : spec.shape[1];
  const at::ScalarType from = source_scalar_type(t.dtype), dense = scalar_type_of(o.dense_type);
  const uint64_t row_bytes = static_cast<uint64_t>(cols) * at::elementSize(from);
  const int64_t chunk_rows = static_cast<int64_t>(std::max<uint64_t>(1, kChunkBytes / std::max<uint64_t>(1, row_bytes)));
  buf.resize(static_cast<size_t>(std::min(chunk_rows, rows) * row_bytes));
  const bool quantize = o.nvfp4 && spec.quantizable;
  std::optional<Nvfp4PairWriter> pair;
  if (quantize) pair.emplace(out, spec.key, rows, cols, o.scale_mode, ElemType::UInt8);
  else out.begin_entry(spec.key, o.dense_type, spec.shape);
  for (int64_t r = 0; r < rows; r += chunk_rows) {
    const int64_t n = std::min(chunk_rows, rows - r);
    src.file->read_range(t, r * row_bytes, buf.data(), n * row_bytes);
    const at::Tensor x = at::from_blob(buf.data(), {n, cols}, at::TensorOptions().dtype(from)).to(dense);
    if (!at::isfinite(x).all().item<bool>())
      throw Error(fmt::format("{}: tensor '{}' (rows {}..{}) has a value that is not finite as {}{}", src.file->path(),
                              t.name, r, r + n - 1, elem_type_name(o.dense_type),
                              o.dense_type == ElemType::Float16 ? " (past 65504? try --dtype bfloat16)" : ""));
    if (quantize) pair->add_rows(x.to(at::kFloat).contiguous().data_ptr<float>(), n);
    else out.write_payload(x.data_ptr(), static_cast<uint64_t>(x.numel()) * x.element_size());
  }
  if (pair) pair->finish();
}

// config.json beside the output, durably like the `.dat` (temporary name, fsync, rename).
std::string copy_config(const fs::path& config, const std::string& out) {
  fs::path dir = fs::path(out).parent_path();
  if (dir.empty()) dir = ".";
  const fs::path target = dir / "config.json";
  std::error_code ec;
  if (fs::exists(target, ec) && fs::equivalent(config, target, ec)) return target.string();
  std::ifstream in = open_input_file(config.string(), "config");
  std::ostringstream text;
  text << in.rdbuf();
  try {
    write_file_durably(target.string(), text.str());
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + "; " + out + " was written");
  }
  return target.string();
}

}  // namespace

ConvertReport convert_hf_checkpoint(const ConvertOptions& o) {
  if (o.dense_type != ElemType::Float16 && o.dense_type != ElemType::BFloat16)
    throw UsageError(std::string("convert: --dtype ") + elem_type_name(o.dense_type) + " (float16 or bfloat16)");
  const fs::path dir(o.hf_dir);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw Error(o.hf_dir + ": no such directory");
  const fs::path config_path = dir / "config.json";
  const Qwen3Config config = load_config(config_path.string());
  ConvertReport rep;
  const HfCheckpoint ck = open_checkpoint(dir, rep);
  for (const auto& file : ck.files) check_not_same_file(file.path(), o.out);

  rep.lm_head = ck.tensors.count("lm_head.weight") > 0;
  if (rep.lm_head && config.tie_word_embeddings)
    spdlog::info("convert: the config ties lm_head to the embedding, but the checkpoint has its own: it is written");
  const auto specs = qwen3_tensors(config.shape(), rep.lm_head || !config.tie_word_embeddings);
  check_against_config(ck, specs, o.hf_dir);
  std::set<std::string> used;
  for (const auto& s : specs) {
    used.insert(s.key);
    if (modelopt_pair(ck, s.key)) {  // its scales are part of it; input_scale (activations) has no use here
      const std::string base = s.key.substr(0, s.key.size() - std::string(".weight").size());
      used.insert({base + ".weight_scale", base + ".weight_scale_2", base + ".input_scale"});
    }
  }
  for (const auto& [name, where] : ck.tensors)
    if (!used.count(name)) rep.ignored.push_back(name);
  if (!rep.ignored.empty())
    spdlog::warn("convert: {} tensors the model does not use are left out (first: {})", rep.ignored.size(),
                 rep.ignored.front());

  // A tied checkpoint stores the embedding once; the original pipeline (a state dict, where the tied head
  // appears under both names) wrote lm_head too, and the real file and its runner have it: so do we.
  const bool head_from_embedding = !rep.lm_head && config.tie_word_embeddings;
  const auto write_specs = head_from_embedding ? qwen3_tensors(config.shape(), true) : specs;
  for (const auto& s : write_specs) rep.entries += o.nvfp4 && s.quantizable ? 2 : 1;
  DatWriter out(o.out, rep.entries);
  std::vector<uint8_t> buf;
  for (const auto& spec : write_specs) {
    spdlog::debug("convert: {}", spec.key);
    const bool from_embedding = head_from_embedding && spec.key == "lm_head.weight";
    const std::string source = from_embedding ? "model.embed_tokens.weight" : spec.key;
    if (const auto modelopt = modelopt_pair(ck, source))
      convert_modelopt(*modelopt, spec, o, out, rep);
    else
      convert_tensor(ck.tensors.at(source), spec, o, out, buf);
    ++rep.tensors;
    if (o.nvfp4 && spec.quantizable) ++rep.quantized;
  }
  out.commit();
  if (rep.modelopt_tensors > 0)
    spdlog::info("convert: {} ModelOpt NVFP4 projections{}", rep.modelopt_tensors,
                 o.nvfp4 ? fmt::format(" re-quantized to single-level blocks; worst relative RMS error {:.3g} ({})",
                                       rep.modelopt_worst_error, rep.modelopt_worst_tensor)
                         : std::string(" dequantized"));
  rep.config_path = copy_config(config_path, o.out);
  return rep;
}

}  // namespace qwen3
