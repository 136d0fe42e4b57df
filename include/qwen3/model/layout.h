// The tensor keys, shapes and order of a Qwen3 checkpoint (docs/model.md), derived from the handful of sizes
// that determine them (ModelShape, config.h): the one list the model, its loader, `synth`, the converter, the
// memory and time models, the benchmarks and the tests build on.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "qwen3/config/config.h"
#include "qwen3/dat/dat.h"

namespace qwen3 {


struct TensorSpec {
  std::string key;             // e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // dense shape, [out, in] for matrices
  bool quantizable = false;    // one of the seven projections or lm_head: stored as an NVFP4 pair
};

// Hugging Face state-dict order: embedding; per block q,k,v,o, q_norm, k_norm, gate, up, down (a sparse block:
// the router mlp.gate, then mlp.experts.E.gate/up/down for each expert), the two layernorms; final norm;
// lm_head (when with_lm_head).
std::vector<TensorSpec> qwen3_tensors(const ModelShape& shape, bool with_lm_head = true);

// The `.dat` entries those tensors become: NVFP4 pairs (qdata [out, in/2] uint8, scale [out, in/16] e4m3)
// for quantizable tensors when nvfp4 is set, `dense_type` for everything else.
struct EntrySpec {
  std::string key;
  ElemType type;
  std::vector<int64_t> shape;
};
std::vector<EntrySpec> qwen3_dat_entries(const ModelShape& shape, bool nvfp4, ElemType dense_type,
                                         bool with_lm_head = true);

// The block index of a "model.layers.{i}.…" key; nullopt for any other key (or a malformed index).
std::optional<int64_t> layer_of_key(std::string_view key);

}  // namespace qwen3
