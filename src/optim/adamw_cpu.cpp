// The CPU side of the fused AdamW step: rows of one parameter in parallel; each row's moments decoded into an
// fp32 row buffer (cache resident), updated with the master in one pass, and encoded back, by the element rules
// the CUDA kernel uses (kernels/adamw_update.cuh).
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "optim/adamw_step.h"

// The row loops are compiled for AVX-512 and for AVX2 with FMA besides the baseline, and one is chosen at load
// time by the CPU's features: the build targets generic x86-64, where fmaf is a library call and nothing is
// vectorized wider than SSE2. The bodies are always inlined into the three entry points so that each is
// compiled for its target. Every variant does the same IEEE operations, fmaf where written and nowhere else
// (the project compiles with -ffp-contract=off), so the bytes do not depend on the variant.
#define QWEN3_ROW_BODY inline __attribute__((always_inline))
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define QWEN3_X86_VARIANTS 1
#define QWEN3_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,bmi2,f16c")))
#define QWEN3_TARGET_AVX2 __attribute__((target("avx2,fma,bmi2,f16c")))
#endif

namespace qwen3::optim_detail {
namespace {

namespace ka = kernels::adamw;
using ka::Moments;

// Elements a parallel task should cover at least (ATen's own grain for elementwise loops).
constexpr int64_t kGrainElements = 32768;

// Calls body(c0, count, low, high) for the pieces of the elements [first, first + n) whose indices share their
// high 32 bits (all of them but where the range crosses a multiple of 2^32): a loop over a piece makes the draws
// with 32-bit lanes, element_draws_split(key, low + k, high), the draws of element_draws(key, first + c0 + k).
// A 64-bit index vector and its narrowing cost as much as the rounding they feed.
template <class Body>
QWEN3_ROW_BODY void for_each_32bit_piece(int64_t first, int64_t n, Body&& body) {
  for (int64_t c0 = 0; c0 < n;) {
    const auto index = static_cast<uint64_t>(first + c0);
    const auto count = ka::indices_sharing_high_bits(index, static_cast<uint64_t>(n - c0));
    body(c0, static_cast<uint32_t>(count), static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32));
    c0 += static_cast<int64_t>(count);
  }
}

// The largest of non-negative floats, as the largest of their bit patterns (the same order): an integer
// reduction vectorizes where a float max, with its NaN rules, does not.
QWEN3_ROW_BODY float max_of_nonnegative(const float* x, int64_t n) {
  uint32_t top = 0;
  for (int64_t i = 0; i < n; ++i) top = std::max(top, ka::float_bits(x[i]));
  return ka::bits_to_float(top);
}

QWEN3_ROW_BODY void decode_int8(const ka::ParamView& p, bool second, int64_t r, float* out) {
  constexpr int kB = ka::kInt8Block;
  const int64_t blocks = p.stored_cols / kB, first = r * p.stored_cols;
  const float* scales = static_cast<const float*>(second ? p.exp_avg_sq_scale : p.exp_avg_scale) + r * blocks;
  for (int64_t b = 0; b < blocks; ++b) {
    const float scale = scales[b];
    float* x = out + b * kB;
    if (second) {
      const uint8_t* codes = static_cast<const uint8_t*>(p.exp_avg_sq) + first + b * kB;
      for (int i = 0; i < kB; ++i) x[i] = ka::int8_log_decode(codes[i], scale);
    } else {
      const int8_t* codes = static_cast<const int8_t*>(p.exp_avg) + first + b * kB;
      for (int i = 0; i < kB; ++i) x[i] = ka::int8_linear_decode(codes[i], scale);
    }
  }
}

QWEN3_ROW_BODY void encode_int8(const ka::ParamView& p, bool second, int64_t r, const float* in, uint64_t key) {
  constexpr int kB = ka::kInt8Block;
  const int64_t blocks = p.stored_cols / kB;
  float* scales = static_cast<float*>(second ? p.exp_avg_sq_scale : p.exp_avg_scale) + r * blocks;
  float magnitude[kB];
  for (int64_t b = 0; b < blocks; ++b) {
    const float* x = in + b * kB;
    const int64_t first = r * p.stored_cols + b * kB;
    // A block lies within one 32-bit piece of the draws' indices: rows start at multiples of the block size, and
    // 2^32 is one too.
    const auto low = static_cast<uint32_t>(first), high = static_cast<uint32_t>(static_cast<uint64_t>(first) >> 32);
    if (second) {  // v >= 0: its block maximum
      const float top = max_of_nonnegative(x, kB);
      const ka::BlockDivisor divisor = ka::block_divisor(top);
      auto* codes = static_cast<uint8_t*>(p.exp_avg_sq) + first;
      for (uint32_t i = 0; i < kB; ++i)
        codes[i] = ka::int8_log_encode(x[i], divisor, ka::uniform_from_draw(ka::element_draws_split(key, low + i, high).v));
      scales[b] = top;
    } else {  // m: a step of a 127th of the largest magnitude
      for (int i = 0; i < kB; ++i) magnitude[i] = std::fabs(x[i]);
      const float step = ka::int8_linear_step(max_of_nonnegative(magnitude, kB));
      const ka::BlockDivisor divisor = ka::block_divisor(step);
      auto* codes = static_cast<int8_t*>(p.exp_avg) + first;
      for (uint32_t i = 0; i < kB; ++i)
        codes[i] = ka::int8_linear_encode(x[i], divisor, ka::uniform_from_draw(ka::m_draw_split(key, low + i, high)));
      scales[b] = step;
    }
  }
}

// The row's fp32 scale needs the row's largest |m| (or sqrt(v)) before any element is encoded. Four passes over
// the row: block maxima of the raw bits, the scale of each element's block, the fused stochastic rounding, the
// packing. The maxima need neither the magnitudes nor their normalized values: sqrt and the normalization (two
// correctly rounded products by positive constants, divide()) are monotone, hence the largest sqrt(v) is
// sqrt(largest v) and the largest normalized magnitude is the normalized largest one, the very values the
// element-wise order gives.
struct Nvfp4RowScratch {
  std::vector<float> block_max, scale, reciprocal;
  std::vector<uint8_t> code;
  void resize(int64_t n) {
    block_max.resize(n / ka::kNvfp4Block), scale.resize(n), reciprocal.resize(n), code.resize(n);
  }
};

QWEN3_ROW_BODY void encode_nvfp4(const ka::ParamView& p, bool second, int64_t r, const float* in, uint64_t key,
                                 Nvfp4RowScratch& scratch) {
  constexpr int kB = ka::kNvfp4Block;
  const int64_t n = p.stored_cols, blocks = n / kB, first = r * n;
  float* block_max = scratch.block_max.data();
  float* reciprocal = scratch.reciprocal.data();
  uint8_t* code = scratch.code.data();
  // v >= 0 (a NaN, whatever its sign, is the largest pattern either way); m by its magnitude's bits.
  const uint32_t magnitude_mask = second ? 0xFFFFFFFFu : 0x7FFFFFFFu;
  uint32_t row_top = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    uint32_t top = 0;
    for (int i = 0; i < kB; ++i) top = std::max(top, ka::float_bits(in[b * kB + i]) & magnitude_mask);
    block_max[b] = second ? std::sqrt(ka::bits_to_float(top)) : ka::bits_to_float(top);
    row_top = std::max(row_top, ka::float_bits(block_max[b]));
  }
  const float row_scale = ka::nvfp4_row_scale(ka::bits_to_float(row_top));
  const ka::BlockDivisor row = ka::block_divisor(row_scale);
  auto* scales = static_cast<uint8_t*>(second ? p.exp_avg_sq_scale : p.exp_avg_scale) + r * blocks;
  for (int64_t b = 0; b < blocks; ++b) {
    scales[b] = ka::nvfp4_unclipped_scale_code(ka::divide(block_max[b], row));
    // An E4M3 scale (2^-9 to 448, or 0 with reciprocal 0) never takes block_divisor's power-of-two shift.
    const float block_reciprocal = ka::block_divisor(kernels::codec::e4m3_to_float(scales[b])).reciprocal;
    for (int i = 0; i < kB; ++i) reciprocal[b * kB + i] = block_reciprocal;
  }
  // The rounding, fused: magnitude, normalization, draws, rounding and sign.
  for_each_32bit_piece(first, n, [&](int64_t c0, uint32_t count, uint32_t low, uint32_t high) {
    const float* x = in + c0;
    const float* piece_reciprocal = reciprocal + c0;
    uint8_t* piece_code = code + c0;
    if (second) {
      for (uint32_t k = 0; k < count; ++k) {
        const float uniform = ka::uniform_from_draw(ka::element_draws_split(key, low + k, high).v);
        piece_code[k] = static_cast<uint8_t>(ka::nvfp4_stochastic_magnitude<true>(
            ka::divide(std::sqrt(x[k]), row), ka::BlockDivisor{1.0f, piece_reciprocal[k]}, uniform));
      }
    } else {  // the sign where the magnitude is not zero (no -0 is written)
      for (uint32_t k = 0; k < count; ++k) {
        const float uniform = ka::uniform_from_draw(ka::m_draw_split(key, low + k, high));
        const uint32_t magnitude = ka::nvfp4_stochastic_magnitude<false>(
            ka::divide(std::fabs(x[k]), row), ka::BlockDivisor{1.0f, piece_reciprocal[k]}, uniform);
        const uint32_t sign = x[k] < 0.0f ? 8u : 0u;
        piece_code[k] = static_cast<uint8_t>(magnitude | (magnitude != 0 ? sign : 0u));
      }
    }
  });
  auto* codes = static_cast<uint8_t*>(second ? p.exp_avg_sq : p.exp_avg) + first / 2;
  for (int64_t j = 0; j < n / 2; ++j) codes[j] = static_cast<uint8_t>(code[2 * j] | (code[2 * j + 1] << 4));
  (second ? p.exp_avg_sq_row_scale : p.exp_avg_row_scale)[r] = row_scale;
}

