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

// The random bits, and the uniform draw, of element `index` of the stream `key`.
QWEN3_ROW_BODY uint32_t bits_at(uint64_t key, int64_t index) { return ka::random_bits(key, static_cast<uint64_t>(index)); }
QWEN3_ROW_BODY float uniform_at(uint64_t key, int64_t index) { return ka::uniform_from_bits(bits_at(key, index)); }

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
    if (second) {  // v >= 0: its block maximum
      const float top = max_of_nonnegative(x, kB);
      auto* codes = static_cast<uint8_t*>(p.exp_avg_sq) + first;
      for (int i = 0; i < kB; ++i) codes[i] = ka::int8_log_encode(x[i], top, uniform_at(key, first + i));
      scales[b] = top;
    } else {  // m: a step of a 127th of the largest magnitude
      for (int i = 0; i < kB; ++i) magnitude[i] = std::fabs(x[i]);
      const float step = ka::div_rn(max_of_nonnegative(magnitude, kB), ka::kInt8LinearMax);
      auto* codes = static_cast<int8_t*>(p.exp_avg) + first;
      for (int i = 0; i < kB; ++i) codes[i] = ka::int8_linear_encode(x[i], step, uniform_at(key, first + i));
      scales[b] = step;
    }
  }
}

// The row's fp32 scale needs the row's largest |m| (or sqrt(v)) before any element is encoded. Whole-row loops
// (each simple enough to vectorize) rather than one pass per 16-block: a block is one AVX-512 vector, and the
// per-block loop overhead dominated.
struct Nvfp4RowScratch {
  std::vector<float> magnitude, scale, uniform;
  std::vector<uint8_t> code;
  void resize(int64_t n) {
    magnitude.resize(n), scale.resize(n), uniform.resize(n), code.resize(n);
  }
};

QWEN3_ROW_BODY void encode_nvfp4(const ka::ParamView& p, bool second, int64_t r, const float* in, uint64_t key,
                                 Nvfp4RowScratch& scratch) {
  constexpr int kB = ka::kNvfp4Block;
  const int64_t n = p.stored_cols, blocks = n / kB, first = r * n;
  float* mag = scratch.magnitude.data();
  float* scale = scratch.scale.data();
  float* uniform = scratch.uniform.data();
  uint8_t* code = scratch.code.data();
  if (second)
    for (int64_t c = 0; c < n; ++c) mag[c] = std::sqrt(in[c]);
  else
    for (int64_t c = 0; c < n; ++c) mag[c] = std::fabs(in[c]);
  const float row_scale = ka::nvfp4_row_scale(max_of_nonnegative(mag, n));
  for (int64_t c = 0; c < n; ++c) mag[c] = ka::div_rn(mag[c], row_scale);  // now normalized
  auto* scales = static_cast<uint8_t*>(second ? p.exp_avg_sq_scale : p.exp_avg_scale) + r * blocks;
  for (int64_t b = 0; b < blocks; ++b) {
    scales[b] = ka::nvfp4_unclipped_scale_code(max_of_nonnegative(mag + b * kB, kB));
    const float block_scale = kernels::codec::e4m3_to_float(scales[b]);
    for (int i = 0; i < kB; ++i) scale[b * kB + i] = block_scale;
  }
  for (int64_t c = 0; c < n; ++c) uniform[c] = uniform_at(key, first + c);
  if (second) {
    for (int64_t c = 0; c < n; ++c) code[c] = static_cast<uint8_t>(ka::nvfp4_stochastic_magnitude<true>(mag[c], scale[c], uniform[c]));
  } else {  // the sign where the magnitude is not zero (no -0 is written)
    for (int64_t c = 0; c < n; ++c) code[c] = static_cast<uint8_t>(ka::nvfp4_stochastic_magnitude<false>(mag[c], scale[c], uniform[c]));
    for (int64_t c = 0; c < n; ++c) code[c] |= (code[c] != 0) & (in[c] < 0.0f) ? 8u : 0u;
  }
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
  for (int64_t j = 0; j < n / 2; ++j) {
    out[2 * j] = ka::nvfp4_decode_value(codes[j] & 0xFu, scale[2 * j], row_scale);
    out[2 * j + 1] = ka::nvfp4_decode_value(codes[j] >> 4, scale[2 * j + 1], row_scale);
  }
  if (second)  // v is stored as sqrt(v)
    for (int64_t c = 0; c < n; ++c) out[c] = ka::mul_rn(out[c], out[c]);
}

// m and v of one row, fresh, then the master: one pass over the row buffers.
template <bool kBf16Master, bool kBf16Grad>
QWEN3_ROW_BODY void update_row(const ka::ParamView& p, const ka::StepScalars& s, int64_t r, float* m, float* v) {
  const int64_t first = r * p.cols;
  for (int64_t c = 0; c < p.cols; ++c) {
    const int64_t i = first + c;
    ka::update_moments(ka::grad_at<kBf16Grad>(p.grad, i, s.grad_scale), m[c], v[c], s);
    const float updated = ka::updated_master(ka::master_at<kBf16Master>(p.master, i), m[c], v[c], s);
    ka::store_master_at<kBf16Master>(p.master, i, updated, s.master_key);
  }
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
      for (int64_t c = 0; c < p.cols; ++c) state[c] = ka::bf16_stochastic(in[c], bits_at(key, first + c));
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
    encode_row(p, false, r, m.data(), s.exp_avg_key, scratch);
    encode_row(p, true, r, v.data(), s.exp_avg_sq_key, scratch);
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
