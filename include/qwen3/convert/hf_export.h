// A model out to the Hugging Face layout (docs/export.md, "Hugging Face and vLLM"): a folder that
// transformers.AutoModelForCausalLM.from_pretrained loads (format hf: every tensor bf16, projections as the
// dequantized NVFP4 weights the model computes with), or that vLLM and TensorRT-LLM load as a ModelOpt NVFP4
// checkpoint (format nvfp4-hf: projections as packed E2M1 codes with E4M3 block scales). The tensors come from
// a checkpoint's master weights where it has them (re-quantized with the canonical quantizer, as the .dat export
// does) and from the input .dat otherwise, streamed in row blocks: memory is bounded by a block, not a tensor.
// The folder is assembled under a temporary name beside --out and renamed into place when complete.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "qwen3/nvfp4/nvfp4.h"

namespace qwen3 {

enum class HfFormat { hf, nvfp4_hf };

struct HfExportOptions {
  HfFormat format = HfFormat::hf;
  std::string checkpoint;   // a step-* folder or a checkpoint root; empty: the input .dat as it is
  std::string weights;      // the input .dat (the checkpoint's, when one is given)
  std::string config;       // the model's config.json
  std::string tokenizer;    // tokenizer.json to copy, with its tokenizer_config.json etc. beside it; empty: the
                            // checkpoint's run's (an error when there is none, unless no_tokenizer)
  bool no_tokenizer = false;  // the weights alone, on purpose
  std::string out;          // the folder to create
  uint64_t max_shard_bytes = 5'000'000'000;  // HF's default max_shard_size, "5GB"
  bool overwrite = false;   // replace an existing folder (moved aside, removed once the new one is in place)
  std::optional<nvfp4::ScaleMode> scale_mode;  // re-quantization of trained projections; default: the checkpoint's
  // nvfp4-hf: declare W4A4 (NVFP4: FP4 activations too, with an uncalibrated input_scale of 1) instead of the
  // weight-only W4A16_NVFP4 the model was trained as (docs/export.md).
  bool nvfp4_w4a4 = false;
};

struct HfExportReport {
  std::vector<std::string> files;  // written, relative to `out`
  uint64_t tensors = 0, bytes = 0, shards = 0;
  uint64_t trained = 0;  // tensors taken from the checkpoint
  std::vector<std::string> removed_stale;  // folders an earlier export to this target left when it was killed
};

HfExportReport export_hf(const HfExportOptions& options);

// The projections that share one power-of-two weight_scale_2 in an nvfp4-hf export: each fused layer vLLM loads
// them into (q/k/v as qkv_proj, gate/up as gate_up_proj, an expert's gate/up as its w13: vLLM takes one global
// scale for a fused layer, and warns and loses accuracy when an expert's two differ); the key itself otherwise.
std::string nvfp4_scale_group(const std::string& key);

}  // namespace qwen3
