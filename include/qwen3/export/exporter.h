// Trained weights back into the `.dat` format the original runner loads (docs/dat.md, "What
// the exporter must do"): the input file is streamed entry by entry; an entry whose tensor was trained is
// rewritten from its master weight (NVFP4 pairs re-quantized with the canonical quantizer, dense tensors in their
// original element type), every other entry is copied byte for byte. Same count, same order, same keys, element
// ids and shapes. Written atomically (temporary file, fsync, rename); the input is never overwritten.
// `train --output-dat` and `qwen3-train export` (checkpoint_export.h) both come through here.
#pragma once
#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "qwen3/dat/dat.h"
#include "qwen3/nvfp4/nvfp4.h"

namespace qwen3 {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct ExportReport {
  uint64_t entries = 0;
  uint64_t rewritten = 0;  // entries written from trained tensors (a pair counts 2)
  uint64_t copied = 0;
};

// `trained`: dense weights by their model key ("model.layers.0.self_attn.q_proj.weight", "model.norm.weight").
// A key that names no entry of the input (dense or pair), a shape that differs, a dense entry that is not a
// floating-point type, or a non-finite value is an Error naming the key; nothing is left at `output_dat` then.
ExportReport export_dat(const DatReader& input, const std::string& output_dat, const NamedTensors& trained,
                        nvfp4::ScaleMode mode);
ExportReport export_dat(const std::string& input_dat, const std::string& output_dat, const NamedTensors& trained,
                        nvfp4::ScaleMode mode);

// The tied-head rule shared by every exporter caller: a tied model trains one tensor for the embedding and the
// head, but the input file may store its own `lm_head` (the real Qwen3-4B file does: the quantized embedding).
// When `tied_head` is set, the embedding trained and the input has an `lm_head`, the trained embedding is also
// returned as "lm_head.weight", so the file's head stays the (re-quantized) embedding. Otherwise `trained` as is.
NamedTensors with_tied_head(NamedTensors trained, bool tied_head, const DatReader& input);

// A cheap identity of the file's values, recorded in checkpoints next to the layout hash: FNV-1a over each
// entry's key and the first and last 4 KiB of its payload (a few MB read for a 3 GB file). It tells the input
// apart from another file of the same layout (another seed, a trained output), whose untrained entries an
// export would otherwise copy silently.
std::string weights_sample_hash(const DatReader& input);

}  // namespace qwen3
