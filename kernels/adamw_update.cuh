// AdamW's element update and the moment encodings as __host__ __device__ functions: the CPU step
// (src/optim/adamw_cpu.cpp, over at::parallel_for) and the CUDA kernel (adamw_step.cu) run this very code, so
// CPU tests pin the arithmetic the GPU does. Encodings and why: docs/optim.md; the kernel: kernels/adamw_step.md.
//
// Every operation is one IEEE operation rounded on its own, written out (mul_rn, add_rn, div_rn, fmaf) so that
// neither compiler contracts or reorders anything: the update's bytes equal those of the ATen-composed optimizer
// this replaced, whose scalar-times-tensor adds were fused multiply-adds, and every rule equals its plain
// statement in docs/optim.md ("The rules, exactly"; tests/test_optim_golden.cpp, tests/adamw_reference.h).
// No libtorch, no CUDA runtime calls.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#endif

#include "nvfp4_codec.cuh"

namespace qwen3::kernels::adamw {

using codec::add_rn;
using codec::bits_to_float;
using codec::div_rn;
using codec::float_bits;
using codec::mul_rn;
using codec::recip_rn;
using codec::sub_rn;

enum class Moments : int { f32 = 0, bf16 = 1, int8 = 2, nvfp4 = 3 };

constexpr int kInt8Block = 64;
constexpr int kNvfp4Block = codec::kBlock;  // 16
constexpr float kInt8LinearMax = 127.0f;     // m codes -127..127
constexpr float kNvfp4RowTop = 2688.0f;      // 448 * 6: the top of E4M3 x E2M1, what a row's maximum maps to
constexpr float kE2m1Max = 6.0f;
constexpr float kE2m1Smallest = 0.5f;

// What one parameter's update needs from the host: the options and schedule rounded to fp32 once (as ATen
// rounded its double scalars), and the 64-bit key of the step's random draws for this parameter.
struct StepScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  float inverse_bias_correction2_sqrt;  // RN(1 / bias_correction2_sqrt): set_bias_correction2 sets both
  float eps;
  float neg_step_size;          // -lr / (1 - beta1^t)
  float decay_factor;           // 1 - lr * weight_decay; exactly 1 where no decay applies (x * 1 is x)
  float grad_scale;             // the clipping factor; exactly 1 leaves the gradient as it is
  uint64_t random_key;           // element_draws(random_key, index): every stochastic rounding of the step
  // Where set (CUDA only), the clipping factor is read from this device float instead, by every thread before
  // anything else, and NaN there means "do not update": the in-backward update computes each block's factor on
  // the device and launches without waiting for it (kernels/adamw_step.md). The CPU loops never see it set.
  const float* grad_scale_on_device;
};

// sqrt(1 - beta2^t) rounded to fp32 once, and its correctly rounded reciprocal, which divide_by_known takes.
QWEN3_HD void set_bias_correction2(StepScalars& s, float bias_correction2_sqrt) {
  s.bias_correction2_sqrt = bias_correction2_sqrt;
  s.inverse_bias_correction2_sqrt = recip_rn(bias_correction2_sqrt);
}

// Resolves grad_scale_on_device into grad_scale; false: the factor is NaN and nothing is to be updated.
QWEN3_HD bool take_device_grad_scale(StepScalars& s) {
  if (s.grad_scale_on_device == nullptr) return true;
  s.grad_scale = *s.grad_scale_on_device;
  return s.grad_scale == s.grad_scale;
}

// One parameter viewed as a row-major matrix [rows, cols]; block-scaled moments pad each row to stored_cols.
struct ParamView {
  void* master;             // fp32 or bf16 [rows, cols]
  int master_bf16;
  const void* grad;         // fp32 or bf16 [rows, cols]
  int grad_bf16;
  void* exp_avg;            // f32/bf16 [rows, cols]; int8: int8 [rows, stored]; nvfp4: packed codes [rows, stored/2]
  void* exp_avg_sq;         // f32/bf16 [rows, cols]; int8: uint8 log codes; nvfp4: packed codes of sqrt(v)
  void* exp_avg_scale;      // int8: fp32 step per 64-block; nvfp4: E4M3 code per 16-block
  void* exp_avg_sq_scale;   // int8: fp32 block max of v; nvfp4: E4M3 code per 16-block of sqrt(v)
  float* exp_avg_row_scale;     // nvfp4 only
  float* exp_avg_sq_row_scale;  // nvfp4 only
  int64_t rows, cols, stored_cols;
  Moments moments;
  // --keep-weight-operands always (CUDA): where set, the stepped master's bf16 operand deq(Q(master))
  // for the next forward, [rows, cols] with cols a multiple of 16, written in the same pass; operand_search: the
  // scale mode (rne 0, search 1); operand_nonfinite_flag (nullable): raised to 1 for a block with an infinite or
  // NaN master, as the quantize kernels raise it.
  uint16_t* operand;
  int operand_search;
  int* operand_nonfinite_flag;
};

