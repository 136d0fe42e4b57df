// Two E2M1 codes times their E4M3 scale as a packed bf16x2 or f16x2, with integer shifts and two exact packed
// multiplies: the tensor-core product's B operand (nvfp4_matmul.cu) and the dequantize kernel's 16-bit output
// (nvfp4_dequantize.cu). Device only.
//
// A nibble's 3 magnitude bits shifted into the low exponent bits and the top mantissa bit make a raw value
// fp4 x 2^-126 (bf16) or fp4 x 2^-14 (f16); code 1 (0.5) lands on a subnormal. Multiplying by 2^126 (2^14)
// undoes the bias and then by the scale: both exact, subnormal inputs included (mul.bf16x2 / f16x2 without .ftz
// keep subnormals), since every E2M1 x E4M3 product is representable in bf16 and f16.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "nvfp4_codec.cuh"

namespace qwen3::kernels::pairs {

template <typename T>
struct PairFormat;
template <>
struct PairFormat<__nv_bfloat16> {
  static constexpr int kShift = 6;
  static constexpr uint32_t kMagnitudeMask = 0x01C001C0u;
  static constexpr uint32_t kUnbias = 0x7E807E80u;  // 2^126 twice
  __device__ static uint32_t mul2(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
  }
  __device__ static uint16_t from_float_bits(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
};
template <>
struct PairFormat<__half> {
  static constexpr int kShift = 3;
  static constexpr uint32_t kMagnitudeMask = 0x0E000E00u;
  static constexpr uint32_t kUnbias = 0x74007400u;  // 2^14 twice
  __device__ static uint32_t mul2(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
  }
  __device__ static uint16_t from_float_bits(float v) { return __half_as_ushort(__float2half_rn(v)); }
};

// The two nibbles at bits 12..15 and 28..31 of `word`, times the scale pair, as a packed pair (low half =
// the nibble at bits 12..15). Exact.
template <typename T>
__device__ __forceinline__ uint32_t decode_pair(uint32_t word, uint32_t scale_pair) {
  using F = PairFormat<T>;
  const uint32_t raw = (word & 0x80008000u) | ((word >> F::kShift) & F::kMagnitudeMask);
  return F::mul2(F::mul2(raw, F::kUnbias), scale_pair);
}

// E4M3 byte -> the scale in T, twice (exact: 4 significant bits, range 2^-9..448).
template <typename T>
__device__ __forceinline__ uint32_t scale_pair(uint8_t code) {
  const uint32_t half = PairFormat<T>::from_float_bits(codec::e4m3_to_float(code));
  return half | (half << 16);
}

// The 8 codes of a word (nibble i = element i) times one scale pair, in element order: four packed pairs,
// pair j = elements 2j (low half) and 2j + 1. decode_pair takes nibbles k and k + 4 (the word shifted so that
// nibble k sits at bits 12..15), and two byte permutes put the halves in order.
template <typename T>
__device__ __forceinline__ void decode_word(uint32_t word, uint32_t scales, uint32_t (&out)[4]) {
  const uint32_t p0 = decode_pair<T>(word << 12, scales);  // elements 0 and 4
  const uint32_t p1 = decode_pair<T>(word << 8, scales);   // 1 and 5
  const uint32_t p2 = decode_pair<T>(word << 4, scales);   // 2 and 6
  const uint32_t p3 = decode_pair<T>(word, scales);        // 3 and 7
  out[0] = __byte_perm(p0, p1, 0x5410);  // 0, 1
  out[1] = __byte_perm(p2, p3, 0x5410);  // 2, 3
  out[2] = __byte_perm(p0, p1, 0x7632);  // 4, 5
  out[3] = __byte_perm(p2, p3, 0x7632);  // 6, 7
}

}  // namespace qwen3::kernels::pairs
