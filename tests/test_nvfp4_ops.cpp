// NVFP4 on tensors: the same bytes as the raw codec for every input dtype, dequantize to every dtype and from
// the numeric (float16/float32) scales of older files, and clear errors for bad arguments.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "qwen3/base/error.h"
#include "qwen3/nvfp4/nvfp4_ops.h"

namespace qwen3::nvfp4 {
namespace {

TEST(Nvfp4Ops, EveryInputDtypeGivesTheRawCodecBytesOfItsFp32View) {
  at::manual_seed(11);
  const at::Tensor base = at::randn({24, 96}) * 0.03;
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble}) {
    const at::Tensor x = base.to(dtype);
    const at::Tensor fp32_view = x.to(at::kFloat).contiguous();
    for (ScaleMode mode : {ScaleMode::rne, ScaleMode::search}) {
      const Quantized q = quantize(x, mode);
      ASSERT_EQ(q.codes.sizes(), (std::vector<int64_t>{24, 48}));
      ASSERT_EQ(q.scales.sizes(), (std::vector<int64_t>{24, 6}));
      ASSERT_EQ(q.codes.scalar_type(), at::kByte);
      at::Tensor codes = at::empty({24, 48}, at::kByte), scales = at::empty({24, 6}, at::kByte);
      quantize_rows_cpu(fp32_view.data_ptr<float>(), 24, 96, codes.data_ptr<uint8_t>(), scales.data_ptr<uint8_t>(),
                        mode);
      EXPECT_TRUE(q.codes.equal(codes)) << c10::toString(dtype) << " " << scale_mode_name(mode);
      EXPECT_TRUE(q.scales.equal(scales)) << c10::toString(dtype) << " " << scale_mode_name(mode);
    }
  }
}

TEST(Nvfp4Ops, NonContiguousInputIsQuantizedByValue) {
  at::manual_seed(12);
  const at::Tensor x = at::randn({32, 48});
  const Quantized from_view = quantize(x.t());  // [48, 32], strided
  const Quantized from_copy = quantize(x.t().contiguous());
  EXPECT_TRUE(from_view.codes.equal(from_copy.codes));
  EXPECT_TRUE(from_view.scales.equal(from_copy.scales));
}

TEST(Nvfp4Ops, DequantizeIsExactInEveryDtype) {
  at::manual_seed(13);
  const at::Tensor codes = at::randint(0, 256, {8, 32}, at::kByte);
  const at::Tensor scales = at::randint(0, 0x7F, {8, 4}, at::kByte);  // every finite non-negative code
  const at::Tensor fp32 = dequantize(codes, scales, at::kFloat);
  ASSERT_EQ(fp32.sizes(), (std::vector<int64_t>{8, 64}));
  for (int64_t row = 0; row < 8; ++row)
    for (int64_t col = 0; col < 64; ++col) {
      const int byte = codes[row][col / 2].item<int>();
      const int code = col % 2 == 0 ? byte & 15 : byte >> 4;
      const float expected = e2m1_to_float(code) * e4m3_to_float(scales[row][col / 16].item<int>());
      ASSERT_EQ(fp32[row][col].item<float>(), expected) << row << "," << col;
    }
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf, at::kDouble}) {
    const at::Tensor y = dequantize(codes, scales, dtype);
    EXPECT_EQ(y.scalar_type(), dtype);
    EXPECT_TRUE(y.to(at::kFloat).equal(fp32)) << c10::toString(dtype);  // nothing rounded away
  }
}

TEST(Nvfp4Ops, DequantizeTakesNumericScalesOfOlderFiles) {
  at::manual_seed(14);
  const at::Tensor codes = at::randint(0, 256, {4, 16}, at::kByte);
  const at::Tensor e4m3_scales = at::randint(0, 0x7F, {4, 2}, at::kByte);
  std::vector<float> numeric(8);
  for (int i = 0; i < 8; ++i) numeric[i] = e4m3_to_float(e4m3_scales.view(-1)[i].item<int>());
  const at::Tensor float_scales = at::tensor(numeric).view({4, 2});
  const at::Tensor reference = dequantize(codes, e4m3_scales, at::kFloat);
  EXPECT_TRUE(dequantize(codes, float_scales, at::kFloat).equal(reference));
  EXPECT_TRUE(dequantize(codes, float_scales.to(at::kHalf), at::kFloat).equal(reference));
  // A scale no E4M3 code holds: each value is the code's E2M1 value times it, in fp32.
  const at::Tensor odd_scales = at::full({4, 2}, 0.0123f);
  const at::Tensor y = dequantize(codes, odd_scales, at::kBFloat16);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  const int byte = codes[2][5].item<int>();
  EXPECT_EQ(y[2][11].item<float>(), static_cast<float>(c10::BFloat16(e2m1_to_float(byte >> 4) * 0.0123f)));
}

TEST(Nvfp4Ops, RoundTripThroughTensorsKeepsTheCodes) {
  at::manual_seed(15);
  const at::Tensor x = at::randn({16, 64});
  const Quantized q = quantize(x, ScaleMode::search);
  const at::Tensor y = dequantize(q.codes, q.scales, at::kBFloat16);
  const at::Tensor relative_error = (y.to(at::kFloat) - x).norm() / x.norm();
  EXPECT_LT(relative_error.item<float>(), 0.12f);
  EXPECT_GT(relative_error.item<float>(), 0.01f);  // it did quantize
}

TEST(Nvfp4Ops, NonFiniteTensorInputIsAnError) {
  at::Tensor x = at::randn({4, 32}).to(at::kBFloat16);
  x[2][17] = std::numeric_limits<float>::infinity();
  try {
    quantize(x);
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("row 2, column 17"), std::string::npos) << error.what();
  }
  EXPECT_FALSE(take_nonfinite_flag(at::Device(at::kCPU)));
}

TEST(Nvfp4Ops, BadArgumentsAreErrors) {
  EXPECT_THROW(quantize(at::zeros({4, 24})), Error);                  // cols % 16
  EXPECT_THROW(quantize(at::zeros({2, 4, 16})), Error);               // not 2-D
  EXPECT_THROW(quantize(at::zeros({4, 16}, at::kInt)), Error);        // not floating point
  const at::Tensor codes = at::zeros({4, 8}, at::kByte);
  EXPECT_THROW(dequantize(codes, at::zeros({4, 2}, at::kByte), at::kFloat), Error);  // 8 bytes = 16 values = 1 scale
  EXPECT_THROW(dequantize(codes, at::zeros({4, 1}, at::kInt), at::kFloat), Error);
  EXPECT_THROW(dequantize(codes, at::zeros({4, 1}, at::kByte), at::kInt), Error);
  EXPECT_THROW(dequantize(codes.to(at::kChar), at::zeros({4, 1}, at::kByte), at::kFloat), Error);
  EXPECT_NO_THROW(dequantize(codes, at::zeros({4, 1}, at::kByte), at::kFloat));
}

}  // namespace
}  // namespace qwen3::nvfp4
