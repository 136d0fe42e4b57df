// Storage of AdamW's moments between steps. Every parameter is viewed as a matrix [rows, cols] (dim 0 by the
// rest; a vector or a scalar is one row). Block-scaled storages pad each row to a whole number of blocks, so
// blocks never span rows and a row range can be decoded and encoded on its own. Encodings and their measured
// error: docs/optim.md; the element rules: kernels/adamw_update.cuh.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

#include "adamw_update.cuh"
#include "qwen3/optim/optim.h"

namespace qwen3 {

struct AdamW::ParamState {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stored_cols = 0;    // cols rounded up to the storage's block
  at::Tensor exp_avg;         // float32 / bfloat16 [rows, cols]; int8 [rows, stored]; nvfp4 codes uint8 [rows, stored/2]
  at::Tensor exp_avg_scale;   // int8: fp32 step per 64-block; nvfp4: E4M3 codes per 16-block; else undefined
  at::Tensor exp_avg_sq;      // float32 / bfloat16 [rows, cols]; int8: uint8 log codes; nvfp4: codes of sqrt(v)
  at::Tensor exp_avg_sq_scale;  // int8: fp32 block max of v; nvfp4: E4M3 codes per 16-block of sqrt(v)
  at::Tensor exp_avg_row_scale;     // nvfp4: fp32 per row, the value that E4M3 x E2M1's top (2688) stands for
  at::Tensor exp_avg_sq_row_scale;  // the same for sqrt(v)
};

namespace optim_detail {

// Rows and columns of the matrix view of a parameter of this shape.
int64_t matrix_rows(at::IntArrayRef shape);
int64_t matrix_cols(at::IntArrayRef shape);

// The one place a MomentStorage becomes a layout, picked once when the optimizer is built: what state tensors
// a parameter gets (allocate), what they cost (state_bytes), and the raw view through which the fused update
// decodes and encodes them element by element (view; the rules themselves are kernels/adamw_update.cuh's).
// load/store decode and encode whole rows of CPU state by the same rules, for tests and tools.
class MomentCodec {
 public:
  explicit MomentCodec(MomentStorage storage);

  MomentStorage storage() const { return storage_; }
  int64_t block() const { return block_; }  // elements per scale block (1: unscaled)
  uint64_t state_bytes(at::IntArrayRef shape) const;
  AdamW::ParamState allocate(at::IntArrayRef shape, const at::Device& device) const;
  // The state's pointers and sizes; the caller fills in master and gradient.
  kernels::adamw::ParamView view(const AdamW::ParamState& state) const;

  // fp32 [count, stored_cols] of rows first_row .. first_row + count - 1 of m (second = false) or v.
  at::Tensor load(const AdamW::ParamState& state, bool second, int64_t first_row, int64_t count) const;
  // Encodes fp32 [count, stored_cols] into those rows; `random_key` keys the stochastic rounding.
  void store(AdamW::ParamState& state, bool second, int64_t first_row, const at::Tensor& values,
             uint64_t random_key) const;

 private:
  MomentStorage storage_;
  kernels::adamw::Moments kind_;
  int64_t block_;
  at::ScalarType exp_avg_dtype_, exp_avg_sq_dtype_;
  int64_t codes_per_element_byte_;        // 2 for packed nvfp4 nibbles, else 1
  at::ScalarType block_scale_dtype_;      // int8: fp32; nvfp4: E4M3 codes as uint8; Undefined: none
  bool row_scale_;                        // nvfp4: an fp32 scale per row
};

// The test-facing forms of MomentCodec(storage).allocate / load / store.
AdamW::ParamState allocate_moments(MomentStorage storage, at::IntArrayRef shape, const at::Device& device);
at::Tensor load_exp_avg(const AdamW::ParamState& state, MomentStorage storage, int64_t first_row, int64_t count);
at::Tensor load_exp_avg_sq(const AdamW::ParamState& state, MomentStorage storage, int64_t first_row, int64_t count);
void store_exp_avg(AdamW::ParamState& state, MomentStorage storage, int64_t first_row, const at::Tensor& values,
                   uint64_t random_key);
void store_exp_avg_sq(AdamW::ParamState& state, MomentStorage storage, int64_t first_row, const at::Tensor& values,
                      uint64_t random_key);

}  // namespace optim_detail
}  // namespace qwen3
