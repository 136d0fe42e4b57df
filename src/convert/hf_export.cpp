#include "qwen3/convert/hf_export.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <optional>

#include "qwen3/base/error.h"
#include "qwen3/base/file_io.h"
#include "qwen3/checkpoint/checkpoint.h"
#include "qwen3/config/config.h"
#include "qwen3/convert/safetensors_writer.h"
#include "qwen3/dat/dat_tensor.h"
#include "qwen3/dat/durable_file.h"
#include "qwen3/export/checkpoint_export.h"
#include "qwen3/export/exporter.h"
#include "qwen3/model/layout.h"
#include "qwen3/model/model_loader.h"

namespace qwen3 {
namespace {

namespace fs = std::filesystem;

// Rows of fp32 work per block: 16 Mi elements (64 MiB), whatever the tensor.
constexpr int64_t kBlockElements = int64_t{1} << 24;

// One model tensor and where its values come from.
struct Source {
  std::string key;
  int64_t rows = 1, cols = 0;
  std::vector<int64_t> shape;
  const DatEntry* master = nullptr;  // the checkpoint's trained weight ("master/<key>")
  const DatEntry* dense = nullptr;   // the input's dense entry
  const DatEntry* codes = nullptr;   // the input's NVFP4 pair
  const DatEntry* scales = nullptr;
  bool quantized() const { return codes != nullptr; }
};

struct Inputs {
  const DatReader& input;
  const DatReader* checkpoint;  // tensors.dat of the checkpoint, or null
  nvfp4::ScaleMode mode;
};

// Rows [r0, r0 + n) of a dense entry (F16/BF16/F32/F64) as fp32.
at::Tensor read_dense_rows(const DatReader& reader, const DatEntry& e, int64_t cols, int64_t r0, int64_t n) {
  at::Tensor raw = at::empty({n, cols}, scalar_type_of(e.type));
  const uint64_t row_bytes = static_cast<uint64_t>(cols) * elem_size(e.type);
  reader.read_range(e, static_cast<uint64_t>(r0) * row_bytes, raw.data_ptr(), static_cast<uint64_t>(n) * row_bytes);
  return raw.to(at::kFloat).contiguous();
}

// The projection's codes and scales for rows [r0, r0 + n): the checkpoint's master re-quantized, else the input's
// bytes as they are.
void pair_rows(const Inputs& in, const Source& s, int64_t r0, int64_t n, std::vector<uint8_t>& codes,
               std::vector<uint8_t>& scales) {
  codes.resize(static_cast<size_t>(n * s.cols / 2));
  scales.resize(static_cast<size_t>(n * s.cols / 16));
  if (s.master) {
    const at::Tensor x = read_dense_rows(*in.checkpoint, *s.master, s.cols, r0, n);
    nvfp4::quantize_rows_cpu(x.data_ptr<float>(), n, s.cols, codes.data(), scales.data(), in.mode);
    return;
  }
  in.input.read_range(*s.codes, static_cast<uint64_t>(r0 * s.cols / 2), codes.data(), codes.size());
  in.input.read_range(*s.scales, static_cast<uint64_t>(r0 * s.cols / 16), scales.data(), scales.size());
}

// Rows [r0, r0 + n) as the values the model computes with, fp32: a projection stored as NVFP4 dequantized (from
// the re-quantized master when trained), anything else as stored or trained.
at::Tensor float_rows(const Inputs& in, const Source& s, int64_t r0, int64_t n) {
  if (s.quantized()) {
    std::vector<uint8_t> codes, scales;
    pair_rows(in, s, r0, n, codes, scales);
    at::Tensor out = at::empty({n, s.cols}, at::kFloat);
    nvfp4::dequantize_rows_cpu(codes.data(), scales.data(), n, s.cols, out.data_ptr<float>());
    return out;
  }
  if (s.master) return read_dense_rows(*in.checkpoint, *s.master, s.cols, r0, n);
  return read_dense_rows(in.input, *s.dense, s.cols, r0, n);
}

int64_t block_rows(const Source& s) { return std::max<int64_t>(1, kBlockElements / std::max<int64_t>(1, s.cols)); }

// What one source becomes in the output: its tensors' specs, and how to stream their payloads.
struct Output {
  const Source* source;
  bool as_nvfp4;  // weight (U8 codes), weight_scale (F8_E4M3), weight_scale_2 and input_scale (F32 scalars)
  std::vector<SafetensorsSpec> specs() const {
    const std::string base = source->key.substr(0, source->key.size() - std::string(".weight").size());
    if (!as_nvfp4) return {{source->key, "BF16", source->shape}};
    return {{source->key, "U8", {source->rows, source->cols / 2}},
            {base + ".weight_scale", "F8_E4M3", {source->rows, source->cols / 16}},
            {base + ".weight_scale_2", "F32", {}},
            {base + ".input_scale", "F32", {}}};
  }
  uint64_t nbytes() const {
    uint64_t n = 0;
    for (const auto& s : specs()) n += s.nbytes();
    return n;
  }
  void write(const Inputs& in, SafetensorsWriter& w) const {
    const Source& s = *source;
    const int64_t step = block_rows(s);
    if (!as_nvfp4) {
      for (int64_t r0 = 0; r0 < s.rows; r0 += step) {
        const int64_t n = std::min(step, s.rows - r0);
        const at::Tensor bf16 = float_rows(in, s, r0, n).to(at::kBFloat16).contiguous();  // round to nearest even
        w.write(bf16.data_ptr(), static_cast<uint64_t>(bf16.numel()) * 2);
      }
      return;
    }
    // The codes of every block first, then the scales, as the two tensors lie one after the other: the scales
    // (an eighth of the codes' bytes) are kept until the codes are written.
    std::vector<uint8_t> all_scales, codes, scales;
    all_scales.reserve(static_cast<size_t>(s.rows * s.cols / 16));
    for (int64_t r0 = 0; r0 < s.rows; r0 += step) {
      const int64_t n = std::min(step, s.rows - r0);
      pair_rows(in, s, r0, n, codes, scales);
      w.write(codes.data(), codes.size());
      all_scales.insert(all_scales.end(), scales.begin(), scales.end());
    }
    w.write(all_scales.data(), all_scales.size());
    // Single-level scales: the .dat has no tensor scale, so the second level is 1 and the E4M3 scales are the
    // blocks' own. input_scale (the activations' global scale for W4A4 kernels) is uncalibrated: 1 (docs/export.md).
    const float one = 1.0f;
    w.write(&one, 4);
    w.write(&one, 4);
  }
};

nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  std::ifstream f = open_input_file(path, what);
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": not valid JSON (" + std::string(e.what()) + ")");
  }
}

