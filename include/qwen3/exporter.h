// Trained weights back into the `.dat` format the original runner loads (../shared/docs/dat-format.md, "What
// the exporter must do"): the input file is streamed entry by entry; an entry whose tensor was trained is
// rewritten from its master weight (NVFP4 pairs re-quantized with the canonical quantizer, dense tensors in their
// original element type), every other entry is copied byte for byte. Same count, same order, same keys, element
// ids and shapes. Written atomically (temporary file, fsync, rename); the input is never overwritten.
#pragma once
#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "qwen3/nvfp4.h"

namespace qwen3 {

struct ExportReport {
  uint64_t entries = 0;
  uint64_t rewritten = 0;  // entries written from trained tensors (a pair counts 2)
  uint64_t copied = 0;
};

// `trained`: dense weights by their model key ("model.layers.0.self_attn.q_proj.weight", "model.norm.weight").
// A key that names no entry of the input (dense or pair) is an Error, as is a shape that differs.
ExportReport export_dat(const std::string& input_dat, const std::string& output_dat,
                        const std::vector<std::pair<std::string, at::Tensor>>& trained, nvfp4::ScaleMode mode);

}  // namespace qwen3
