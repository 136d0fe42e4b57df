#include "qwen3/convert/hf_export.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cerrno>
#include <csignal>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <fstream>
#include <sstream>
#include <optional>

#include "qwen3/base/error.h"
#include "qwen3/base/file_io.h"
#include "qwen3/base/remove_tree.h"
#include "qwen3/base/json_limits.h"
#include "qwen3/checkpoint/checkpoint.h"
#include "qwen3/config/config.h"
#include "qwen3/convert/safetensors_writer.h"
#include "qwen3/dat/dat_tensor.h"
#include "qwen3/dat/durable_file.h"
#include "qwen3/export/checkpoint_export.h"
#include "qwen3/export/exporter.h"
#include "qwen3/model/layout.h"
#include "qwen3/model/model_loader.h"
#include "qwen3/tokenizer/tokenizer.h"

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

// The largest E4M3 block scale a projection's blocks can have: read from the input's scale bytes when the
// projection is stored as NVFP4 and untrained; for a trained one (re-quantized from its master) bounded from the
// master's largest magnitude: the canonical rne scale of amax / 6, raised by two codes for the search mode's
// neighbours (docs/nvfp4.md). Zero for an all-zero tensor.
float largest_block_scale(const Inputs& in, const Source& s) {
  const int64_t step = block_rows(s);
  if (!s.master) {
    std::vector<uint8_t> scales;
    uint8_t top = 0;
    for (int64_t r0 = 0; r0 < s.rows; r0 += step) {
      const int64_t n = std::min(step, s.rows - r0);
      scales.resize(static_cast<size_t>(n * s.cols / 16));
      in.input.read_range(*s.scales, static_cast<uint64_t>(r0 * s.cols / 16), scales.data(), scales.size());
      for (uint8_t c : scales) top = std::max<uint8_t>(top, c & 0x7F);  // the scales are non-negative
    }
    return nvfp4::e4m3_to_float(top);
  }
  float amax = 0;
  for (int64_t r0 = 0; r0 < s.rows; r0 += step) {
    const int64_t n = std::min(step, s.rows - r0);
    amax = std::max(amax, read_dense_rows(*in.checkpoint, *s.master, s.cols, r0, n).abs().max().item<float>());
  }
  const uint8_t code = nvfp4::e4m3_from_float_rne(amax / 6.0f);
  return code == 0 ? 0.0f : nvfp4::e4m3_to_float(static_cast<uint8_t>(std::min(code + 2, 0x7E)));
}

// The power of two 2^-shift that becomes weight_scale_2 while every block scale is multiplied by 2^shift, as far as
// the largest one stays within E4M3's 448: the values are the same (a power of two moves an E4M3 value's exponent
// only), and the global scale is of ModelOpt's size (amax / 2688) instead of 1, which vLLM's FP4 Marlin path on
// Hopper garbled before February 2026. An all-zero group keeps 2^-8.
int global_scale_shift(float largest) {
  if (largest <= 0) return 8;
  int shift = 0;
  while (std::ldexp(largest, shift + 1) <= 448.0f) ++shift;
  return shift;
}

// A block scale code times 2^shift, exactly, as a code; Error when the product is not an E4M3 value.
uint8_t shifted_scale(uint8_t code, int shift, const std::string& key) {
  if (code == 0) return 0;
  const float v = std::ldexp(nvfp4::e4m3_to_float(code), shift);
  const uint8_t shifted = nvfp4::e4m3_from_float_rne(v);
  if (!(v <= 448.0f) || nvfp4::e4m3_to_float(shifted) != v)
    throw Error(fmt::format("{}: block scale {} times 2^{} is not an E4M3 value", key, nvfp4::e4m3_to_float(code), shift));
  return shifted;
}

