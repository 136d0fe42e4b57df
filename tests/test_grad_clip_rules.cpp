// The group clipping kernel's rules (kernels/grad_clip.cuh) on the host: the chunks cover every element once,
// the kernel's summation order (tests/grad_clip_host_run.h) sums in fp64 and agrees with a plain sum, and the
// factor is the host's clip_factor on the group's share of the limit. The kernel itself against this host run:
// tests/gpu/test_grad_clip_kernel.cpp. The optimizer-level function (group_clip_factors) on a CPU: below.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gpu_test.h"
#include "grad_clip_host_run.h"
#include "qwen3/optim/optim.h"

namespace qwen3 {
namespace {

namespace gc = kernels::grad_clip;

TEST(GradClipRules, ChunksCoverEveryElementOnce) {
  for (int64_t numel : {int64_t{0}, int64_t{1}, gc::kChunkElements - 1, gc::kChunkElements, gc::kChunkElements + 1,
                        int64_t{50'001}}) {
    SCOPED_TRACE(numel);
    std::vector<int> seen(static_cast<size_t>(numel), 0);
    const int64_t chunks = gc::chunks_of(numel);
    EXPECT_EQ(chunks, numel == 0 ? 1 : (numel + gc::kChunkElements - 1) / gc::kChunkElements);
    for (int64_t c = 0; c < chunks; ++c)
      for (int t = 0; t < gc::kThreads; ++t)
        for (int k = 0; k < gc::kPieces; ++k)
          for (int j = 0; j < gc::kPieceElements; ++j) {
            const int64_t e = gc::element_index(c, t, k, j);
            ASSERT_GE(e, c * gc::kChunkElements);
            ASSERT_LT(e, (c + 1) * gc::kChunkElements);
            if (e < numel) ++seen[static_cast<size_t>(e)];
          }
    for (int64_t e = 0; e < numel; ++e) ASSERT_EQ(seen[static_cast<size_t>(e)], 1) << "element " << e;
  }
}

// fp64 sums: a 1 and seven squares of 2^-20 (2^-40 each) in one thread's running sum, which an fp32 sum at 1
// (a step of 2^-23) would drop and fp64 keeps exactly.
TEST(GradClipRules, TheKernelsOrderSumsInFp64) {
  std::vector<float> x(static_cast<size_t>(gc::kChunkElements), 0.0f);
  x[static_cast<size_t>(gc::element_index(0, 0, 0, 0))] = 1.0f;
  for (int k = 1; k < gc::kPieces; ++k) x[static_cast<size_t>(gc::element_index(0, 0, k, 0))] = std::ldexp(1.0f, -20);
  EXPECT_EQ(grad_clip_test::group_square_on_host(std::vector<std::vector<float>>{x}), 1.0 + 7 * std::ldexp(1.0, -40));
}

TEST(GradClipRules, TheKernelsOrderAgreesWithAPlainSum) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::vector<std::vector<float>> tensors;
  long double plain = 0;
  for (int64_t n : {int64_t{0}, int64_t{5}, gc::kChunkElements, int64_t{3 * gc::kChunkElements + 77}, int64_t{200'000}}) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& e : v) {
      e = normal(rng);
      plain += static_cast<long double>(e) * e;
    }
    tensors.push_back(std::move(v));
  }
  const double square = grad_clip_test::group_square_on_host(tensors);
  EXPECT_NEAR(square, static_cast<double>(plain), 1e-13 * static_cast<double>(plain));
  // Empty groups and empty tensors sum to zero.
  EXPECT_EQ(grad_clip_test::group_square_on_host(std::vector<std::vector<float>>{{}}), 0.0);
}

// clip_scale is clip_factor(sqrt(square), max_norm * sqrt(counted / trainable)) rounded to fp32 once.
TEST(GradClipRules, ClipScaleIsTheHostsClipFactorOnTheGroupsShare) {
  const double trainable = 1'000'000;
  for (double max_norm : {0.0, 1e-4, 1.0, 3.5}) {
    for (double counted : {0.0, 1.0, 4096.0, 250'000.0, 1'000'000.0}) {
      for (double square : {0.0, 1e-20, 1e-9, 0.0625, 1.0, 2.0, 17.0, 1e12}) {
        const double limit = max_norm * std::sqrt(counted / trainable);
        const float expected = static_cast<float>(clip_factor(std::sqrt(square), limit));
        const float got = gc::clip_scale(square, counted, trainable, max_norm);
        EXPECT_EQ(std::memcmp(&got, &expected, 4), 0)
            << "max_norm " << max_norm << " counted " << counted << " square " << square << ": " << got << " vs "
            << expected;
      }
    }
    EXPECT_TRUE(std::isnan(gc::clip_scale(std::numeric_limits<double>::infinity(), 10, trainable, max_norm)));
    EXPECT_TRUE(std::isnan(gc::clip_scale(std::numeric_limits<double>::quiet_NaN(), 10, trainable, max_norm)));
  }
}

// The optimizer's function on a CPU (the ATen form): with data parallel's counts, a gradient no rank had gets NaN
// and does not count toward the group's share; the group's square is added to the running sum.
TEST(GroupClipFactors, RanksChooseWhatCountsAndTheSquareAccumulates) {
  const at::Tensor a = at::full({4, 16}, 0.5f), b = at::full({2, 16}, 0.25f);
  const double max_norm = 0.1, trainable = 1000;
  at::Tensor running;
  const at::Tensor plain = group_clip_factors({a, b}, at::Tensor(), max_norm, 1000, running);
  const double square = 64 * 0.25 + 32 * 0.0625;
  ASSERT_TRUE(running.defined());
  EXPECT_EQ(running.item<double>(), square);
  const float share = static_cast<float>(clip_factor(std::sqrt(square), max_norm * std::sqrt(96 / trainable)));
  ASSERT_EQ(plain.numel(), 2);
  EXPECT_EQ(plain[0].item<float>(), share);
  EXPECT_EQ(plain[1].item<float>(), share);

  const at::Tensor ranked = group_clip_factors({a, b}, at::tensor({2.0f, 0.0f}), max_norm, 1000, running);
  EXPECT_EQ(running.item<double>(), 2 * square);
  EXPECT_EQ(ranked[0].item<float>(),
            static_cast<float>(clip_factor(std::sqrt(square), max_norm * std::sqrt(64 / trainable))));
  EXPECT_TRUE(std::isnan(ranked[1].item<float>()));
}

// On CUDA each gradient's square is the kernel's own (fp64 from its chunks, rounded to fp32 once), bf16 and fp32,
// one of them larger than a launch's chunk; on a CPU square_sum_fp32's. The ordinary step's norm is their sum.
TEST(GroupClipFactors, GpuSquareSumsAreTheKernelsPerTensorSquares) {
  QWEN3_GPU_TEST(at::hasCUDA());
  at::manual_seed(5);
  const at::Device cuda(at::kCUDA, 0);
  const std::vector<at::Tensor> grads = {at::randn({300, 100}).to(cuda) * 1e-3,
                                         at::randn({64, 2560}).to(cuda, at::kBFloat16), at::randn({7}).to(cuda)};
  const at::Tensor squares = square_sums_fp32(grads);
  ASSERT_EQ(squares.numel(), 3);
  EXPECT_EQ(squares.scalar_type(), at::kFloat);
  for (int64_t i = 0; i < 3; ++i) {
    const float expected =
        static_cast<float>(grad_clip_test::group_square_on_host(std::vector<at::Tensor>{grads[static_cast<size_t>(i)]}));
    EXPECT_EQ(squares[i].item<float>(), expected) << "gradient " << i;
  }
}

}  // namespace
}  // namespace qwen3
