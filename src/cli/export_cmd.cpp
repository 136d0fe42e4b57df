// `export`: a training checkpoint back into a `.dat` the original runner loads (docs/export.md).
#include <fmt/format.h>

#include <chrono>

#include "cli_common.h"
#include "qwen3/export/checkpoint_export.h"
#include "qwen3/export/output_target.h"

namespace qwen3::cli {

Command add_export_command(CLI::App& app) {
  struct Options {
    CheckpointExportOptions opt;
    std::string scale_mode;  // empty: the checkpoint's
    bool overwrite = false;
  };
  auto o = std::make_shared<Options>();
  auto* sub = app.add_subcommand("export", "Write a checkpoint's trained weights into a copy of its input .dat");
  sub->add_option("--checkpoint", o->opt.checkpoint, "a step-* checkpoint, or a checkpoint folder (newest is used)")
      ->required();
  sub->add_option("--weights,--input-dat", o->opt.weights, "the .dat the checkpoint was trained from")->required();
  sub->add_option("--out", o->opt.out, "the new .dat (never the input)")->required();
  sub->add_option("--scale-mode", o->scale_mode, "NVFP4 block scales: rne or search (default: the checkpoint's)")
      ->check(CLI::IsMember({"rne", "search"}));
  add_bool_flag(sub, "--overwrite", o->overwrite, "replace an existing --out (never an input or a checkpoint file)");
  return {sub, [o]() {
            prepare_output_target("--out", o->opt.out, o->overwrite, {o->opt.weights}, {o->opt.checkpoint});
            if (!o->scale_mode.empty()) o->opt.scale_mode = nvfp4::scale_mode_from_name(o->scale_mode);
            const auto t0 = std::chrono::steady_clock::now();
            const CheckpointExportResult r = export_checkpoint(o->opt);
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            fmt::print("exported {} (step {}, {} trained tensors) to {}: {} entries ({} rewritten, {} copied), "
                       "scale mode {}, in {:.1f} s\n",
                       r.checkpoint_path, r.step, r.trained_tensors, o->opt.out, r.report.entries, r.report.rewritten,
                       r.report.copied, nvfp4::scale_mode_name(r.scale_mode), s);
            return 0;
          }};
}

}  // namespace qwen3::cli
