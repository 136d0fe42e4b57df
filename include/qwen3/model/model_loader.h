// Weights into a Qwen3Model from a `.dat`: NVFP4 pairs are dequantized, dense fp16/bf16/fp32 entries cast,
// one tensor in flight at a time, straight into the model's preallocated parameters.
#pragma once
#include <memory>

#include "qwen3/dat/dat.h"
#include "qwen3/model/model.h"

namespace qwen3 {

// Every missing or mis-shaped key is listed in one Error. A file without lm_head gives a model whose head is
// the embedding (allowed when the config ties them; an error otherwise). Entries the model does not use are
// reported at debug level and ignored.
// With `tie_head` the model's head is its embedding even when the file stores lm_head (as the real Qwen3-4B
// file does, quantized): training a tied model must update one tensor, as HF does; the exporter then writes the
// file's lm_head from the trained embedding. Requires config.tie_word_embeddings.
std::shared_ptr<Qwen3Model> load_model(const DatReader& reader, const Qwen3Config& config, at::ScalarType dtype,
                                       at::Device device, bool tie_head = false);

// True if the file has lm_head, dense or as an NVFP4 pair.
bool file_has_lm_head(const DatReader& reader);

// Reads one named weight (dense entry or NVFP4 pair) as a tensor of `dtype` on `device`; throws if absent.
at::Tensor read_weight(const DatReader& reader, const std::string& key, at::ScalarType dtype, at::Device device);

}  // namespace qwen3
