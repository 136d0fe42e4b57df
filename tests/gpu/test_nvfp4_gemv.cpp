// The small-M NVFP4 kernel (kernels/nvfp4_gemv.cu) against the host run of its own functions
// (tests/nvfp4_gemv_host_run.h, itself checked against fp64 on every CI run): bit for bit, fp32 output, every
// M it takes, N off the two-rows-a-warp grid, Qwen3-4B widths; bf16 and f16 outputs as the rounding of those
// sums; the launcher's refusals; and that launch_nvfp4_matmul hands it the products it takes.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "gpu_test.h"
#include "gpu_test_util.h"
#include "nvfp4_gemv_host_run.h"
#include "qwen3/nvfp4/nvfp4.h"
#include "qwen3_kernels.h"

namespace qwen3 {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::kInvalidValue;
using kernels::KernelDType;

// y from the kernel, in `out` type, through launch_nvfp4_gemv or (via_matmul) launch_nvfp4_matmul.
std::vector<float> run_kernel(const gemv_test::Product& p, KernelDType out, bool via_matmul) {
  std::vector<uint16_t> x_bits(p.x.size());
  for (size_t i = 0; i < p.x.size(); ++i) x_bits[i] = gpu_test::bf16_bits(p.x[i]);
  DeviceBuffer x(x_bits.size() * 2), codes(p.codes.size()), scales(p.scales.size()), y(p.M * p.N * 4);
  EXPECT_TRUE(x.ok() && codes.ok() && scales.ok() && y.ok());
  gpu_test::upload(x_bits, x.at());
  gpu_test::upload(p.codes, codes.at());
  gpu_test::upload(p.scales, scales.at());
  EXPECT_EQ(cudaMemset(y.at(), 0xFF, p.M * p.N * 4), cudaSuccess);  // NaN: an unwritten output fails
  const int status = via_matmul ? kernels::launch_nvfp4_matmul(x.at(), KernelDType::bf16, p.M, p.K, codes.at(), scales.at(), p.N, y.at(), out, nullptr)
                                : kernels::launch_nvfp4_gemv(x.at(), KernelDType::bf16, p.M, p.K, codes.at(), scales.at(), p.N, y.at(), out, nullptr);
  EXPECT_EQ(status, 0);
  std::vector<float> result(p.M * p.N);
  if (out == KernelDType::f32) {
    gpu_test::download(y.at(), result);
  } else {
    std::vector<uint16_t> bits(p.M * p.N);
    gpu_test::download(y.at(), bits);
    for (size_t i = 0; i < bits.size(); ++i) result[i] = gpu_test::from_bits(out, bits[i]);
  }
  return result;
}

TEST(GpuNvfp4Gemv, EqualsTheHostRunOfItsFunctionsBitForBit) {
  QWEN3_REQUIRE_GPU();
  std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes{{1, 9, 32},    {2, 7, 64},     {3, 1024, 2560},
                                                            {4, 5, 9728},  {1, 4096, 2560}, {4, 2560, 4096}};
  if (test::small_gpu_shapes()) shapes.resize(4);
  uint32_t seed = 1;
  for (const auto& [M, N, K] : shapes) {
    const gemv_test::Product p = gemv_test::random_product(M, N, K, seed++);
    const std::vector<float> host = gemv_test::gemv_on_host(p);
    const std::string where = "M " + std::to_string(M) + " N " + std::to_string(N) + " K " + std::to_string(K);
    const std::vector<float> device = run_kernel(p, KernelDType::f32, /*via_matmul=*/false);
    for (int64_t i = 0; i < M * N; ++i)
      ASSERT_EQ(gpu_test::float_bits(device[i]), gpu_test::float_bits(host[i])) << where << " element " << i;
    // The product's launcher sends it here: the same bits.
    EXPECT_EQ(run_kernel(p, KernelDType::f32, /*via_matmul=*/true), device) << where;
    for (KernelDType out : {KernelDType::bf16, KernelDType::f16}) {
      const std::vector<float> rounded = run_kernel(p, out, false);
      for (int64_t i = 0; i < M * N; ++i)
        ASSERT_EQ(gpu_test::to_bits(out, rounded[i]), gpu_test::to_bits(out, host[i]))
            << where << " " << gpu_test::dtype_name(out) << " element " << i;
    }
  }
}

// Argument checks come before any device call: they hold on every machine that builds the kernels (each refusal
// is the launcher's own error: gpu_test_util.h, kInvalidValue, says why).
TEST(Nvfp4GemvLaunch, RefusesWhatItDoesNotTakeWithoutLaunching) {
  alignas(64) static uint8_t fake[256];  // never dereferenced: every call below is refused (or has nothing to do)
  uint8_t* p = fake;
  const auto launch = [&](const void* x, KernelDType x_type, int64_t M, int64_t K, const uint8_t* codes, int64_t N) {
    return kernels::launch_nvfp4_gemv(x, x_type, M, K, codes, p, N, p, KernelDType::f32, nullptr);
  };
  EXPECT_EQ(kInvalidValue, launch(p, KernelDType::bf16, 5, 32, p, 4));       // more rows than it takes
  EXPECT_EQ(kInvalidValue, launch(p, KernelDType::bf16, 0, 32, p, 4));
  EXPECT_EQ(kInvalidValue, launch(p, KernelDType::bf16, 1, 48, p, 4));       // K not a multiple of 32
  EXPECT_EQ(kInvalidValue, launch(p, KernelDType::f32, 1, 32, p, 4));        // x must be bf16 or f16
  EXPECT_EQ(kInvalidValue, launch(p + 8, KernelDType::bf16, 1, 32, p, 4));   // x not 16-byte aligned
  EXPECT_EQ(kInvalidValue, launch(p, KernelDType::bf16, 1, 32, p + 8, 4));   // codes not 16-byte aligned
  EXPECT_EQ(kInvalidValue, launch(p, KernelDType::bf16, 1, 32, nullptr, 4));
  EXPECT_EQ(launch(nullptr, KernelDType::bf16, 1, 32, nullptr, 0), 0);  // N = 0: nothing to do
}

}  // namespace
}  // namespace qwen3
