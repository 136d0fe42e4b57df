#include "qwen3/export/checkpoint_export.h"

#include <nlohmann/json.hpp>

#include <filesystem>

#include "qwen3/checkpoint/checkpoint.h"
#include "qwen3/dat/dat_tensor.h"
#include "qwen3/export/quantize_dat.h"

namespace qwen3 {
namespace fs = std::filesystem;

std::string resolve_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw Error(dir + ": no such checkpoint directory");
  if (fs::exists(fs::path(dir) / "checkpoint.json", ec)) return dir;
  if (auto latest = latest_checkpoint(dir)) return *latest;
  // A run's --output-dir (run.json beside checkpoints/): the newest of its checkpoints, as --resume takes it.
  const fs::path run_checkpoints = fs::path(dir) / "checkpoints";
  if (fs::exists(fs::path(dir) / "run.json", ec) && fs::is_directory(run_checkpoints, ec))
    if (auto latest = latest_checkpoint(run_checkpoints.string())) return *latest;
  throw Error(dir + ": neither a checkpoint (no checkpoint.json), a folder of complete step-* checkpoints, nor a "
                    "run's --output-dir with one in checkpoints/");
}

void check_trained_from(const ExportInfo& info, const DatReader& input, const std::string& checkpoint_path,
                        const std::string& weights_path) {
  if (weights_hash(input) != info.weights_hash)
    throw Error(checkpoint_path + ": was not trained from " + weights_path +
                " (the file's keys, element types or shapes differ from the checkpoint's input)");
  // Checkpoints from before the sample hash carry only the layout hash: checked as far as it goes.
  if (info.weights_sample_hash && *info.weights_sample_hash != weights_sample_hash(input))
    throw Error(checkpoint_path + ": was not trained from " + weights_path +
                " (same layout, but the stored values differ from the checkpoint's input)");
}

CheckpointExportResult export_checkpoint(const CheckpointExportOptions& o) {
  CheckpointExportResult res;
  res.checkpoint_path = resolve_checkpoint(o.checkpoint);
  CheckpointState ckpt = load_checkpoint(res.checkpoint_path, kMasterWeightPrefix);
  const std::string origin = res.checkpoint_path + "/checkpoint.json";
  const std::optional<ExportInfo> info = ExportInfo::from_json(ckpt.extra, origin);
  if (!info)
    throw Error(origin + ": has no export information (extra.weights_hash, tied_head, scale_mode); it was written "
                         "by an older qwen3-train");
  res.step = ckpt.step;
  res.scale_mode = o.scale_mode ? *o.scale_mode : info->scale_mode;
  check_not_same_file(o.weights, o.out);
  const DatReader input(o.weights);
  check_trained_from(*info, input, res.checkpoint_path, o.weights);
  NamedTensors trained;
  const size_t prefix = std::string(kMasterWeightPrefix).size();
  for (auto& [name, t] : ckpt.tensors) trained.emplace_back(name.substr(prefix), std::move(t));
  if (trained.empty()) throw Error(res.checkpoint_path + ": no master weights (master/*) in the checkpoint");
  res.trained_tensors = trained.size();
  trained = with_tied_head(std::move(trained), info->tied_head, input);
  res.report = export_dat(input, o.out, trained, res.scale_mode);
  return res;
}

}  // namespace qwen3