// What one source becomes in the output: its tensors' specs, and how to stream their payloads.
struct Output {
  const Source* source;
  bool as_nvfp4;  // weight (U8 codes), weight_scale (F8_E4M3), weight_scale_2 (F32 scalar)
  bool with_input_scale = false;  // W4A4: input_scale (F32 scalar) too
  int shift = 0;  // weight_scale_2 = 2^-shift, block scales times 2^shift (shared within a fused group)
  std::vector<SafetensorsSpec> specs() const {
    const std::string base = source->key.substr(0, source->key.size() - std::string(".weight").size());
    if (!as_nvfp4) return {{source->key, "BF16", source->shape}};
    std::vector<SafetensorsSpec> out = {{source->key, "U8", {source->rows, source->cols / 2}},
                                        {base + ".weight_scale", "F8_E4M3", {source->rows, source->cols / 16}},
                                        {base + ".weight_scale_2", "F32", {}}};
    if (with_input_scale) out.push_back({base + ".input_scale", "F32", {}});
    return out;
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
    // The .dat's single-level scales as two levels: each block scale times 2^shift, exactly, over 2^-shift.
    for (uint8_t& code : all_scales) code = shifted_scale(code, shift, s.key);
    w.write(all_scales.data(), all_scales.size());
    const float global = std::ldexp(1.0f, -shift);
    w.write(&global, 4);
    // W4A4 only: input_scale, the activations' global scale FP4 kernels quantize them with. qwen3-train has no
    // calibration pass: 1 (docs/export.md says what that needs).
    const float one = 1.0f;
    if (with_input_scale) w.write(&one, 4);
  }
};


nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  std::ifstream f = open_input_file(path, what);
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": not valid JSON (" + json_error_text(e) + ")");
  }
}

// config.json for the output: the model's own, its weights now bf16, and for nvfp4-hf ModelOpt's
// quantization_config (flat form; hf_quant_config.json has the nested one). W4A16_NVFP4 (weight-only, what
// qwen3-train trains) unless W4A4 is asked for.
// `dense_modules`: what stays bf16 (lm_head, and a MoE model's routers, mlp.gate of each sparse block).
nlohmann::json quantization_section(bool flat, bool w4a4, const std::vector<std::string>& dense_modules) {
  nlohmann::json q = {{"quant_algo", w4a4 ? "NVFP4" : "W4A16_NVFP4"}, {"kv_cache_quant_algo", nullptr},
                      {"group_size", 16}, {"exclude_modules", dense_modules}};
  if (!flat) return {{"producer", {{"name", "qwen3-train"}, {"version", "1"}}}, {"quantization", q}};
  q["quant_method"] = "modelopt";
  q["ignore"] = dense_modules;
  return q;
}

void write_text(const fs::path& dir, const std::string& name, const std::string& text, HfExportReport& report) {
  write_file_durably((dir / name).string(), text);
  report.files.push_back(name);
}

// --out as a folder path: "newhf/" is the folder newhf (a trailing slash left an empty name to build the
// temporary and the aside names from).
fs::path export_target(const std::string& out) {
  fs::path target = fs::path(out).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();
  return target;
}

// The names an export writes: what an existing --out may hold to be replaced by --overwrite.
bool written_by_export(const fs::path& name) {
  const std::string n = name.filename().string();
  static const char* fixed[] = {"config.json", "generation_config.json", "hf_quant_config.json",
                                "model.safetensors", "model.safetensors.index.json", "tokenizer.json",
                                "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                                "vocab.json", "merges.txt", "chat_template.jinja"};
  for (const char* f : fixed)
    if (n == f) return true;
  return n.rfind("model-", 0) == 0 && n.size() > 12 && n.substr(n.size() - 12) == ".safetensors";
}

// Before anything is read or written: --out must not be, hold or lie inside any input (the weights, the
// checkpoint being exported, the config, the tokenizer), with or without --overwrite; an existing --out is
// replaced only with --overwrite and only when it holds nothing but what an export writes.
void check_export_target(const HfExportOptions& o, const std::vector<std::string>& inputs) {
  const fs::path target = export_target(o.out);
  std::error_code ec;
  const fs::path t = fs::weakly_canonical(fs::absolute(target, ec), ec);
  for (const std::string& input : inputs) {
    if (input.empty()) continue;
    const fs::path in = fs::weakly_canonical(fs::absolute(input, ec), ec);
    const auto inside = [](const fs::path& a, const fs::path& b) {  // a is b or lies under it
      auto [ai, bi] = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
      return bi == b.end();
    };
    if (inside(in, t) || inside(t, in))
      throw UsageError("export: --out " + o.out + (inside(in, t) ? " holds " : " is inside ") + "the input " + input +
                       ": an export never replaces what it reads; choose another --out");
  }
  if (!fs::exists(target, ec)) return;
  if (!o.overwrite) throw UsageError("export: --out " + o.out + " exists; pass --overwrite to replace it");
  if (!fs::is_directory(target, ec)) throw UsageError("export: --out " + o.out + " is a file; --format hf writes a folder");
  std::vector<std::string> foreign;
  for (const auto& entry : fs::directory_iterator(target, ec))
    if (!entry.is_regular_file(ec) || !written_by_export(entry.path())) foreign.push_back(entry.path().filename().string());
  if (!foreign.empty()) {
    std::sort(foreign.begin(), foreign.end());
    std::string listed;
    for (size_t i = 0; i < foreign.size() && i < 5; ++i) listed += (i ? ", " : "") + foreign[i];
    throw UsageError("export: --out " + o.out + " holds what no export writes (" + listed +
                     (foreign.size() > 5 ? ", ..." : "") + "): --overwrite replaces only an earlier export's folder");
  }
}

}  // namespace

