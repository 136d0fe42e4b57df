// The canonical NVFP4 codec on the CPU (docs/nvfp4.md: the format and the decisions). Every other
// quantizer in the product is tested for byte equality against this file, so each arithmetic step below is
// spelled out in the order the spec (and the CUDA kernels) follow: no step may be reassociated or fused.
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "nvfp4/block16.h"
#include "qwen3/base/error.h"
#include "qwen3/nvfp4/nvfp4.h"

// The squared errors of the search mode are summed in a fixed tree; a fused multiply-add would round
// differently from the CUDA kernels, so contraction stays off whatever the compiler's default.
#if defined(__clang__)
#pragma clang fp contract(off)
#endif

// The row loops are compiled for AVX-512 and AVX2 as well as the baseline, chosen at load time, because the
// build targets generic x86-64. Every lane does the same IEEE operations in each clone, so the bytes are the
// same whichever clone runs.
#if defined(__x86_64__) && defined(__linux__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define QWEN3_NVFP4_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef QWEN3_NVFP4_CLONES
#define QWEN3_NVFP4_CLONES
#endif

namespace qwen3::nvfp4 {
namespace {

constexpr uint8_t kE4m3MaxFiniteCode = 0x7E;  // 448; 0x7F is NaN
constexpr float kE4m3MinNormal = 0.015625f;   // 2^-6
constexpr float kE2m1Max = 6.0f;

uint32_t float_bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

float float_from_bits(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// E4M3FN by moving its fields into an fp32: exponent bias 7 becomes 127, the 3 mantissa bits go to the top.
float decode_e4m3(uint8_t code) {
  const uint32_t sign = (code & 0x80u) << 24;
  const uint32_t exponent = (code >> 3) & 0x0Fu;
  const uint32_t mantissa = code & 0x07u;
  if (exponent == 0x0F && mantissa == 0x07) return std::numeric_limits<float>::quiet_NaN();
  if (exponent == 0) {  // subnormal: m/8 * 2^-6 = m * 2^-9, exact
    const float magnitude = static_cast<float>(mantissa) * (1.0f / 512.0f);
    return float_from_bits(float_bits(magnitude) | sign);
  }
  return float_from_bits(sign | ((exponent + 120u) << 23) | (mantissa << 20));
}

struct E4m3DecodeTable {
  float value[256];
  E4m3DecodeTable() {
    for (int code = 0; code < 256; ++code) value[code] = decode_e4m3(static_cast<uint8_t>(code));
  }
};
const E4m3DecodeTable& e4m3_table() {
  static const E4m3DecodeTable table;
  return table;
}

constexpr float kE2m1Magnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// x >= 0 and finite (the caller's promise). Normal range: round the 23-bit fp32 mantissa to 3 bits with ties
// to even by integer addition; a mantissa carry correctly bumps the exponent, and anything past 448 (including
// the 464..480 midpoint range that would round to the NaN pattern) saturates to 0x7E.
uint8_t encode_e4m3_rne_nonnegative(float x) {
  if (x >= kE4m3MinNormal) {
    const uint32_t bits = float_bits(x);
    const uint32_t rounded = bits + 0x7FFFFu + ((bits >> 20) & 1u);
    const uint32_t code = (rounded >> 20) - (120u << 3);
    return static_cast<uint8_t>(std::min<uint32_t>(code, kE4m3MaxFiniteCode));
  }
  // Subnormal range: multiples of 2^-9. x * 512 is exact and below 8; adding 2^23 rounds it to an integer,
  // ties to even, into the low mantissa bits. 8 is code 0x08 = 2^-6, the smallest normal, as it should be.
  // (NaN, met only on the way to the non-finite error, gives some code instead of an undefined conversion.)
  return static_cast<uint8_t>(float_bits(x * 512.0f + 8388608.0f) & 0x0Fu);
}

// Squared error of one block at scale s, in fp32: d_i = |x_i| - q_i*s (the product is exact), e_i = d_i*d_i,
// summed by the butterfly of nvfp4.h. Scale 0 leaves d_i = |x_i|: the all-zero block.
QWEN3_ALWAYS_INLINE float block_squared_error(const block16::F32x16& magnitude, float scale) {
  using block16::F32x16;
  const F32x16 quantized =
      scale > 0.0f ? block16::e2m1_magnitude_value(magnitude / block16::splat<F32x16>(scale)) * scale : F32x16{};
  const F32x16 difference = magnitude - quantized;
  return block16::butterfly_sum(difference * difference);
}

QWEN3_ALWAYS_INLINE uint8_t choose_scale_code(const block16::F32x16& magnitude, float amax, ScaleMode mode,
                                              const float* scale_of) {
  uint8_t rne_code = encode_e4m3_rne_nonnegative(amax / kE2m1Max);
  // E4M3's own range starts at 2^-9 (code 1): a block with a non-zero element never rounds to scale 0, which
  // would zero it whole; scale 2^-9 is no worse element by element (0 is on the E2M1 grid too). This is what
  // the "full E4M3 range, RNE" column of the spec's error table measures (0.118 at std 0.005; 0.136 without).
  if (rne_code == 0 && amax > 0.0f) rne_code = 1;
  if (mode == ScaleMode::rne) return rne_code;
  const int lowest = std::max(0, rne_code - 2);
  const int highest = std::min<int>(kE4m3MaxFiniteCode, rne_code + 2);
  uint8_t best_code = static_cast<uint8_t>(lowest);
  float best_error = block_squared_error(magnitude, scale_of[lowest]);
  for (int code = lowest + 1; code <= highest; ++code) {
    const float error = block_squared_error(magnitude, scale_of[code]);
    if (error < best_error) {  // strict: a tie keeps the smaller code
      best_error = error;
      best_code = static_cast<uint8_t>(code);
    }
  }
  return best_code;
}

// Quantizes rows [row_begin, row_end). Returns the flat index of the first non-finite element met, or -1.
// The check is once per row (a horizontal reduction per block would cost a fifth of the time); a row with a
// non-finite value gets unspecified bytes, and the caller throws.
QWEN3_NVFP4_CLONES
int64_t quantize_row_range(const float* x, int64_t row_begin, int64_t row_end, int64_t cols, uint8_t* codes,
                           uint8_t* scales, ScaleMode mode, const float* scale_of) {
  using block16::F32x16;
  using block16::I32x16;
  const int64_t blocks_per_row = cols / kBlock;
  for (int64_t row = row_begin; row < row_end; ++row) {
    I32x16 row_nonfinite{};
    for (int64_t block = 0; block < blocks_per_row; ++block) {
      const int64_t first = row * cols + block * kBlock;
      const F32x16 value = block16::load(x + first);
      const F32x16 magnitude = block16::abs(value);
      row_nonfinite |= block16::nonfinite_lanes(magnitude);
      const uint8_t scale_code = choose_scale_code(magnitude, block16::max_lane(magnitude), mode, scale_of);
      scales[row * blocks_per_row + block] = scale_code;
      if (scale_code == 0) {
        std::memset(codes + first / 2, 0, kBlock / 2);
        continue;
      }
      const I32x16 magnitude_code =
          block16::e2m1_magnitude_code(magnitude / block16::splat<F32x16>(scale_of[scale_code]));
      block16::store_packed(magnitude_code | block16::sign_bits(value, magnitude_code), codes + first / 2);
    }
    if (block16::any_lane(row_nonfinite)) {
      int64_t col = 0;
      while (std::isfinite(x[row * cols + col])) ++col;
      return row * cols + col;
    }
  }
  return -1;
}

QWEN3_NVFP4_CLONES
void dequantize_row_range(const uint8_t* codes, const uint8_t* scales, int64_t row_begin, int64_t row_end,
                          int64_t cols, float* out, const float* scale_of) {
  const int64_t blocks_per_row = cols / kBlock;
  for (int64_t row = row_begin; row < row_end; ++row) {
    for (int64_t block = 0; block < blocks_per_row; ++block) {
      const int64_t first = row * cols + block * kBlock;
      const float scale = scale_of[scales[row * blocks_per_row + block]];
      const block16::F32x16 values = block16::e2m1_decode(block16::load_packed(codes + first / 2)) * scale;
      std::memcpy(out + first, &values, sizeof values);
    }
  }
}

void check_shape(int64_t rows, int64_t cols, const char* what) {
  if (rows < 0 || cols < 0 || cols % kBlock != 0)
    throw Error(std::string("nvfp4 ") + what + ": shape [" + std::to_string(rows) + ", " + std::to_string(cols) +
                "] needs rows >= 0 and columns a multiple of 16");
}

// About 64 KiB of fp32 input per task: enough work to pay for a thread hand-off.
int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)); }

}  // namespace