// ---- counter-based random bits ---------------------------------------------------------------------------------

// A 32-bit xorshift-multiply mixer (the shape of Wellons' lowbias32).
QWEN3_HD uint32_t mix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x7FEB352Du;
  h ^= h >> 15;
  h *= 0x2C1B3C6Du;
  h ^= h >> 16;
  return h;
}

// The bits of element `index` of the stream `key`: two keyed rounds, the low index bits with the low key, then
// the high index bits (0 below 2^32 elements) with the high key.
QWEN3_HD uint32_t random_bits_split(uint64_t key, uint32_t index_low, uint32_t index_high) {
  const uint32_t h = mix32(index_low ^ static_cast<uint32_t>(key));
  return mix32(h ^ index_high ^ static_cast<uint32_t>(key >> 32));
}
QWEN3_HD uint32_t random_bits(uint64_t key, uint64_t index) {
  return random_bits_split(key, static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32));
}

// How many of the `count` indices from `index` on share its high 32 bits (1..count): the host loops draw a run
// of them with 32-bit lanes, random_bits_split(key, low + k, high), the same bits as random_bits.
QWEN3_HD uint64_t indices_sharing_high_bits(uint64_t index, uint64_t count) {
  const uint64_t to_next = (uint64_t{1} << 32) - (index & 0xFFFFFFFFu);
  return count < to_next ? count : to_next;
}

// Uniform in [0, 1) from the top 24 bits (exact in fp32).
QWEN3_HD float uniform_from_bits(uint32_t bits) { return static_cast<float>(bits >> 8) * 5.9604644775390625e-8f; }

// Every stochastic rounding of one element in one step draws from one hash of its index (two mixer rounds, 64
// bits), cut into disjoint pieces: 24 bits for m's rounding, 24 for v's, 16 for a bf16 master's. One hash where
// each rounding had a keyed stream of its own (three hashes, six rounds): the compressed-moment kernels are
// bound by their instructions, not their bytes (kernels/adamw_step.md). The index is the element's in the
// (padded) row-major state, row * stored_cols + col, for the master too. Both rounds see the whole index; m's
// piece comes from the first round alone, so a loop that rounds only m computes one.
struct ElementDraws {
  uint32_t m;       // 24 bits
  uint32_t v;       // 24 bits
  uint32_t master;  // 16 bits
};

QWEN3_HD uint32_t first_draw_round(uint64_t key, uint32_t index_low, uint32_t index_high) {
  return mix32(index_low ^ static_cast<uint32_t>(key) ^ (index_high * 0x9E3779B1u));
}
QWEN3_HD ElementDraws draws_from_rounds(uint32_t first, uint32_t second) {
  return {first >> 8, second >> 8, ((first & 0xFFu) << 8) | (second & 0xFFu)};
}
QWEN3_HD ElementDraws element_draws_split(uint64_t key, uint32_t index_low, uint32_t index_high) {
  const uint32_t first = first_draw_round(key, index_low, index_high);
  return draws_from_rounds(first, mix32(first ^ static_cast<uint32_t>(key >> 32)));
}
QWEN3_HD ElementDraws element_draws(uint64_t key, uint64_t index) {
  return element_draws_split(key, static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32));
}
// m's draw alone: the first round's top 24 bits.
QWEN3_HD uint32_t m_draw_split(uint64_t key, uint32_t index_low, uint32_t index_high) {
  return first_draw_round(key, index_low, index_high) >> 8;
}

// Uniform in [0, 1) from a 24-bit draw (exact in fp32), and a draw's top 16 bits, what bf16 rounding adds.
QWEN3_HD float uniform_from_draw(uint32_t draw) { return static_cast<float>(draw) * 5.9604644775390625e-8f; }
QWEN3_HD uint32_t sixteen_bits_of_draw(uint32_t draw) { return draw >> 8; }

// ---- one division a block ----------------------------------------------------------------------------------------

