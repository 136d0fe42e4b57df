// NVFP4 quantize/dequantize kernels against the canonical CPU codec (qwen3::nvfp4::*_rows_cpu), byte for byte.
// The first group runs the kernels' own per-element code (kernels/nvfp4_codec.cuh) on the host, so the
// arithmetic is proven equal to the CPU codec on every machine, GPU or not; the rest launch the kernels and
// skip cleanly without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <vector>

#include "gpu_test_util.h"
#include "nvfp4_codec.cuh"
#include "nvfp4_test_data.h"
#include "qwen3/nvfp4/nvfp4.h"
#include "qwen3_kernels.h"

namespace qwen3 {
namespace {

namespace codec = kernels::codec;
using kernels::KernelDType;
using gpu_test::DeviceBuffer;

// ---- The kernels' arithmetic on the host (no GPU needed) ----

TEST(Nvfp4KernelCodec, E4m3DecodeMatchesCpuForAll256Codes) {
  for (int code = 0; code < 256; ++code)
    EXPECT_TRUE(gpu_test::same_float(codec::e4m3_to_float(static_cast<uint8_t>(code)),
                                     nvfp4::e4m3_to_float(static_cast<uint8_t>(code))))
        << "code " << code;
}

TEST(Nvfp4KernelCodec, E4m3EncodeMatchesCpu) {
  std::vector<float> probes;
  for (int code = 0; code < codec::kE4m3MaxCode; ++code) {  // every midpoint and its fp32 neighbours
    const float mid = 0.5f * (codec::e4m3_to_float(static_cast<uint8_t>(code)) +
                              codec::e4m3_to_float(static_cast<uint8_t>(code + 1)));
    probes.insert(probes.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY),
                                 codec::e4m3_to_float(static_cast<uint8_t>(code))});
  }
  for (float v : {448.0f, 455.9f, 463.99f, 464.0f, 470.0f, 480.0f, 1e9f, FLT_MAX, 0.0f, 1e-45f, 0x1p-10f})
    probes.push_back(v);
  for (uint32_t bits = 0; bits < 0x43FA0000u; bits += 251) {  // a sweep of [0, 500] in fp32 bit order
    float v;
    std::memcpy(&v, &bits, 4);
    probes.push_back(v);
  }
  for (float v : probes)
    ASSERT_EQ(codec::e4m3_from_float_rne(v), nvfp4::e4m3_from_float_rne(v)) << "x = " << v;
}

TEST(Nvfp4KernelCodec, E2m1EncodeMatchesCpuAtEveryMidpoint) {
  for (float mid : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 7.0f, 0.0f, 1e-30f, 1e30f})
    for (float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)})
      for (float sign : {1.0f, -1.0f})
        EXPECT_EQ(codec::e2m1_encode(sign * v, 1.0f, 1.0f), nvfp4::e2m1_from_float(sign * v)) << sign * v;
  EXPECT_EQ(codec::e2m1_encode(-0.0f, 1.0f, 1.0f), 0u);
  EXPECT_EQ(codec::e2m1_encode(-0.1f, 1.0f, 1.0f), 0u);  // rounds to zero: no -0 code
}

// divide_by_scale replaces one IEEE division per element with a shared reciprocal and one correction step.
// It must equal RN(x / s) for every quotient that can change a code (about 2^-4 .. 2^4): checked for every
// E4M3 mantissa of s (8 normal ones; subnormal scales have the same mantissas), scales at both ends of the
// range and in the middle, and a stride through all 2^23 mantissas of x over 7 binades of the quotient.
TEST(Nvfp4KernelCodec, DivideByScaleIsCorrectlyRoundedOverTheCodeRange) {
  int64_t checked = 0;
  for (int mantissa = 0; mantissa < 8; ++mantissa)
    for (int exponent : {-9, -6, -1, 0, 5, 8}) {
      const float s = std::ldexp(1.0f + mantissa / 8.0f, exponent);
      const float reciprocal = 1.0f / s;
      for (int quotient_exponent = -4; quotient_exponent <= 3; ++quotient_exponent)
        for (uint32_t x_mantissa = mantissa; x_mantissa < (1u << 23); x_mantissa += 89) {
          const uint32_t bits = (static_cast<uint32_t>(127 + exponent + quotient_exponent) << 23) | x_mantissa;
          float x;
          std::memcpy(&x, &bits, 4);
          ASSERT_EQ(gpu_test::float_bits(codec::divide_by_scale(x, s, reciprocal)), gpu_test::float_bits(x / s))
              << "x = " << x << ", s = " << s;
          ++checked;
        }
    }
  EXPECT_GT(checked, 4000000);
}

