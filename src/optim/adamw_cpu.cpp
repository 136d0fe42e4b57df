// The CPU side of the fused AdamW step: rows of one parameter in parallel; each row's moments decoded into an
// fp32 row buffer (cache resident), updated with the master in one pass, and encoded back, by the element rules
// the CUDA kernel uses (kernels/adamw_update.cuh).
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "optim/adamw_step.h"

// The row loops are compiled for AVX-512 and AVX2+FMA besides the baseline and chosen at load time (the build
// targets generic x86-64, where fmaf is a library call). Every clone does the same IEEE operations, fmaf where
// written and nowhere else (the project compiles with -ffp-contract=off), so the bytes do not depend on the
// clone.
#if defined(__x86_64__) && defined(__linux__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define QWEN3_ADAMW_CLONES __attribute__((target_clones("arch=skylake-avx512", "arch=haswell", "default")))
#endif
#endif
#ifndef QWEN3_ADAMW_CLONES
#define QWEN3_ADAMW_CLONES
#endif

namespace qwen3::optim_detail {
namespace {

namespace ka = kernels::adamw;
using ka::Moments;

// Elements a parallel task should cover at least (ATen's own grain for elementwise loops).
constexpr int64_t kGrainElements = 32768;

uint32_t bits_at(uint64_t key, int64_t index) { return ka::random_bits(key, static_cast<uint64_t>(index)); }

QWEN3_ADAMW_CLONES void decode_int8(const ka::ParamView& p, bool second, int64_t r, float* out) {
  const int64_t blocks = p.stored_cols / ka::kInt8Block, first = r * p.stored_cols;
  const float* scales = static_cast<const float*>(second ? p.exp_avg_sq_scale : p.exp_avg_scale) + r * blocks;
  for (int64_t c = 0; c < p.stored_cols; ++c) {
    const float scale = scales[c / ka::kInt8Block];
    out[c] = second ? ka::int8_log_decode(static_cast<const uint8_t*>(p.exp_avg_sq)[first + c], scale)
                    : ka::int8_linear_decode(static_cast<const int8_t*>(p.exp_avg)[first + c], scale);
  }
}

QWEN3_ADAMW_CLONES void encode_int8(const ka::ParamView& p, bool second, int64_t r, const float* in, uint64_t key) {
  constexpr int kB = ka::kInt8Block;
  const int64_t blocks = p.stored_cols / kB;
  float* scales = static_cast<float*>(second ? p.exp_avg_sq_scale : p.exp_avg_scale) + r * blocks;
  for (int64_t b = 0; b < blocks; ++b) {
    const float* x = in + b * kB;
    const int64_t first = r * p.stored_cols + b * kB;
    float top = 0.0f;  // v: the block maximum; m: the largest magnitude, and the step is a 127th of it
    for (int i = 0; i < kB; ++i) top = std::max(top, second ? x[i] : std::fabs(x[i]));
    if (second) {
      auto* codes = static_cast<uint8_t*>(p.exp_avg_sq) + first;
      for (int i = 0; i < kB; ++i) codes[i] = ka::int8_log_encode(x[i], top, ka::uniform_from_bits(bits_at(key, first + i)));
      scales[b] = top;
    } else {
      const float step = ka::div_rn(top, ka::kInt8LinearMax);
      auto* codes = static_cast<int8_t*>(p.exp_avg) + first;
      for (int i = 0; i < kB; ++i) codes[i] = ka::int8_linear_encode(x[i], step, ka::uniform_from_bits(bits_at(key, first + i)));
      scales[b] = step;
    }
  }
}

QWEN3_ADAMW_CLONES void decode_nvfp4(const ka::ParamView& p, bool second, int64_t r, float* out) {
  const auto* codes = static_cast<const uint8_t*>(second ? p.exp_avg_sq : p.exp_avg) + r * p.stored_cols / 2;
  const auto* scales =
      static_cast<const uint8_t*>(second ? p.exp_avg_sq_scale : p.exp_avg_scale) + r * (p.stored_cols / ka::kNvfp4Block);
  const float row_scale = (second ? p.exp_avg_sq_row_scale : p.exp_avg_row_scale)[r];
  for (int64_t c = 0; c < p.stored_cols; ++c) {
    const float x = ka::nvfp4_decode(codes, scales, c, row_scale);
    out[c] = second ? ka::mul_rn(x, x) : x;  // v is stored as sqrt(v)
  }
}

// The row's fp32 scale needs the row's largest |m| (or sqrt(v)) before any element is encoded.
QWEN3_ADAMW_CLONES void encode_nvfp4(const ka::ParamView& p, bool second, int64_t r, const float* in, uint64_t key,
                  std::vector<float>& magnitude) {
  constexpr int kB = ka::kNvfp4Block;
  const int64_t blocks = p.stored_cols / kB;
  float row_max = 0.0f;
  for (int64_t c = 0; c < p.stored_cols; ++c) {
    magnitude[c] = second ? std::sqrt(in[c]) : std::fabs(in[c]);
    row_max = std::max(row_max, magnitude[c]);
  }
  const float row_scale = ka::nvfp4_row_scale(row_max);
  auto* codes = static_cast<uint8_t*>(second ? p.exp_avg_sq : p.exp_avg) + r * p.stored_cols / 2;
  auto* scales = static_cast<uint8_t*>(second ? p.exp_avg_sq_scale : p.exp_avg_scale) + r * blocks;
  for (int64_t b = 0; b < blocks; ++b) {
    float normalized[kB], amax = 0.0f;
    for (int i = 0; i < kB; ++i) {
      normalized[i] = ka::div_rn(magnitude[b * kB + i], row_scale);
      amax = std::max(amax, normalized[i]);
    }
    const uint8_t scale_code = ka::nvfp4_unclipped_scale_code(amax);
    const float scale = kernels::codec::e4m3_to_float(scale_code);
    for (int i = 0; i < kB; i += 2) {
      uint32_t pair = 0;
      for (int j = 0; j < 2; ++j) {
        const int64_t c = b * kB + i + j;
        uint32_t code = ka::nvfp4_stochastic_magnitude(
            normalized[i + j], scale, ka::uniform_from_bits(bits_at(key, r * p.stored_cols + c)), second);
        if (!second && code != 0 && in[c] < 0.0f) code |= 8u;
        pair |= code << (4 * j);
      }
      codes[(b * kB + i) / 2] = static_cast<uint8_t>(pair);
    }
    scales[b] = scale_code;
  }
  (second ? p.exp_avg_sq_row_scale : p.exp_avg_row_scale)[r] = row_scale;
}

// m and v of one row, fresh, then the master: one pass over the row buffers.
template <bool kBf16Master, bool kBf16Grad>
inline void update_row(const ka::ParamView& p, const ka::StepScalars& s, int64_t r, float* m, float* v) {
  const int64_t first = r * p.cols;
  for (int64_t c = 0; c < p.cols; ++c) {
    const int64_t i = first + c;
    ka::update_moments(ka::grad_at<kBf16Grad>(p.grad, i, s.grad_scale), m[c], v[c], s);
    const float updated = ka::updated_master(ka::master_at<kBf16Master>(p.master, i), m[c], v[c], s);
    ka::store_master_at<kBf16Master>(p.master, i, updated, s.master_key);
  }
  for (int64_t c = p.cols; c < p.stored_cols; ++c) ka::update_moments(0.0f, m[c], v[c], s);  // row padding
}

// Clones are not allowed on templates: one cloned function per (master, gradient) dtype pair.
QWEN3_ADAMW_CLONES void update_row_f32_f32(const ka::ParamView& p, const ka::StepScalars& s, int64_t r, float* m, float* v) {
  update_row<false, false>(p, s, r, m, v);
}
QWEN3_ADAMW_CLONES void update_row_bf16_bf16(const ka::ParamView& p, const ka::StepScalars& s, int64_t r, float* m, float* v) {
  update_row<true, true>(p, s, r, m, v);
}
QWEN3_ADAMW_CLONES void update_row_f32_bf16(const ka::ParamView& p, const ka::StepScalars& s, int64_t r, float* m, float* v) {
  update_row<false, true>(p, s, r, m, v);
}
QWEN3_ADAMW_CLONES void update_row_bf16_f32(const ka::ParamView& p, const ka::StepScalars& s, int64_t r, float* m, float* v) {
  update_row<true, false>(p, s, r, m, v);
}

}  // namespace

void decode_moment_row(const ka::ParamView& p, bool second, int64_t r, float* out) {
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
    case Moments::nvfp4: return decode_nvfp4(p, second, r, out);
  }
}

