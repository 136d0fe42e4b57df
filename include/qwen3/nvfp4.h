// NVFP4 as this project encodes it (../shared/docs/nvfp4.md, docs/nvfp4.md): FP4 E2M1 codes, two a byte
// (element 2j in the low nibble), one FP8 E4M3 scale per 16 consecutive elements of a row, no tensor scale.
// The CPU functions here are the canonical quantizer: every other path (CUDA, STE forward, optimizer,
// exporter) must produce the same bytes for the same input.
#pragma once
#include <cstdint>
#include <string_view>

namespace qwen3::nvfp4 {

constexpr int64_t kBlock = 16;  // elements per scale

enum class ScaleMode {
  rne,     // s = e4m3_rne(amax / 6)
  search,  // s and its two E4M3 neighbours either side; least squared error, ties to the smaller code
};
ScaleMode scale_mode_from_name(std::string_view name);  // "rne" | "search"; UsageError otherwise
const char* scale_mode_name(ScaleMode mode);

// Scalar format rules.
float e4m3_to_float(uint8_t code);  // NaN only for 0x7F / 0xFF; max finite 448; subnormals m/8 * 2^-6
uint8_t e4m3_from_float_rne(float x);  // x >= 0 and finite: round to nearest even, saturate at 448
float e2m1_to_float(uint8_t code);  // code 0..15; bit 3 is the sign
uint8_t e2m1_from_float(float v);   // |v| clamped to 6, ties to even code, never -0

// The canonical CPU codec on raw row-major buffers. cols % 16 == 0.
// Non-finite input is an error (qwen3::Error naming the row and column), never garbage bytes.
void quantize_rows_cpu(const float* x, int64_t rows, int64_t cols, uint8_t* codes, uint8_t* scales,
                       ScaleMode mode);
void dequantize_rows_cpu(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, float* out);

}  // namespace qwen3::nvfp4