// The device's E4M3 decode (the code's bits as a scaled-down fp32, times 2^120; NaN by a test) against the case
// form, all 256 codes bit for bit (NaN's sign and bits, -0). Fails with the rebias off by one (checked).
TEST(Nvfp4KernelCodec, E4m3DecodeByScalingEqualsTheCaseForm) {
  for (int code = 0; code < 256; ++code)
    EXPECT_EQ(gpu_test::float_bits(codec::e4m3_to_float_by_scaling(static_cast<uint8_t>(code))),
              gpu_test::float_bits(codec::e4m3_to_float(static_cast<uint8_t>(code))))
        << "code " << code;
}

// The device's E2M1 decode (the code's bits as an fp32 subnormal, times 2^126) against the host's integer form,
// all 16 codes, bit for bit (-0 for code 8 included). Fails with the sign or the exponent bits misplaced.
TEST(Nvfp4KernelCodec, E2m1DecodeByScalingEqualsTheIntegerForm) {
  for (uint32_t code = 0; code < 16; ++code) {
    EXPECT_EQ(gpu_test::float_bits(codec::e2m1_to_float_by_scaling(code)), gpu_test::float_bits(codec::e2m1_to_float(code)))
        << "code " << code;
    EXPECT_EQ(codec::e2m1_to_float(code), (code & 8u ? -1.0f : 1.0f) * codec::e2m1_magnitude(code)) << "code " << code;
  }
}

// The quantize kernels' E2M1 code from the quotient's bits (about half the instructions of the seven compares)
// against the compares, which are the definition: a stride through every non-negative fp32 and infinity, each
// with both signs, and a few ulps either side of every threshold and of 1 (where the two forms meet). The whole
// 2^32 was compared once when it was written (0 differences). Fails with ties rounded up instead of to even.
TEST(Nvfp4KernelCodec, MagnitudeCodeFromBitsEqualsTheComparisons) {
  std::vector<float> probes{0.0f, 1e-45f, FLT_MIN, FLT_MAX, INFINITY};
  for (float edge : {0.25f, 0.75f, 1.0f, 1.25f, 1.75f, 2.0f, 2.5f, 3.5f, 4.0f, 5.0f, 6.0f, 7.0f}) {
    float below = edge, above = edge;
    for (int k = 0; k < 4; ++k) {
      probes.insert(probes.end(), {below, above});
      below = std::nextafter(below, 0.0f);
      above = std::nextafter(above, INFINITY);
    }
  }
  int64_t checked = 0;
  for (uint64_t bits = 0; bits < 0x7F800000u; bits += 193) {
    float v;
    const uint32_t b = static_cast<uint32_t>(bits);
    std::memcpy(&v, &b, 4);
    probes.push_back(v);
  }
  for (float v : probes)
    for (float sign : {1.0f, -1.0f}) {
      ASSERT_EQ(codec::e2m1_magnitude_code_from_bits(sign * v), codec::e2m1_magnitude_code(v)) << sign * v;
      ++checked;
    }
  EXPECT_GT(checked, 20000000);
}

// The operand's E2M1 value straight from the quotient (e2m1_value_nearest, what scaled_operand multiplies by
// the scale) against the code and its decoding, which define it: the magnitude code by the seven comparisons, the
// sign only on a non-zero magnitude, e2m1_to_float. A stride through every non-negative fp32 and infinity with both
// signs, and a few ulps either side of every threshold, of 1 (where its two forms meet) and of 6, 7 and 8 (the
// cap). Bit for bit, so -0 would fail. Fails with ties rounded up, without the cap, or with the sign kept on zero
// (checked).
TEST(Nvfp4KernelCodec, E2m1ValueEqualsTheCodeDecoded) {
  std::vector<float> probes{0.0f, 1e-45f, FLT_MIN, FLT_MAX, INFINITY};
  for (float edge : {0.25f, 0.75f, 1.0f, 1.25f, 1.75f, 2.0f, 2.5f, 3.5f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f}) {
    float below = edge, above = edge;
    for (int k = 0; k < 4; ++k) {
      probes.insert(probes.end(), {below, above});
      below = std::nextafter(below, 0.0f);
      above = std::nextafter(above, INFINITY);
    }
  }
  for (uint64_t bits = 0; bits < 0x7F800000u; bits += 211) {
    float v;
    const uint32_t b = static_cast<uint32_t>(bits);
    std::memcpy(&v, &b, 4);
    probes.push_back(v);
  }
  int64_t checked = 0;
  for (float v : probes)
    for (float sign : {1.0f, -1.0f}) {
      const float x = sign * v;
      const uint32_t magnitude = codec::e2m1_magnitude_code(v);
      const uint32_t code = magnitude | (magnitude != 0u && x < 0.0f ? 8u : 0u);
      ASSERT_EQ(gpu_test::float_bits(codec::e2m1_value_nearest(x)), gpu_test::float_bits(codec::e2m1_to_float(code)))
          << x;
      ++checked;
    }
  EXPECT_GT(checked, 20000000);
}