QWEN3_ROW_BODY void decode_nvfp4(const ka::ParamView& p, bool second, int64_t r, float* out, Nvfp4RowScratch& scratch) {
  constexpr int kB = ka::kNvfp4Block;
  const int64_t n = p.stored_cols, blocks = n / kB;
  const auto* codes = static_cast<const uint8_t*>(second ? p.exp_avg_sq : p.exp_avg) + r * n / 2;
  const auto* scales = static_cast<const uint8_t*>(second ? p.exp_avg_sq_scale : p.exp_avg_scale) + r * blocks;
  const float row_scale = (second ? p.exp_avg_sq_row_scale : p.exp_avg_row_scale)[r];
  float* scale = scratch.scale.data();
  for (int64_t b = 0; b < blocks; ++b) {
    const float block_scale = kernels::codec::e4m3_to_float(scales[b]);
    for (int i = 0; i < kB; ++i) scale[b * kB + i] = block_scale;
  }
  if (second) {  // v is stored as sqrt(v)
    for (int64_t j = 0; j < n / 2; ++j) {
      const float low = ka::nvfp4_decode_value(codes[j] & 0xFu, scale[2 * j], row_scale);
      const float high = ka::nvfp4_decode_value(codes[j] >> 4, scale[2 * j + 1], row_scale);
      out[2 * j] = ka::mul_rn(low, low);
      out[2 * j + 1] = ka::mul_rn(high, high);
    }
  } else {
    for (int64_t j = 0; j < n / 2; ++j) {
      out[2 * j] = ka::nvfp4_decode_value(codes[j] & 0xFu, scale[2 * j], row_scale);
      out[2 * j + 1] = ka::nvfp4_decode_value(codes[j] >> 4, scale[2 * j + 1], row_scale);
    }
  }
}

