// A second implementation of the optimizer's rules, written plainly from docs/optim.md ("The rules, exactly")
// for tests/test_optim_golden.cpp: one element at a time, no vectorizing forms, no tables, nothing from
// kernels/adamw_update.cuh (only the NVFP4 format's own E4M3/E2M1 conversions from the codec). The golden hashes
// of the fused step are the bytes this gives; a change to a rule must change both, or the test says which
// tensor differs.
//
// Floating point here is IEEE single precision with every operation rounded on its own (the project compiles
// with -ffp-contract=off), fmaf only where the rules say a fused multiply-add.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "nvfp4_codec.cuh"

namespace qwen3::adamw_reference {

inline uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// ---- the draws ----

inline uint64_t splitmix_finalizer(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// The key of (seed, step, parameter index).
inline uint64_t step_key(uint64_t seed, int64_t step, int64_t param) {
  uint64_t key = splitmix_finalizer(seed ^ 0x6A09E667F3BCC909ULL);
  key = splitmix_finalizer(key ^ static_cast<uint64_t>(step));
  return splitmix_finalizer(key ^ static_cast<uint64_t>(param));
}

inline uint32_t lowbias32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x7FEB352Du;
  h ^= h >> 15;
  h *= 0x2C1B3C6Du;
  h ^= h >> 16;
  return h;
}

struct Draws {
  uint32_t m24, v24, master16;
};

// Element `index` (row * stored columns + column) of a step: two rounds, cut into three disjoint pieces.
inline Draws draws(uint64_t key, uint64_t index) {
  const uint32_t low = static_cast<uint32_t>(index), high = static_cast<uint32_t>(index >> 32);
  const uint32_t a = lowbias32(low ^ static_cast<uint32_t>(key) ^ (high * 0x9E3779B1u));
  const uint32_t b = lowbias32(a ^ static_cast<uint32_t>(key >> 32));
  return {a >> 8, b >> 8, ((a & 0xFFu) << 8) | (b & 0xFFu)};
}

inline float uniform(uint32_t draw24) { return static_cast<float>(draw24) / 16777216.0f; }

// ---- bf16 ----

inline float bf16_value(uint16_t b) { return float_of(static_cast<uint32_t>(b) << 16); }
inline uint16_t bf16_nearest_even(float x) {
  if (std::isnan(x)) return 0x7FC0;
  const uint32_t u = bits_of(x);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
inline uint16_t bf16_stochastic(float x, uint32_t bits16) { return static_cast<uint16_t>((bits_of(x) + bits16) >> 16); }

// ---- x / d by one reciprocal a block ----

inline float block_quotient(float x, float d) {
  const float shift = d < 0x1p-64f ? 0x1p64f : (d > 0x1p64f ? 0x1p-64f : 1.0f);
  const float reciprocal = d > 0.0f ? 1.0f / (d * shift) : 0.0f;
  return (x * shift) * reciprocal;
}

// ---- the step's scalars and one element's update ----

struct Hyper {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, bias_correction2_sqrt, eps, neg_step_size, decay_factor;
};

inline Hyper hyper(double lr, double beta1, double beta2, double eps, double weight_decay, bool decay, int64_t t) {
  Hyper h{};
  h.beta1 = static_cast<float>(beta1);
  h.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  h.beta2 = static_cast<float>(beta2);
  h.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  h.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(beta2, static_cast<double>(t))));
  h.eps = static_cast<float>(eps);
  h.neg_step_size = static_cast<float>(-(lr / (1.0 - std::pow(beta1, static_cast<double>(t)))));
  h.decay_factor = decay && weight_decay != 0.0 ? static_cast<float>(1.0 - lr * weight_decay) : 1.0f;
  return h;
}

// ---- int8 ----

inline float int8_level(int code) { return static_cast<float>(std::exp2(-static_cast<double>(code) / 8.0)); }

inline int8_t int8_m_code(float x, float step, float u) {
  const float t = block_quotient(x, step);
  float code = std::floor(t);
  if (u < t - code) code += 1.0f;
  code = std::min(127.0f, std::max(-127.0f, code));
  return static_cast<int8_t>(code);
}

