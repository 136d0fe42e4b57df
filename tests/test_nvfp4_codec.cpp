// The canonical NVFP4 codec (docs/nvfp4.md) against values and a brute-force reference quantizer
// computed here independently: nearest-value searches over the formats' value lists instead of the codec's
// bit tricks and comparison chains.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "nvfp4/block16.h"
#include "qwen3/base/error.h"
#include "qwen3/nvfp4/nvfp4.h"
#include "qwen3/nvfp4/nvfp4_ops.h"

namespace qwen3::nvfp4 {
namespace {

// E4M3FN from its definition: sign, exponent bias 7, 3 mantissa bits, subnormal m/8 * 2^-6, NaN = S.1111.111.
double reference_e4m3(int code) {
  const int exponent = (code >> 3) & 15, mantissa = code & 7;
  if (exponent == 15 && mantissa == 7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude = exponent == 0 ? std::ldexp(mantissa, -9) : std::ldexp(8 + mantissa, exponent - 10);
  return (code & 0x80) ? -magnitude : magnitude;
}

const double kE2m1Grid[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

// Index of the nearest value in `values` (ascending), ties to the even index; above the last value: the last.
template <typename ValueOf>
int nearest_even_index(double x, int count, ValueOf value_of) {
  if (x >= value_of(count - 1)) return count - 1;  // (distances to huge x would tie in float64)
  int best = 0;
  for (int i = 1; i < count; ++i) {
    const double gap_best = std::fabs(x - value_of(best)), gap_i = std::fabs(x - value_of(i));
    if (gap_i < gap_best || (gap_i == gap_best && i % 2 == 0)) best = i;
  }
  return best;
}

int reference_e4m3_rne(double x) { return nearest_even_index(x, 0x7F, reference_e4m3); }

int reference_e2m1(double v) {
  const int magnitude = nearest_even_index(std::fabs(v), 8, [](int i) { return kE2m1Grid[i]; });
  return magnitude == 0 ? 0 : (v < 0 ? magnitude | 8 : magnitude);
}

double reference_e2m1_value(int code) { return (code & 8) ? -kE2m1Grid[code & 7] : kE2m1Grid[code & 7]; }

// One block by the spec's words, squared errors in float64 (the codec sums in fp32; they agree off exact ties).
void reference_quantize_block(const float* x, ScaleMode mode, int* codes, int* scale_code) {
  float amax = 0;
  for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(x[i]));
  const int rne_code = amax > 0 ? std::max(1, reference_e4m3_rne(amax / 6.0f)) : 0;  // lowest scale 2^-9
  auto codes_at = [&](int code, int* out) {
    const float scale = static_cast<float>(reference_e4m3(code));
    double error = 0;
    for (int i = 0; i < 16; ++i) {
      out[i] = scale == 0 ? 0 : reference_e2m1(x[i] / scale);
      const double d = x[i] - reference_e2m1_value(out[i]) * scale;
      error += d * d;
    }
    return error;
  };
  *scale_code = rne_code;
  if (mode == ScaleMode::search) {
    int scratch[16];
    double best = std::numeric_limits<double>::infinity();
    for (int code = std::max(0, rne_code - 2); code <= std::min(0x7E, rne_code + 2); ++code) {
      const double error = codes_at(code, scratch);
      if (error < best) best = error, *scale_code = code;
    }
  }
  codes_at(*scale_code, codes);
}

std::vector<float> gaussian(int64_t count, double std, uint32_t seed) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal(0.0f, static_cast<float>(std));
  std::vector<float> values(count);
  for (float& v : values) v = normal(generator);
  return values;
}

struct RawQuantized {
  std::vector<uint8_t> codes, scales;
};
RawQuantized quantize_raw(const std::vector<float>& x, int64_t rows, ScaleMode mode) {
  const int64_t cols = static_cast<int64_t>(x.size()) / rows;
  RawQuantized q{std::vector<uint8_t>(rows * cols / 2), std::vector<uint8_t>(rows * cols / 16)};
  quantize_rows_cpu(x.data(), rows, cols, q.codes.data(), q.scales.data(), mode);
  return q;
}

std::vector<float> dequantize_raw(const RawQuantized& q, int64_t rows) {
  const int64_t cols = static_cast<int64_t>(q.codes.size()) * 2 / rows;
  std::vector<float> out(rows * cols);
  dequantize_rows_cpu(q.codes.data(), q.scales.data(), rows, cols, out.data());
  return out;
}

int nibble(const std::vector<uint8_t>& codes, int64_t index) {
  return index % 2 == 0 ? codes[index / 2] & 15 : codes[index / 2] >> 4;
}

TEST(Nvfp4Codec, EveryE4m3CodeDecodes) {
  for (int code = 0; code < 256; ++code) {
    const double expected = reference_e4m3(code);
    const float got = e4m3_to_float(static_cast<uint8_t>(code));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << code;
    } else {
      EXPECT_EQ(static_cast<double>(got), expected) << code;
      EXPECT_EQ(std::signbit(got), (code & 0x80) != 0) << code;  // 0x80 is -0
    }
  }
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x78), 256.0f);  // exponent 15 is finite except m = 7
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)) && std::isnan(e4m3_to_float(0xFF)));
}