// The scale code's RN(amax / 6) by a Markstein step instead of a division: the quotient is exact from 2^-125 up
// and the scale code equal for every input (the whole 2^31 compared once when written: 0 differences; here a
// stride, and every seventh input below 2^-124, where the quotient becomes subnormal). Fails with the
// correction step dropped (q = RN(amax * RN(1/6)) alone).
TEST(Nvfp4KernelCodec, ScaleCodeWithoutADivisionEqualsTheDivision) {
  const auto by_division = [](float amax) {
    const uint8_t code = codec::e4m3_from_float_rne(codec::div_rn(amax, 6.0f));
    return (code == 0 && amax > 0.0f) ? uint8_t{1} : code;
  };
  int64_t checked = 0;
  const auto same = [&](uint32_t bits) {  // false (and the test failed) at the first difference
    float amax;
    std::memcpy(&amax, &bits, 4);
    ++checked;
    if (codec::rne_scale_code(amax) != by_division(amax)) {
      ADD_FAILURE() << "scale code of " << amax << ": " << int(codec::rne_scale_code(amax)) << " vs "
                    << int(by_division(amax));
      return false;
    }
    if (amax >= 0x1p-125f && gpu_test::float_bits(codec::divide_by_6(amax)) != gpu_test::float_bits(amax / 6.0f)) {
      ADD_FAILURE() << amax << " / 6: " << codec::divide_by_6(amax) << " vs " << amax / 6.0f;
      return false;
    }
    return true;
  };
  for (uint64_t bits = 0; bits < 0x7F800000u; bits += 211)
    if (!same(static_cast<uint32_t>(bits))) return;
  for (uint32_t bits = 0x00000000u; bits < 0x01800000u; bits += 7)  // up to 2^-124
    if (!same(bits)) return;
  if (!same(0x7F7FFFFFu)) return;  // FLT_MAX
  EXPECT_GT(checked, 13000000);
}

// A block's maximum that is NaN when any element is NaN and infinite when one is infinite (and none NaN),
// whichever position: what tells the kernels a block is not finite, in place of a test an element.
TEST(Nvfp4KernelCodec, BlockMaximumCarriesNonFiniteElements) {
  for (float bad : {NAN, -NAN, INFINITY, -INFINITY})
    for (int at = 0; at < 16; ++at) {
      float amax = 0.0f;
      for (int i = 0; i < 16; ++i) amax = codec::max_abs_nan(amax, i == at ? bad : 0.5f * static_cast<float>(i) - 3.0f);
      EXPECT_FALSE(codec::finite_maximum(amax)) << bad << " at " << at;
      EXPECT_EQ(std::isnan(amax), std::isnan(bad)) << bad << " at " << at;
    }
  float amax = 0.0f;
  for (float x : {-0.0f, 1e-45f, -3.5f, FLT_MAX, -FLT_MAX, 2.0f}) amax = codec::max_abs_nan(amax, x);
  EXPECT_TRUE(codec::finite_maximum(amax));
  EXPECT_EQ(amax, FLT_MAX);
}

// The whole block algorithm the kernels run, against the CPU codec, on the fp32, bf16 and f16 views.
TEST(Nvfp4KernelCodec, HostRunOfKernelBlockCodeMatchesCpuCodec) {
  int64_t rows = 0;
  std::vector<float> inputs = gpu_test::blocks_to_matrix(gpu_test::adversarial_blocks(), 16, rows);
  for (float stddev : {0.005f, 0.02f, 1.0f}) {  // plus 3 x 64 rows of Gaussian weights at typical scales
    const std::vector<float> more = gpu_test::gaussian(64 * 256, stddev, static_cast<uint32_t>(stddev * 1000));
    inputs.insert(inputs.end(), more.begin(), more.end());
    rows += 64;
  }
  for (KernelDType type : {KernelDType::f32, KernelDType::bf16, KernelDType::f16}) {
    std::vector<float> view = inputs;
    if (type != KernelDType::f32) gpu_test::to_16bit(type, inputs, view);
    const int64_t cols = 256, n_blocks = rows * cols / 16;
    for (bool search : {false, true}) {
      std::vector<uint8_t> cpu_codes(n_blocks * 8), cpu_scales(n_blocks);
      nvfp4::quantize_rows_cpu(view.data(), rows, cols, cpu_codes.data(), cpu_scales.data(),
                               search ? nvfp4::ScaleMode::search : nvfp4::ScaleMode::rne);
      for (int64_t b = 0; b < n_blocks; ++b) {
        uint8_t codes[8];
        const uint8_t scale = codec::quantize_block(view.data() + b * 16, search, codes);
        ASSERT_EQ(scale, cpu_scales[b]) << gpu_test::dtype_name(type) << " search=" << search << " block " << b;
        for (int j = 0; j < 8; ++j)
          ASSERT_EQ(codes[j], cpu_codes[b * 8 + j]) << gpu_test::dtype_name(type) << " block " << b << " byte " << j;
      }
    }
  }
}