ScaleMode scale_mode_from_name(std::string_view name) {
  if (name == "rne") return ScaleMode::rne;
  if (name == "search") return ScaleMode::search;
  throw UsageError("unknown NVFP4 scale mode '" + std::string(name) + "' (expected rne or search)");
}

const char* scale_mode_name(ScaleMode mode) { return mode == ScaleMode::search ? "search" : "rne"; }

float e4m3_to_float(uint8_t code) { return e4m3_table().value[code]; }

uint8_t e4m3_from_float_rne(float x) {
  if (!(x >= 0.0f) || !std::isfinite(x))
    throw Error("e4m3_from_float_rne: " + std::to_string(x) + " is not a finite non-negative value");
  return encode_e4m3_rne_nonnegative(x);
}

float e2m1_to_float(uint8_t code) {
  const float magnitude = kE2m1Magnitude[code & 0x07];
  return (code & 0x08) ? -magnitude : magnitude;
}

uint8_t e2m1_from_float(float v) {
  // The block rule on a splat, so that the scalar and the block paths cannot drift apart.
  const int32_t magnitude_code = block16::e2m1_magnitude_code(block16::splat<block16::F32x16>(std::fabs(v)))[0];
  return static_cast<uint8_t>(magnitude_code | ((v < 0.0f && magnitude_code != 0) ? 8 : 0));
}

