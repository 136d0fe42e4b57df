// The scalar and per-block NVFP4 rules of docs/nvfp4.md as __host__ __device__ functions, so the
// CUDA kernels and the host-side tests share one source of truth: the tests run these functions on the CPU
// (no GPU needed) against qwen3::nvfp4::quantize_rows_cpu, and the kernels run the very same code.
//
// No libtorch, no CUDA runtime calls. Every floating-point step is written so that host and device round the
// same way: no fused multiply-add unless written as fmaf, no fast-math, subnormals kept.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define QWEN3_HD __host__ __device__ __forceinline__
#define QWEN3_UNROLL _Pragma("unroll")
#else
#define QWEN3_HD inline
#define QWEN3_UNROLL
#endif

namespace qwen3::kernels::codec {

constexpr int kBlock = 16;             // elements per E4M3 scale
constexpr uint8_t kE4m3MaxCode = 0x7E;  // 448; 0x7F is NaN
constexpr uint8_t kNonFiniteBlockScale = 0x7F;  // written for a block whose input is not finite (see quantize)

QWEN3_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}

QWEN3_HD float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}

// max(m, |x|), NaN when either is NaN: a block's largest magnitude and, in the same one instruction an element
// on the device (max.NaN, sm_80 on), whether the block is finite: the result is then not <= FLT_MAX. fmaxf
// would drop a NaN, so the kernels tested each element's exponent besides (three instructions an element).
QWEN3_HD float max_abs_nan(float m, float x) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(m), "f"(fabsf(x)));
  return r;
#else
  const float a = std::fabs(x);
  return (std::isnan(m) || std::isnan(a)) ? bits_to_float(0x7FC00000u) : std::fmax(m, a);
#endif
}

// A block maximum from max_abs_nan: false when an element was infinite or NaN.
QWEN3_HD bool finite_maximum(float amax) { return amax <= 3.40282347e38f; }

// Correctly rounded fp32 quotient a / b (IEEE division, never the fast approximate one).
QWEN3_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

QWEN3_HD float recip_rn(float b) {
#if defined(__CUDA_ARCH__)
  return __frcp_rn(b);
#else
  return 1.0f / b;
#endif
}

// fp32 a + b and a * b, each rounded on its own (the device compiler would otherwise contract them).
QWEN3_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
QWEN3_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
QWEN3_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// E4M3FN decode with no case split but NaN's: the code's exponent and mantissa bits where an fp32's lowest
// exponent and top mantissa bits are make exactly the value x 2^-120 (exponent 0: an fp32 subnormal, as E4M3's
// m/8 x 2^-6), and the multiply by 2^120 is exact. The device's form (subnormals kept: nvcc's -ftz=false), as
// e2m1_to_float_by_scaling below; Nvfp4KernelCodec.E4m3DecodeByScalingEqualsTheCaseForm compares all 256 codes.
QWEN3_HD float e4m3_to_float_by_scaling(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const float value = mul_rn(bits_to_float((static_cast<uint32_t>(code & 0x7Fu) << 20) | sign), 0x1p120f);
  return (code & 0x7Fu) == 0x7Fu ? bits_to_float(0x7FC00000u | sign) : value;
}

// E4M3FN decode: exponent 0 is subnormal (m/8 * 2^-6), only 0x7F/0xFF are NaN, max finite 448. On the device
// the form above (branches here: the scale of every block a kernel reads).
QWEN3_HD float e4m3_to_float(uint8_t code) {
#if defined(__CUDA_ARCH__)
  return e4m3_to_float_by_scaling(code);
#else
  const uint32_t exponent = (code >> 3) & 0xF;
  const uint32_t mantissa = code & 0x7;
  float magnitude;
  if (exponent == 0xF && mantissa == 0x7) {
    magnitude = bits_to_float(0x7FC00000u);
  } else if (exponent == 0) {
    magnitude = static_cast<float>(mantissa) * 0.001953125f;  // m * 2^-9, exact
  } else {
    magnitude = bits_to_float(((exponent + 120u) << 23) | (mantissa << 20));  // rebias 7 -> 127
  }
  return (code & 0x80) ? -magnitude : magnitude;
#endif
}