// config.json for the output: the model's own, its weights now bf16, and for nvfp4-hf ModelOpt's
// quantization_config (flat form; hf_quant_config.json has the nested one).
nlohmann::json quantization_section(bool flat) {
  nlohmann::json q = {{"quant_algo", "NVFP4"}, {"kv_cache_quant_algo", nullptr}, {"group_size", 16},
                      {"exclude_modules", {"lm_head"}}};
  if (!flat) return {{"producer", {{"name", "qwen3-train"}, {"version", "1"}}}, {"quantization", q}};
  q["quant_method"] = "modelopt";
  q["ignore"] = {"lm_head"};
  return q;
}

void write_text(const fs::path& dir, const std::string& name, const std::string& text, HfExportReport& report) {
  write_file_durably((dir / name).string(), text);
  report.files.push_back(name);
}

}  // namespace

HfExportReport export_hf(const HfExportOptions& o) {
  HfExportReport report;
  // Inputs: the checkpoint (optional), the .dat, the config.
  std::optional<DatReader> ckpt;
  std::optional<ExportInfo> info;
  if (!o.checkpoint.empty()) {
    const std::string path = resolve_checkpoint(o.checkpoint);
    const CheckpointState meta = load_checkpoint(path, "\x01");  // metadata only: no tensor has that prefix
    info = ExportInfo::from_json(meta.extra, path + "/checkpoint.json");
    if (!info) throw Error(path + "/checkpoint.json: has no export information; it was written by an older qwen3-train");
    ckpt.emplace((fs::path(path) / "tensors.dat").string(), DatRules::container_only);
  }
  const DatReader input(o.weights);
  if (info) check_trained_from(*info, input, o.checkpoint, o.weights);
  nlohmann::json config_json;
  if (!o.config.empty())
    config_json = read_json_file(o.config, "config");
  else if (info && info->config.is_object())
    config_json = info->config;
  else
    throw UsageError("export --format hf: give --config (the model's config.json)");
  const Qwen3Config config = config_from_json(config_json, o.config.empty() ? "the checkpoint's config" : o.config);
  const Inputs in{input, ckpt ? &*ckpt : nullptr, o.scale_mode ? *o.scale_mode : (info ? info->scale_mode : nvfp4::ScaleMode::rne)};

  // The tensors, in the layout's order. A tied config writes no lm_head: transformers ties it to the embedding.
  const bool separate_head = !config.tie_word_embeddings;
  if (separate_head && !file_has_lm_head(input))
    throw Error(o.weights + ": no lm_head and the config does not tie it to the embedding");
  std::vector<Source> sources;
  for (const TensorSpec& spec : qwen3_tensors(config.shape(), separate_head)) {
    Source s;
    s.key = spec.key;
    s.shape = spec.shape;
    s.cols = spec.shape.back();
    s.rows = spec.shape.size() == 2 ? spec.shape[0] : 1;
    if (ckpt) s.master = ckpt->find(std::string(kMasterWeightPrefix) + spec.key);
    // A tied model trains the embedding for both; an untied head trained under a tied run does not exist.
    s.dense = input.find(spec.key);
    s.codes = input.find(spec.key + std::string(kQdataSuffix));
    s.scales = input.find(spec.key + std::string(kScaleSuffix));
    if (!s.dense && !(s.codes && s.scales)) throw Error(o.weights + ": no entry '" + spec.key + "' (dense or NVFP4 pair)");
    if (s.dense) s.codes = s.scales = nullptr;
    if (s.master && s.master->numel() != static_cast<uint64_t>(s.rows * s.cols))
      throw Error(o.checkpoint + ": master weight '" + spec.key + "' does not have the config's shape");
    report.trained += s.master != nullptr;
    sources.push_back(std::move(s));
  }
  std::vector<Output> outputs;
  for (const Source& s : sources)
    outputs.push_back(Output{&s, o.format == HfFormat::nvfp4_hf && s.quantized() && s.key != "lm_head.weight"});

  // Shards: consecutive tensors up to max_shard_bytes each (a tensor larger than that is a shard alone).
  std::vector<std::vector<const Output*>> shards(1);
  uint64_t shard_bytes = 0;
  for (const Output& out : outputs) {
    const uint64_t n = out.nbytes();
    if (!shards.back().empty() && shard_bytes + n > o.max_shard_bytes) shards.emplace_back(), shard_bytes = 0;
    shards.back().push_back(&out);
    shard_bytes += n;
    report.bytes += n;
    report.tensors += out.specs().size();
  }
  report.shards = shards.size();

  // The folder: built beside --out under a temporary name, renamed into place when complete.
  const fs::path target(o.out);
  std::error_code ec;
  if (fs::exists(target, ec) && !o.overwrite)
    throw UsageError("export: --out " + o.out + " exists; pass --overwrite to replace it");
  if (fs::exists(target, ec) && !fs::is_directory(target, ec))
    throw UsageError("export: --out " + o.out + " is a file; --format hf writes a folder");
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  fs::create_directories(parent, ec);
  const fs::path temp = parent / ("." + target.filename().string() + ".partial-" + std::to_string(::getpid()));
  fs::remove_all(temp, ec);
  if (!fs::create_directory(temp, ec)) throw Error(temp.string() + ": cannot create (" + ec.message() + ")");
  struct RemoveOnFailure {
    fs::path path;
    bool keep = false;
    ~RemoveOnFailure() {
      std::error_code ignored;
      if (!keep) fs::remove_all(path, ignored);
    }
  } cleanup{temp};

  const nlohmann::json metadata = {{"format", "pt"}};
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = shards.size() == 1 ? "model.safetensors"
                                                : fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
    std::vector<SafetensorsSpec> specs;
    for (const Output* out : shards[i])
      for (SafetensorsSpec& s : out->specs()) {
        weight_map[s.name] = name;
        specs.push_back(std::move(s));
      }
    SafetensorsWriter writer((temp / name).string(), std::move(specs), metadata);
    for (const Output* out : shards[i]) out->write(in, writer);
    writer.commit();
    report.files.push_back(name);
  }
  if (shards.size() > 1)
    write_text(temp, "model.safetensors.index.json",
               nlohmann::json{{"metadata", {{"total_size", report.bytes}}}, {"weight_map", weight_map}}.dump(2) + "\n",
               report);

  nlohmann::json out_config = config_json;
  out_config["architectures"] = {"Qwen3ForCausalLM"};
  out_config["model_type"] = "qwen3";
  out_config["torch_dtype"] = "bfloat16";
  out_config.erase("quantization_config");
  if (o.format == HfFormat::nvfp4_hf) {
    out_config["quantization_config"] = quantization_section(/*flat=*/true);
    write_text(temp, "hf_quant_config.json", quantization_section(/*flat=*/false).dump(2) + "\n", report);
  }
  write_text(temp, "config.json", out_config.dump(2) + "\n", report);
  nlohmann::json generation = {{"do_sample", false}};
  if (config_json.contains("bos_token_id")) generation["bos_token_id"] = config_json["bos_token_id"];
  if (!config.eos_token_ids.empty())
    generation["eos_token_id"] = config.eos_token_ids.size() == 1 ? nlohmann::json(config.eos_token_ids[0])
                                                                   : nlohmann::json(config.eos_token_ids);
  write_text(temp, "generation_config.json", generation.dump(2) + "\n", report);
  if (!o.tokenizer.empty()) {
    open_input_file(o.tokenizer, "tokenizer");  // names a missing file
    const fs::path dir = fs::path(o.tokenizer).parent_path();
    std::vector<fs::path> files = {o.tokenizer};
    for (const char* name : {"tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
                             "merges.txt", "chat_template.jinja"})
      if (fs::is_regular_file(dir / name, ec) && fs::path(o.tokenizer).filename() != name) files.push_back(dir / name);
    for (const fs::path& f : files) {
      const std::string name = f.filename() == fs::path(o.tokenizer).filename() ? "tokenizer.json" : f.filename().string();
      std::ifstream src = open_input_file(f.string(), "tokenizer file", std::ios::binary);
      std::ostringstream text;
      text << src.rdbuf();
      write_text(temp, name, text.str(), report);
    }
  }
  fsync_path(temp.string(), /*directory=*/true);

  // Into place: an existing folder (with --overwrite) is moved aside first and removed once the new one is there.
  const fs::path aside = parent / ("." + target.filename().string() + ".old-" + std::to_string(::getpid()));
  const bool replacing = fs::exists(target, ec);
  if (replacing) {
    fs::rename(target, aside, ec);
    if (ec) throw Error(o.out + ": cannot move the old folder aside (" + ec.message() + ")");
  }
  fs::rename(temp, target, ec);
  if (ec) {
    std::error_code ignored;
    if (replacing) fs::rename(aside, target, ignored);
    throw Error(o.out + ": cannot move the new folder into place (" + ec.message() + ")");
  }
  cleanup.keep = true;
  fsync_path(parent.string(), /*directory=*/true);
  if (replacing) fs::remove_all(aside, ec);
  return report;
}

}  // namespace qwen3
