// `synth`: a random Qwen3 model of any shape, written as `config.json` + `model.dat` with the real key names
// and order, streamed tensor by tensor in row chunks (the 4B preset needs well under 1 GB of memory).
#pragma once
#include <cstdint>
#include <string>

#include "qwen3/config/config.h"
#include "qwen3/nvfp4/nvfp4.h"

namespace qwen3 {

struct SynthOptions {
  Qwen3Config config;
  std::string out_dir;
  uint64_t seed = 0;
  bool dense = false;  // fp16 everywhere instead of NVFP4 pairs for the projections and lm_head
  nvfp4::ScaleMode scale_mode = nvfp4::ScaleMode::rne;
};

struct SynthResult {
  std::string dat_path;
  std::string config_path;
  uint64_t entries = 0;
  uint64_t file_bytes = 0;
  uint64_t parameters = 0;
};

SynthResult write_synthetic_model(const SynthOptions& options);

// The model `train --synthetic` trains: random weights of `config`'s shape from `seed`, written once into `folder`
// with a record of both (synthetic.json), and reused while that record matches (a resume, or the same run again,
// finds the same weights). A folder holding another config's or seed's weights (a new run with other flags in
// the same --checkpoint-dir) is written anew where `replace_other` (train's --overwrite of a previous run), else
// refused: UsageError naming what differs, never trained in place of what the flags ask for. An empty `folder`: a
// fresh temporary one. The result names the files (its counts are those of a fresh write only).
SynthResult synthetic_training_model(const Qwen3Config& config, uint64_t seed, const std::string& folder,
                                     bool replace_other = false);

}  // namespace qwen3