// E4M3 round-to-nearest-even of a finite x >= 0, saturating at 448, subnormals kept (no lower clamp).
QWEN3_HD uint8_t e4m3_from_float_rne(float x) {
  if (!(x < 448.0f)) return kE4m3MaxCode;  // also catches values that would round up to the NaN code
  if (x < 0.015625f) {  // below 2^-6: the subnormal grid is k * 2^-9, k = 0..8 (k = 8 is code 0x08 = 2^-6)
#if defined(__CUDA_ARCH__)
    return static_cast<uint8_t>(__float2uint_rn(x * 512.0f));
#else
    return static_cast<uint8_t>(std::nearbyint(x * 512.0f));  // default rounding mode: to nearest even
#endif
  }
  // Normal range: keep 3 of fp32's 23 mantissa bits with round-to-nearest-even; a carry moves the exponent.
  const uint32_t bits = float_bits(x);
  const uint32_t rounded = (bits + 0x7FFFFu + ((bits >> 20) & 1u)) >> 20;  // (fp32 exponent << 3) | mantissa3
  return static_cast<uint8_t>(rounded - ((127u - 7u) << 3));
}

// E2M1 magnitude 0..7 at code index: 0, 0.5, 1, 1.5, 2, 3, 4, 6.
QWEN3_HD float e2m1_magnitude(uint32_t magnitude_code) {
  switch (magnitude_code & 7u) {
    case 0: return 0.0f;
    case 1: return 0.5f;
    case 2: return 1.0f;
    case 3: return 1.5f;
    case 4: return 2.0f;
    case 5: return 3.0f;
    case 6: return 4.0f;
    default: return 6.0f;
  }
}

// The same value with no case split: the code's bits where an fp32 subnormal's are (the two exponent bits in
// fp32's exponent field, the mantissa bit at its top, the sign at the sign) make exactly e2m1 x 2^-126 (code 1:
// 0.5 x 2^-126, a subnormal; from code 2 on normal numbers), and the multiply by 2^126 is exact. Two shifts, two
// masks and a multiply where the integer form below selects among three cases. It needs subnormals kept, which
// the kernels have (nvcc's default -ftz=false; the codec relies on it throughout) but a host process may not
// (denormals-are-zero is a CPU mode some libraries set): the device decodes this way, the host the integer way,
// and Nvfp4KernelCodec.E2m1DecodeByScalingEqualsTheIntegerForm compares them for all 16 codes.
QWEN3_HD float e2m1_to_float_by_scaling(uint32_t code) {
  return mul_rn(bits_to_float(((code & 7u) << 22) | ((code & 8u) << 28)), 0x1p126f);
}

// The signed value of a 4-bit code. On the host built as float bits with integer operations only (the host loops
// vectorize it; e2m1_magnitude's switch compiles to a chain of compares): from magnitude code 2 up the code is
// 2 * (exponent + 1) + mantissa bit, so its bits are (126 << 23) + (code << 22); code 1 is 0.5 and 0 is 0. On the
// device the scaling form above. tests/test_optim_golden.cpp checks it against e2m1_magnitude for all 16 codes.
QWEN3_HD float e2m1_to_float(uint32_t code) {
#if defined(__CUDA_ARCH__)
  return e2m1_to_float_by_scaling(code);
#else
  const uint32_t m = code & 7u;
  const uint32_t magnitude = m >= 2u ? (126u << 23) + (m << 22) : (m == 1u ? 126u << 23 : 0u);
  return bits_to_float(magnitude | ((code & 8u) << 28));
#endif
}

