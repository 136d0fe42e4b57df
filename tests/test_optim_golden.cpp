// The optimizer's exact bytes, pinned: three AdamW steps of every (moment storage, master dtype) pair on inputs
// built from integer hashes (no libtorch generator, no libm, so they are the same on every machine and
// libtorch), hashed over the parameters and every state tensor. The expected hashes were produced by the
// ATen-composed optimizer (commit b73ff9e, before the fused element update) on x86-64: the fused update must
// reproduce its results bit for bit.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "adamw_update.cuh"
#include "gpu_test.h"
#include "optim_test_util.h"
#include "qwen3/optim/optim.h"

namespace qwen3 {
namespace {

uint64_t splitmix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Values uniform in [-1, 1) times 2^-(0..19), one in 17 exactly zero, and row `zero_row` all zero: magnitudes
// that span six decades inside a block (the hard case of the block-scaled moments), built exactly in fp32.
at::Tensor hashed_values(at::IntArrayRef shape, uint64_t key, int64_t zero_row = -1) {
  at::Tensor t = at::empty(shape, at::kFloat);
  float* data = t.data_ptr<float>();
  const int64_t cols = t.dim() <= 1 ? t.numel() : t.numel() / t.size(0);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const uint64_t bits = splitmix(key * 0x100000001B3ULL + static_cast<uint64_t>(i));
    const float unit = static_cast<float>(static_cast<int32_t>(bits >> 32)) * 0x1p-31f;
    const float scale = static_cast<float>(1u << 20 >> (bits % 20)) * 0x1p-20f;
    data[i] = (bits % 17 == 0 || i / cols == zero_row) ? 0.0f : unit * scale;
  }
  return t;
}

uint64_t fnv1a(uint64_t hash, const at::Tensor& t) {
  const at::Tensor c = t.detach().contiguous().to(at::kCPU);
  const auto* bytes = static_cast<const uint8_t*>(c.data_ptr());
  for (int64_t i = 0; i < c.numel() * static_cast<int64_t>(c.element_size()); ++i)
    hash = (hash ^ bytes[i]) * 0x100000001B3ULL;
  return hash;
}

struct GoldenCase {
  MomentStorage storage;
  at::ScalarType master;
  uint64_t expected;
};

class AdamWGolden : public ::testing::TestWithParam<GoldenCase> {};

uint64_t three_steps_hash(MomentStorage storage, at::ScalarType master, int64_t chunk_rows,
                          const at::Device& device = at::kCPU) {
  const std::vector<std::vector<int64_t>> shapes{{13, 37}, {29}, {7, 3, 16}, {40, 200}, {3, 2560}};
  std::vector<OptimParam> params;
  for (size_t i = 0; i < shapes.size(); ++i)
    params.push_back(optim_test::make_param("p" + std::to_string(i),
                                            hashed_values(shapes[i], 1000 + i).mul(4.0f).to(device, master), i != 1));
  AdamWOptions options;
  options.moments = storage;
  options.weight_decay = 0.05;
  options.seed = 2026;
  options.step_chunk_rows = chunk_rows;
  AdamW optimizer(params, options);
  const double lrs[] = {1e-2, 3e-3, 5e-2};
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < params.size(); ++i)
      optim_test::set_grad(params[i], hashed_values(shapes[i], 100 * (step + 1) + i, step == 1 ? 2 : -1).to(device));
    optimizer.step(lrs[step]);
  }
  uint64_t hash = 0xCBF29CE484222325ULL;
  for (const OptimParam& p : params) hash = fnv1a(hash, p.param);
  for (const auto& named : optimizer.state_tensors()) hash = fnv1a(hash, named.second);
  return hash;
}

TEST_P(AdamWGolden, ThreeStepsGiveTheBytesOfTheComposedOptimizer) {
  const GoldenCase c = GetParam();
  EXPECT_EQ(three_steps_hash(c.storage, c.master, 0), c.expected);
  EXPECT_EQ(three_steps_hash(c.storage, c.master, 5), c.expected) << "in pieces of 5 rows";
}

