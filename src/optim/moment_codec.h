// Storage of AdamW's moments between steps: allocate, load a row range as fp32, store fp32 values back with
// stochastic rounding. Every parameter is viewed as a matrix [rows, cols] (dim 0 by the rest; a vector or a
// scalar is one row). Block-scaled storages pad each row to a whole number of blocks, so blocks never span
// rows and a row range can be loaded and stored on its own. Encodings and their measured error: docs/optim.md.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

#include "qwen3/optim.h"

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
  at::Tensor level_table;     // int8: 2^(-c/8) for c = 0..255; nvfp4: the value of each E4M3 code; on the device
};

namespace optim_detail {

// Rows and columns of the matrix view of a parameter of this shape.
int64_t matrix_rows(at::IntArrayRef shape);
int64_t matrix_cols(at::IntArrayRef shape);

// Elements per scale block (1 for the unscaled float storages).
int64_t moment_block(MomentStorage storage);

AdamW::ParamState allocate_moments(MomentStorage storage, at::IntArrayRef shape, const at::Device& device);

// fp32 [count, stored_cols] of rows first_row .. first_row+count-1. For float32 storage this is a view of the
// state itself (updated in place, store_* is then a no-op); otherwise a decoded copy.
at::Tensor load_exp_avg(const AdamW::ParamState& state, MomentStorage storage, int64_t first_row, int64_t count);
at::Tensor load_exp_avg_sq(const AdamW::ParamState& state, MomentStorage storage, int64_t first_row, int64_t count);

// Encodes fp32 [count, stored_cols] into those rows; `random_key` keys the stochastic rounding.
void store_exp_avg(AdamW::ParamState& state, MomentStorage storage, int64_t first_row, const at::Tensor& values,
                   uint64_t random_key);
void store_exp_avg_sq(AdamW::ParamState& state, MomentStorage storage, int64_t first_row, const at::Tensor& values,
                      uint64_t random_key);

}  // namespace optim_detail
}  // namespace qwen3