// x / d for every element of a block (or row) by one division: x * s times the rounded reciprocal of d * s, where
// s is the power of two that brings d * s into [2^-64, 2^64], so that the reciprocal is a normal float for any
// finite d > 0 (a subnormal d, a decayed moment's block maximum, included: scaling by a power of two is exact).
// Within two ulps of the quotient; the encoders are defined by this product. d = 0 gives 0 for every x.
struct BlockDivisor {
  float scale, reciprocal;
};
QWEN3_HD BlockDivisor block_divisor(float d) {
  const float s = d < 0x1p-64f ? 0x1p64f : (d > 0x1p64f ? 0x1p-64f : 1.0f);
  return {s, d > 0.0f ? recip_rn(mul_rn(d, s)) : 0.0f};
}
QWEN3_HD float divide(float x, BlockDivisor d) { return mul_rn(mul_rn(x, d.scale), d.reciprocal); }

// ---- bf16 ----------------------------------------------------------------------------------------------------

QWEN3_HD float bf16_to_float(uint16_t b) { return bits_to_float(static_cast<uint32_t>(b) << 16); }

// Round up (in magnitude) when the 16 discarded bits plus 16 random bits carry: E[result] = x.
QWEN3_HD uint16_t bf16_stochastic(float x, uint32_t bits) {
  return static_cast<uint16_t>((float_bits(x) + (bits & 0xFFFFu)) >> 16);
}

// Round to nearest even, NaN to the canonical quiet NaN (c10::BFloat16's conversion). On the device one
// conversion instruction (cvt.rn.bf16.f32, the same rounding: IEEE round to nearest even, overflow to infinity,
// subnormals kept) and a NaN test, where the integer form takes six or seven; the hardware's own NaN is 0x7FFF,
// so a NaN still becomes 0x7FC0. The fused kernels round every intermediate this way (RoPE: ten times a pair).
QWEN3_HD uint16_t bf16_nearest(float x) {
#if defined(__CUDA_ARCH__)
  const uint32_t converted = __bfloat16_as_ushort(__float2bfloat16_rn(x));  // both, then a select: no branch
  return static_cast<uint16_t>(x != x ? 0x7FC0u : converted);
#else
  const uint32_t u = float_bits(x);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : rounded);
#endif
}

// ---- the element update ----------------------------------------------------------------------------------------

// The gradient as the update sees it: scaled by the clipping factor in the gradient's own dtype (a bf16
// gradient scaled in place is rounded back to bf16).
template <bool kBf16>
QWEN3_HD float scaled_grad(float read, float grad_scale) {
  // Multiplying by exactly 1 (and rounding a bf16 value to bf16) changes nothing: no branch for the common case.
  if (kBf16) {
#if defined(__CUDA_ARCH__)
    // Without bf16_nearest's NaN test: a NaN gradient stays NaN either way, and its payload reaches no byte (the
    // GPU's arithmetic gives every NaN result the same canonical bits; the gradient is never stored). Two
    // instructions an element fewer in the compressed updates, which are bound by their instructions.
    return __bfloat162float(__float2bfloat16_rn(mul_rn(read, grad_scale)));
#else
    return bf16_to_float(bf16_nearest(mul_rn(read, grad_scale)));
#endif
  }
  return mul_rn(read, grad_scale);
}
template <bool kBf16>
QWEN3_HD float grad_at(const void* grad, int64_t index, float grad_scale) {
  return kBf16 ? scaled_grad<true>(bf16_to_float(static_cast<const uint16_t*>(grad)[index]), grad_scale)
               : scaled_grad<false>(static_cast<const float*>(grad)[index], grad_scale);
}

// m <- b1 m + (1 - b1) g and v <- b2 v + (1 - b2) g^2, fp32, each ending in one fused multiply-add (where
// ATen's vectorized add-with-alpha and addcmul on x86-64 fused theirs: measured element by element).
QWEN3_HD void update_moments(float g, float& m, float& v, const StepScalars& s) {
  m = fmaf(g, s.one_minus_beta1, mul_rn(m, s.beta1));
  v = fmaf(mul_rn(s.one_minus_beta2, g), g, mul_rn(v, s.beta2));
}

