// `quantize`: the offline pass that turns a dense `.dat` (fp16/bf16/fp32, the HF export) into the NVFP4 file
// the runner loads: each projection and lm_head becomes a qdata/scale pair in place of its dense entry; every
// other entry is copied byte for byte. Streams row chunks, so memory stays at a few tens of MB.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "qwen3/nvfp4/nvfp4.h"

namespace qwen3 {

// The families the original quantize script converted: 2-D "*.weight" tensors whose key names one of the
// seven projections or lm_head, and never the embedding or a norm.
bool is_quantizable_weight(std::string_view key, size_t ndim);
std::string quantizable_family(std::string_view key);  // "q_proj", ..., "lm_head"; empty if none

struct FamilyError {
  std::string family;
  uint64_t tensors = 0;
  double sum_sq_error = 0;
  double sum_sq_input = 0;
  double relative() const;  // ||deq(Q(W)) - W||_F / ||W||_F over the family
};

struct QuantizeReport {
  uint64_t entries_in = 0;
  uint64_t entries_out = 0;
  uint64_t quantized = 0;
  std::vector<FamilyError> families;
};

QuantizeReport quantize_dat_file(const std::string& in_path, const std::string& out_path, nvfp4::ScaleMode mode);

// Refuses to write over the input (an in-place rewrite would destroy it on failure).
void check_not_same_file(const std::string& in_path, const std::string& out_path);

}  // namespace qwen3