// m and v of one row, fresh, then the master: one pass over the row buffers (a bf16 master's draws with 32-bit
// lanes, from the element's index in the padded state).
template <bool kBf16Master, bool kBf16Grad>
QWEN3_ROW_BODY void update_row(const ka::ParamView& p, const ka::StepScalars& s, int64_t r, float* m, float* v) {
  for_each_32bit_piece(r * p.stored_cols, p.cols, [&](int64_t c0, uint32_t count, uint32_t low, uint32_t high) {
    float* pm = m + c0;
    float* pv = v + c0;
    const int64_t index = r * p.cols + c0;
    for (uint32_t k = 0; k < count; ++k) {
      ka::update_moments(ka::grad_at<kBf16Grad>(p.grad, index + k, s.grad_scale), pm[k], pv[k], s);
      const float updated = ka::updated_master(ka::master_at<kBf16Master>(p.master, index + k), pm[k], pv[k], s);
      if (kBf16Master)  // store_master_at's rounding, its draws in 32-bit lanes
        static_cast<uint16_t*>(p.master)[index + k] =
            ka::bf16_stochastic(updated, ka::element_draws_split(s.random_key, low + k, high).master);
      else
        static_cast<float*>(p.master)[index + k] = updated;
    }
  });
  for (int64_t c = p.cols; c < p.stored_cols; ++c) ka::update_moments(0.0f, m[c], v[c], s);  // row padding
}

QWEN3_ROW_BODY void decode_row(const ka::ParamView& p, bool second, int64_t r, float* out, Nvfp4RowScratch& scratch) {
  const int64_t first = r * p.cols;
  switch (p.moments) {
    case Moments::f32: {
      const float* state = static_cast<const float*>(second ? p.exp_avg_sq : p.exp_avg) + first;
      std::copy(state, state + p.cols, out);
      return;
    }
    case Moments::bf16: {
      const uint16_t* state = static_cast<const uint16_t*>(second ? p.exp_avg_sq : p.exp_avg) + first;
      for (int64_t c = 0; c < p.cols; ++c) out[c] = ka::bf16_to_float(state[c]);
      return;
    }
    case Moments::int8: return decode_int8(p, second, r, out);
    case Moments::nvfp4:
      scratch.resize(p.stored_cols);
      return decode_nvfp4(p, second, r, out, scratch);
  }
}

