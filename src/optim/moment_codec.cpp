// The four moment storages as layouts. Why each encoding is what it is (and what it measures): docs/optim.md.
#include "optim/moment_codec.h"

#include <ATen/ATen.h>

#include <vector>

#include "optim/adamw_step.h"
#include "qwen3/base/error.h"

namespace qwen3::optim_detail {

namespace ka = kernels::adamw;

int64_t matrix_rows(at::IntArrayRef shape) { return shape.size() <= 1 ? 1 : shape[0]; }

int64_t matrix_cols(at::IntArrayRef shape) {
  int64_t cols = 1;
  for (size_t d = shape.size() <= 1 ? 0 : 1; d < shape.size(); ++d) cols *= shape[d];
  return cols;
}

MomentCodec::MomentCodec(MomentStorage storage) : storage_(storage) {
  block_scale_dtype_ = at::ScalarType::Undefined;
  row_scale_ = false;
  codes_per_element_byte_ = 1;
  switch (storage) {
    case MomentStorage::float32:
      kind_ = ka::Moments::f32, block_ = 1, exp_avg_dtype_ = exp_avg_sq_dtype_ = at::kFloat;
      return;
    case MomentStorage::bfloat16:
      kind_ = ka::Moments::bf16, block_ = 1, exp_avg_dtype_ = exp_avg_sq_dtype_ = at::kBFloat16;
      return;
    case MomentStorage::int8:
      kind_ = ka::Moments::int8, block_ = ka::kInt8Block, exp_avg_dtype_ = at::kChar, exp_avg_sq_dtype_ = at::kByte;
      block_scale_dtype_ = at::kFloat;
      return;
    case MomentStorage::nvfp4:
      kind_ = ka::Moments::nvfp4, block_ = ka::kNvfp4Block, exp_avg_dtype_ = exp_avg_sq_dtype_ = at::kByte;
      codes_per_element_byte_ = 2;
      block_scale_dtype_ = at::kByte;
      row_scale_ = true;
      return;
  }
  throw Error("optimizer: unknown moment storage");
}

uint64_t MomentCodec::state_bytes(at::IntArrayRef shape) const {
  const uint64_t rows = matrix_rows(shape), cols = matrix_cols(shape), block = block_;
  const uint64_t stored = rows * ((cols + block - 1) / block * block);
  uint64_t one = stored * at::elementSize(exp_avg_dtype_) / codes_per_element_byte_;  // m's codes (v's alike)
  if (block_scale_dtype_ != at::ScalarType::Undefined) one += stored / block * at::elementSize(block_scale_dtype_);
  if (row_scale_) one += 4 * rows;
  return 2 * one;
}

AdamW::ParamState MomentCodec::allocate(at::IntArrayRef shape, const at::Device& device) const {
  AdamW::ParamState s;
  s.rows = matrix_rows(shape);
  s.cols = matrix_cols(shape);
  s.stored_cols = (s.cols + block_ - 1) / block_ * block_;
  const auto on = [&](at::ScalarType dtype) { return at::TensorOptions().dtype(dtype).device(device); };
  // Zero codes with zero scales decode to exactly 0 in every storage.
  s.exp_avg = at::zeros({s.rows, s.stored_cols / codes_per_element_byte_}, on(exp_avg_dtype_));
  s.exp_avg_sq = at::zeros({s.rows, s.stored_cols / codes_per_element_byte_}, on(exp_avg_sq_dtype_));
  if (block_scale_dtype_ != at::ScalarType::Undefined) {
    s.exp_avg_scale = at::zeros({s.rows, s.stored_cols / block_}, on(block_scale_dtype_));
    s.exp_avg_sq_scale = at::zeros({s.rows, s.stored_cols / block_}, on(block_scale_dtype_));
  }
  if (row_scale_) {
    s.exp_avg_row_scale = at::ones({s.rows}, on(at::kFloat));
    s.exp_avg_sq_row_scale = at::ones({s.rows}, on(at::kFloat));
  }
  return s;
}

ka::ParamView MomentCodec::view(const AdamW::ParamState& s) const {
  const auto pointer = [](const at::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; };
  ka::ParamView v{};
  v.exp_avg = pointer(s.exp_avg);
  v.exp_avg_sq = pointer(s.exp_avg_sq);
  v.exp_avg_scale = pointer(s.exp_avg_scale);
  v.exp_avg_sq_scale = pointer(s.exp_avg_sq_scale);
  v.exp_avg_row_scale = static_cast<float*>(pointer(s.exp_avg_row_scale));
  v.exp_avg_sq_row_scale = static_cast<float*>(pointer(s.exp_avg_sq_row_scale));
  v.rows = s.rows;
  v.cols = s.cols;
  v.stored_cols = s.stored_cols;
  v.moments = kind_;
  return v;
}

at::Tensor MomentCodec::load(const AdamW::ParamState& s, bool second, int64_t first_row, int64_t count) const {
  if (!s.exp_avg.device().is_cpu()) throw Error("optimizer: moments are decoded on the host from CPU state only");
  const ka::ParamView v = view(s);
  at::Tensor out = at::empty({count, s.stored_cols}, at::kFloat);
  for (int64_t r = 0; r < count; ++r) decode_moment_row(v, second, first_row + r, out.data_ptr<float>() + r * s.stored_cols);
  return out;
}

void MomentCodec::store(AdamW::ParamState& s, bool second, int64_t first_row, const at::Tensor& values,
                        uint64_t random_key) const {
  if (!s.exp_avg.device().is_cpu()) throw Error("optimizer: moments are encoded on the host into CPU state only");
  const at::Tensor in = values.to(at::kFloat).contiguous();
  const ka::ParamView v = view(s);
  for (int64_t r = 0; r < in.size(0); ++r)
    encode_moment_row(v, second, first_row + r, in.data_ptr<float>() + r * s.stored_cols, random_key);
}

AdamW::ParamState allocate_moments(MomentStorage storage, at::IntArrayRef shape, const at::Device& device) {
  return MomentCodec(storage).allocate(shape, device);
}
at::Tensor load_exp_avg(const AdamW::ParamState& s, MomentStorage storage, int64_t first_row, int64_t count) {
  return MomentCodec(storage).load(s, false, first_row, count);
}
at::Tensor load_exp_avg_sq(const AdamW::ParamState& s, MomentStorage storage, int64_t first_row, int64_t count) {
  return MomentCodec(storage).load(s, true, first_row, count);
}
void store_exp_avg(AdamW::ParamState& s, MomentStorage storage, int64_t first_row, const at::Tensor& values,
                   uint64_t random_key) {
  MomentCodec(storage).store(s, false, first_row, values, random_key);
}
void store_exp_avg_sq(AdamW::ParamState& s, MomentStorage storage, int64_t first_row, const at::Tensor& values,
                      uint64_t random_key) {
  MomentCodec(storage).store(s, true, first_row, values, random_key);
}

}  // namespace qwen3::optim_detail