TEST(Nvfp4Codec, EveryE2m1CodeDecodes) {
  const float expected[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int code = 0; code < 16; ++code) EXPECT_EQ(e2m1_to_float(static_cast<uint8_t>(code)), expected[code]);
}

TEST(Nvfp4Codec, E2m1RoundsTiesToEvenAndClamps) {
  const std::pair<float, float> ties[] = {{0.25f, 0}, {0.75f, 1}, {1.25f, 1}, {1.75f, 2},
                                          {2.5f, 2},  {3.5f, 4},  {5.0f, 4}};
  for (auto [input, value] : ties) {
    EXPECT_EQ(e2m1_to_float(e2m1_from_float(input)), value) << input;
    EXPECT_EQ(e2m1_to_float(e2m1_from_float(-input)), -value) << -input;
  }
  EXPECT_EQ(e2m1_from_float(6.5f), 7);
  EXPECT_EQ(e2m1_from_float(1e30f), 7);
  EXPECT_EQ(e2m1_from_float(-100.0f), 15);
  EXPECT_EQ(e2m1_from_float(-0.1f), 0);  // never -0
  EXPECT_EQ(e2m1_from_float(-0.0f), 0);
  std::mt19937 generator(1);
  std::uniform_real_distribution<float> uniform(-7.0f, 7.0f);
  for (int i = 0; i < 20000; ++i) {
    const float v = uniform(generator);
    ASSERT_EQ(e2m1_from_float(v), reference_e2m1(v)) << v;
  }
}

// The block rounding (the codec's vector path) against the brute-force nearest value, code and value, on a
// sweep over the fp32 bit patterns of [0, 8] (every 251st pattern) plus every midpoint and its neighbours.
TEST(Nvfp4Codec, BlockE2m1RoundingMatchesTheReferenceOnASweep) {
  std::vector<float> inputs;
  for (uint32_t bits = 0; bits <= 0x41000000u; bits += 251) {
    float m;
    std::memcpy(&m, &bits, sizeof m);
    inputs.push_back(m);
  }
  for (int i = 0; i < 7; ++i) {
    const float midpoint = static_cast<float>((kE2m1Grid[i] + kE2m1Grid[i + 1]) / 2);
    inputs.insert(inputs.end(), {midpoint, std::nextafter(midpoint, 0.0f), std::nextafter(midpoint, 9.0f)});
  }
  inputs.insert(inputs.end(), {6.0f, 1e30f, std::numeric_limits<float>::infinity()});
  while (inputs.size() % 16) inputs.push_back(0.0f);
  for (size_t first = 0; first < inputs.size(); first += 16) {
    block16::I32x16 code;
    block16::F32x16 value;
    block16::e2m1_round(block16::load(&inputs[first]), &code, &value);
    for (int lane = 0; lane < 16; ++lane) {
      const float m = inputs[first + lane];
      ASSERT_EQ(code[lane], reference_e2m1(m)) << m;
      ASSERT_EQ(static_cast<double>(value[lane]), kE2m1Grid[code[lane]]) << m;
    }
  }
}

