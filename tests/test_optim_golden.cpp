// The optimizer's exact bytes, pinned: three AdamW steps of every (moment storage, master dtype) pair on inputs
// built from integer hashes (no libtorch generator, no libm, so they are the same on every machine and
// libtorch), hashed over the parameters and every state tensor, and compared tensor by tensor with a second,
// plainly written implementation of the rules (tests/adamw_reference.h).
//
// fp32 moments with an fp32 master draw nothing: its hash is the one the ATen-composed optimizer produced (commit
// b73ff9e, before the fused element update) on x86-64. The other seven pairs' hashes changed once, when every
// stochastic rounding of an element came to draw from one hash and the encoders to multiply by a block's
// reciprocal instead of dividing (kernels/adamw_step.md, "Bytes or instructions?"): they are the bytes the
// plainly written rules give (ThreeStepsEqualThePlainlyWrittenRules), and before that change they were the
// composed optimizer's too.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "adamw_reference.h"
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

const std::vector<std::vector<int64_t>>& golden_shapes() {
  static const std::vector<std::vector<int64_t>> shapes{{13, 37}, {29}, {7, 3, 16}, {40, 200}, {3, 2560}};
  return shapes;
}

uint64_t three_steps_hash(MomentStorage storage, at::ScalarType master, int64_t chunk_rows,
                          const at::Device& device = at::kCPU) {
  const auto& shapes = golden_shapes();
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

// A tensor's bytes against the reference's, or where they first differ.
std::string first_difference(const std::string& what, const at::Tensor& tensor, const std::vector<uint8_t>& expected) {
  const at::Tensor c = tensor.detach().contiguous().to(at::kCPU);
  const auto* got = static_cast<const uint8_t*>(c.data_ptr());
  const size_t size = static_cast<size_t>(c.numel()) * c.element_size();
  if (size != expected.size())
    return what + ": " + std::to_string(size) + " bytes, the reference " + std::to_string(expected.size());
  for (size_t i = 0; i < size; ++i)
    if (got[i] != expected[i]) return what + ": byte " + std::to_string(i) + " differs from the reference";
  return "";
}

// The same three steps through the plainly written rules, compared after every step with the optimizer's
// parameters and state tensors, element by element.
TEST_P(AdamWGolden, ThreeStepsEqualThePlainlyWrittenRules) {
  namespace ref = adamw_reference;
  const GoldenCase c = GetParam();
  const auto& shapes = golden_shapes();
  std::vector<OptimParam> params;
  for (size_t i = 0; i < shapes.size(); ++i)
    params.push_back(optim_test::make_param("p" + std::to_string(i), hashed_values(shapes[i], 1000 + i).mul(4.0f).to(c.master), i != 1));
  AdamWOptions options;
  options.moments = c.storage;
  options.weight_decay = 0.05;
  options.seed = 2026;
  AdamW optimizer(params, options);

  const ref::Storage storage = c.storage == MomentStorage::float32    ? ref::Storage::f32
                               : c.storage == MomentStorage::bfloat16 ? ref::Storage::bf16
                               : c.storage == MomentStorage::int8     ? ref::Storage::int8
                                                                      : ref::Storage::nvfp4;
  std::vector<ref::State> states;
  std::vector<std::vector<float>> masters_f32;
  std::vector<std::vector<uint16_t>> masters_bf16;
  for (const OptimParam& p : params) {
    ref::State st;
    st.storage = storage;
    st.rows = p.param.dim() <= 1 ? 1 : p.param.size(0);
    st.cols = p.param.numel() / st.rows;
    const int64_t block = ref::block_of(storage);
    st.stored = (st.cols + block - 1) / block * block;
    const auto elements = static_cast<size_t>(st.rows * st.stored), blocks = elements / block;
    const auto rows = static_cast<size_t>(st.rows);
    // The optimizer's initial state: zero codes and scales (decoding to 0), row scales 1.
    if (storage == ref::Storage::f32) st.m_f32.assign(elements, 0.0f), st.v_f32.assign(elements, 0.0f);
    if (storage == ref::Storage::bf16) st.m_bf16.assign(elements, 0), st.v_bf16.assign(elements, 0);
    if (storage == ref::Storage::int8)
      st.m_int8.assign(elements, 0), st.v_int8.assign(elements, 0), st.m_step.assign(blocks, 0.0f), st.v_max.assign(blocks, 0.0f);
    if (storage == ref::Storage::nvfp4) {
      st.m_fp4.assign(elements / 2, 0), st.v_fp4.assign(elements / 2, 0);
      st.m_scale.assign(blocks, 0), st.v_scale.assign(blocks, 0), st.m_row.assign(rows, 1.0f), st.v_row.assign(rows, 1.0f);
    }
    states.push_back(st);
    const at::Tensor value = p.param.detach().contiguous();
    if (c.master == at::kFloat) {
      masters_f32.emplace_back(value.data_ptr<float>(), value.data_ptr<float>() + value.numel());
    } else {
      const auto* bits = static_cast<const uint16_t*>(value.data_ptr());
      masters_bf16.emplace_back(bits, bits + value.numel());
    }
  }

  const double lrs[] = {1e-2, 3e-3, 5e-2};
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < params.size(); ++i) {
      optim_test::set_grad(params[i], hashed_values(shapes[i], 100 * (step + 1) + i, step == 1 ? 2 : -1));
      const at::Tensor grad = params[i].param.grad().to(at::kFloat).contiguous();
      const std::vector<float> g(grad.data_ptr<float>(), grad.data_ptr<float>() + grad.numel());
      const ref::Hyper h = ref::hyper(lrs[step], options.beta1, options.beta2, options.eps, options.weight_decay,
                                      params[i].decay, step + 1);
      const uint64_t key = ref::step_key(options.seed, step + 1, static_cast<int64_t>(i));
      ref::step(states[i], c.master == at::kFloat ? &masters_f32[i] : nullptr,
                c.master == at::kFloat ? nullptr : &masters_bf16[i], g, h, key);
    }
    optimizer.step(lrs[step]);

    std::vector<std::string> differences;
    const auto note = [&](const std::string& d) {
      if (!d.empty()) differences.push_back(d);
    };
    const auto named = optimizer.state_tensors();
    size_t next = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string where = "step " + std::to_string(step + 1) + ", p" + std::to_string(i);
      note(first_difference(where + " master", params[i].param,
                            c.master == at::kFloat ? ref::bytes_of(masters_f32[i]) : ref::bytes_of(masters_bf16[i])));
      for (const auto& [suffix, bytes] : ref::named_bytes(states[i])) {
        const auto& [name, tensor] = named.at(next++);
        EXPECT_EQ(name, "p" + std::to_string(i) + suffix);
        note(first_difference(where + suffix, tensor, bytes));
      }
    }
    ASSERT_TRUE(differences.empty()) << differences.size() << " tensors differ; first: " << differences.front();
  }
}

