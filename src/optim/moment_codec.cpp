// The four moment storages. Why each encoding is what it is (and what it measures): docs/optim.md.
#include "optim/moment_codec.h"

#include <ATen/ATen.h>

#include <cmath>
#include <vector>

#include "optim/counter_random.h"
#include "qwen3/error.h"
#include "qwen3/nvfp4_ops.h"

namespace qwen3::optim_detail {
namespace {

constexpr int64_t kInt8Block = 64;
constexpr double kInt8LinearMax = 127.0;   // m codes -127 .. 127 (symmetric: -128 is never written)
constexpr double kLogCodesPerOctave = 8.0;  // v codes: v = block max * 2^(-code / 8), 256 levels over 2^-31.9
constexpr double kE2m1Max = 6.0;
constexpr double kE2m1Smallest = 0.5;

at::Tensor rows_of(const at::Tensor& t, int64_t first_row, int64_t count) { return t.narrow(0, first_row, count); }

at::Tensor uniform_for(uint64_t key, int64_t first_row, int64_t count, int64_t cols, const at::Device& device) {
  return uniform_from_bits(random_bits(key, first_row * cols, count, cols, device));
}

// ---- int8: m linear with a per-block step, v on a per-block log2 grid -----------------------------------------

at::Tensor load_int8_linear(const at::Tensor& codes, const at::Tensor& steps) {
  const int64_t rows = codes.size(0), blocks = steps.size(1);
  return (codes.to(at::kFloat).view({rows, blocks, kInt8Block}) * steps.unsqueeze(-1)).view({rows, -1});
}

void store_int8_linear(const at::Tensor& values, const at::Tensor& uniform, at::Tensor codes, at::Tensor steps) {
  const int64_t rows = values.size(0), blocks = steps.size(1);
  const at::Tensor x = values.view({rows, blocks, kInt8Block});
  const at::Tensor step = x.abs().amax(-1, true).div_(kInt8LinearMax);
  const at::Tensor t = at::where(step > 0, x / step, at::zeros({}, x.options()));
  at::Tensor lower = t.floor();
  // Round up with probability (t - floor t): unbiased. The clamp only catches t = 127 * (1 + ulp).
  lower.add_((uniform.view_as(t) < (t - lower)).to(at::kFloat)).clamp_(-kInt8LinearMax, kInt8LinearMax);
  codes.copy_(lower.view({rows, -1}));
  steps.copy_(step.squeeze(-1));
}

at::Tensor load_int8_log(const at::Tensor& codes, const at::Tensor& block_max, const at::Tensor& levels) {
  const int64_t rows = codes.size(0), blocks = block_max.size(1);
  const at::Tensor ratio = at::take(levels, codes.to(at::kLong)).view({rows, blocks, kInt8Block});
  return (ratio * block_max.unsqueeze(-1)).view({rows, -1});
}

void store_int8_log(const at::Tensor& values, const at::Tensor& uniform, const at::Tensor& levels, at::Tensor codes,
                    at::Tensor block_max) {
  const int64_t rows = values.size(0), blocks = block_max.size(1);
  const at::Tensor x = values.view({rows, blocks, kInt8Block});
  const at::Tensor max = x.amax(-1, true);
  const at::Tensor ratio = at::where(max > 0, x / max, at::zeros({}, x.options()));
  // The code just above the ratio (ratio = 0 gives +inf, clamped); its neighbours come from the same table the
  // decoder uses, so a log2 that is off by an ulp at a boundary only moves p to 0 or 1.
  const at::Tensor upper_code = ratio.log2().mul_(-kLogCodesPerOctave).floor_().clamp_(0, 254).to(at::kLong);
  const at::Tensor upper = at::take(levels, upper_code);
  const at::Tensor lower = at::take(levels, upper_code + 1);
  // Linear in v between the two levels: E[stored v] = v. Below the last level the code is 255 (a floor).
  const at::Tensor p_upper = ((ratio - lower) / (upper - lower)).clamp_(0, 1);
  const at::Tensor code = upper_code + (uniform.view_as(ratio) >= p_upper).to(at::kLong);
  codes.copy_(code.view({rows, -1}));
  block_max.copy_(max.squeeze(-1));
}

// ---- nvfp4: the project's format; the codec's scale, elements rounded stochastically on the E2M1 grid --------

// E4M3 scale codes for 16-blocks of non-negative `magnitude` [rows, blocks, 16]: the canonical codec's code,
// raised by one where the codec's scale would clip the block maximum (amax > 6 s), so rounding never clips.
at::Tensor unclipped_scale_codes(const at::Tensor& magnitude_rows, const at::Tensor& e4m3_values) {
  const int64_t rows = magnitude_rows.size(0);
  const at::Tensor canonical = nvfp4::quantize(magnitude_rows).scales;  // [rows, blocks]
  const at::Tensor amax = magnitude_rows.view({rows, -1, nvfp4::kBlock}).amax(-1);
  const at::Tensor clips = amax > at::take(e4m3_values, canonical.to(at::kLong)).mul(kE2m1Max);
  return (canonical.to(at::kInt) + clips.to(at::kInt)).clamp_max_(0x7E).to(at::kByte);
}

// |x| / s on the E2M1 magnitude grid {0, .5, 1, 1.5, 2, 3, 4, 6}, rounded to a neighbour at random: linear in
// the value (unbiased in x) or in the square (unbiased in x^2, used for sqrt(v)). Returns magnitude codes 0..7.
at::Tensor e2m1_stochastic_codes(const at::Tensor& scaled, const at::Tensor& uniform, bool unbiased_in_square) {
  const at::Tensor spacing = at::where(scaled < 2, at::full({}, 0.5, scaled.options()),
                                       at::where(scaled < 4, at::full({}, 1.0, scaled.options()),
                                                 at::full({}, 2.0, scaled.options())));
  const at::Tensor lower = (scaled / spacing).floor_().mul_(spacing);
  const at::Tensor upper = lower + spacing;
  const at::Tensor p_upper = unbiased_in_square ? (scaled * scaled - lower * lower) / (upper * upper - lower * lower)
                                                : (scaled - lower) / spacing;
  const at::Tensor value = at::where(uniform < p_upper, upper, lower);
  // Value to code: 0, .5, 1, 1.5 -> 0..3; 2, 3 -> 4, 5; 4, 6 -> 6, 7.
  return at::where(value < 2, value * 2, at::where(value < 4, value + 2, value * 0.5 + 4)).to(at::kByte);
}

at::Tensor pack_nibbles(const at::Tensor& codes) {  // [rows, cols] uint8 0..15 -> [rows, cols/2]
  const at::Tensor pairs = codes.view({codes.size(0), -1, 2});
  return pairs.select(-1, 0).bitwise_or(pairs.select(-1, 1).mul(16));
}

// One fp32 scale a row maps the row's largest magnitude to the top of E4M3 x E2M1 (448 * 6): the format has no
// tensor scale, and E4M3 alone ends at 2^-9, far above typical moments (gradients of 1e-5 and their squares).
constexpr double kNvfp4RowTop = 448.0 * kE2m1Max;

at::Tensor load_nvfp4(const at::Tensor& codes, const at::Tensor& scale_codes, const at::Tensor& row_scale) {
  return nvfp4::dequantize(codes, scale_codes, at::kFloat).mul_(row_scale.unsqueeze(1));
}

void store_nvfp4(const at::Tensor& values, const at::Tensor& uniform, const at::Tensor& e4m3_values, bool is_sqrt_v,
                 at::Tensor codes, at::Tensor scale_codes, at::Tensor row_scale) {
  const int64_t rows = values.size(0);
  const at::Tensor magnitude = is_sqrt_v ? values.sqrt() : values.abs();
  const at::Tensor row_max = magnitude.amax(1, true);
  const at::Tensor scale_of_row =
      at::where(row_max > 0, row_max / kNvfp4RowTop, at::ones({}, row_max.options()));
  const at::Tensor normalized = magnitude / scale_of_row;
  const at::Tensor scale_code = unclipped_scale_codes(normalized, e4m3_values);
  const at::Tensor scale = at::take(e4m3_values, scale_code.to(at::kLong)).unsqueeze(-1);
  const at::Tensor blocks = normalized.view({rows, -1, nvfp4::kBlock});
  at::Tensor scaled = at::where(scale > 0, blocks / scale, at::zeros({}, blocks.options())).clamp_max_(kE2m1Max);
  // sqrt(v) is floored at the smallest non-zero level of its block: a zero there would divide a live m by eps.
  if (is_sqrt_v) scaled = at::where(scale > 0, scaled.clamp_min(kE2m1Smallest), scaled);
  at::Tensor code = e2m1_stochastic_codes(scaled, uniform.view_as(scaled), is_sqrt_v).view({rows, -1});
  if (!is_sqrt_v) code = code.bitwise_or((values < 0).logical_and(code != 0).to(at::kByte).mul(8));
  codes.copy_(pack_nibbles(code));
  scale_codes.copy_(scale_code);
  row_scale.copy_(scale_of_row.squeeze(1));
}

at::Tensor level_table(MomentStorage storage, const at::Device& device) {
  std::vector<float> table(256);
  for (int code = 0; code < 256; ++code)
    table[code] = storage == MomentStorage::int8
                      ? static_cast<float>(std::exp2(-code / kLogCodesPerOctave))
                      : nvfp4::e4m3_to_float(static_cast<uint8_t>(code));
  return at::tensor(table, at::kFloat).to(device);
}

}  // namespace

int64_t matrix_rows(at::IntArrayRef shape) { return shape.size() <= 1 ? 1 : shape[0]; }

int64_t matrix_cols(at::IntArrayRef shape) {
  int64_t cols = 1;
  for (size_t d = shape.size() <= 1 ? 0 : 1; d < shape.size(); ++d) cols *= shape[d];
  return cols;
}

int64_t moment_block(MomentStorage storage) {
  switch (storage) {
    case MomentStorage::int8: return kInt8Block;
    case MomentStorage::nvfp4: return nvfp4::kBlock;
    default: return 1;
  }
}

AdamW::ParamState allocate_moments(MomentStorage storage, at::IntArrayRef shape, const at::Device& device) {
  AdamW::ParamState s;
  s.rows = matrix_rows(shape);
  s.cols = matrix_cols(shape);
  const int64_t block = moment_block(storage);
  s.stored_cols = (s.cols + block - 1) / block * block;
  const auto on = [&](at::ScalarType dtype) { return at::TensorOptions().dtype(dtype).device(device); };
  switch (storage) {
    case MomentStorage::float32:
    case MomentStorage::bfloat16: {
      const at::ScalarType dtype = storage == MomentStorage::float32 ? at::kFloat : at::kBFloat16;
      s.exp_avg = at::zeros({s.rows, s.cols}, on(dtype));
      s.exp_avg_sq = at::zeros({s.rows, s.cols}, on(dtype));
      break;
    }
    case MomentStorage::int8:
      s.exp_avg = at::zeros({s.rows, s.stored_cols}, on(at::kChar));
      s.exp_avg_scale = at::zeros({s.rows, s.stored_cols / block}, on(at::kFloat));
      s.exp_avg_sq = at::zeros({s.rows, s.stored_cols}, on(at::kByte));
      s.exp_avg_sq_scale = at::zeros({s.rows, s.stored_cols / block}, on(at::kFloat));
      s.level_table = level_table(storage, device);
      break;
    case MomentStorage::nvfp4:
      // Code 0 with scale code 0 decodes to exactly 0 for both moments.
      s.exp_avg = at::zeros({s.rows, s.stored_cols / 2}, on(at::kByte));
      s.exp_avg_scale = at::zeros({s.rows, s.stored_cols / block}, on(at::kByte));
      s.exp_avg_sq = at::zeros({s.rows, s.stored_cols / 2}, on(at::kByte));
      s.exp_avg_sq_scale = at::zeros({s.rows, s.stored_cols / block}, on(at::kByte));
      s.exp_avg_row_scale = at::ones({s.rows}, on(at::kFloat));
      s.exp_avg_sq_row_scale = at::ones({s.rows}, on(at::kFloat));
      s.level_table = level_table(storage, device);
      break;
  }
  return s;
}

at::Tensor load_exp_avg(const AdamW::ParamState& s, MomentStorage storage, int64_t first_row, int64_t count) {
  const at::Tensor codes = rows_of(s.exp_avg, first_row, count);
  switch (storage) {
    case MomentStorage::float32: return codes;
    case MomentStorage::bfloat16: return codes.to(at::kFloat);
    case MomentStorage::int8: return load_int8_linear(codes, rows_of(s.exp_avg_scale, first_row, count));
    case MomentStorage::nvfp4:
      return load_nvfp4(codes, rows_of(s.exp_avg_scale, first_row, count),
                        rows_of(s.exp_avg_row_scale, first_row, count));
  }
  throw Error("optimizer: unknown moment storage");
}

at::Tensor load_exp_avg_sq(const AdamW::ParamState& s, MomentStorage storage, int64_t first_row, int64_t count) {
  const at::Tensor codes = rows_of(s.exp_avg_sq, first_row, count);
  switch (storage) {
    case MomentStorage::float32: return codes;
    case MomentStorage::bfloat16: return codes.to(at::kFloat);
    case MomentStorage::int8:
      return load_int8_log(codes, rows_of(s.exp_avg_sq_scale, first_row, count), s.level_table);
    case MomentStorage::nvfp4: {
      const at::Tensor root = load_nvfp4(codes, rows_of(s.exp_avg_sq_scale, first_row, count),
                                         rows_of(s.exp_avg_sq_row_scale, first_row, count));
      return root.mul_(root);
    }
  }
  throw Error("optimizer: unknown moment storage");
}

void store_exp_avg(AdamW::ParamState& s, MomentStorage storage, int64_t first_row, const at::Tensor& values,
                   uint64_t random_key) {
  const int64_t count = values.size(0);
  switch (storage) {
    case MomentStorage::float32: return;  // updated in place through the view load_exp_avg returned
    case MomentStorage::bfloat16:
      rows_of(s.exp_avg, first_row, count)
          .copy_(bfloat16_stochastic_from_bits(values, random_bits(random_key, first_row * s.cols, count, s.cols,
                                                                   values.device())));
      return;
    case MomentStorage::int8:
      store_int8_linear(values, uniform_for(random_key, first_row, count, s.stored_cols, values.device()),
                        rows_of(s.exp_avg, first_row, count), rows_of(s.exp_avg_scale, first_row, count));
      return;
    case MomentStorage::nvfp4:
      store_nvfp4(values, uniform_for(random_key, first_row, count, s.stored_cols, values.device()), s.level_table,
                  false, rows_of(s.exp_avg, first_row, count), rows_of(s.exp_avg_scale, first_row, count),
                  rows_of(s.exp_avg_row_scale, first_row, count));
      return;
  }
}

void store_exp_avg_sq(AdamW::ParamState& s, MomentStorage storage, int64_t first_row, const at::Tensor& values,
                      uint64_t random_key) {
  const int64_t count = values.size(0);
  switch (storage) {
    case MomentStorage::float32: return;
    case MomentStorage::bfloat16:
      rows_of(s.exp_avg_sq, first_row, count)
          .copy_(bfloat16_stochastic_from_bits(values, random_bits(random_key, first_row * s.cols, count, s.cols,
                                                                   values.device())));
      return;
    case MomentStorage::int8:
      store_int8_log(values, uniform_for(random_key, first_row, count, s.stored_cols, values.device()),
                     s.level_table, rows_of(s.exp_avg_sq, first_row, count),
                     rows_of(s.exp_avg_sq_scale, first_row, count));
      return;
    case MomentStorage::nvfp4:
      store_nvfp4(values, uniform_for(random_key, first_row, count, s.stored_cols, values.device()), s.level_table,
                  true, rows_of(s.exp_avg_sq, first_row, count), rows_of(s.exp_avg_sq_scale, first_row, count),
                  rows_of(s.exp_avg_sq_row_scale, first_row, count));
      return;
  }
}

}  // namespace qwen3::optim_detail