// The largest code 0..254 whose level is >= ratio (0 above the first level, 254 below the last, and for 0).
inline int int8_v_upper(float ratio) {
  int upper = 0;
  for (int c = 0; c <= 254; ++c)
    if (int8_level(c) >= ratio) upper = c;
  return ratio > 0.0f ? upper : 254;
}

// The probability of the upper level, linear in v between the two levels.
inline float int8_v_probability(float ratio, int upper) {
  const float gap = int8_level(upper) - int8_level(upper + 1);
  const float p = (ratio - int8_level(upper + 1)) * (1.0f / gap);
  return std::min(1.0f, std::max(0.0f, p));
}

inline uint8_t int8_v_code(float v, float vmax, float u) {
  const float ratio = block_quotient(v, vmax);
  const int upper = int8_v_upper(ratio);
  return static_cast<uint8_t>(upper + (u >= int8_v_probability(ratio, upper) ? 1 : 0));
}

// ---- nvfp4 ----

inline float e2m1_value(uint32_t code) {
  const float magnitude = kernels::codec::e2m1_magnitude(code & 7u);
  return (code & 8u) ? -magnitude : magnitude;
}

// The E4M3 code of a block's largest normalized magnitude: the canonical rounding, one code up where the block
// maximum would be clipped by six times it.
inline uint8_t block_scale_code(float amax) {
  uint32_t code = kernels::codec::rne_scale_code(amax);
  if (amax > kernels::codec::e4m3_to_float(static_cast<uint8_t>(code)) * 6.0f) code += 1;
  return static_cast<uint8_t>(std::min<uint32_t>(code, kernels::codec::kE4m3MaxCode));
}

// The E2M1 magnitude code of `a` under block scale `scale`, rounded to a neighbour at random: linear in the
// value, or in its square for sqrt(v) (floored at the smallest non-zero level).
inline uint32_t e2m1_stochastic(float a, float scale, float u, bool sqrt_v) {
  float scaled = block_quotient(a, scale);
  if (scaled > 6.0f) scaled = 6.0f;
  if (sqrt_v && scale > 0.0f && scaled < 0.5f) scaled = 0.5f;
  if (std::isnan(scaled)) return 7;
  const float spacing = scaled < 2.0f ? 0.5f : (scaled < 4.0f ? 1.0f : 2.0f);
  const float lower = std::floor(scaled / spacing) * spacing;
  const float upper = lower + spacing;
  const float p = sqrt_v ? (scaled * scaled - lower * lower) * (1.0f / (upper * upper - lower * lower))
                         : (scaled - lower) / spacing;
  const float chosen = u < p ? upper : lower;
  // Grid value to code: 0, 0.5, 1, 1.5 -> 0..3; 2, 3, 4 -> 4..6; 6 -> 7.
  return chosen < 2.0f ? static_cast<uint32_t>(chosen * 2.0f)
                       : (chosen < 5.0f ? static_cast<uint32_t>(chosen) + 2u : 7u);
}

// ---- one parameter ----

enum class Storage { f32, bf16, int8, nvfp4 };