// ---- Launcher argument checks (no GPU needed: they return before touching the device) ----

TEST(Nvfp4KernelLaunch, RejectsBadArgumentsWithoutLaunching) {
  uint8_t dummy[64] = {};
  EXPECT_EQ(kernels::launch_nvfp4_quantize(dummy, KernelDType::f32, 1, 24, dummy, dummy, 0, nullptr, nullptr),
            static_cast<int>(cudaErrorInvalidValue));  // cols % 16 != 0
  EXPECT_EQ(kernels::launch_nvfp4_quantize(dummy, KernelDType::f32, 1, 16, dummy, dummy, 2, nullptr, nullptr),
            static_cast<int>(cudaErrorInvalidValue));  // unknown mode
  EXPECT_EQ(kernels::launch_nvfp4_quantize(nullptr, KernelDType::f32, 0, 16, nullptr, nullptr, 0, nullptr, nullptr),
            0);  // empty: nothing to do
  // Codes and scales may be left out together, and only when the operand is written.
  EXPECT_EQ(kernels::launch_nvfp4_quantize(dummy, KernelDType::f32, 1, 16, nullptr, nullptr, 0, nullptr, nullptr),
            static_cast<int>(cudaErrorInvalidValue));
  EXPECT_EQ(kernels::launch_nvfp4_quantize_with_operand(dummy, KernelDType::f32, 1, 16, nullptr, dummy, 0, nullptr,
                                                        dummy, nullptr),
            static_cast<int>(cudaErrorInvalidValue));
  EXPECT_EQ(kernels::launch_nvfp4_quantize_with_operand(dummy, KernelDType::f32, 1, 16, dummy, dummy, 0, nullptr,
                                                        dummy + 1, nullptr),
            static_cast<int>(cudaErrorInvalidValue));  // the operand's bf16 elements misaligned
  const void* inputs[2] = {dummy, nullptr};
  EXPECT_EQ(kernels::launch_nvfp4_quantize_batch(inputs, 0, KernelDType::f32, 1, 16, dummy, dummy, 0, nullptr, nullptr,
                                                 nullptr),
            static_cast<int>(cudaErrorInvalidValue));  // no input
  EXPECT_EQ(kernels::launch_nvfp4_quantize_batch(inputs, 2, KernelDType::f32, 1, 16, dummy, dummy, 0, nullptr, nullptr,
                                                 nullptr),
            static_cast<int>(cudaErrorInvalidValue));  // a null input
  EXPECT_EQ(kernels::launch_nvfp4_quantize_batch(inputs, kernels::kNvfp4QuantizeMaxBatch + 1, KernelDType::f32, 1, 16,
                                                 dummy, dummy, 0, nullptr, nullptr, nullptr),
            static_cast<int>(cudaErrorInvalidValue));  // more than one launch's table
  EXPECT_EQ(kernels::launch_nvfp4_dequantize(dummy, dummy, 2, 40, dummy, KernelDType::bf16, nullptr),
            static_cast<int>(cudaErrorInvalidValue));
  EXPECT_EQ(kernels::launch_nvfp4_matmul(dummy, KernelDType::bf16, 1, 40, dummy, dummy, 8, dummy, KernelDType::f32,
                                         nullptr),
            static_cast<int>(cudaErrorInvalidValue));  // K % 16 != 0
  EXPECT_EQ(kernels::launch_nvfp4_matmul(dummy, KernelDType::f32, 1, 16, dummy, dummy, 8, dummy, KernelDType::f32,
                                         nullptr),
            static_cast<int>(cudaErrorInvalidValue));  // X must be bf16 or f16
  alignas(16) uint8_t aligned[64] = {};
  EXPECT_EQ(kernels::launch_nvfp4_matmul(aligned + 2, KernelDType::bf16, 1, 16, aligned, aligned, 8, aligned,
                                         KernelDType::f32, nullptr),
            static_cast<int>(cudaErrorInvalidValue));  // X not 16-byte aligned
  EXPECT_EQ(kernels::launch_nvfp4_matmul(aligned, KernelDType::bf16, 0, 16, aligned, aligned, 8, aligned,
                                         KernelDType::f32, nullptr),
            0);  // M = 0
}