TEST(Nvfp4Codec, E4m3EncodeRoundsToNearestEvenWithSubnormalsAndSaturation) {
  for (int code = 0; code < 0x7E; ++code) {
    const double low = reference_e4m3(code), high = reference_e4m3(code + 1);
    const double midpoint = (low + high) / 2;  // exact in fp32: one more mantissa bit than E4M3
    EXPECT_EQ(e4m3_from_float_rne(static_cast<float>(low)), code);
    EXPECT_EQ(e4m3_from_float_rne(static_cast<float>(midpoint)), code % 2 == 0 ? code : code + 1) << code;
    EXPECT_EQ(e4m3_from_float_rne(std::nextafter(static_cast<float>(midpoint), 0.0f)), code) << code;
    EXPECT_EQ(e4m3_from_float_rne(std::nextafter(static_cast<float>(midpoint), 1e9f)), code + 1) << code;
  }
  EXPECT_EQ(e4m3_from_float_rne(448.0f), 0x7E);
  EXPECT_EQ(e4m3_from_float_rne(464.0f), 0x7E);  // would round to 480, the NaN pattern
  EXPECT_EQ(e4m3_from_float_rne(1e30f), 0x7E);
  EXPECT_EQ(e4m3_from_float_rne(std::numeric_limits<float>::max()), 0x7E);
  EXPECT_EQ(e4m3_from_float_rne(std::ldexp(1.0f, -10)), 0);  // half the smallest subnormal: tie to 0
  EXPECT_EQ(e4m3_from_float_rne(std::ldexp(1.01f, -10)), 1);
  EXPECT_EQ(e4m3_from_float_rne(std::numeric_limits<float>::denorm_min()), 0);
  EXPECT_EQ(e4m3_from_float_rne(0.0f), 0);
  EXPECT_THROW(e4m3_from_float_rne(-1.0f), Error);
  EXPECT_THROW(e4m3_from_float_rne(std::nanf("")), Error);
  EXPECT_THROW(e4m3_from_float_rne(std::numeric_limits<float>::infinity()), Error);
  std::mt19937 generator(2);
  std::uniform_real_distribution<float> exponent(-14.0f, 10.0f);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::exp2(exponent(generator));
    ASSERT_EQ(e4m3_from_float_rne(x), reference_e4m3_rne(x)) << x;
  }
}

TEST(Nvfp4Codec, ScaleModeNames) {
  EXPECT_EQ(scale_mode_from_name("rne"), ScaleMode::rne);
  EXPECT_EQ(scale_mode_from_name("search"), ScaleMode::search);
  EXPECT_STREQ(scale_mode_name(ScaleMode::search), "search");
  EXPECT_THROW(scale_mode_from_name("RNE"), UsageError);
}

TEST(Nvfp4Codec, ZeroAndTinyBlocks) {
  std::vector<float> x(80, 0.0f);
  for (int i = 16; i < 32; ++i) x[i] = -0.0f;
  for (int i = 32; i < 48; ++i) x[i] = (i % 2 ? -1 : 1) * std::ldexp(1.0f, -13);  // below half of 2^-9 / 0.5
  for (int i = 48; i < 64; ++i) x[i] = std::numeric_limits<float>::denorm_min();
  x[64] = 0.0009f;  // amax / 6 rounds to 0, yet at the smallest scale 2^-9 it is code 1 (0.5 * 2^-9)
  for (ScaleMode mode : {ScaleMode::rne, ScaleMode::search}) {
    const RawQuantized q = quantize_raw(x, 1, mode);
    EXPECT_EQ(q.scales[0], 0);  // all-zero blocks get scale 0 in both modes
    EXPECT_EQ(q.scales[1], 0);
    // Non-zero blocks start at scale 2^-9 (rne); search ties every candidate there and keeps code 0.
    EXPECT_EQ(q.scales[2], mode == ScaleMode::rne ? 1 : 0);
    EXPECT_EQ(q.scales[3], mode == ScaleMode::rne ? 1 : 0);
    for (int j = 0; j < 32; ++j) EXPECT_EQ(q.codes[j], 0) << j;  // no -0 either
    EXPECT_EQ(q.scales[4], 1);
    EXPECT_EQ(q.codes[32], 0x01);
    EXPECT_EQ(dequantize_raw(q, 1)[64], std::ldexp(1.0f, -10));
  }
}