// RN(x / d) for a divisor known in advance, given r = RN(1 / d), by two Markstein corrections instead of an IEEE
// division: q0 = RN(x r) is within a few ulps of x / d; q1 = RN(q0 + RN(x - q0 d) r) is then within one ulp (the
// correction's own error is about 2^-23 of q0's); with q1 within one ulp and r within half an ulp of 1 / d,
// Markstein's theorem makes the remainder x - q1 d exact and q2 = RN(q1 + (x - q1 d) r) the correctly rounded
// quotient, wherever nothing over- or underflows. updated_master's x = sqrt(v) of a finite v >= 0 is 0 or at least
// 2^-75, and d = sqrt(1 - beta2^t) lies in [2^-27, 1] for any beta2 < 1 (a double: 1 - beta2 >= 2^-53), so the
// quotients are normal and the remainders multiples of 2^-148, exact; x = 0 gives +0.
// An infinite or NaN x (or a quotient past fp32's range, which the update never makes) gives q0, x r: what IEEE's
// x / d is there. Five multiply-adds and a select where the device's division runs a reciprocal, its refinement, a
// range check and a branch around five multiply-adds (the compressed updates are bound by their instructions).
// AdamWRules.KnownDivisorQuotientIsTheIeeeOne compares it with the division for every mantissa of x under a set of
// divisors.
QWEN3_HD float divide_by_known(float x, float d, float r) {
  const float q0 = mul_rn(x, r);
  const float q1 = fmaf(fmaf(-q0, d, x), r, q0);
  const float q2 = fmaf(fmaf(-q1, d, x), r, q1);
  return fabsf(q0) <= 3.40282347e38f ? q2 : q0;  // x / d infinite or NaN: q0 (NaN compares false)
}

// p <- p (1 - lr wd) - step_size m / (sqrt(v) / sqrt(1 - b2^t) + eps), from the fresh fp32 moments.
QWEN3_HD float updated_master(float p, float m, float v, const StepScalars& s) {
  const float corrected = divide_by_known(sqrtf(v), s.bias_correction2_sqrt, s.inverse_bias_correction2_sqrt);
  const float denom = add_rn(corrected, s.eps);
  return add_rn(mul_rn(p, s.decay_factor), div_rn(mul_rn(s.neg_step_size, m), denom));
}

template <bool kBf16>
QWEN3_HD float master_at(const void* master, int64_t index) {
  return kBf16 ? bf16_to_float(static_cast<const uint16_t*>(master)[index]) : static_cast<const float*>(master)[index];
}

// A bf16 master is rounded stochastically with its element's 16-bit master draw.
template <bool kBf16>
QWEN3_HD void store_master_at(void* master, int64_t index, float value, uint32_t master_draw) {
  if (kBf16)
    static_cast<uint16_t*>(master)[index] = bf16_stochastic(value, master_draw);
  else
    static_cast<float*>(master)[index] = value;
}

// The gradient of element (row, col) of a row-major [rows, cols] parameter as the update sees it (grad_at), 0 in
// the row padding of the block-scaled storages (col >= cols).
QWEN3_HD float grad_of(const ParamView& p, const StepScalars& s, int64_t row, int64_t col) {
  if (col >= p.cols) return 0.0f;
  const int64_t index = row * p.cols + col;
  return p.grad_bf16 ? grad_at<true>(p.grad, index, s.grad_scale) : grad_at<false>(p.grad, index, s.grad_scale);
}

// The master of a parameter at `index` in its stored dtype (fp32 or bf16, as the view says), and its update
// stored back: what every GPU kernel does per element (the host loops specialize on the dtype instead).
QWEN3_HD float master_of(const ParamView& p, int64_t index) {
  return p.master_bf16 ? master_at<true>(p.master, index) : master_at<false>(p.master, index);
}
// The stepped master as it is stored: an fp32 one's bits, or a bf16 one (rounded stochastically) in the low 16.
QWEN3_HD uint32_t stepped_master_bits(bool bf16, const StepScalars& s, float master, float m, float v,
                                      uint32_t master_draw) {
  const float updated = updated_master(master, m, v, s);
  return bf16 ? bf16_stochastic(updated, master_draw) : float_bits(updated);
}
QWEN3_HD float stored_master_value(bool bf16, uint32_t bits) {
  return bf16 ? bf16_to_float(static_cast<uint16_t>(bits)) : bits_to_float(bits);
}
// One value's bits stored at `index` of an fp32 or bf16 array (a bf16 value in the low 16 bits): a master's, or a
// plain moment's.
QWEN3_HD void store_bits_at(void* to, bool bf16, int64_t index, uint32_t bits) {
  if (bf16)
    static_cast<uint16_t*>(to)[index] = static_cast<uint16_t>(bits);
  else
    static_cast<float*>(to)[index] = bits_to_float(bits);
}
QWEN3_HD void store_master_bits(const ParamView& p, int64_t index, uint32_t bits) {
  if (p.master_bf16)
    static_cast<uint16_t*>(p.master)[index] = static_cast<uint16_t>(bits);
  else
    static_cast<float*>(p.master)[index] = bits_to_float(bits);
}
// Returns the master as stored (a bf16 one after its rounding), as a float.
QWEN3_HD float step_master(const ParamView& p, const StepScalars& s, int64_t index, float master, float m, float v,
                           uint32_t master_draw) {
  const uint32_t bits = stepped_master_bits(p.master_bf16 != 0, s, master, m, v, master_draw);
  store_master_bits(p, index, bits);
  return stored_master_value(p.master_bf16 != 0, bits);
}
// The same where nothing else of the element is rounded (fp32 moments): the draws are made only for a bf16
// master, from the element's state index `draw_index`.
QWEN3_HD float step_master_drawing(const ParamView& p, const StepScalars& s, int64_t index, float master, float m,
                                   float v, uint64_t draw_index) {
  if (p.master_bf16)  // a branch, not a select: an fp32 master's (the fast configuration's) update makes no hash
    return step_master(p, s, index, master, m, v, element_draws(s.random_key, draw_index).master);
  return step_master(p, s, index, master, m, v, 0u);
}