void quantize_rows_cpu(const float* x, int64_t rows, int64_t cols, uint8_t* codes, uint8_t* scales,
                       ScaleMode mode) {
  check_shape(rows, cols, "quantize");
  if (rows == 0 || cols == 0) return;
  // Threads do not throw: each reports its first non-finite element and the smallest index overall is named,
  // so the message does not depend on the thread count.
  std::atomic<int64_t> first_nonfinite{INT64_MAX};
  at::parallel_for(0, rows, row_grain(cols), [&](int64_t begin, int64_t end) {
    const int64_t found = quantize_row_range(x, begin, end, cols, codes, scales, mode, e4m3_table().value);
    if (found < 0) return;
    int64_t current = first_nonfinite.load();
    while (found < current && !first_nonfinite.compare_exchange_weak(current, found)) {
    }
  });
  const int64_t found = first_nonfinite.load();
  if (found != INT64_MAX) {
    const float value = x[found];
    throw Error("nvfp4 quantize: non-finite value " + std::string(std::isnan(value) ? "nan" : value > 0 ? "inf" : "-inf") +
                " at row " + std::to_string(found / cols) + ", column " + std::to_string(found % cols));
  }
}

void dequantize_rows_cpu(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, float* out) {
  check_shape(rows, cols, "dequantize");
  if (rows == 0 || cols == 0) return;
  at::parallel_for(0, rows, row_grain(cols), [&](int64_t begin, int64_t end) {
    dequantize_row_range(codes, scales, begin, end, cols, out, e4m3_table().value);
  });
}

void NanScaleCodes::add(const uint8_t* scales, uint64_t n, uint64_t offset) {
  for (uint64_t i = 0; i < n; ++i)
    if ((scales[i] & 0x7F) == 0x7F && count++ == 0) first = offset + i;
}

std::string NanScaleCodes::describe(uint64_t blocks_per_row) const {
  const uint64_t per_row = blocks_per_row > 0 ? blocks_per_row : 1;
  return std::to_string(count) + " NaN E4M3 scale code" + (count == 1 ? "" : "s") + " (the first is row " +
         std::to_string(first / per_row) + ", block " + std::to_string(first % per_row) + ")";
}

}  // namespace qwen3::nvfp4