// ---- Quantize on the device ----

// Quantizes `values` (fp32, rounded to `type` first when 16-bit) on the device and compares every byte with
// the CPU codec run on the fp32 view. misaligned: x and codes start one element / one byte off alignment,
// which selects the scalar kernels.
void expect_quantize_matches_cpu(const std::vector<float>& values, int64_t rows, int64_t cols, KernelDType type,
                                 bool search, bool misaligned) {
  std::vector<float> view = values;
  std::vector<uint16_t> bits16;
  if (type != KernelDType::f32) bits16 = gpu_test::to_16bit(type, values, view);
  const int64_t n = rows * cols, n_blocks = n / 16;
  std::vector<uint8_t> cpu_codes(n / 2), cpu_scales(n_blocks);
  nvfp4::quantize_rows_cpu(view.data(), rows, cols, cpu_codes.data(), cpu_scales.data(),
                           search ? nvfp4::ScaleMode::search : nvfp4::ScaleMode::rne);

  const size_t element = type == KernelDType::f32 ? 4 : 2;
  const size_t x_offset = misaligned ? element : 0, codes_offset = misaligned ? 1 : 0;
  DeviceBuffer x(n * element), codes(n / 2), scales(n_blocks), flag(sizeof(int));
  ASSERT_TRUE(x.ok() && codes.ok() && scales.ok() && flag.ok());
  if (type == KernelDType::f32) gpu_test::upload(view, x.at(x_offset));
  else gpu_test::upload(bits16, x.at(x_offset));
  QWEN3_CUDA_OK(cudaMemset(flag.at(), 0, sizeof(int)));
  QWEN3_CUDA_OK(cudaMemset(codes.at(), 0xAB, n / 2 + DeviceBuffer::kSlack));  // catch unwritten bytes
  ASSERT_EQ(kernels::launch_nvfp4_quantize(x.at(x_offset), type, rows, cols, codes.at(codes_offset), scales.at(),
                                           search ? 1 : 0, reinterpret_cast<int*>(flag.at()), nullptr),
            0);
  std::vector<uint8_t> gpu_codes(n / 2), gpu_scales(n_blocks);
  std::vector<int> gpu_flag(1);
  gpu_test::download(codes.at(codes_offset), gpu_codes);
  gpu_test::download(scales.at(), gpu_scales);
  gpu_test::download(flag.at(), gpu_flag);
  EXPECT_EQ(gpu_flag[0], 0);
  const std::string where = std::string(gpu_test::dtype_name(type)) + (search ? " search" : " rne") +
                            (misaligned ? " misaligned" : "") + " [" + std::to_string(rows) + "x" +
                            std::to_string(cols) + "]";
  for (int64_t b = 0; b < n_blocks; ++b) {
    bool same = gpu_scales[b] == cpu_scales[b];
    for (int j = 0; j < 8; ++j) same = same && gpu_codes[b * 8 + j] == cpu_codes[b * 8 + j];
    if (!same) {
      std::ostringstream block;
      for (int i = 0; i < 16; ++i) block << view[b * 16 + i] << " ";
      FAIL() << where << ": block " << b << " scale gpu " << int(gpu_scales[b]) << " cpu " << int(cpu_scales[b])
             << "; input " << block.str();
    }
  }
  // The same pass writing the bf16 operand too: the same codes and scales, and the operand is the CPU's
  // dequantization of them in bf16 (exact), byte for byte; misaligned (2 bytes off) takes the scalar stores.
  const size_t operand_offset = misaligned ? 2 : 0;
  DeviceBuffer codes2(n / 2), scales2(n_blocks), operand(n * 2);
  ASSERT_TRUE(codes2.ok() && scales2.ok() && operand.ok());
  QWEN3_CUDA_OK(cudaMemset(operand.at(), 0xAB, n * 2 + DeviceBuffer::kSlack));
  ASSERT_EQ(kernels::launch_nvfp4_quantize_with_operand(x.at(x_offset), type, rows, cols, codes2.at(codes_offset),
                                                        scales2.at(), search ? 1 : 0, nullptr,
                                                        operand.at(operand_offset), nullptr),
            0);
  std::vector<uint8_t> codes_again(n / 2), scales_again(n_blocks);
  std::vector<uint16_t> gpu_operand(n);
  gpu_test::download(codes2.at(codes_offset), codes_again);
  gpu_test::download(scales2.at(), scales_again);
  gpu_test::download(operand.at(operand_offset), gpu_operand);
  EXPECT_EQ(codes_again, gpu_codes) << where;
  EXPECT_EQ(scales_again, gpu_scales) << where;
  std::vector<float> cpu_values(n);
  nvfp4::dequantize_rows_cpu(cpu_codes.data(), cpu_scales.data(), rows, cols, cpu_values.data());
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(gpu_operand[i], gpu_test::to_bits(KernelDType::bf16, cpu_values[i])) << where << ": operand element " << i;
  // The operand alone (no codes, no scales): the same operand.
  QWEN3_CUDA_OK(cudaMemset(operand.at(), 0xAB, n * 2 + DeviceBuffer::kSlack));
  ASSERT_EQ(kernels::launch_nvfp4_quantize_with_operand(x.at(x_offset), type, rows, cols, nullptr, nullptr,
                                                        search ? 1 : 0, nullptr, operand.at(operand_offset), nullptr),
            0);
  std::vector<uint16_t> operand_alone(n);
  gpu_test::download(operand.at(operand_offset), operand_alone);
  EXPECT_EQ(operand_alone, gpu_operand) << where << ": the operand without codes";
}