// ---- int8: m linear with a step per 64-block, v on a log2 grid under the block maximum ---------------------------

// 2^(-c/8) for c = 0..255, each exactly float(exp2(-c / 8.0)): the fractional octave's eight values rounded
// once, times an exact power of two.
// One of eight 32-bit patterns by its index, as masks and ors: the host loops vectorize this (a table lookup in
// them does not, and a chain of selects is turned into a branch table).
QWEN3_HD uint32_t pick8(uint32_t index, const uint32_t (&patterns)[8]) {
  uint32_t out = 0;
  for (uint32_t k = 0; k < 8; ++k) out |= (0u - static_cast<uint32_t>(index == k)) & patterns[k];
  return out;
}

QWEN3_HD float int8_log_level(uint32_t code) {
  // float(2^(-b/8)) for b = 0..7 as bit patterns: 1, 0x1.d5818ep-1, 0x1.ae89fap-1, 0x1.8ace54p-1, 0x1.6a09e6p-1,
  // 0x1.4bfdaep-1, 0x1.306fe0p-1, 0x1.172b84p-1.
  constexpr uint32_t kOctave[8] = {0x3F800000u, 0x3F6AC0C7u, 0x3F5744FDu, 0x3F45672Au,
                                   0x3F3504F3u, 0x3F25FED7u, 0x3F1837F0u, 0x3F0B95C2u};
  return bits_to_float(pick8(code & 7u, kOctave)) * bits_to_float((127u - (code >> 3)) << 23);
}

// 1 / (level(c) - level(c + 1)) for c = 0..254, what v's rounding probability multiplies by: the gap is exact
// (the two levels are within a factor of two), an octave's eight gaps scale by 2^-octave like the levels
// (level(8 o + 8) = level(8 o) / 2), so the reciprocal is one of eight rounded values times an exact 2^octave.
QWEN3_HD float int8_log_inverse_gap(uint32_t code) {
  // float(1 / (level(b) - level(b + 1))) for b = 0..7.
  constexpr uint32_t kInverseGaps[8] = {0x4140C7CEu, 0x41523A87u, 0x41654180u, 0x417A015Cu,
                                        0x41885103u, 0x4194A76Au, 0x41A21BC6u, 0x41B0C7CCu};
  return bits_to_float(pick8(code & 7u, kInverseGaps) + ((code >> 3) << 23));
}

QWEN3_HD float int8_linear_decode(int8_t code, float step) { return mul_rn(static_cast<float>(code), step); }

// The block's step, a 127th of its largest |m|: what decoding multiplies the codes by.
QWEN3_HD float int8_linear_step(float amax) { return div_rn(amax, kInt8LinearMax); }

// Code of x under its block's step (`inverse`: block_divisor(step), nothing for step 0): floor(x / step), raised
// by one with probability equal to the remainder, so E[code * step] = x (to the quotient's two ulps).
QWEN3_HD int8_t int8_linear_encode(float x, BlockDivisor inverse, float uniform) {
  const float t = divide(x, inverse);
  float lower = floorf(t);
  lower = add_rn(lower, uniform < sub_rn(t, lower) ? 1.0f : 0.0f);
  lower = lower < -kInt8LinearMax ? -kInt8LinearMax : (lower > kInt8LinearMax ? kInt8LinearMax : lower);
  return static_cast<int8_t>(static_cast<int>(lower));
}

