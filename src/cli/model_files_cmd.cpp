// `synth` and `quantize`: the two commands that make model files (a random model; a dense file to NVFP4).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>

#include "cli_common.h"
#include "qwen3/base/error.h"
#include "qwen3/export/output_target.h"
#include "qwen3/export/quantize_dat.h"
#include "qwen3/model/synth.h"

namespace qwen3::cli {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

CLI::Option* add_scale_mode(CLI::App* sub, std::string& target) {
  return sub->add_option("--scale-mode", target, "NVFP4 block-scale choice: rne or search (see docs/nvfp4.md)")
      ->check(CLI::IsMember({"rne", "search"}))
      ->capture_default_str();
}

}  // namespace

Command add_synth_command(CLI::App& app) {
  struct Options {
    std::string preset, config, out_dir, scale_mode = "rne";
    uint64_t seed = 0;
    bool dense = false, overwrite = false;
  };
  auto o = std::make_shared<Options>();
  auto* sub = app.add_subcommand("synth", "Write a random Qwen3 model (config.json + model.dat) of any shape");
  auto* preset = sub->add_option("--preset", o->preset, "tiny, qwen3-4b, qwen3-moe-tiny or qwen3-30b-a3b")
                     ->check(CLI::IsMember({"tiny", "qwen3-4b", "qwen3-moe-tiny", "qwen3-30b-a3b"}));
  auto* config = sub->add_option("--config", o->config, "a config.json giving the shape instead of a preset");
  preset->excludes(config);
  sub->add_option("--out-dir", o->out_dir, "folder for config.json and model.dat")->required();
  sub->add_option("--seed", o->seed, "random seed")->check(seed_integer())->capture_default_str();
  add_bool_flag(sub, "--dense", o->dense, "float16 everywhere instead of NVFP4 pairs");
  add_scale_mode(sub, o->scale_mode);
  add_bool_flag(sub, "--overwrite", o->overwrite,
                "replace a model.dat and config.json already in --out-dir (never --config)");
  return {sub, [o]() {
            if (o->preset.empty() && o->config.empty()) throw UsageError("synth: give --preset or --config");
            // Before anything is written: a model already in the folder is someone's (exit 2 unless --overwrite),
            // and the config read is never the one written.
            for (const char* name : {"model.dat", "config.json"})
              prepare_output_target("synth: --out-dir", (std::filesystem::path(o->out_dir) / name).string(),
                                    o->overwrite, {o->config});
            SynthOptions opt;
            opt.config = o->config.empty() ? preset_config(o->preset) : load_config(o->config);
            opt.out_dir = o->out_dir;
            opt.seed = o->seed;
            opt.dense = o->dense;
            opt.scale_mode = nvfp4::scale_mode_from_name(o->scale_mode);
            const auto t0 = std::chrono::steady_clock::now();
            spdlog::info("synth: writing {} ({} layers, hidden {}) to {}", o->config.empty() ? o->preset : o->config,
                         opt.config.num_hidden_layers, opt.config.hidden_size, o->out_dir);
            const SynthResult r = write_synthetic_model(opt);
            fmt::print("wrote {} ({} entries, {} bytes, {:.3f} B parameters) and {} in {:.1f} s\n", r.dat_path,
                       r.entries, r.file_bytes, r.parameters / 1e9, r.config_path, seconds_since(t0));
            return 0;
          }};
}

Command add_quantize_command(CLI::App& app) {
  struct Options {
    std::string in, out, scale_mode = "rne";
    bool overwrite = false;
  };
  auto o = std::make_shared<Options>();
  auto* sub = app.add_subcommand("quantize", "Quantize a dense .dat's projections and lm_head to NVFP4 pairs");
  sub->add_option("--in", o->in, "dense input .dat (float16, bfloat16 or float32 weights)")->required();
  sub->add_option("--out", o->out, "NVFP4 output .dat (a new file)")->required();
  add_scale_mode(sub, o->scale_mode);
  add_bool_flag(sub, "--overwrite", o->overwrite, "replace an existing --out (never the input)");
  return {sub, [o]() {
            prepare_output_target("--out", o->out, o->overwrite, {o->in});
            const auto t0 = std::chrono::steady_clock::now();
            const QuantizeReport r = quantize_dat_file(o->in, o->out, nvfp4::scale_mode_from_name(o->scale_mode));
            fmt::print("{:<10} {:>8} {:>14}\n", "family", "tensors", "relative error");
            for (const auto& f : r.families) fmt::print("{:<10} {:>8} {:>14.4f}\n", f.family, f.tensors, f.relative());
            fmt::print("wrote {}: {} entries ({} quantized of {} input entries) in {:.1f} s\n", o->out, r.entries_out,
                       r.quantized, r.entries_in, seconds_since(t0));
            if (r.quantized == 0)  // the file is written all the same (a copy), but that is rarely what was meant
              spdlog::warn("quantize: {} holds no dense projection or head to quantize (NVFP4 already?): {} is a copy",
                           o->in, o->out);
            return 0;
          }};
}

}  // namespace qwen3::cli
