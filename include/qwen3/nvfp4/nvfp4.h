// NVFP4 as this project encodes it (docs/nvfp4.md): FP4 E2M1 codes, two a byte
// (element 2j in the low nibble), one FP8 E4M3 scale per 16 consecutive elements of a row, no tensor scale.
// The CPU functions here are the canonical quantizer: every other path (CUDA, STE forward, optimizer,
// exporter) must produce the same bytes for the same input.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace qwen3::nvfp4 {

constexpr int64_t kBlock = 16;  // elements per scale

enum class ScaleMode {
  rne,     // s = e4m3_rne(amax / 6)
  search,  // s and its two E4M3 neighbours either side; least squared error, ties to the smaller code
};
// Arithmetic every implementation follows to give the same bytes (all fp32, IEEE round to nearest, no FMA):
//   amax = max_i |x_i|;  c0 = e4m3_from_float_rne(amax / 6.0f)  (a correctly rounded fp32 division first),
//     then c0 = 1 if c0 == 0 and amax > 0 (E4M3's range starts at 2^-9: only an all-zero block gets scale 0
//     from the rounding; the spec's error table is measured this way);
//   rne: the scale code is c0;
//   search: candidates are the codes max(0, c0-2) .. min(0x7E, c0+2) in increasing order; for a candidate of
//     value s, q_i = e2m1 value of (|x_i| / s) (or 0 when s == 0), d_i = |x_i| - q_i * s (the product is exact),
//     e_i = d_i * d_i, err = the butterfly sum  e_i += e_{i+8} (i<8), += e_{i+4} (i<4), += e_{i+2}, += e_{i+1};
//     the first candidate with the strictly smallest err wins;
//   codes: c_i = e2m1_from_float(x_i / s) (x_i / s correctly rounded; all codes 0 when the scale code is 0).
// Errors past fp32's range (|x| beyond ~1.8e19) are +inf for every candidate, so the smallest code wins there.
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

// NaN E4M3 scale codes (0x7F, 0xFF: the whole block decodes to NaN) in a scale matrix read in pieces: add each
// piece with its offset into the matrix, then describe() names the count and the first bad block. One rule for
// the model loader (which refuses them) and `inspect` (which reports them).
struct NanScaleCodes {
  uint64_t count = 0, first = 0;  // `first`: byte index in the matrix of the first NaN code
  void add(const uint8_t* scales, uint64_t n, uint64_t offset);
  // "N NaN E4M3 scale codes (the first is row R, block B)" for a matrix of `blocks_per_row` columns.
  std::string describe(uint64_t blocks_per_row) const;
};

}  // namespace qwen3::nvfp4