// What v's encoder reads at its upper code c: the level below it, level(c + 1), and 1 / (level(c) - level(c + 1)).
struct LowerAndInverseGap {
  float lower, inverse_gap;
};
// The levels and the encoder's pairs as computed (the host loops' form), and the same values from tables the
// caller filled with them (the GPU kernel's form: shared-memory loads in place of the masks and ors of pick8).
struct ComputedLevels {
  QWEN3_HD float operator()(uint32_t code) const { return int8_log_level(code); }
  QWEN3_HD LowerAndInverseGap below(uint32_t code) const {
    return {int8_log_level(code + 1), int8_log_inverse_gap(code)};
  }
};
struct TabledLevels {  // the encoder's pair in one 8-byte load
  const float* table;                // [256]: table[c] == int8_log_level(c)
  const LowerAndInverseGap* pairs;   // [256]: pairs[c] == ComputedLevels{}.below(c)
  QWEN3_HD float operator()(uint32_t code) const { return table[code]; }
  QWEN3_HD LowerAndInverseGap below(uint32_t code) const { return pairs[code]; }
};

template <typename Levels = ComputedLevels>
QWEN3_HD float int8_log_decode(uint8_t code, float block_max, Levels level = Levels()) {
  return mul_rn(level(code), block_max);
}

// The largest code c in 0..254 with level(c) >= ratio (the level just above), from the float's exponent and a
// comparison of its mantissa with the octave's levels: the exact floor(-8 log2 ratio), without a logarithm.
// Branch free (selects only), so that the CPU loops vectorize.
QWEN3_HD uint32_t int8_log_upper_code(float ratio) {
  const uint32_t bits = float_bits(ratio);
  const int exponent = static_cast<int>((bits >> 23) & 0xFFu) - 127;  // ratio in [2^e, 2^(e+1))
  const float half_mantissa = bits_to_float((bits & 0x007FFFFFu) | (126u << 23));  // in [0.5, 1)
  // ratio = half_mantissa * 2^-(octave); level(8 octave + b) = level(b) * 2^-octave for b = 0..8, and the
  // levels fall with b: the code is 8 octave + the number of b in 1..8 whose level is >= half_mantissa.
  // Written out (a loop inside the element loop would stop the CPU loops vectorizing).
  const int above = (half_mantissa == 0.5f ? 1 : 0) + (0x1.d5818ep-1f >= half_mantissa ? 1 : 0) +
                    (0x1.ae89fap-1f >= half_mantissa ? 1 : 0) + (0x1.8ace54p-1f >= half_mantissa ? 1 : 0) +
                    (0x1.6a09e6p-1f >= half_mantissa ? 1 : 0) + (0x1.4bfdaep-1f >= half_mantissa ? 1 : 0) +
                    (0x1.306fe0p-1f >= half_mantissa ? 1 : 0) + (0x1.172b84p-1f >= half_mantissa ? 1 : 0);
  int code = 8 * (-exponent - 1) + above;
  code = exponent < -33 ? 254 : (code > 254 ? 254 : code);  // far below the last level (2^-31.9)
  code = ratio >= 1.0f ? 0 : code;
  return static_cast<uint32_t>(ratio > 0.0f ? code : 254);  // zero (and NaN): the floor level
}

// The same code from an estimate of log2(ratio) within kInt8LogEstimateError / 8 of it (so -8 times it within
// kInt8LogEstimateError of -8 log2 ratio), by one comparison with a level: floor(-8 estimate +
// kInt8LogEstimateMargin) is then the code or the one above it (the margin covers the estimate's error and the
// levels' own rounding, about 1e-6 of a code, and is far below one code), and the level at it says which. The GPU
// kernel estimates with the hardware's approximate log2 (lg2.approx.ftz): CUDA documents it to 2^-22 absolute in
// [0.5, 2] and two ulps elsewhere, so above 2^-126 its error is under 2^-17 of log2 ratio, a sixteenth of the
// bound; a subnormal ratio is flushed to 0 and estimated at -infinity, which gives 254, its code (every ratio
// below 2^-32 takes it). One special-function op, a table load and a comparison where the exponent form takes
// eight comparisons and their sum. What each step may leave out, given the bound: a candidate of 255 or more
// means a ratio below 2^-31.87, under level(254), so clamping it to 254 before the comparison keeps 254; a ratio
// of 1 or more gives a candidate of 0, which the comparison keeps; -8 times a float is exact, so the one fused
// multiply-add is the product's sum with the margin rounded once. Every code read is within 0..254.
constexpr float kInt8LogEstimateError = 0x1p-10f;
constexpr float kInt8LogEstimateMargin = 0x1p-9f;