// The state of one [rows, cols] parameter, laid out as the optimizer's state tensors.
struct State {
  Storage storage;
  int64_t rows = 0, cols = 0, stored = 0;
  std::vector<float> m_f32, v_f32;                // f32
  std::vector<uint16_t> m_bf16, v_bf16;           // bf16
  std::vector<int8_t> m_int8;                     // int8 [rows, stored]
  std::vector<uint8_t> v_int8;                    // int8 [rows, stored]
  std::vector<float> m_step, v_max;               // int8 [rows, stored / 64]
  std::vector<uint8_t> m_fp4, v_fp4;              // nvfp4 [rows, stored / 2]
  std::vector<uint8_t> m_scale, v_scale;          // nvfp4 [rows, stored / 16]
  std::vector<float> m_row, v_row;                // nvfp4 [rows]
};

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// The state's tensors as bytes, named and ordered as the optimizer's state_tensors() names a parameter's.
inline std::vector<std::pair<std::string, std::vector<uint8_t>>> named_bytes(const State& s) {
  switch (s.storage) {
    case Storage::f32: return {{".exp_avg", bytes_of(s.m_f32)}, {".exp_avg_sq", bytes_of(s.v_f32)}};
    case Storage::bf16: return {{".exp_avg", bytes_of(s.m_bf16)}, {".exp_avg_sq", bytes_of(s.v_bf16)}};
    case Storage::int8:
      return {{".exp_avg", bytes_of(s.m_int8)}, {".exp_avg.scale", bytes_of(s.m_step)},
              {".exp_avg_sq", bytes_of(s.v_int8)}, {".exp_avg_sq.scale", bytes_of(s.v_max)}};
    case Storage::nvfp4:
      return {{".exp_avg", bytes_of(s.m_fp4)},          {".exp_avg.scale", bytes_of(s.m_scale)},
              {".exp_avg.row_scale", bytes_of(s.m_row)}, {".exp_avg_sq", bytes_of(s.v_fp4)},
              {".exp_avg_sq.scale", bytes_of(s.v_scale)}, {".exp_avg_sq.row_scale", bytes_of(s.v_row)}};
  }
  return {};
}

inline int64_t block_of(Storage s) { return s == Storage::int8 ? 64 : (s == Storage::nvfp4 ? 16 : 1); }