TEST_P(AdamWGolden, ThreeStepsGiveThePinnedBytes) {
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
// neighbour's value turned into its code; for sqrt(v) the probability's denominator's reciprocal computed here):
// the element rule derives the neighbour and its code from the scaled value's bits and reads the reciprocal
// from a table, which must give the same code for every input. Both normalize by the block's divisor (x times
// the rounded reciprocal of the scale, kernels/adamw_update.cuh).
template <bool kIsSqrtV>
uint32_t reference_stochastic_magnitude(float a, float scale, float uniform) {
  float scaled = scale > 0.0f ? (a * 1.0f) * (1.0f / scale) : 0.0f;  // E4M3 scales need no power-of-two shift
  scaled = scaled > 6.0f ? 6.0f : scaled;
  if (kIsSqrtV && scale > 0.0f && scaled < 0.5f) scaled = 0.5f;
  const float spacing = scaled < 2.0f ? 0.5f : (scaled < 4.0f ? 1.0f : 2.0f);
  const float inverse_spacing = 1.0f / spacing;
  const float lower = std::floor(scaled * inverse_spacing) * spacing;
  const float upper = lower + spacing;
  const float p_upper = kIsSqrtV ? (scaled * scaled - lower * lower) * (1.0f / (upper * upper - lower * lower))
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
    const uint32_t got = ka::nvfp4_stochastic_magnitude<kSqrtV>(a, ka::block_divisor(scale), uniform);
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

// The int8 encoders against the plainly written rules where a last-bit difference would show: uniforms on the
// 24-bit grid at and beside the reference's own threshold (the remainder for m, the upper level's probability for
// v), block maxima from subnormal to 2^100 (the block divisor's power-of-two shift), values across every octave
// of v's levels and between them. The golden steps rarely land on a threshold; this test lands on every one.
TEST(AdamWRules, Int8EncodersEqualThePlainRulesAtTheirThresholds) {
  namespace ka = kernels::adamw;
  namespace ref = adamw_reference;
  const auto grid_around = [](float threshold) {
    const float at = std::floor(threshold * 16777216.0f) / 16777216.0f;
    std::vector<float> u;
    for (float x : {at - 0x1p-24f, at, at + 0x1p-24f})
      if (x >= 0.0f && x < 1.0f) u.push_back(x);
    return u;
  };
  int64_t checked = 0, differing = 0;
  std::string first;
  const auto expect_same = [&](int got, int want, const std::string& what) {
    ++checked;
    if (got != want && differing++ == 0) first = what + ": " + std::to_string(got) + ", the rule " + std::to_string(want);
  };
  for (float block_max : {1.0f, 3.7f, 1e-3f, 0x1p-100f, 1e-40f, 7e-39f, 1e30f, 0x1p70f, 123456.0f}) {
    const ka::BlockDivisor v_divisor = ka::block_divisor(block_max);
    for (int code = 0; code <= 256; ++code)
      for (float fraction : {0.0f, 0.013f, 0.25f, 0.5f, 0.61803f, 0.999f}) {
        // A ratio between level(code) and level(code + 1) (or beyond the last one), times the block maximum.
        const float ratio = ref::int8_level(code) * (1.0f - fraction * 0.083f);
        const float v = ratio * block_max;
        const float rule_ratio = ref::block_quotient(v, block_max);
        const int upper = ref::int8_v_upper(rule_ratio);
        for (float u : grid_around(ref::int8_v_probability(rule_ratio, upper)))
          expect_same(ka::int8_log_encode(v, v_divisor, u), ref::int8_v_code(v, block_max, u),
                      "v=" + std::to_string(v) + " max=" + std::to_string(block_max) + " u=" + std::to_string(u));
      }
    const float step = block_max / 127.0f;
    const ka::BlockDivisor m_divisor = ka::block_divisor(step);
    for (int k = -127 * 8; k <= 127 * 8; ++k) {
      const float x = step * (static_cast<float>(k) / 8.0f + 0.0371f);
      const float t = ref::block_quotient(x, step);
      for (float u : grid_around(t - std::floor(t)))
        expect_same(ka::int8_linear_encode(x, m_divisor, u), ref::int8_m_code(x, step, u),
                    "m=" + std::to_string(x) + " step=" + std::to_string(step) + " u=" + std::to_string(u));
    }
  }
  EXPECT_EQ(differing, 0) << "of " << checked << "; first: " << first;
  EXPECT_GT(checked, 50000);
}

// The GPU's int8 log code from an estimate of log2(ratio) (the hardware's approximate log2 there) is the exact one
// for any estimate within kInt8LogEstimateError / 8 of it: every level and its neighbours one and two ulps away,
// ratios between levels, and the edges (0, subnormal, NaN, 1 and above), each with estimates off by up to that
// either way, and with what the hardware gives where it flushes: -infinity for 0 and for a subnormal ratio.
// Fails without the margin (an estimate just under a level's code), without the one comparison (an estimate just
// over it), or with the candidate clamped to 253 (checked).
TEST(AdamWRules, Int8LogCodeFromAnEstimateIsTheExactOne) {
  namespace ka = kernels::adamw;
  std::vector<float> ratios{0.0f, 1e-45f, 1e-40f, 0x1p-126f, 1e-30f, 1.0f, 1.0000001f, 2.0f, 3e38f, HUGE_VALF,
                            std::nanf("")};
  for (uint32_t code = 0; code <= 255; ++code) {
    const float level = ka::int8_log_level(code);
    float below = level, above = level;
    for (int k = 0; k < 3; ++k) {
      ratios.push_back(below), ratios.push_back(above);
      below = std::nextafter(below, 0.0f), above = std::nextafter(above, 2.0f);
    }
    for (float f : {0.1f, 0.5f, 0.9f}) ratios.push_back(level * (1.0f - f * 0.083f));
  }
  int64_t checked = 0, differing = 0;
  std::string first;
  for (float ratio : ratios) {
    std::vector<float> estimates;
    if (ratio > 0.0f) {
      const double exact = std::log2(static_cast<double>(ratio));
      const double e = ka::kInt8LogEstimateError / 8.0;
      for (double delta : {-e, -e / 2, 0.0, e / 2, e}) estimates.push_back(static_cast<float>(exact + delta));
      if (ratio < 0x1p-126f) estimates.push_back(-HUGE_VALF);  // flushed to 0
    } else {
      estimates = {HUGE_VALF, -HUGE_VALF, std::nanf("")};
    }
    for (float estimate : estimates) {
      ++checked;
      const uint32_t got = ka::int8_log_upper_code_from_log2(ratio, estimate, ka::ComputedLevels{});
      const uint32_t want = ka::int8_log_upper_code(ratio);
      if (got != want && differing++ == 0)
        first = "ratio " + std::to_string(ratio) + ", estimate " + std::to_string(estimate) + ": " + std::to_string(got) +
                ", the exact code " + std::to_string(want);
    }
  }
  EXPECT_EQ(differing, 0) << "of " << checked << "; first: " << first;
  EXPECT_GT(checked, 10000);
}

// The master update's division by sqrt(1 - beta2^t) as two Markstein corrections with the divisor's reciprocal
// (divide_by_known) is IEEE's quotient: for the bias corrections of four beta2 at steps from 1 to 1000, the smallest
// divisor any beta2 gives, 1, and a few others, a stride through every mantissa of x in [1, 2) (quotients scale
// with x's exponent, so that covers every binade where nothing under- or overflows), x in the binades the update
// reaches (from sqrt of the smallest subnormal, 2^-75, to 2^63), and 0, infinity, NaN and 2^64 less an ulp. Bit for
// bit. Written, it was compared for 3,703 divisors over all 2^23 mantissas each (0 differences). Fails without the
// corrections (q0 = RN(x r) alone; checked).
TEST(AdamWRules, KnownDivisorQuotientIsTheIeeeOne) {
  namespace ka = kernels::adamw;
  std::vector<float> divisors{1.0f, static_cast<float>(std::sqrt(std::ldexp(1.0, -53))), 0.0316227766f, 0.7f,
                              0x1.fffffep-1f, 0x1.000002p-7f};
  for (double beta2 : {0.999, 0.99, 0.95, 0.9999})
    for (int t : {1, 2, 3, 10, 100, 1000}) divisors.push_back(static_cast<float>(std::sqrt(1.0 - std::pow(beta2, t))));
  int64_t checked = 0, differing = 0;
  std::string first;
  auto check = [&](float x, float d) {
    ka::StepScalars s{};
    ka::set_bias_correction2(s, d);
    const float got = ka::divide_by_known(x, s.bias_correction2_sqrt, s.inverse_bias_correction2_sqrt);
    const float want = x / d;
    ++checked;
    uint32_t got_bits, want_bits;
    std::memcpy(&got_bits, &got, 4);
    std::memcpy(&want_bits, &want, 4);
    if (got_bits != want_bits && !(std::isnan(got) && std::isnan(want)) && differing++ == 0)
      first = "x " + std::to_string(x) + " d " + std::to_string(d);
  };
  for (float d : divisors) {
    for (uint32_t m = 0; m < (1u << 23); m += 5) {
      check(std::ldexp(1.0f + std::ldexp(static_cast<float>(m), -23), 0), d);
    }
    for (int e : {-75, -74, -40, -1, 20, 63})
      for (uint32_t m = 0; m < (1u << 23); m += 4099)
        check(std::ldexp(1.0f + std::ldexp(static_cast<float>(m), -23), e), d);
    for (float x : {0.0f, 0x1.fffffep63f, std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()})
      check(x, d);
  }
  EXPECT_EQ(differing, 0) << "of " << checked << "; first: " << first;
  EXPECT_GT(checked, 20000000);
}

// The host form of the GPU's saturating floor conversion (cvt.rmi.u32.f32) at its edges.
TEST(AdamWRules, FloorToU32SaturatesAsTheGpuConversion) {
  namespace ka = kernels::adamw;
  EXPECT_EQ(ka::floor_to_u32_saturated(std::nanf("")), 0u);
  EXPECT_EQ(ka::floor_to_u32_saturated(-HUGE_VALF), 0u);
  EXPECT_EQ(ka::floor_to_u32_saturated(-0.5f), 0u);
  EXPECT_EQ(ka::floor_to_u32_saturated(0.0f), 0u);
  EXPECT_EQ(ka::floor_to_u32_saturated(0.999f), 0u);
  EXPECT_EQ(ka::floor_to_u32_saturated(1.0f), 1u);
  EXPECT_EQ(ka::floor_to_u32_saturated(254.998f), 254u);
  EXPECT_EQ(ka::floor_to_u32_saturated(0x1.fffffep31f), 0xFFFFFF00u);
  EXPECT_EQ(ka::floor_to_u32_saturated(0x1p32f), 0xFFFFFFFFu);
  EXPECT_EQ(ka::floor_to_u32_saturated(HUGE_VALF), 0xFFFFFFFFu);
}

// The reciprocal tables of the encoders equal the reciprocals they stand for: int8's inverse level gaps (every
// code of 0..254) and nvfp4's inverse square gaps.
TEST(AdamWRules, ReciprocalTablesEqualTheirDefinitions) {
  namespace ka = kernels::adamw;
  for (uint32_t code = 0; code <= 254; ++code) {
    const float gap = ka::int8_log_level(code) - ka::int8_log_level(code + 1);
    EXPECT_EQ(ka::int8_log_inverse_gap(code), 1.0f / gap) << code;
  }
  const float lower[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float upper[8] = {0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, 8.0f};
  for (uint32_t c = 0; c < 8; ++c)
    EXPECT_EQ(ka::nvfp4_inverse_square_gap(c), 1.0f / (upper[c] * upper[c] - lower[c] * lower[c])) << c;
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
    // The step's draws too (the host loops make them in runs), m's alone from the first round.
    const ka::ElementDraws split = ka::element_draws_split(key, low, high), whole = ka::element_draws(key, index);
    EXPECT_EQ(split.m, whole.m) << index;
    EXPECT_EQ(split.v, whole.v) << index;
    EXPECT_EQ(split.master, whole.master) << index;
    EXPECT_EQ(ka::m_draw_split(key, low, high), whole.m) << index;
  }
  // Elements 2^32 apart draw differently (both rounds see the high bits).
  const ka::ElementDraws below = ka::element_draws(key, 7), above = ka::element_draws(key, kTwo32 + 7);
  EXPECT_NE(below.m, above.m);
  EXPECT_NE(below.v, above.v);
}

INSTANTIATE_TEST_SUITE_P(
    AllStorages, AdamWGolden,
    ::testing::Values(GoldenCase{MomentStorage::float32, at::kFloat, 0x5f492fa611c1ceb7ULL},
                      GoldenCase{MomentStorage::float32, at::kBFloat16, 0x2a1daac7b3eaab32ULL},
                      GoldenCase{MomentStorage::bfloat16, at::kFloat, 0x370c54b6aa27fa22ULL},
                      GoldenCase{MomentStorage::bfloat16, at::kBFloat16, 0x8606a31dbf34a78fULL},
                      GoldenCase{MomentStorage::int8, at::kFloat, 0xa6bdbbf7e7c0912ULL},
                      GoldenCase{MomentStorage::int8, at::kBFloat16, 0xb4b8ba5c60b78266ULL},
                      GoldenCase{MomentStorage::nvfp4, at::kFloat, 0x527aafe9de569bdaULL},
                      GoldenCase{MomentStorage::nvfp4, at::kBFloat16, 0x1746146c46794169ULL}),
    [](const ::testing::TestParamInfo<GoldenCase>& info) {
      return std::string(moment_storage_name(info.param.storage)) + "_master_" +
             (info.param.master == at::kFloat ? "float32" : "bfloat16");
    });

}  // namespace
}  // namespace qwen3