// |v| (already clamped or not: anything above 5 is code 7) to the E2M1 magnitude code, ties to the even code:
// 0.25->0, 0.75->2 (1.0), 1.25->2, 1.75->4 (2.0), 2.5->4, 3.5->6 (4.0), 5->6. A NaN gives 0. The rule as the
// CPU codec states it; the kernels run the bits form below, which the tests hold to this one.
QWEN3_HD uint32_t e2m1_magnitude_code(float a) {
  return static_cast<uint32_t>(a > 0.25f) + static_cast<uint32_t>(a >= 0.75f) +
         static_cast<uint32_t>(a > 1.25f) + static_cast<uint32_t>(a >= 1.75f) +
         static_cast<uint32_t>(a > 2.5f) + static_cast<uint32_t>(a >= 3.5f) + static_cast<uint32_t>(a > 5.0f);
}

// The same code from the bits of a finite or infinite v (its sign ignored), about half the instructions of the
// seven compares: below 1 the grid 0, 0.5, 1 is 2|v| rounded to an integer, ties to even, which adding
// 1.5 * 2^23 does (its ulp is 1; the integer lands in the low bits); from 1 on, E2M1 keeps one mantissa bit, so
// fp32's exponent and top mantissa bit rounded to nearest even (a carry moves the exponent) are the code
// plus 252, and everything past 6 is code 7. Equal to e2m1_magnitude_code(|v|) for every non-negative and
// finite fp32 and both infinities (checked exhaustively when written; the tests sweep a stride of them and every
// threshold's neighbours). A NaN gives 7, not 0: callers pass finite quotients.
QWEN3_HD uint32_t e2m1_magnitude_code_from_bits(float v) {
  // Both forms, then a select: a branch would split a warp's lanes an element.
  const uint32_t magnitude = float_bits(v) & 0x7FFFFFFFu;
  const uint32_t below_one = float_bits(fmaf(fabsf(v), 2.0f, 12582912.0f)) & 3u;
  // (exponent << 1 | mantissa bit) - 252 in one add: 0xC11FFFFF is 0x1FFFFF (round half up, the lsb making
  // ties even) minus 252 << 22; below 1 it wraps to a large value, clamped and not taken.
  const uint32_t code_from_one = (magnitude + ((magnitude >> 22) & 1u) + 0xC11FFFFFu) >> 22;
  const uint32_t from_one = code_from_one < 7u ? code_from_one : 7u;
  return magnitude < 0x3F800000u ? below_one : from_one;
}

// RN(x / s) for an E4M3 scale s > 0, given reciprocal = RN(1 / s). One reciprocal per block instead of one
// IEEE division per element: q = RN(x * r) is off by at most a few ulps, and one Markstein correction step
// with the exact remainder fma(-q, s, x) lands on the correctly rounded quotient. Checked exhaustively on
// the host for every fp32 mantissa of x and every E4M3 mantissa of s over the quotient range that can change
// an E2M1 code (tests/gpu/test_nvfp4_kernels.cpp, DivideByScale*). Quotients far below 0.25 or above 6 may
// differ from RN(x / s) in the last place, which cannot change the code.
QWEN3_HD float divide_by_scale(float x, float scale, float reciprocal) {
#if defined(__CUDA_ARCH__)
  const float q = __fmul_rn(x, reciprocal);  // never contracted into a neighbouring add
#else
  const float q = x * reciprocal;
#endif
  const float remainder = fmaf(-q, scale, x);
  return fmaf(remainder, reciprocal, q);
}