void encode_moment_row(const ka::ParamView& p, bool second, int64_t r, const float* in, uint64_t key,
                       std::vector<float>& scratch) {
  const int64_t first = r * p.cols;
  switch (p.moments) {
    case Moments::f32:
      std::copy(in, in + p.cols, static_cast<float*>(second ? p.exp_avg_sq : p.exp_avg) + first);
      return;
    case Moments::bf16: {
      uint16_t* state = static_cast<uint16_t*>(second ? p.exp_avg_sq : p.exp_avg) + first;
      for (int64_t c = 0; c < p.cols; ++c) state[c] = ka::bf16_stochastic(in[c], bits_at(key, first + c));
      return;
    }
    case Moments::int8: return encode_int8(p, second, r, in, key);
    case Moments::nvfp4:
      scratch.resize(static_cast<size_t>(p.stored_cols));
      return encode_nvfp4(p, second, r, in, key, scratch);
  }
}

void adamw_step_cpu(const ka::ParamView& p, const ka::StepScalars& s, int64_t rows_per_task) {
  const auto update = p.master_bf16 ? (p.grad_bf16 ? update_row_bf16_bf16 : update_row_bf16_f32)
                                    : (p.grad_bf16 ? update_row_f32_bf16 : update_row_f32_f32);
  const int64_t grain =
      rows_per_task > 0 ? rows_per_task : std::max<int64_t>(1, kGrainElements / std::max<int64_t>(1, p.stored_cols));
  at::parallel_for(0, p.rows, grain, [&](int64_t first, int64_t last) {
    std::vector<float> m(static_cast<size_t>(p.stored_cols)), v(m.size()), scratch;
    for (int64_t r = first; r < last; ++r) {
      decode_moment_row(p, false, r, m.data());
      decode_moment_row(p, true, r, v.data());
      update(p, s, r, m.data(), v.data());
      encode_moment_row(p, false, r, m.data(), s.exp_avg_key, scratch);
      encode_moment_row(p, true, r, v.data(), s.exp_avg_sq_key, scratch);
    }
  });
}

}  // namespace qwen3::optim_detail