class GpuQuantizeKernel : public ::testing::TestWithParam<std::tuple<KernelDType, bool>> {};

TEST_P(GpuQuantizeKernel, AdversarialBlocksMatchCpuBytes) {
  QWEN3_REQUIRE_GPU();
  const auto [type, search] = GetParam();
  int64_t rows = 0;
  const std::vector<float> matrix = gpu_test::blocks_to_matrix(gpu_test::adversarial_blocks(), 16, rows);
  for (bool misaligned : {false, true}) expect_quantize_matches_cpu(matrix, rows, 256, type, search, misaligned);
}

TEST_P(GpuQuantizeKernel, RandomMatricesMatchCpuBytes) {
  QWEN3_REQUIRE_GPU();
  const auto [type, search] = GetParam();
  // Shapes whose vector counts leave partial CTAs and partial unroll steps; one Qwen3-sized row block.
  std::vector<std::pair<int64_t, int64_t>> shapes{{1, 16}, {3, 48}, {7, 2560}, {129, 1040}, {256, 9728}};
  if (test::small_gpu_shapes()) shapes.resize(4);
  uint32_t seed = 1;
  for (const auto& [rows, cols] : shapes) {
    for (float stddev : {0.005f, 1.0f}) {
      const std::vector<float> values = gpu_test::gaussian(rows * cols, stddev, seed++);
      expect_quantize_matches_cpu(values, rows, cols, type, search, /*misaligned=*/false);
      if (rows * cols <= 8192) expect_quantize_matches_cpu(values, rows, cols, type, search, /*misaligned=*/true);
    }
  }
}