// RN(a / 6) for a finite a >= 2^-125, by Markstein's step with RN(1/6) (q = RN(a * r), then one correction with
// the exact remainder) instead of an IEEE division, which the device runs as a subroutine of about ten
// instructions and a branch. Checked exhaustively when written: equal to a / 6 for every fp32 from 2^-125 up;
// below it (subnormal quotients) it may differ in the last place, which no E4M3 scale code sees (every a
// there gives code 0, raised to 1): rne_scale_code gives the same code for all 2^31 non-negative finite
// inputs either way (a stride of them in the tests, and the neighbourhood of 2^-125).
QWEN3_HD float divide_by_6(float a) {
  constexpr float kSixth = 0x1.555556p-3f;  // RN(1/6)
#if defined(__CUDA_ARCH__)
  const float q = __fmul_rn(a, kSixth);  // never contracted into the fma below
#else
  const float q = a * kSixth;
#endif
  return fmaf(fmaf(-q, 6.0f, a), kSixth, q);
}

// One element's E2M1 code for scale s > 0: sign bit only when the magnitude is non-zero (no -0 is written).
QWEN3_HD uint32_t e2m1_encode(float x, float scale, float reciprocal) {
  const float v = divide_by_scale(x, scale, reciprocal);
  const uint32_t magnitude = e2m1_magnitude_code_from_bits(v);
  const uint32_t sign = magnitude != 0u ? (float_bits(v) >> 28) & 8u : 0u;
  return magnitude | sign;
}

// The default scale: e4m3_rne(amax / 6) with a correctly rounded fp32 division, raised to code 1 (2^-9, the
// bottom of E4M3's range) when it rounds to 0 but the block is not all zero (include/qwen3/nvfp4/nvfp4.h: only an
// all-zero block gets scale 0).
QWEN3_HD uint8_t rne_scale_code(float amax) {
  const uint8_t code = e4m3_from_float_rne(divide_by_6(amax));
  return (code == 0 && amax > 0.0f) ? uint8_t{1} : code;
}

// Squared reconstruction error of one 16-element block under scale code `scale_code`, in fp32 exactly as the
// CPU codec (src/nvfp4/nvfp4.cpp) computes it: d_i = |x_i| - q_i*s (the product is exact), e_i = d_i*d_i,
// summed as the butterfly e_i + e_{i+8}, then +4, +2, +1. The order and the rounding decide ties between
// candidates, so they are part of the byte contract. Scale 0 gives d_i = |x_i| (the all-zero block).
// One element's term of it: (|x| - q*s)^2 for scale s > 0 with reciprocal RN(1/s), |x|^2 for s = 0.
QWEN3_HD float element_squared_error(float x, float scale, float reciprocal) {
  const float magnitude = fabsf(x);
  const float quantized =
      scale > 0.0f ? e2m1_magnitude(e2m1_magnitude_code_from_bits(divide_by_scale(magnitude, scale, reciprocal))) * scale
                   : 0.0f;
  const float difference = sub_rn(magnitude, quantized);
  return mul_rn(difference, difference);
}

QWEN3_HD float block_squared_error(const float* x, uint8_t scale_code) {
  const float scale = e4m3_to_float(scale_code);
  float squared[kBlock];
  const float reciprocal = scale > 0.0f ? recip_rn(scale) : 0.0f;
  for (int i = 0; i < kBlock; ++i) squared[i] = element_squared_error(x[i], scale, reciprocal);
  for (int width = kBlock / 2; width >= 1; width /= 2)
    for (int i = 0; i < width; ++i) squared[i] = add_rn(squared[i], squared[i + width]);
  return squared[0];
}

// Candidate `k` (0..4) of the search around `center`: the code center - 2 + k, and whether it is one (E4M3 codes
// 0..0x7E only). The candidates in increasing order, as search_scale_code tries them.
QWEN3_HD int search_candidate(int center, int k, bool& valid) {
  const int code = center - 2 + k;
  valid = code >= 0 && code <= kE4m3MaxCode;
  return valid ? code : center;
}

