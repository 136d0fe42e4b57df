// `export`: a training checkpoint back into a `.dat` the original runner loads, or (--format hf | nvfp4-hf) out to
// a Hugging Face folder that transformers or vLLM load (docs/export.md).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cmath>

#include "cli_common.h"
#include "qwen3/convert/hf_export.h"
#include "qwen3/export/checkpoint_export.h"
#include "qwen3/export/output_target.h"

namespace qwen3::cli {
namespace {

// "5GB", "500MB", "64KB", "123" (bytes): decimal units, as HF's max_shard_size.
uint64_t parse_size(const std::string& text) {
  size_t used = 0;
  double value = -1;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = text.substr(used);
  double scale = unit.empty() || unit == "B" ? 1 : unit == "KB" ? 1e3 : unit == "MB" ? 1e6 : unit == "GB" ? 1e9 : -1;
  if (used == 0 || scale < 0 || !(value >= 1) || !std::isfinite(value * scale) || value * scale > 1e15)
    throw UsageError("--max-shard-size: '" + text + "' is not a size such as 5GB, 500MB or 1000000");
  return static_cast<uint64_t>(value * scale);
}

}  // namespace

Command add_export_command(CLI::App& app) {
  struct Options {
    CheckpointExportOptions opt;
    std::string scale_mode;  // empty: the checkpoint's
    std::string format = "dat", config, tokenizer, max_shard_size = "5GB";
    bool overwrite = false, no_tokenizer = false, w4a4 = false;
  };
  auto o = std::make_shared<Options>();
  auto* sub = app.add_subcommand("export", "Write a checkpoint's trained weights into a copy of its input .dat, or "
                                           "out to a Hugging Face folder (--format hf | nvfp4-hf)");
  sub->add_option("--checkpoint", o->opt.checkpoint,
                  "a step-* checkpoint, or a checkpoint folder (newest is used); optional with --format hf | nvfp4-hf "
                  "(the .dat as it is)");
  sub->add_option("--weights,--input-dat", o->opt.weights, "the .dat the checkpoint was trained from")->required();
  sub->add_option("--out", o->opt.out, "the new .dat, or the new folder (hf, nvfp4-hf); never an input")->required();
  sub->add_option("--format", o->format, "dat, hf (bf16 safetensors) or nvfp4-hf (ModelOpt NVFP4)")
      ->check(CLI::IsMember({"dat", "hf", "nvfp4-hf"}))->capture_default_str();
  sub->add_option("--config", o->config, "hf, nvfp4-hf: the model's config.json (default: the checkpoint's)");
  sub->add_option("--tokenizer", o->tokenizer,
                  "hf, nvfp4-hf: tokenizer.json to copy, with its tokenizer_config.json and chat template (default: "
                  "the checkpoint's run's)");
  add_bool_flag(sub, "--no-tokenizer", o->no_tokenizer, "hf, nvfp4-hf: the weights alone, without tokenizer files");
  add_bool_flag(sub, "--nvfp4-w4a4", o->w4a4,
                "nvfp4-hf: declare W4A4 (NVFP4: FP4 activations, with an uncalibrated input_scale of 1) instead of "
                "the weight-only W4A16_NVFP4 the model trained as; needs calibrated activation scales to be accurate");
  auto* shard_size = sub->add_option("--max-shard-size", o->max_shard_size, "hf, nvfp4-hf: largest safetensors shard")
                         ->capture_default_str();
  sub->add_option("--scale-mode", o->scale_mode, "NVFP4 block scales: rne or search (default: the checkpoint's)")
      ->check(CLI::IsMember({"rne", "search"}));
  add_bool_flag(sub, "--overwrite", o->overwrite, "replace an existing --out (never an input or a checkpoint file)");
  return {sub, [o, shard_size]() {
            const auto t0 = std::chrono::steady_clock::now();
            const auto seconds = [&t0] {
              return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            };
            if (o->format != "dat") {
              HfExportOptions h;
              h.format = o->format == "hf" ? HfFormat::hf : HfFormat::nvfp4_hf;
              h.checkpoint = o->opt.checkpoint;
              h.weights = o->opt.weights;
              h.config = o->config;
              h.tokenizer = o->tokenizer;
              h.no_tokenizer = o->no_tokenizer;
              h.nvfp4_w4a4 = o->w4a4;
              if (o->w4a4 && h.format != HfFormat::nvfp4_hf) throw UsageError("export: --nvfp4-w4a4 applies to --format nvfp4-hf");
              h.out = o->opt.out;
              h.overwrite = o->overwrite;
              h.max_shard_bytes = parse_size(o->max_shard_size);
              if (!o->scale_mode.empty()) h.scale_mode = nvfp4::scale_mode_from_name(o->scale_mode);
              const HfExportReport r = export_hf(h);
              for (const std::string& stale : r.removed_stale)
                fmt::print(stderr, "export: removed {}, left by an export to this target that was killed\n", stale);
              fmt::print("exported {} ({} tensors, {} from the checkpoint, {:.1f} MB in {} shard{}) to {}: {} in {:.1f} s\n",
                         o->opt.checkpoint.empty() ? o->opt.weights : o->opt.checkpoint, r.tensors, r.trained,
                         static_cast<double>(r.bytes) / 1e6, r.shards, r.shards == 1 ? "" : "s", o->opt.out,
                         fmt::join(r.files, ", "), seconds());
              return 0;
            }
            if (o->opt.checkpoint.empty()) throw UsageError("export: --checkpoint is required with --format dat");
            if (!o->config.empty() || !o->tokenizer.empty() || o->no_tokenizer || o->w4a4 || shard_size->count() > 0)
              throw UsageError("export: --config, --tokenizer, --no-tokenizer, --nvfp4-w4a4 and --max-shard-size apply "
                               "to --format hf | nvfp4-hf");
            prepare_output_target("--out", o->opt.out, o->overwrite, {o->opt.weights}, {o->opt.checkpoint});
            if (!o->scale_mode.empty()) o->opt.scale_mode = nvfp4::scale_mode_from_name(o->scale_mode);
            const CheckpointExportResult r = export_checkpoint(o->opt);
            fmt::print("exported {} (step {}, {} trained tensors) to {}: {} entries ({} rewritten, {} copied), "
                       "scale mode {}, in {:.1f} s\n",
                       r.checkpoint_path, r.step, r.trained_tensors, o->opt.out, r.report.entries, r.report.rewritten,
                       r.report.copied, nvfp4::scale_mode_name(r.scale_mode), seconds());
            return 0;
          }};
}

}  // namespace qwen3::cli
