#include "qwen3/checkpoint_export.h"

#include <nlohmann/json.hpp>

#include <filesystem>

#include "qwen3/checkpoint.h"
#include "qwen3/dat_tensor.h"
#include "qwen3/quantize_dat.h"

namespace qwen3 {
namespace {

namespace fs = std::filesystem;


std::string resolve_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw Error(dir + ": no such checkpoint directory");
  if (fs::exists(fs::path(dir) / "checkpoint.json", ec)) return dir;
  if (auto latest = latest_checkpoint(dir)) return *latest;
  throw Error(dir + ": neither a checkpoint (no checkpoint.json) nor a folder of complete step-* checkpoints");
}

// The export information the trainer records in `extra`; older checkpoints lack it.
void check_export_info(const nlohmann::json& extra, const std::string& ckpt) {
  if (!extra.is_object() || !extra.contains("weights_hash") || !extra["weights_hash"].is_string() ||
      !extra.contains("tied_head") || !extra["tied_head"].is_boolean() || !extra.contains("scale_mode") ||
      !extra["scale_mode"].is_string())
    throw Error(ckpt + "/checkpoint.json: has no export information (extra.weights_hash, tied_head, scale_mode); "
                       "it was written by an older qwen3-train");
}

}  // namespace

CheckpointExportResult export_checkpoint(const CheckpointExportOptions& o) {
  CheckpointExportResult res;
  res.checkpoint_path = resolve_checkpoint(o.checkpoint);
  CheckpointState ckpt = load_checkpoint(res.checkpoint_path, kMasterWeightPrefix);
  const nlohmann::json& extra = ckpt.extra;
  check_export_info(extra, res.checkpoint_path);
  res.step = ckpt.step;
  if (o.scale_mode) {
    res.scale_mode = *o.scale_mode;
  } else {
    const std::string name = extra["scale_mode"].get<std::string>();
    if (name != "rne" && name != "search")
      throw Error(res.checkpoint_path + "/checkpoint.json: unknown scale mode '" + name + "'");
    res.scale_mode = nvfp4::scale_mode_from_name(name);
  }
  check_not_same_file(o.weights, o.out);
  const DatReader input(o.weights);
  if (weights_hash(input) != extra["weights_hash"].get<std::string>())
    throw Error(res.checkpoint_path + ": was not trained from " + o.weights +
                " (the file's keys, element types or shapes differ from the checkpoint's input)");
  // Checkpoints from before the sample hash carry only the layout hash: checked as far as it goes.
  if (extra.contains("weights_sample_hash") && extra["weights_sample_hash"] != weights_sample_hash(input))
    throw Error(res.checkpoint_path + ": was not trained from " + o.weights +
                " (same layout, but the stored values differ from the checkpoint's input)");
  NamedTensors trained;
  const size_t prefix = std::string(kMasterWeightPrefix).size();
  for (auto& [name, t] : ckpt.tensors) trained.emplace_back(name.substr(prefix), std::move(t));
  if (trained.empty()) throw Error(res.checkpoint_path + ": no master weights (master/*) in the checkpoint");
  res.trained_tensors = trained.size();
  trained = with_tied_head(std::move(trained), extra["tied_head"].get<bool>(), input);
  res.report = export_dat(input, o.out, trained, res.scale_mode);
  return res;
}

}  // namespace qwen3