// The search mode's choice: c0 = rne_scale_code(amax) and its two E4M3 neighbours either side (codes 0..0x7E
// only), least squared error, ties (and an all-infinite error past fp32's range) to the smaller code.
QWEN3_HD uint8_t search_scale_code(const float* x, float amax) {
  const int center = rne_scale_code(amax);
  int best_code = center;
  float best_error = 0.0f;
  bool have_best = false;
  for (int k = 0; k < 5; ++k) {
    bool valid = false;
    const int code = search_candidate(center, k, valid);
    if (!valid) continue;
    const float error = block_squared_error(x, static_cast<uint8_t>(code));
    if (!have_best || error < best_error) {
      best_code = code;
      best_error = error;
      have_best = true;
    }
  }
  return static_cast<uint8_t>(best_code);
}

// e2m1_to_float(e2m1_encode-style code of v) without the code: the E2M1 value nearest the finite or infinite
// quotient v, ties to even, +0 where the magnitude rounds to 0 (no -0, as e2m1_encode writes none). Below 1 the
// grid 0, 0.5, 1 is 2|v| rounded to an integer (the 1.5 * 2^23 addition, as e2m1_magnitude_code_from_bits)
// and halved; from 1 on the value itself with its mantissa rounded to one bit, ties to even (the same sum whose
// top bits are that function's code + 252: a code c from 2 up decodes to the float bits (126 << 23) + (c << 22),
// which are those sum's bits cut below bit 22), capped at 6 (code 7). About half the instructions of the code and
// its decoding; Nvfp4KernelCodec.E2m1ValueEqualsTheCodeDecoded holds it to them.
QWEN3_HD float e2m1_value_nearest(float v) {
  const uint32_t bits = float_bits(v), magnitude = bits & 0x7FFFFFFFu;
  const float below_one = mul_rn(sub_rn(fmaf(fabsf(v), 2.0f, 12582912.0f), 12582912.0f), 0.5f);
  const float from_one = fminf(bits_to_float((magnitude + ((magnitude >> 22) & 1u) + 0x1FFFFFu) & 0xFFC00000u), 6.0f);
  const float nearest = magnitude < 0x3F800000u ? below_one : from_one;
  return bits_to_float(float_bits(nearest) | (nearest != 0.0f ? bits & 0x80000000u : 0u));
}

// One element's value in the dense operand deq(Q(x)) under a positive (finite) block scale with reciprocal
// RN(1/scale): its E2M1 value times the scale (exact in fp32 and in bf16). A zero scale (an all-zero block) gives 0
// and a non-finite block's NaN scale NaN: the caller tests the scale once for the block (block_lanes::spread_operand).
QWEN3_HD float scaled_operand(float x, float scale, float reciprocal) {
  return mul_rn(e2m1_value_nearest(divide_by_scale(x, scale, reciprocal)), scale);
}

// Quantizes one block of 16 fp32 values into 8 code bytes (element 2j in the low nibble of byte j) and
// returns the scale code. Returns kNonFiniteBlockScale with all-zero codes when any input is not finite
// (the kernels raise their non-finite flag; the CPU codec refuses such input).
QWEN3_HD uint8_t quantize_block(const float* x, bool search, uint8_t* codes) {
  float amax = 0.0f;
  for (int i = 0; i < kBlock; ++i) amax = max_abs_nan(amax, x[i]);
  for (int j = 0; j < kBlock / 2; ++j) codes[j] = 0;
  if (!finite_maximum(amax)) return kNonFiniteBlockScale;
  const uint8_t scale_code = search ? search_scale_code(x, amax) : rne_scale_code(amax);
  const float scale = e4m3_to_float(scale_code);
  if (scale == 0.0f) return scale_code;
  const float reciprocal = recip_rn(scale);
  for (int j = 0; j < kBlock / 2; ++j) {
    codes[j] = static_cast<uint8_t>(e2m1_encode(x[2 * j], scale, reciprocal) |
                                    (e2m1_encode(x[2 * j + 1], scale, reciprocal) << 4));
  }
  return scale_code;
}

}  // namespace qwen3::kernels::codec