QWEN3_ROW_BODY void encode_row(const ka::ParamView& p, bool second, int64_t r, const float* in, uint64_t key,
                               Nvfp4RowScratch& scratch) {
  const int64_t first = r * p.cols;
  switch (p.moments) {
    case Moments::f32:
      std::copy(in, in + p.cols, static_cast<float*>(second ? p.exp_avg_sq : p.exp_avg) + first);
      return;
    case Moments::bf16: {
      uint16_t* state = static_cast<uint16_t*>(second ? p.exp_avg_sq : p.exp_avg) + first;
      for_each_32bit_piece(first, p.cols, [&](int64_t c0, uint32_t count, uint32_t low, uint32_t high) {
        if (second) {
          for (uint32_t k = 0; k < count; ++k)
            state[c0 + k] = ka::bf16_stochastic(
                in[c0 + k], ka::sixteen_bits_of_draw(ka::element_draws_split(key, low + k, high).v));
        } else {
          for (uint32_t k = 0; k < count; ++k)
            state[c0 + k] = ka::bf16_stochastic(in[c0 + k], ka::sixteen_bits_of_draw(ka::m_draw_split(key, low + k, high)));
        }
      });
      return;
    }
    case Moments::int8: return encode_int8(p, second, r, in, key);
    case Moments::nvfp4:
      scratch.resize(p.stored_cols);
      return encode_nvfp4(p, second, r, in, key, scratch);
  }
}

// Rows [first, last): decode m and v into row buffers, update them and the master, encode them back.
QWEN3_ROW_BODY void step_rows(const ka::ParamView& p, const ka::StepScalars& s, int64_t first, int64_t last) {
  std::vector<float> m(static_cast<size_t>(p.stored_cols)), v(m.size());
  Nvfp4RowScratch scratch;
  for (int64_t r = first; r < last; ++r) {
    decode_row(p, false, r, m.data(), scratch);
    decode_row(p, true, r, v.data(), scratch);
    if (p.master_bf16)
      p.grad_bf16 ? update_row<true, true>(p, s, r, m.data(), v.data()) : update_row<true, false>(p, s, r, m.data(), v.data());
    else
      p.grad_bf16 ? update_row<false, true>(p, s, r, m.data(), v.data()) : update_row<false, false>(p, s, r, m.data(), v.data());
    encode_row(p, false, r, m.data(), s.random_key, scratch);
    encode_row(p, true, r, v.data(), s.random_key, scratch);
  }
}

using StepRows = void (*)(const ka::ParamView&, const ka::StepScalars&, int64_t, int64_t);

void step_rows_baseline(const ka::ParamView& p, const ka::StepScalars& s, int64_t first, int64_t last) {
  step_rows(p, s, first, last);
}
#ifdef QWEN3_X86_VARIANTS
QWEN3_TARGET_AVX2 void step_rows_avx2(const ka::ParamView& p, const ka::StepScalars& s, int64_t first, int64_t last) {
  step_rows(p, s, first, last);
}
QWEN3_TARGET_AVX512 void step_rows_avx512(const ka::ParamView& p, const ka::StepScalars& s, int64_t first, int64_t last) {
  step_rows(p, s, first, last);
}
#endif

StepRows pick_step_rows() {
#ifdef QWEN3_X86_VARIANTS
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("f16c");
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return step_rows_avx512;
  if (avx2) return step_rows_avx2;
#endif
  return step_rows_baseline;
}

}  // namespace

void decode_moment_row(const ka::ParamView& p, bool second, int64_t r, float* out) {
  Nvfp4RowScratch scratch;
  decode_row(p, second, r, out, scratch);
}

void encode_moment_row(const ka::ParamView& p, bool second, int64_t r, const float* in, uint64_t key) {
  Nvfp4RowScratch scratch;
  encode_row(p, second, r, in, key, scratch);
}

void adamw_step_cpu(const ka::ParamView& p, const ka::StepScalars& s, int64_t rows_per_task) {
  static const StepRows step = pick_step_rows();
  const int64_t grain =
      rows_per_task > 0 ? rows_per_task : std::max<int64_t>(1, kGrainElements / std::max<int64_t>(1, p.stored_cols));
  at::parallel_for(0, p.rows, grain, [&](int64_t first, int64_t last) { step(p, s, first, last); });
}

}  // namespace qwen3::optim_detail
