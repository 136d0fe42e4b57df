// One NVFP4 block (16 floats) as one GCC/Clang vector: the codec's inner loops written once, compiled to
// AVX-512, AVX2, SSE or NEON by whichever target the including function has. Every lane operation is an IEEE
// fp32 operation or an exact integer/bit operation, so the results are the same on every target.
// Private to src/nvfp4/nvfp4.cpp.
#pragma once
#include <cstdint>
#include <cstring>

// Every function here is inlined into its caller, so the vector-argument ABI note of -Wpsabi is moot.
#pragma GCC diagnostic ignored "-Wpsabi"

#define QWEN3_ALWAYS_INLINE inline __attribute__((always_inline))

namespace qwen3::nvfp4::block16 {

typedef float F32x16 __attribute__((vector_size(64)));
typedef int32_t I32x16 __attribute__((vector_size(64)));
typedef uint32_t U32x16 __attribute__((vector_size(64)));
typedef int64_t I64x8 __attribute__((vector_size(64)));
typedef float F32x8 __attribute__((vector_size(32)));
typedef float F32x4 __attribute__((vector_size(16)));
typedef uint8_t U8x8 __attribute__((vector_size(8)));

template <typename Vector>
QWEN3_ALWAYS_INLINE Vector splat(float value) {
  return Vector{} + value;
}
QWEN3_ALWAYS_INLINE I32x16 splat_int(int32_t value) { return I32x16{} + value; }

QWEN3_ALWAYS_INLINE F32x16 load(const float* p) {
  F32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename Half, typename Whole>
QWEN3_ALWAYS_INLINE Half low_half(const Whole& v) {
  Half h;
  std::memcpy(&h, &v, sizeof h);
  return h;
}
template <typename Half, typename Whole>
QWEN3_ALWAYS_INLINE Half high_half(const Whole& v) {
  Half h;
  std::memcpy(&h, reinterpret_cast<const char*>(&v) + sizeof h, sizeof h);
  return h;
}

QWEN3_ALWAYS_INLINE F32x16 abs(const F32x16& x) { return (F32x16)((I32x16)x & splat_int(0x7FFFFFFF)); }

// All ones in lanes that are inf or NaN (NaN fails every comparison). Masks come from float comparisons and
// shifts only: GCC lowers integer vector comparisons lane by lane for AVX-512F without AVX-512DQ.
QWEN3_ALWAYS_INLINE I32x16 nonfinite_lanes(const F32x16& magnitude) {
  return ~(magnitude <= splat<F32x16>(3.40282347e38f));
}

QWEN3_ALWAYS_INLINE bool any_lane(const I32x16& mask) {
  const I64x8 pairs = (I64x8)mask;
  int64_t lanes[8];
  std::memcpy(lanes, &pairs, sizeof lanes);
  return (lanes[0] | lanes[1] | lanes[2] | lanes[3] | lanes[4] | lanes[5] | lanes[6] | lanes[7]) != 0;
}

QWEN3_ALWAYS_INLINE float max_lane(const F32x16& v) {  // v >= 0: order does not matter (NaN: any result)
  const F32x8 a = low_half<F32x8>(v), b = high_half<F32x8>(v);
  const F32x8 m8 = (F32x8)(((a > b) & (decltype(a > b))a) | (~(a > b) & (decltype(a > b))b));
  const F32x4 c = low_half<F32x4>(m8), d = high_half<F32x4>(m8);
  const F32x4 m4 = (F32x4)(((c > d) & (decltype(c > d))c) | (~(c > d) & (decltype(c > d))d));
  float lanes[4];
  std::memcpy(lanes, &m4, sizeof lanes);
  const float m2a = lanes[0] > lanes[2] ? lanes[0] : lanes[2], m2b = lanes[1] > lanes[3] ? lanes[1] : lanes[3];
  return m2a > m2b ? m2a : m2b;
}

// The spec's butterfly: lane i += lane i+8, then i+4, i+2, i+1 (the order the CUDA kernels follow too).
QWEN3_ALWAYS_INLINE float butterfly_sum(const F32x16& v) {
  const F32x8 s8 = low_half<F32x8>(v) + high_half<F32x8>(v);
  const F32x4 s4 = low_half<F32x4>(s8) + high_half<F32x4>(s8);
  float lanes[4];
  std::memcpy(lanes, &s4, sizeof lanes);
  const float s2a = lanes[0] + lanes[2], s2b = lanes[1] + lanes[3];
  return s2a + s2b;
}

// m = |v| >= 0 rounded to the E2M1 grid {0, .5, 1, 1.5, 2, 3, 4, 6} with ties to the even code and the
// clamp at 6: its magnitude code (0..7) and value. Like a float with a 1-bit mantissa: for 1 <= m <= 5 the
// fp32 mantissa is rounded to one bit, ties to even, by integer addition (a carry bumps the exponent);
// below 1 the grid is the multiples of 0.5, and m * 2 + 2^23 rounds m * 2 to an integer, ties to even, in
// the low mantissa bits; above 5 everything rounds (or clamps) to 6. Masks come from float comparisons only.
QWEN3_ALWAYS_INLINE void e2m1_round(const F32x16& m, I32x16* code, F32x16* value) {
  const F32x16 wide_bits_magic = splat<F32x16>(8388608.0f);  // 2^23
  const U32x16 bits = (U32x16)m;
  const U32x16 rounded = bits + 0x1FFFFFu + ((bits >> 22) & 1u);  // unsigned: NaN bits wrap harmlessly
  const I32x16 normal_code = (I32x16)(rounded >> 22) - (126 << 1);  // 1.0 -> 2, 1.5 -> 3, ..., 6.0 -> 7
  const F32x16 normal_value = (F32x16)(rounded & 0xFFC00000u);
  const F32x16 doubled_plus_magic = m * 2.0f + wide_bits_magic;  // m < 1: exact, one rounding
  const I32x16 small_code = (I32x16)doubled_plus_magic & 0x0F;     // 0, 1 or 2
  const F32x16 small_value = (doubled_plus_magic - wide_bits_magic) * 0.5f;
  const I32x16 is_normal = m >= splat<F32x16>(1.0f);
  const I32x16 clamped = m > splat<F32x16>(5.0f);
  *code = (clamped & 7) | (~clamped & ((is_normal & normal_code) | (~is_normal & small_code)));
  *value = (F32x16)((clamped & (I32x16)splat<F32x16>(6.0f)) |
                    (~clamped & ((is_normal & (I32x16)normal_value) | (~is_normal & (I32x16)small_value))));
}

QWEN3_ALWAYS_INLINE I32x16 e2m1_magnitude_code(const F32x16& m) {
  I32x16 code;
  F32x16 value;
  e2m1_round(m, &code, &value);
  return code;
}

QWEN3_ALWAYS_INLINE F32x16 e2m1_magnitude_value(const F32x16& m) {
  I32x16 code;
  F32x16 value;
  e2m1_round(m, &code, &value);
  return value;
}

// Codes 0..15 of lanes 2j, 2j+1 into byte j (2j in the low nibble). As 64-bit lanes (little-endian), a pair
// is c_2j + c_2j+1 * 2^32, and shifting by 28 moves c_2j+1 to bits 4..7.
QWEN3_ALWAYS_INLINE void store_packed(const I32x16& codes, uint8_t* out) {
  const I64x8 pairs = (I64x8)codes;
  const U8x8 bytes = __builtin_convertvector((pairs | (pairs >> 28)) & 0xFF, U8x8);
  std::memcpy(out, &bytes, sizeof bytes);
}

// The inverse: 8 bytes to 16 codes, lane 2j from the low nibble.
// The sign bit (8) of each code: set where x is negative and the magnitude code is non-zero (no -0).
QWEN3_ALWAYS_INLINE I32x16 sign_bits(const F32x16& x, const I32x16& magnitude_code) {
  const I32x16 negative = ((I32x16)x >> 31) & 1;
  const I32x16 nonzero = (magnitude_code + 7) >> 3;  // codes 0..7: 1 unless 0
  return (negative & nonzero) << 3;
}

QWEN3_ALWAYS_INLINE I32x16 load_packed(const uint8_t* in) {
  U8x8 bytes;
  std::memcpy(&bytes, in, sizeof bytes);
  const I64x8 wide = __builtin_convertvector(bytes, I64x8);
  return (I32x16)((wide & 0x0F) | ((wide >> 4) << 32));
}

// E2M1 code 0..15 to its fp32 value by building the bits: exponent field e (code bits 1..2) and mantissa bit
// m (bit 0) give (e + 126) << 23 | m << 22 for e > 0, and m ? 0.5 : 0 for e == 0; bit 3 is the sign.
QWEN3_ALWAYS_INLINE F32x16 e2m1_decode(const I32x16& code) {
  const I32x16 exponent = (code >> 1) & 3, mantissa = code & 1;
  const I32x16 normal = ((exponent + 126) << 23) | (mantissa << 22);
  const I32x16 subnormal = mantissa * 0x3F000000;  // 0.5 or 0
  const I32x16 is_normal = -((exponent + 3) >> 2);  // all ones where exponent is 1..3
  const I32x16 magnitude = (is_normal & normal) | (~is_normal & subnormal);
  return (F32x16)(magnitude | ((code & 8) << 28));
}

}  // namespace qwen3::nvfp4::block16