// The CUDA kernel (kernels/adamw_step.cu) runs the same element rules: the same bytes on the GPU. Needs a CUDA
// libtorch and a device; skipped otherwise.
TEST_P(AdamWGolden, GpuStepGivesTheSameBytes) {
  QWEN3_GPU_TEST(at::hasCUDA());  // a CUDA libtorch and a device
  const GoldenCase c = GetParam();
  EXPECT_EQ(three_steps_hash(c.storage, c.master, 0, at::Device(at::kCUDA, 0)), c.expected);
}

// The element rules' own forms of two tables (written for vectorizing host loops and for the kernels) equal the
// originals: the E2M1 values built as float bits (codec::e2m1_to_float, which adamw::e2m1_value is) against the
// codec's table of magnitudes with the sign bit applied (-0 for code 8 included), and int8's log levels
// float(2^(-c/8)).
TEST(AdamWRules, TablesEqualTheirDefinitions) {
  for (uint32_t code = 0; code < 16; ++code) {
    const float magnitude = kernels::codec::e2m1_magnitude(code);
    EXPECT_EQ(kernels::codec::float_bits(kernels::adamw::e2m1_value(code)),
              kernels::codec::float_bits((code & 8u) ? -magnitude : magnitude))
        << code;
  }
  for (uint32_t code = 0; code < 256; ++code)
    EXPECT_EQ(kernels::adamw::int8_log_level(code), static_cast<float>(std::exp2(-static_cast<double>(code) / 8.0)))
        << code;
}

// The definition of nvfp4's stochastic E2M1 rounding, as first written (floor(scaled / spacing) * spacing, the
// neighbour's value turned into its code): the element rule derives the neighbour and its code from the scaled
// value's bits instead, which must give the same code for every input.
template <bool kIsSqrtV>
uint32_t reference_stochastic_magnitude(float a, float scale, float uniform) {
  float scaled = scale > 0.0f ? a / scale : 0.0f;
  scaled = scaled > 6.0f ? 6.0f : scaled;
  if (kIsSqrtV && scale > 0.0f && scaled < 0.5f) scaled = 0.5f;
  const float spacing = scaled < 2.0f ? 0.5f : (scaled < 4.0f ? 1.0f : 2.0f);
  const float inverse_spacing = 1.0f / spacing;
  const float lower = std::floor(scaled * inverse_spacing) * spacing;
  const float upper = lower + spacing;
  const float p_upper = kIsSqrtV ? (scaled * scaled - lower * lower) / (upper * upper - lower * lower)
                                 : (scaled - lower) * inverse_spacing;
  const float value = uniform < p_upper ? upper : lower;
  const float code = value < 2.0f ? value * 2.0f : (value < 4.0f ? value + 2.0f : (value < 5.0f ? 6.0f : 7.0f));
  return static_cast<uint32_t>(code);
}