// Several inputs in one launch (launch_nvfp4_quantize_batch: a mixture-of-experts block's experts): input g's
// codes, scales and bf16 operand are the g-th of the stacked outputs, each what the CPU codec writes for it.
// Misaligned: one input starts an element off, which sends the whole batch down the scalar kernels.
TEST_P(GpuQuantizeKernel, BatchOfInputsMatchesCpuBytes) {
  QWEN3_REQUIRE_GPU();
  const auto [type, search] = GetParam();
  const int64_t rows = 5, cols = 1040, n = rows * cols, n_blocks = n / 16, count = 3;
  const size_t element = type == KernelDType::f32 ? 4 : 2;
  for (const bool misaligned : {false, true}) {
    std::vector<std::unique_ptr<DeviceBuffer>> inputs;
    std::vector<const void*> pointers;
    std::vector<std::vector<uint8_t>> cpu_codes(count, std::vector<uint8_t>(n / 2)), cpu_scales(count, std::vector<uint8_t>(n_blocks));
    std::vector<std::vector<float>> cpu_operands(count, std::vector<float>(n));
    for (int64_t g = 0; g < count; ++g) {
      std::vector<float> view = gpu_test::gaussian(n, g == 1 ? 0.005f : 1.0f, static_cast<uint32_t>(40 + g));
      std::vector<uint16_t> bits16;
      if (type != KernelDType::f32) bits16 = gpu_test::to_16bit(type, view, view);
      nvfp4::quantize_rows_cpu(view.data(), rows, cols, cpu_codes[g].data(), cpu_scales[g].data(),
                               search ? nvfp4::ScaleMode::search : nvfp4::ScaleMode::rne);
      nvfp4::dequantize_rows_cpu(cpu_codes[g].data(), cpu_scales[g].data(), rows, cols, cpu_operands[g].data());
      const size_t offset = misaligned && g == 2 ? element : 0;
      inputs.push_back(std::make_unique<DeviceBuffer>(n * element));
      ASSERT_TRUE(inputs.back()->ok());
      if (type == KernelDType::f32) gpu_test::upload(view, inputs.back()->at(offset));
      else gpu_test::upload(bits16, inputs.back()->at(offset));
      pointers.push_back(inputs.back()->at(offset));
    }
    DeviceBuffer codes(count * n / 2), scales(count * n_blocks), operand(count * n * 2);
    ASSERT_TRUE(codes.ok() && scales.ok() && operand.ok());
    QWEN3_CUDA_OK(cudaMemset(codes.at(), 0xAB, count * n / 2 + DeviceBuffer::kSlack));
    QWEN3_CUDA_OK(cudaMemset(operand.at(), 0xAB, count * n * 2 + DeviceBuffer::kSlack));
    ASSERT_EQ(kernels::launch_nvfp4_quantize_batch(pointers.data(), static_cast<int>(count), type, rows, cols, codes.at(),
                                                   scales.at(), search ? 1 : 0, nullptr, operand.at(), nullptr),
              0);
    std::vector<uint8_t> gpu_codes(count * n / 2), gpu_scales(count * n_blocks);
    std::vector<uint16_t> gpu_operand(count * n);
    gpu_test::download(codes.at(), gpu_codes);
    gpu_test::download(scales.at(), gpu_scales);
    gpu_test::download(operand.at(), gpu_operand);
    for (int64_t g = 0; g < count; ++g) {
      const std::string where = std::string(gpu_test::dtype_name(type)) + (search ? " search" : " rne") +
                                (misaligned ? " misaligned" : "") + ", input " + std::to_string(g);
      EXPECT_TRUE(std::equal(cpu_codes[g].begin(), cpu_codes[g].end(), gpu_codes.begin() + g * n / 2)) << where;
      EXPECT_TRUE(std::equal(cpu_scales[g].begin(), cpu_scales[g].end(), gpu_scales.begin() + g * n_blocks)) << where;
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(gpu_operand[g * n + i], gpu_test::to_bits(KernelDType::bf16, cpu_operands[g][i])) << where << ": operand " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypesAndModes, GpuQuantizeKernel,
                         ::testing::Combine(::testing::Values(KernelDType::f32, KernelDType::bf16, KernelDType::f16),
                                            ::testing::Bool()));

TEST(GpuQuantizeKernelNonFinite, RaisesFlagAndMarksOnlyTheBadBlocks) {
  QWEN3_REQUIRE_GPU();
  const int64_t rows = 4, cols = 64;
  std::vector<float> values = gpu_test::gaussian(rows * cols, 1.0f, 99);
  const int64_t bad[] = {1 * cols + 17, 2 * cols + 40, 3 * cols + 63};
  values[bad[0]] = INFINITY;
  values[bad[1]] = NAN;
  values[bad[2]] = -INFINITY;
  for (KernelDType type : {KernelDType::f32, KernelDType::bf16, KernelDType::f16})
    for (int mode : {0, 1}) {
      std::vector<float> view = values;
      std::vector<uint16_t> bits16(values.size());
      if (type != KernelDType::f32)
        for (size_t i = 0; i < values.size(); ++i) {
          bits16[i] = gpu_test::to_bits(type, values[i]);
          view[i] = gpu_test::from_bits(type, bits16[i]);
        }
      std::vector<float> finite = view;  // the CPU codec refuses non-finite input: zero the bad blocks
      for (int64_t i : bad)
        for (int64_t j = i / 16 * 16; j < i / 16 * 16 + 16; ++j) finite[j] = 0.0f;
      std::vector<uint8_t> cpu_codes(rows * cols / 2), cpu_scales(rows * cols / 16);
      nvfp4::quantize_rows_cpu(finite.data(), rows, cols, cpu_codes.data(), cpu_scales.data(),
                               mode ? nvfp4::ScaleMode::search : nvfp4::ScaleMode::rne);
      DeviceBuffer x(values.size() * 4), codes(rows * cols / 2), scales(rows * cols / 16), flag(sizeof(int));
      ASSERT_TRUE(x.ok() && codes.ok() && scales.ok() && flag.ok());
      if (type == KernelDType::f32) gpu_test::upload(view, x.at());
      else gpu_test::upload(bits16, x.at());
      QWEN3_CUDA_OK(cudaMemset(flag.at(), 0, sizeof(int)));
      ASSERT_EQ(kernels::launch_nvfp4_quantize(x.at(), type, rows, cols, codes.at(), scales.at(), mode,
                                               reinterpret_cast<int*>(flag.at()), nullptr),
                0);
      std::vector<uint8_t> gpu_codes(rows * cols / 2), gpu_scales(rows * cols / 16);
      std::vector<int> gpu_flag(1);
      gpu_test::download(codes.at(), gpu_codes);
      gpu_test::download(scales.at(), gpu_scales);
      gpu_test::download(flag.at(), gpu_flag);
      EXPECT_EQ(gpu_flag[0], 1) << gpu_test::dtype_name(type) << " mode " << mode;
      for (int64_t b = 0; b < rows * cols / 16; ++b) {
        const bool is_bad = b == bad[0] / 16 || b == bad[1] / 16 || b == bad[2] / 16;
        EXPECT_EQ(gpu_scales[b], is_bad ? codec::kNonFiniteBlockScale : cpu_scales[b]) << "block " << b;
        for (int j = 0; j < 8; ++j)
          EXPECT_EQ(gpu_codes[b * 8 + j], is_bad ? 0 : cpu_codes[b * 8 + j]) << "block " << b << " byte " << j;
      }
    }
}

// ---- Dequantize on the device ----

// Every output type at one shape's codes and scales, on the vector kernel (aligned) and on the scalar one.
// codes_offset 2 keeps the f32 kernel's 2-byte code words aligned but not the bf16/f16 kernel's 4-byte ones.
void expect_dequantize_matches_cpu(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> codes(rows * cols / 2), scales(rows * cols / 16);
  for (uint8_t& c : codes) c = static_cast<uint8_t>(rng());
  for (size_t b = 0; b < scales.size(); ++b) scales[b] = static_cast<uint8_t>(b < 256 ? b : rng());
  std::vector<float> cpu(rows * cols);
  nvfp4::dequantize_rows_cpu(codes.data(), scales.data(), rows, cols, cpu.data());

  DeviceBuffer codes_d(codes.size()), scales_d(scales.size()), out(rows * cols * 4);
  ASSERT_TRUE(codes_d.ok() && scales_d.ok() && out.ok());
  for (size_t codes_offset : {0, 1, 2}) {
    gpu_test::upload(codes, codes_d.at(codes_offset));
    gpu_test::upload(scales, scales_d.at());
    for (KernelDType type : {KernelDType::f32, KernelDType::bf16, KernelDType::f16}) {
      for (bool misaligned_out : {false, true}) {
        const size_t out_offset = misaligned_out ? (type == KernelDType::f32 ? 4 : 2) : 0;  // element-aligned only
        const std::string where = std::string(gpu_test::dtype_name(type)) + " [" + std::to_string(rows) + "x" +
                                  std::to_string(cols) + "] codes +" + std::to_string(codes_offset) + " out +" +
                                  std::to_string(out_offset);
        QWEN3_CUDA_OK(cudaMemset(out.at(), 0xAB, rows * cols * 4 + DeviceBuffer::kSlack));  // catch unwritten
        ASSERT_EQ(kernels::launch_nvfp4_dequantize(codes_d.at(codes_offset), scales_d.at(), rows, cols,
                                                   out.at(out_offset), type, nullptr),
                  0);
        if (type == KernelDType::f32) {
          std::vector<float> gpu(rows * cols);
          gpu_test::download(out.at(out_offset), gpu);
          for (int64_t i = 0; i < rows * cols; ++i)
            ASSERT_TRUE(gpu_test::same_float(gpu[i], cpu[i])) << where << " element " << i << ": " << gpu[i] << " vs " << cpu[i];
        } else {
          std::vector<uint16_t> gpu(rows * cols);
          gpu_test::download(out.at(out_offset), gpu);
          for (int64_t i = 0; i < rows * cols; ++i) {
            const float got = gpu_test::from_bits(type, gpu[i]);
            ASSERT_TRUE(gpu_test::same_float(got, cpu[i]))  // exact: the conversion must lose nothing
                << where << " element " << i << ": " << got << " vs " << cpu[i];
          }
        }
      }
    }
  }
}

TEST(GpuDequantizeKernel, MatchesCpuExactlyForEveryScaleCodeAndOutputType) {
  QWEN3_REQUIRE_GPU();
  expect_dequantize_matches_cpu(8, 640, 5);  // 320 blocks: every one of the 256 scale codes, NaN codes included
}

TEST(GpuDequantizeKernel, PartialCtasAndUnrollStepsMatchCpu) {
  QWEN3_REQUIRE_GPU();
  // Vector counts that end inside a thread's unroll steps and inside a CTA; one Qwen3-sized row block.
  std::vector<std::pair<int64_t, int64_t>> shapes{{1, 16}, {3, 48}, {7, 2560}, {129, 1040}, {256, 9728}};
  if (test::small_gpu_shapes()) shapes.resize(4);
  uint32_t seed = 11;
  for (const auto& [rows, cols] : shapes) expect_dequantize_matches_cpu(rows, cols, seed++);
}

}  // namespace
}  // namespace qwen3
