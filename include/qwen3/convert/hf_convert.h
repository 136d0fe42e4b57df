// `convert`: a Hugging Face Qwen3 checkpoint directory (config.json + *.safetensors, with or without
// model.safetensors.index.json) → a `.dat` in the key order of docs/model.md, dense (what the original's
// export_qwen3.py wrote) or directly NVFP4 (its quantize step too), tensor by tensor in row chunks read with
// pread: memory stays at a few tens of MB whatever the model size. config.json is copied beside the output.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "qwen3/dat/dat.h"
#include "qwen3/nvfp4/nvfp4.h"

namespace qwen3 {

struct ConvertOptions {
  std::string hf_dir;
  std::string out;                           // the `.dat`; config.json goes to its directory
  ElemType dense_type = ElemType::Float16;   // float16 or bfloat16
  // The projections and lm_head as NVFP4 pairs (qdata id 0, scale id 101), quantized from the values rounded to
  // `dense_type`, so the output equals `convert` followed by `quantize` byte for byte.
  bool nvfp4 = false;
  nvfp4::ScaleMode scale_mode = nvfp4::ScaleMode::rne;
};

struct ConvertReport {
  std::vector<std::string> shards;   // the safetensors files read
  uint64_t tensors = 0;              // model tensors written
  uint64_t entries = 0;              // `.dat` entries (a pair counts 2)
  uint64_t quantized = 0;
  bool lm_head = false;              // the checkpoint has its own lm_head (written); else the config ties it
  std::vector<std::string> ignored;  // tensors in the checkpoint the model does not use
  std::string config_path;           // where config.json was copied
  // ModelOpt NVFP4 projections read (two-level scales), and with nvfp4 output the worst relative RMS error of
  // their re-quantization to single-level blocks.
  uint64_t modelopt_tensors = 0;
  double modelopt_worst_error = 0;
  std::string modelopt_worst_tensor;
};

// Errors name the file (and tensor): a malformed safetensors header or index, tensors missing, mis-shaped or of
// a non-float dtype against the config (all listed in one message), values not finite in the output type.
ConvertReport convert_hf_checkpoint(const ConvertOptions& options);

}  // namespace qwen3