// Every E4M3 scale (and 0); magnitudes at, one ulp either side of and between the grid points times the scale,
// across the range where the rounding is live and far below it; uniforms at 0, the smallest step, around each
// probability the grid's midpoints give, and spread over [0, 1).
TEST(AdamWRules, Nvfp4StochasticRoundingFromBitsEqualsTheDefinition) {
  namespace ka = kernels::adamw;
  std::vector<float> multiples;
  for (float g : {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f, 4.0f, 5.0f, 6.0f, 7.0f})
    multiples.push_back(g);
  for (int k = 1; k <= 128; ++k) multiples.push_back(static_cast<float>(k) * (6.5f / 128.0f));
  std::vector<float> uniforms{0.0f, 0x1p-24f, 0.25f, 0.5f, 0.75f, 1.0f - 0x1p-24f};
  for (int k = 1; k < 64; ++k) uniforms.push_back(static_cast<float>(k * 262139 % 16777216) * 0x1p-24f);
  int64_t checked = 0, differing = 0;
  std::string first_difference;
  auto check = [&](auto is_sqrt_v, float a, float scale, float uniform) {
    constexpr bool kSqrtV = decltype(is_sqrt_v)::value;
    const uint32_t got = ka::nvfp4_stochastic_magnitude<kSqrtV>(a, scale, uniform);
    const uint32_t want = reference_stochastic_magnitude<kSqrtV>(a, scale, uniform);
    ++checked;
    if (got != want && differing++ == 0)
      first_difference = std::string(kSqrtV ? "sqrt(v)" : "m") + ": a=" + std::to_string(a) + " scale=" +
                         std::to_string(scale) + " uniform=" + std::to_string(uniform) + " gives " +
                         std::to_string(got) + ", the definition " + std::to_string(want);
  };
  for (int scale_code = 0; scale_code <= kernels::codec::kE4m3MaxCode; ++scale_code) {
    const float scale = kernels::codec::e4m3_to_float(static_cast<uint8_t>(scale_code));
    const float unit = scale > 0.0f ? scale : 1.0f;
    for (float multiple : multiples)
      for (float tiny : {1.0f, 0x1p-20f, 0x1p-120f}) {
        const float center = multiple * unit * tiny;
        for (float a : {center, std::nextafter(center, 0.0f), std::nextafter(center, 1e30f)})
          for (float uniform : uniforms) {
            check(std::false_type{}, a, scale, uniform);
            check(std::true_type{}, a, scale, uniform);
          }
      }
  }
  EXPECT_EQ(differing, 0) << "of " << checked << "; first: " << first_difference;
  EXPECT_GT(checked, 1000000);
}

// The host loops draw the random stream in runs of 32-bit indices: a run stops where the high bits change, and
// its bits are the 64-bit index's.
TEST(AdamWRules, RandomRunsStopWhereTheHighBitsChange) {
  namespace ka = kernels::adamw;
  constexpr uint64_t kTwo32 = uint64_t{1} << 32;
  EXPECT_EQ(ka::indices_sharing_high_bits(0, 2560), 2560u);
  EXPECT_EQ(ka::indices_sharing_high_bits(kTwo32 - 3, 10), 3u);
  EXPECT_EQ(ka::indices_sharing_high_bits(kTwo32, 10), 10u);
  EXPECT_EQ(ka::indices_sharing_high_bits(3 * kTwo32 - 1, 2), 1u);
  const uint64_t key = 0x0123456789ABCDEFULL;
  for (uint64_t index : {kTwo32 - 2, kTwo32 - 1, kTwo32, 5 * kTwo32 + 7}) {
    const auto low = static_cast<uint32_t>(index), high = static_cast<uint32_t>(index >> 32);
    EXPECT_EQ(ka::random_bits_split(key, low, high), ka::random_bits(key, index)) << index;
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllStorages, AdamWGolden,
    ::testing::Values(GoldenCase{MomentStorage::float32, at::kFloat, 0x5f492fa611c1ceb7ULL},
                      GoldenCase{MomentStorage::float32, at::kBFloat16, 0xa6322bed1cdb5cf2ULL},
                      GoldenCase{MomentStorage::bfloat16, at::kFloat, 0x90fe92da74ee1f8cULL},
                      GoldenCase{MomentStorage::bfloat16, at::kBFloat16, 0x1215edb2282332dULL},
                      GoldenCase{MomentStorage::int8, at::kFloat, 0xcb243581fa4cc951ULL},
                      GoldenCase{MomentStorage::int8, at::kBFloat16, 0x214630031ac725fULL},
                      GoldenCase{MomentStorage::nvfp4, at::kFloat, 0x51fa9880f9eeb71eULL},
                      GoldenCase{MomentStorage::nvfp4, at::kBFloat16, 0xe0386cd984c64169ULL}),
    [](const ::testing::TestParamInfo<GoldenCase>& info) {
      return std::string(moment_storage_name(info.param.storage)) + "_master_" +
             (info.param.master == at::kFloat ? "float32" : "bfloat16");
    });

}  // namespace
}  // namespace qwen3