TEST(Nvfp4Codec, NibbleOrderIsElementTwoJInTheLowNibble) {
  std::vector<float> x(16, 0.0f);
  x[0] = 6.0f;    // amax 6: scale 1 (code 0x38), element 0 -> code 7
  x[1] = -0.5f;   // code 9
  x[14] = 1.5f;   // code 3
  x[15] = -4.0f;  // code 14
  const RawQuantized q = quantize_raw(x, 1, ScaleMode::rne);
  EXPECT_EQ(q.scales[0], 0x38);
  EXPECT_EQ(q.codes[0], 0x97);
  EXPECT_EQ(q.codes[7], 0xE3);
  for (int j = 1; j < 7; ++j) EXPECT_EQ(q.codes[j], 0);
}

TEST(Nvfp4Codec, NonFiniteInputIsAnErrorNamingTheFirstPosition) {
  const int64_t rows = 64, cols = 256;
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()}) {
    std::vector<float> x = gaussian(rows * cols, 1.0, 3);
    x[50 * cols + 200] = bad;
    x[37 * cols + 21] = bad;  // the first one in row-major order, whichever thread meets it
    for (ScaleMode mode : {ScaleMode::rne, ScaleMode::search}) {
      try {
        quantize_raw(x, rows, mode);
        ADD_FAILURE() << "no error for " << bad;
      } catch (const Error& error) {
        EXPECT_NE(std::string(error.what()).find("row 37, column 21"), std::string::npos) << error.what();
      }
    }
  }
}

TEST(Nvfp4Codec, MatchesTheBruteForceReference) {
  const int64_t rows = 48, cols = 64;
  std::vector<float> x = gaussian(rows * cols, 1.0, 4);
  // Rows at every magnitude: subnormal and saturating scales, the clamp, sign mixes; and exact grid ties.
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t col = 0; col < cols; ++col) x[row * cols + col] *= std::ldexp(1.0f, static_cast<int>(row) - 24);
  const float tie_block[16] = {6, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5, -6, -0.25f, -0.75f, -1.25f, -1.75f,
                               -2.5f, -3.5f, -5};
  std::copy(tie_block, tie_block + 16, x.begin() + 24 * cols);
  for (ScaleMode mode : {ScaleMode::rne, ScaleMode::search}) {
    const RawQuantized q = quantize_raw(x, rows, mode);
    for (int64_t block = 0; block < rows * cols / 16; ++block) {
      int codes[16], scale_code;
      reference_quantize_block(&x[block * 16], mode, codes, &scale_code);
      ASSERT_EQ(q.scales[block], scale_code) << scale_mode_name(mode) << " block " << block;
      for (int i = 0; i < 16; ++i) ASSERT_EQ(nibble(q.codes, block * 16 + i), codes[i]) << "block " << block;
    }
  }
}

