// `qwen3-train export`: a training checkpoint plus the `.dat` it was trained from → a new `.dat`, through the
// same exporter (and the same tied-head rule) as `train --output-dat`.
#pragma once
#include <optional>
#include <string>

#include "qwen3/checkpoint/checkpoint.h"
#include "qwen3/export/exporter.h"

namespace qwen3 {

struct CheckpointExportOptions {
  std::string checkpoint;  // a `step-*` directory, or a checkpoint root (its newest complete checkpoint is used)
  std::string weights;     // the input `.dat` the checkpoint was trained from
  std::string out;         // the new `.dat`
  std::optional<nvfp4::ScaleMode> scale_mode;  // default: the mode the checkpoint trained with
};

struct CheckpointExportResult {
  std::string checkpoint_path;  // the `step-*` directory used
  int64_t step = 0;
  nvfp4::ScaleMode scale_mode = nvfp4::ScaleMode::rne;
  size_t trained_tensors = 0;   // master weights in the checkpoint
  ExportReport report;
};

// The checkpoint a path names: a `step-*` directory itself, the newest complete one of a checkpoint root, or of a
// run's --output-dir (its checkpoints/, beside run.json). Error naming the path when it is none of them.
std::string resolve_checkpoint(const std::string& path);
// Error unless `input` is the file the checkpoint (`info`, from `checkpoint_path`) was trained from: its layout
// hash, and the sample hash of its values when the checkpoint has one.
void check_trained_from(const ExportInfo& info, const DatReader& input, const std::string& checkpoint_path,
                        const std::string& weights_path);

// Errors (qwen3::Error, naming the path): no checkpoint there, a checkpoint without the export information,
// one trained from another weight file (keys, element types or shapes differ), master weights that do not fit.
CheckpointExportResult export_checkpoint(const CheckpointExportOptions& options);

}  // namespace qwen3
