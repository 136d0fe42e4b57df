// `convert`: a Hugging Face Qwen3 checkpoint directory into a `.dat` (docs/export.md).
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_common.h"
#include "qwen3/convert/hf_convert.h"
#include "qwen3/export/output_target.h"

namespace qwen3::cli {

Command add_convert_command(CLI::App& app) {
  struct Options {
    ConvertOptions opt;
    std::string dtype = "float16", scale_mode = "rne";
    bool overwrite = false;
  };
  auto o = std::make_shared<Options>();
  auto* sub = app.add_subcommand("convert", "Convert a Hugging Face safetensors checkpoint into a .dat");
  sub->add_option("--hf-dir", o->opt.hf_dir, "folder with config.json and *.safetensors (index.json optional)")
      ->required();
  sub->add_option("--out", o->opt.out, "the .dat to write; config.json is copied beside it")->required();
  sub->add_option("--dtype", o->dtype, "dense element type: float16 (as the original's export) or bfloat16")
      ->check(CLI::IsMember({"float16", "bfloat16"}))
      ->capture_default_str();
  add_bool_flag(sub, "--nvfp4", o->opt.nvfp4, "write the projections and lm_head as NVFP4 pairs (as `quantize`)");
  auto* scale_mode = sub->add_option("--scale-mode", o->scale_mode, "NVFP4 block scales with --nvfp4: rne or search")
      ->check(CLI::IsMember({"rne", "search"}))
      ->capture_default_str();
  add_bool_flag(sub, "--overwrite", o->overwrite,
                "replace an existing --out and the config.json beside it (never the input's own files)");
  return {sub, [o, scale_mode]() {
            if (scale_mode->count() > 0 && !o->opt.nvfp4)  // it was ignored: nothing is quantized without --nvfp4
              throw UsageError("convert: --scale-mode applies with --nvfp4");
            // The input's own files (its config.json and shards) are never replaced; the folder itself may hold
            // the output.
            std::vector<std::string> inputs;
            std::error_code ec;
            for (const auto& e : std::filesystem::directory_iterator(o->opt.hf_dir, ec))
              if (e.is_regular_file(ec)) inputs.push_back(e.path().string());
            prepare_output_target("--out", o->opt.out, o->overwrite, inputs);
            // config.json beside the .dat: nothing to write when that is the input's own (a .dat made inside the
            // Hugging Face folder, which --model-dir then trains from).
            const std::filesystem::path beside = std::filesystem::absolute(o->opt.out).parent_path() / "config.json";
            const std::filesystem::path own = std::filesystem::path(o->opt.hf_dir) / "config.json";
            if (!(std::filesystem::exists(beside, ec) && std::filesystem::equivalent(beside, own, ec)))
              prepare_output_target("--out (the config.json beside it)", beside.string(), o->overwrite, inputs);
            o->opt.dense_type = elem_type_from_name(o->dtype);
            o->opt.scale_mode = nvfp4::scale_mode_from_name(o->scale_mode);
            const auto t0 = std::chrono::steady_clock::now();
            const ConvertReport r = convert_hf_checkpoint(o->opt);
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            fmt::print("wrote {}: {} entries from {} tensors in {} shard(s) ({} NVFP4, lm_head {}, {} ignored), "
                       "config {}, in {:.1f} s\n",
                       o->opt.out, r.entries, r.tensors, r.shards.size(), r.quantized,
                       r.lm_head ? "written" : "tied to the embedding", r.ignored.size(), r.config_path, s);
            if (r.modelopt_tensors > 0)
              fmt::print("{} ModelOpt NVFP4 projections {}\n", r.modelopt_tensors,
                         o->opt.nvfp4 ? fmt::format("re-quantized to single-level blocks: worst relative RMS error "
                                                    "{:.3g} ({})",
                                                    r.modelopt_worst_error, r.modelopt_worst_tensor)
                                      : std::string("dequantized (two-level scales folded)"));
            return 0;
          }};
}

}  // namespace qwen3::cli