TEST(Nvfp4Codec, DequantizeIsExactAndRoundTripsAreBounded) {
  const int64_t rows = 32, cols = 128;
  const std::vector<float> x = gaussian(rows * cols, 1.0, 5);  // normal-range scales: the bounds below hold
  const RawQuantized q = quantize_raw(x, rows, ScaleMode::rne);
  const std::vector<float> y = dequantize_raw(q, rows);
  for (int64_t i = 0; i < rows * cols; ++i) {
    const double scale = reference_e4m3(q.scales[i / 16]);
    ASSERT_EQ(static_cast<double>(y[i]), reference_e2m1_value(nibble(q.codes, i)) * scale) << i;
    EXPECT_LE(std::fabs(x[i] - y[i]), scale) << i;  // half a grid gap (<= 1) or the clamp (<= 0.375)
    EXPECT_TRUE(y[i] == 0 || std::signbit(y[i]) == std::signbit(x[i])) << i;
  }
  // With normal-range scales the max element lands on code 7, so quantizing the result gives it back.
  const RawQuantized again = quantize_raw(y, rows, ScaleMode::rne);
  EXPECT_EQ(again.codes, q.codes);
  EXPECT_EQ(again.scales, q.scales);
}

TEST(Nvfp4Codec, SearchIsNeverWorseThanRnePerBlock) {
  const int64_t rows = 64, cols = 1024;
  std::vector<float> x = gaussian(rows * cols, 0.01, 6);
  for (int64_t i = 0; i < rows * cols; i += 97) x[i] *= 8;  // outliers
  const std::vector<float> by_rne = dequantize_raw(quantize_raw(x, rows, ScaleMode::rne), rows);
  const std::vector<float> by_search = dequantize_raw(quantize_raw(x, rows, ScaleMode::search), rows);
  int64_t improved = 0;
  for (int64_t block = 0; block < rows * cols / 16; ++block) {
    double rne_error = 0, search_error = 0;
    for (int64_t i = block * 16; i < block * 16 + 16; ++i) {
      rne_error += std::pow(double(x[i]) - by_rne[i], 2);
      search_error += std::pow(double(x[i]) - by_search[i], 2);
    }
    ASSERT_LE(search_error, rne_error * (1 + 1e-5)) << "block " << block;  // fp32 vs fp64 sums
    improved += search_error < rne_error;
  }
  EXPECT_GT(improved, rows * cols / 16 / 4);
}

TEST(Nvfp4Codec, ReproducesTheErrorTableOfTheSpec) {
  struct Row {
    double std, rne, search;
  };
  const Row table[] = {{0.005, 0.118, 0.109}, {0.02, 0.103, 0.090}, {0.05, 0.096, 0.087}};
  const int64_t rows = 1024, cols = 1024;
  for (const Row& row : table) {
    const std::vector<float> x = gaussian(rows * cols, row.std, 7);
    for (ScaleMode mode : {ScaleMode::rne, ScaleMode::search}) {
      const std::vector<float> y = dequantize_raw(quantize_raw(x, rows, mode), rows);
      double error = 0, norm = 0;
      for (int64_t i = 0; i < rows * cols; ++i) error += std::pow(double(x[i]) - y[i], 2), norm += double(x[i]) * x[i];
      const double relative = std::sqrt(error / norm);
      EXPECT_NEAR(relative, mode == ScaleMode::rne ? row.rne : row.search, 0.002)
          << "std " << row.std << " " << scale_mode_name(mode);
    }
  }
}

TEST(Nvfp4Codec, BytesDoNotDependOnTheThreadCount) {
  const int64_t rows = 256, cols = 512;
  const std::vector<float> x = gaussian(rows * cols, 0.02, 8);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const RawQuantized single = quantize_raw(x, rows, ScaleMode::search);
  at::set_num_threads(std::max(threads, 2));
  const RawQuantized multi = quantize_raw(x, rows, ScaleMode::search);
  at::set_num_threads(threads);
  EXPECT_EQ(single.codes, multi.codes);
  EXPECT_EQ(single.scales, multi.scales);
}

TEST(Nvfp4Codec, RejectsBadShapes) {
  std::vector<float> x(24, 1.0f);
  std::vector<uint8_t> codes(12), scales(2);
  EXPECT_THROW(quantize_rows_cpu(x.data(), 1, 24, codes.data(), scales.data(), ScaleMode::rne), Error);
  EXPECT_THROW(dequantize_rows_cpu(codes.data(), scales.data(), 1, 24, x.data()), Error);
}

}  // namespace
}  // namespace qwen3::nvfp4