// floor(x) as an unsigned integer, saturated: 0 for a negative x or NaN, 2^32 - 1 from 2^32 up (PTX's
// cvt.rmi.u32.f32, one instruction on the GPU).
QWEN3_HD uint32_t floor_to_u32_saturated(float x) {
#if defined(__CUDA_ARCH__)
  return __float2uint_rd(x);
#else
  if (!(x >= 1.0f)) return 0u;  // NaN too
  return x >= 4294967296.0f ? 0xFFFFFFFFu : static_cast<uint32_t>(floorf(x));
#endif
}

template <typename Levels>
QWEN3_HD uint32_t int8_log_upper_code_from_log2(float ratio, float log2_estimate, Levels level) {
  uint32_t code = floor_to_u32_saturated(fmaf(-8.0f, log2_estimate, kInt8LogEstimateMargin));
  code = code > 254 ? 254 : code;
  code = level(code) >= ratio ? code : (code > 0 ? code - 1 : 0);
  return ratio > 0.0f ? code : 254;  // zero (and NaN): the floor level
}

#if defined(__CUDA_ARCH__)
// log2(x) by the special-function unit with subnormal inputs flushed to 0 (-infinity out): one instruction, where
// __log2f scales a subnormal input first (three more).
__device__ __forceinline__ float log2_approx_ftz(float x) {
  float out;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(out) : "f"(x));
  return out;
}
#endif

// Code of v >= 0 under its block maximum (`inverse`: block_divisor(block maximum); any code for a zero block):
// one of the two levels around v / max, chosen with probability linear in v, so E[decoded] = v. Below the last
// level: code 255.
template <typename Levels = ComputedLevels>
QWEN3_HD uint8_t int8_log_encode(float v, BlockDivisor inverse, float uniform, Levels level = Levels()) {
  const float ratio = divide(v, inverse);
#if defined(__CUDA_ARCH__)
  const uint32_t upper_code = int8_log_upper_code_from_log2(ratio, log2_approx_ftz(ratio), level);
#else
  const uint32_t upper_code = int8_log_upper_code(ratio);
#endif
  const LowerAndInverseGap below = level.below(upper_code);
  // The probability of the upper level. Not clamped to [0, 1]: the uniform is in [0, 1), so at or below 0 the
  // lower level (upper_code + 1) is taken and from 1 up the upper one, as the clamped value would give (NaN: the
  // upper, either way).
  const float p_upper = mul_rn(sub_rn(ratio, below.lower), below.inverse_gap);
  return static_cast<uint8_t>(upper_code + (uniform >= p_upper ? 1u : 0u));
}

// ---- nvfp4: E2M1 codes under an E4M3 scale per 16 elements, over an fp32 scale per row --------------------------

// The E2M1 value of a 4-bit code: codec::e2m1_to_float, integer operations only on the host, so its loops
// vectorize (a table becomes a gather); on the device the subnormal-scaling form, the same values (static PTX of
// the nvfp4 kernel, which handles either master, with the E4M3 decode's: 2,121 -> 1,840, scripts/ptx-counts.sh).
QWEN3_HD float e2m1_value(uint32_t code) { return codec::e2m1_to_float(code); }

// e2m1 x E4M3 is exact; the row scale rounds once.
QWEN3_HD float nvfp4_decode_value(uint32_t code, float block_scale, float row_scale) {
  return mul_rn(mul_rn(e2m1_value(code), block_scale), row_scale);
}

QWEN3_HD float nvfp4_decode(const uint8_t* packed, const uint8_t* scale_codes, int64_t col, float row_scale) {
  const uint32_t code = (packed[col >> 1] >> ((col & 1) * 4)) & 0xFu;
  return nvfp4_decode_value(code, codec::e4m3_to_float(scale_codes[col / kNvfp4Block]), row_scale);
}

QWEN3_HD float nvfp4_row_scale(float row_max) { return row_max > 0.0f ? div_rn(row_max, kNvfp4RowTop) : 1.0f; }

// The E4M3 scale code of a block whose largest (row-normalized) magnitude is `amax`: the canonical codec's
// rne code, raised by one where it would clip amax (amax > 6 s), so stochastic rounding never clips.
QWEN3_HD uint8_t nvfp4_unclipped_scale_code(float amax) {
  const uint32_t canonical = codec::rne_scale_code(amax);
  const uint32_t raised = canonical + (amax > mul_rn(codec::e4m3_to_float(static_cast<uint8_t>(canonical)), kE2m1Max) ? 1u : 0u);
  return static_cast<uint8_t>(raised > codec::kE4m3MaxCode ? codec::kE4m3MaxCode : raised);
}