// One AdamW step of a parameter: decode each row's m and v, update them and the master, encode them back.
// `master_f32` or `master_bf16` is the parameter ([rows * cols]); `grad` the gradient as fp32 values (a bf16
// gradient's values; grad_scale 1).
inline void step(State& s, std::vector<float>* master_f32, std::vector<uint16_t>* master_bf16,
                 const std::vector<float>& grad, const Hyper& h, uint64_t key) {
  const int64_t n = s.stored;
  std::vector<float> m(n), v(n);
  for (int64_t r = 0; r < s.rows; ++r) {
    // Decode.
    for (int64_t c = 0; c < n; ++c) {
      const int64_t i = r * n + c;
      switch (s.storage) {
        case Storage::f32: m[c] = s.m_f32[i], v[c] = s.v_f32[i]; break;
        case Storage::bf16: m[c] = bf16_value(s.m_bf16[i]), v[c] = bf16_value(s.v_bf16[i]); break;
        case Storage::int8:
          m[c] = static_cast<float>(s.m_int8[i]) * s.m_step[i / 64];
          v[c] = int8_level(s.v_int8[i]) * s.v_max[i / 64];
          break;
        case Storage::nvfp4: {
          const uint32_t mc = (s.m_fp4[i / 2] >> (4 * (c % 2))) & 0xFu, vc = (s.v_fp4[i / 2] >> (4 * (c % 2))) & 0xFu;
          m[c] = (e2m1_value(mc) * kernels::codec::e4m3_to_float(s.m_scale[i / 16])) * s.m_row[r];
          const float root = (e2m1_value(vc) * kernels::codec::e4m3_to_float(s.v_scale[i / 16])) * s.v_row[r];
          v[c] = root * root;
          break;
        }
      }
    }
    // Update: the moments (padding with a zero gradient), then the master from the fresh moments.
    for (int64_t c = 0; c < n; ++c) {
      const float g = c < s.cols ? grad[r * s.cols + c] : 0.0f;
      m[c] = std::fmaf(g, h.one_minus_beta1, m[c] * h.beta1);
      v[c] = std::fmaf(h.one_minus_beta2 * g, g, v[c] * h.beta2);
      if (c >= s.cols) continue;
      const int64_t p = r * s.cols + c;
      const float old = master_f32 ? (*master_f32)[p] : bf16_value((*master_bf16)[p]);
      const float denom = std::sqrt(v[c]) / h.bias_correction2_sqrt + h.eps;
      const float updated = old * h.decay_factor + (h.neg_step_size * m[c]) / denom;
      if (master_f32)
        (*master_f32)[p] = updated;
      else
        (*master_bf16)[p] = bf16_stochastic(updated, draws(key, static_cast<uint64_t>(r * n + c)).master16);
    }
    // Encode.
    const int64_t block = block_of(s.storage);
    for (int64_t b0 = 0; b0 < n; b0 += block) {
      const int64_t i0 = r * n + b0;
      if (s.storage == Storage::f32) {
        s.m_f32[i0] = m[b0], s.v_f32[i0] = v[b0];
      } else if (s.storage == Storage::bf16) {
        const Draws d = draws(key, static_cast<uint64_t>(i0));
        s.m_bf16[i0] = bf16_stochastic(m[b0], d.m24 >> 8);
        s.v_bf16[i0] = bf16_stochastic(v[b0], d.v24 >> 8);
      } else if (s.storage == Storage::int8) {
        float amax = 0.0f, vmax = 0.0f;
        for (int64_t k = 0; k < 64; ++k) amax = std::max(amax, std::fabs(m[b0 + k])), vmax = std::max(vmax, v[b0 + k]);
        const float m_step = amax / 127.0f;
        for (int64_t k = 0; k < 64; ++k) {
          const Draws d = draws(key, static_cast<uint64_t>(i0 + k));
          s.m_int8[i0 + k] = int8_m_code(m[b0 + k], m_step, uniform(d.m24));
          s.v_int8[i0 + k] = int8_v_code(v[b0 + k], vmax, uniform(d.v24));
        }
        s.m_step[i0 / 64] = m_step, s.v_max[i0 / 64] = vmax;
      }
    }
    if (s.storage != Storage::nvfp4) continue;
    // nvfp4: the row scales first (the row's largest |m| and sqrt(v) mapped to 448 * 6), then each block.
    float m_top = 0.0f, root_top = 0.0f;
    for (int64_t c = 0; c < n; ++c) m_top = std::max(m_top, std::fabs(m[c])), root_top = std::max(root_top, std::sqrt(v[c]));
    const float m_row = m_top > 0.0f ? m_top / 2688.0f : 1.0f, v_row = root_top > 0.0f ? root_top / 2688.0f : 1.0f;
    for (int64_t b0 = 0; b0 < n; b0 += 16) {
      float m_norm[16], root_norm[16], m_amax = 0.0f, root_amax = 0.0f;
      for (int k = 0; k < 16; ++k) {
        m_norm[k] = block_quotient(std::fabs(m[b0 + k]), m_row);
        root_norm[k] = block_quotient(std::sqrt(v[b0 + k]), v_row);
        m_amax = std::max(m_amax, m_norm[k]), root_amax = std::max(root_amax, root_norm[k]);
      }
      const uint8_t m_code = block_scale_code(m_amax), v_code = block_scale_code(root_amax);
      const float m_scale = kernels::codec::e4m3_to_float(m_code), v_scale = kernels::codec::e4m3_to_float(v_code);
      for (int k = 0; k < 16; ++k) {
        const int64_t i = r * n + b0 + k;
        const Draws d = draws(key, static_cast<uint64_t>(i));
        uint32_t mc = e2m1_stochastic(m_norm[k], m_scale, uniform(d.m24), false);
        if (mc != 0 && m[b0 + k] < 0.0f) mc |= 8u;
        const uint32_t vc = e2m1_stochastic(root_norm[k], v_scale, uniform(d.v24), true);
        const int shift = 4 * (k % 2);
        s.m_fp4[i / 2] = static_cast<uint8_t>((s.m_fp4[i / 2] & ~(0xF << shift)) | (mc << shift));
        s.v_fp4[i / 2] = static_cast<uint8_t>((s.v_fp4[i / 2] & ~(0xF << shift)) | (vc << shift));
      }
      s.m_scale[(r * n + b0) / 16] = m_code, s.v_scale[(r * n + b0) / 16] = v_code;
    }
    s.m_row[r] = m_row, s.v_row[r] = v_row;
  }
}

}  // namespace qwen3::adamw_reference
