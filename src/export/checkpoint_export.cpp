#include "qwen3/checkpoint_export.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "qwen3/checkpoint.h"
#include "qwen3/dat_tensor.h"
#include "qwen3/quantize_dat.h"

namespace qwen3 {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kMasterPrefix = "master/";  // the trainer's name for a trained tensor's master weight

std::string resolve_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw Error(dir + ": no such checkpoint directory");
  if (fs::exists(fs::path(dir) / "checkpoint.json", ec)) return dir;
  if (auto latest = latest_checkpoint(dir)) return *latest;
  throw Error(dir + ": neither a checkpoint (no checkpoint.json) nor a folder of complete step-* checkpoints");
}

// checkpoint.json alone: load_checkpoint would also read the optimizer state, which can be twice the model.
nlohmann::json read_checkpoint_json(const std::string& ckpt) {
  const std::string path = (fs::path(ckpt) / "checkpoint.json").string();
  std::ifstream f(path);
  if (!f) throw Error(path + ": cannot open");
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": invalid JSON: " + e.what());
  }
  if (!meta.is_object() || meta.value("magic", "") != kCheckpointMagic)
    throw Error(path + ": not a qwen3-train checkpoint (wrong magic)");
  if (meta.value("format_version", -1) != kCheckpointFormatVersion)
    throw Error(path + ": checkpoint format version " + meta.value("format_version", nlohmann::json()).dump() +
                " is not supported (this build reads version " + std::to_string(kCheckpointFormatVersion) + ")");
  const nlohmann::json extra = meta.value("extra", nlohmann::json::object());
  if (!extra.is_object() || !extra.contains("weights_hash") || !extra["weights_hash"].is_string() ||
      !extra.contains("tied_head") || !extra["tied_head"].is_boolean() || !extra.contains("scale_mode") ||
      !extra["scale_mode"].is_string())
    throw Error(path + ": has no export information (extra.weights_hash, tied_head, scale_mode); it was written "
                       "by an older qwen3-train");
  return meta;
}

NamedTensors read_master_weights(const std::string& ckpt) {
  const DatReader r((fs::path(ckpt) / "tensors.dat").string(), DatRules::container_only);
  NamedTensors out;
  for (const auto& e : r.entries())
    if (e.key.compare(0, kMasterPrefix.size(), kMasterPrefix) == 0)
      out.emplace_back(e.key.substr(kMasterPrefix.size()), read_tensor(r, e));
  if (out.empty()) throw Error(r.path() + ": no master weights (master/*) in the checkpoint");
  return out;
}

}  // namespace

CheckpointExportResult export_checkpoint(const CheckpointExportOptions& o) {
  CheckpointExportResult res;
  res.checkpoint_path = resolve_checkpoint(o.checkpoint);
  const nlohmann::json meta = read_checkpoint_json(res.checkpoint_path);
  const nlohmann::json& extra = meta["extra"];
  res.step = meta.value("step", int64_t{0});
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
  NamedTensors trained = read_master_weights(res.checkpoint_path);
  res.trained_tensors = trained.size();
  trained = with_tied_head(std::move(trained), extra["tied_head"].get<bool>(), input);
  res.report = export_dat(input, o.out, trained, res.scale_mode);
  return res;
}

}  // namespace qwen3