// 1 / (upper^2 - lower^2) for the E2M1 neighbours of sqrt(v) whose lower code is `lower_code` (0..7: the pairs
// (0, 0.5), (0.5, 1), (1, 1.5), (1.5, 2), (2, 3), (3, 4), (4, 6), and (6, 8) at the top, where the probability
// is 0), each rounded once: what v's rounding probability multiplies by. The host loops' form (masks and ors);
// the GPU kernel reads the same values from a table it filled with this.
QWEN3_HD float nvfp4_inverse_square_gap(uint32_t lower_code) {
  // float(1 / d) for d = 0.25, 0.75, 1.25, 1.75, 5, 7, 20, 28.
  constexpr uint32_t kInverse[8] = {0x40800000u, 0x3FAAAAABu, 0x3F4CCCCDu, 0x3F124925u,
                                    0x3E4CCCCDu, 0x3E124925u, 0x3D4CCCCDu, 0x3D124925u};
  return bits_to_float(pick8(lower_code, kInverse));
}
struct ComputedSquareGaps {
  QWEN3_HD float operator()(uint32_t lower_code) const { return nvfp4_inverse_square_gap(lower_code); }
};
struct TabledSquareGaps {
  const float* table;  // [8]: table[c] == nvfp4_inverse_square_gap(c)
  QWEN3_HD float operator()(uint32_t lower_code) const { return table[lower_code]; }
};

// The E2M1 magnitude code (0..7) of normalized magnitude `a` under its block's scale (`inverse`:
// block_divisor(scale)), rounded to one of the two grid neighbours at random: linear in the value, or in its
// square (for sqrt(v), so that E[decoded^2] = v). sqrt(v) is floored at the smallest non-zero level: a zero
// there would divide a live m by eps.
//
// The lower neighbour and its code come from the bits of the scaled value: E2M1 keeps one mantissa bit from
// 1 up (1, 1.5, 2, 3, 4, 6), so for scaled >= 1 the lower neighbour is the float with its mantissa cut to one bit,
// and its code is 2 + 2 * exponent + that bit = (bits >> 22) - 252; below 1 the grid is 0, 0.5. The upper
// neighbour's code is the next one (the codes run in the values' order). The same values and probabilities
// as rounding floor(scaled / spacing) * spacing (tests/test_optim_golden.cpp checks the two against each
// other), in fewer vector instructions: the CPU loop is bound by their count.
template <bool kIsSqrtV, typename SquareGaps = ComputedSquareGaps>
QWEN3_HD uint32_t nvfp4_stochastic_magnitude(float a, BlockDivisor inverse, float uniform,
                                             SquareGaps square_gaps = SquareGaps()) {
  constexpr bool is_sqrt_v = kIsSqrtV;
  const bool live_scale = inverse.reciprocal > 0.0f;
  float scaled = divide(a, inverse);
  scaled = scaled > kE2m1Max ? kE2m1Max : scaled;
  if (is_sqrt_v) {
    const float floored = scaled < kE2m1Smallest ? kE2m1Smallest : scaled;
    scaled = live_scale ? floored : scaled;
  }
  const uint32_t bits = float_bits(scaled);
  const bool at_least_one = scaled >= 1.0f, at_least_half = scaled >= kE2m1Smallest;
  const float lower = at_least_one ? bits_to_float(bits & 0xFFC00000u) : (at_least_half ? kE2m1Smallest : 0.0f);
  const uint32_t lower_code = at_least_one ? (bits >> 22) - 252u : (at_least_half ? 1u : 0u);
  float p_upper;
  if (is_sqrt_v) {
    p_upper = mul_rn(sub_rn(mul_rn(scaled, scaled), mul_rn(lower, lower)), square_gaps(lower_code & 7u));
  } else {
    // Dividing by the spacing (a power of two) is multiplying by its exact reciprocal.
    const float inverse_spacing = scaled < 2.0f ? 2.0f : (scaled < 4.0f ? 1.0f : 0.5f);
    p_upper = mul_rn(sub_rn(scaled, lower), inverse_spacing);
  }
  // At the top (scaled = 6) p_upper is 0: the code never passes 7. A NaN gives 7 (the step is skipped then).
  const uint32_t code = lower_code + (uniform < p_upper ? 1u : 0u);
  return scaled == scaled ? code : 7u;
}

}  // namespace qwen3::kernels::adamw