std::string nvfp4_scale_group(const std::string& key) {
  for (const char* member : {".self_attn.q_proj.", ".self_attn.k_proj.", ".self_attn.v_proj."})
    if (key.find(member) != std::string::npos) return key.substr(0, key.find(".self_attn.")) + ".self_attn.qkv";
  for (const char* member : {".mlp.gate_proj.", ".mlp.up_proj."})
    if (key.find(member) != std::string::npos) return key.substr(0, key.find(".mlp.")) + ".mlp.gate_up";
  // An expert's gate and up are one w13 in vLLM's fused MoE, which warns and loses accuracy when their second
  // levels differ.
  if (key.find(".mlp.experts.") != std::string::npos)
    for (const char* member : {".gate_proj.", ".up_proj."})
      if (key.find(member) != std::string::npos) return key.substr(0, key.find(member)) + ".gate_up";
  return key;
}

HfExportReport export_hf(const HfExportOptions& o) {
  HfExportReport report;
  // Inputs: the checkpoint (optional), the .dat, the config.
  std::optional<DatReader> ckpt;
  std::optional<ExportInfo> info;
  std::string tokenizer = o.tokenizer;
  std::string config_path = o.config;
  if (!o.checkpoint.empty()) {
    const std::string path = resolve_checkpoint(o.checkpoint);
    const CheckpointState meta = load_checkpoint(path, "\x01");  // metadata only: no tensor has that prefix
    // The run's own tokenizer and config files, where the checkpoint names them and they are still there.
    const nlohmann::json flags = meta.extra.value("run", nlohmann::json::object()).value("flags", nlohmann::json::object());
    std::error_code exists_ec;
    if (tokenizer.empty() && !o.no_tokenizer && flags.value("tokenizer", std::string()) != "" &&
        fs::is_regular_file(flags.value("tokenizer", std::string()), exists_ec))
      tokenizer = flags.value("tokenizer", std::string());
    if (config_path.empty() && fs::is_regular_file(flags.value("config", std::string()), exists_ec))
      config_path = flags.value("config", std::string());
    info = ExportInfo::from_json(meta.extra, path + "/checkpoint.json");
    if (!info) throw Error(path + "/checkpoint.json: has no export information; it was written by an older qwen3-train");
    ckpt.emplace((fs::path(path) / "tensors.dat").string(), DatRules::container_only);
  }
  if (tokenizer.empty() && !o.no_tokenizer)
    throw UsageError("export: the folder needs its tokenizer: give --tokenizer T.json (its tokenizer_config.json, "
                     "chat template and the other files beside it are copied too), or --no-tokenizer for the weights "
                     "alone");
  if (!tokenizer.empty() && o.no_tokenizer) throw UsageError("export: --tokenizer and --no-tokenizer contradict");
  check_export_target(o, {o.weights, o.checkpoint.empty() ? std::string() : resolve_checkpoint(o.checkpoint), o.checkpoint,
                          config_path, o.config, tokenizer});
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
  // The tokenizer is loaded, not only copied: an empty or broken file, or one with ids the model lacks, would make
  // a folder transformers cannot load; said before any weight is written.
  if (!tokenizer.empty())
    Tokenizer::from_file(tokenizer).check_fits_model(config.vocab_size, o.config.empty() ? "the checkpoint's config" : o.config);
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
    outputs.push_back(Output{&s, o.format == HfFormat::nvfp4_hf && s.quantized() && s.key != "lm_head.weight",
                             o.nvfp4_w4a4});
  // One global scale per fused group, from the group's largest block scale (a pass over the scales, or over the
  // trained masters).
  std::map<std::string, float> group_largest;
  for (const Output& out : outputs)
    if (out.as_nvfp4) {
      float& largest = group_largest[nvfp4_scale_group(out.source->key)];
      largest = std::max(largest, largest_block_scale(in, *out.source));
    }
  for (Output& out : outputs)
    if (out.as_nvfp4) out.shift = global_scale_shift(group_largest[nvfp4_scale_group(out.source->key)]);

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
  const fs::path target = export_target(o.out);
  std::error_code ec;
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  fs::create_directories(parent, ec);
  // What an export to this target killed before its end left beside it (".NAME.partial-PID", ".NAME.old-PID" of a
  // process that no longer runs) goes now, and the report names it; a live process's are its own.
  const std::string stem = "." + target.filename().string() + ".";
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(stem, 0) != 0) continue;
    const std::string rest = name.substr(stem.size());
    for (const char* kind : {"partial-", "old-"}) {
      if (rest.rfind(kind, 0) != 0) continue;
      const std::string digits = rest.substr(std::string(kind).size());
      if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 10) continue;
      const long long number = std::stoll(digits);
      if (number <= 0 || number > 2147483647) continue;  // no pid
      const auto pid = static_cast<pid_t>(number);
      if (pid == ::getpid() || !(::kill(pid, 0) != 0 && errno == ESRCH)) continue;
      std::error_code removed;
      remove_tree(entry.path(), removed);
      if (!removed) report.removed_stale.push_back(entry.path().string());
    }
  }
  const fs::path temp = parent / ("." + target.filename().string() + ".partial-" + std::to_string(::getpid()));
  remove_tree(temp, ec);
  if (!fs::create_directory(temp, ec)) throw Error(temp.string() + ": cannot create (" + ec.message() + ")");
  struct RemoveOnFailure {
    fs::path path;
    bool keep = false;
    ~RemoveOnFailure() {
      std::error_code ignored;
      if (!keep) remove_tree(path, ignored);
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
  out_config["architectures"] = {config.is_moe() ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"};
  out_config["model_type"] = config.is_moe() ? "qwen3_moe" : "qwen3";
  out_config["torch_dtype"] = "bfloat16";
  out_config.erase("quantization_config");
  // transformers 5.x warns (about a tokenizer regex) on a config without the version that wrote it; Qwen3 came
  // with 4.51.0.
  if (!out_config.contains("transformers_version")) out_config["transformers_version"] = "4.51.0";
  if (o.format == HfFormat::nvfp4_hf) {
    std::vector<std::string> dense_modules = {"lm_head"};
    const ModelShape shape = config.shape();
    for (int64_t layer = 0; layer < shape.layers; ++layer)
      if (shape.moe_layer(layer)) dense_modules.push_back("model.layers." + std::to_string(layer) + ".mlp.gate");
    out_config["quantization_config"] = quantization_section(/*flat=*/true, o.nvfp4_w4a4, dense_modules);
    write_text(temp, "hf_quant_config.json",
               quantization_section(/*flat=*/false, o.nvfp4_w4a4, dense_modules).dump(2) + "\n", report);
  }
  write_text(temp, "config.json", out_config.dump(2) + "\n", report);
  // The base model's generation_config.json (sampling defaults, stop ids) where it sits beside its config.json;
  // else greedy decoding with the config's ids.
  const fs::path base_generation = config_path.empty() ? fs::path() : fs::path(config_path).parent_path() / "generation_config.json";
  if (!base_generation.empty() && fs::is_regular_file(base_generation, ec)) {
    write_text(temp, "generation_config.json", read_json_file(base_generation.string(), "generation config").dump(2) + "\n",
               report);
  } else {
    nlohmann::json generation = {{"do_sample", false}};
    if (config_json.contains("bos_token_id")) generation["bos_token_id"] = config_json["bos_token_id"];
    if (!config.eos_token_ids.empty())
      generation["eos_token_id"] = config.eos_token_ids.size() == 1 ? nlohmann::json(config.eos_token_ids[0])
                                                                     : nlohmann::json(config.eos_token_ids);
    write_text(temp, "generation_config.json", generation.dump(2) + "\n", report);
  }
  if (!tokenizer.empty()) {
    open_input_file(tokenizer, "tokenizer");  // names a missing file
    const fs::path dir = fs::path(tokenizer).parent_path();
    std::vector<fs::path> files = {tokenizer};
    for (const char* name : {"tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
                             "merges.txt", "chat_template.jinja"})
      if (fs::is_regular_file(dir / name, ec) && fs::path(tokenizer).filename() != name) files.push_back(dir / name);
    for (const fs::path& f : files) {
      const std::string name = f.filename() == fs::path(tokenizer).filename() ? "tokenizer.json" : f.filename().string();
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
  if (replacing) remove_tree(aside, ec);
  return report;
}

}  // namespace qwen3
