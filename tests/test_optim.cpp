// AdamW: the fp32 path against a plain double-precision AdamW written here, bias correction, the decay mask,
// bf16 masters with stochastic rounding, chunk invariance, state bytes, checkpoint round trips, bad input.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "gpu_test.h"
#include "optim_test_util.h"
#include "qwen3/base/error.h"
#include "qwen3/base/slow_paths.h"
#include "qwen3/optim/optim.h"

namespace qwen3 {
namespace {

using optim_test::make_param;
using optim_test::set_grad;

constexpr MomentStorage kAllStorages[] = {MomentStorage::float32, MomentStorage::bfloat16, MomentStorage::int8,
                                          MomentStorage::nvfp4};

// The AdamW paper's algorithm with torch's eps placement, element by element in double.
struct ReferenceAdamW {
  double beta1, beta2, eps, weight_decay;
  std::vector<std::vector<double>> m = {}, v = {};
  int64_t t = 0;
  void step(std::vector<std::vector<double>>& params, const std::vector<std::vector<double>>& grads,
            const std::vector<bool>& decay, double lr) {
    ++t;
    if (m.empty())
      for (const auto& p : params) m.emplace_back(p.size(), 0.0), v.emplace_back(p.size(), 0.0);
    for (size_t i = 0; i < params.size(); ++i)
      for (size_t j = 0; j < params[i].size(); ++j) {
        if (decay[i]) params[i][j] *= 1.0 - lr * weight_decay;
        const double g = grads[i][j];
        m[i][j] = beta1 * m[i][j] + (1 - beta1) * g;
        v[i][j] = beta2 * v[i][j] + (1 - beta2) * g * g;
        const double m_hat = m[i][j] / (1 - std::pow(beta1, t)), v_hat = v[i][j] / (1 - std::pow(beta2, t));
        params[i][j] -= lr * m_hat / (std::sqrt(v_hat) + eps);
      }
  }
};

std::vector<double> to_vector(const at::Tensor& t) {
  const at::Tensor flat = t.detach().to(at::kDouble).contiguous().view(-1);
  return std::vector<double>(flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel());
}

TEST(AdamW, Fp32StorageMatchesAPlainReference) {
  at::manual_seed(1);
  std::vector<OptimParam> params{make_param("matrix", at::randn({5, 7})), make_param("norm", at::randn({9}), false),
                                 make_param("cube", at::randn({3, 2, 4}))};
  AdamWOptions options;
  options.beta1 = 0.85;
  options.beta2 = 0.99;
  options.eps = 1e-6;
  options.weight_decay = 0.1;
  AdamW optimizer(params, options);
  ReferenceAdamW reference{options.beta1, options.beta2, options.eps, options.weight_decay};
  std::vector<std::vector<double>> expected;
  for (const OptimParam& p : params) expected.push_back(to_vector(p.param));
  for (int step = 0; step < 25; ++step) {
    const double lr = 1e-2 * (1 + step % 3);
    std::vector<std::vector<double>> grads;
    for (const OptimParam& p : params) {
      const at::Tensor g = at::randn(p.param.sizes()) * std::pow(10.0, step % 4 - 2);
      set_grad(p, g);
      grads.push_back(to_vector(g));
    }
    optimizer.step(lr);
    reference.step(expected, grads, {true, false, true}, lr);
  }
  EXPECT_EQ(optimizer.step_count(), 25);
  for (size_t i = 0; i < params.size(); ++i) {
    const std::vector<double> actual = to_vector(params[i].param);
    for (size_t j = 0; j < actual.size(); ++j)
      ASSERT_NEAR(actual[j], expected[i][j], 1e-6 * std::max(1.0, std::fabs(expected[i][j])))
          << params[i].name << "[" << j << "]";
  }
}

// Without bias correction the first update would be (1 - beta1) / sqrt(1 - beta2) ~ 3.2 times smaller or larger
// than lr; with it, m_hat = g and v_hat = g^2, so every element moves by lr * g / (|g| + eps) ~ lr whatever |g|.
TEST(AdamW, FirstStepMovesEveryElementByLrWhateverTheGradientScale) {
  for (MomentStorage storage : kAllStorages) {
    const at::Tensor grad = at::tensor({1e-3f, -2.0f, 50.0f, -7e-2f, 3.0f, -1e-1f, 4e-4f, 9.0f}).repeat({2, 2});
    std::vector<OptimParam> params{make_param("p", at::zeros({2, 16}))};
    AdamWOptions options;
    options.moments = storage;
    AdamW optimizer(params, options);
    set_grad(params[0], grad);
    optimizer.step(0.01);
    const at::Tensor expected = -0.01 * grad / (grad.abs() + 1e-8);
    EXPECT_TRUE(at::allclose(params[0].param.detach(), expected, 1e-5, 0)) << moment_storage_name(storage);
  }
}

// On a GPU the kernel reads the gradient as autograd writes it (contiguous, the master's dtype); another one is
// copied first, with the same result, and the slower path is recorded (docs/trainer.md, "Slow paths").
TEST(AdamW, GpuGradientNotAsAutogradWritesItIsRecorded) {
  QWEN3_GPU_TEST(at::hasCUDA());
  at::manual_seed(4);
  const at::Tensor start = at::randn({4, 16}).to(at::kCUDA), grad = at::randn({16, 4}).to(at::kCUDA).t();
  ASSERT_FALSE(grad.is_contiguous());
  std::vector<at::Tensor> stepped;
  for (const bool contiguous : {true, false}) {
    std::vector<OptimParam> params{make_param("p", start)};
    AdamW optimizer(params, AdamWOptions{});
    at::Tensor(params[0].param).mutable_grad() = contiguous ? grad.contiguous() : grad;
    take_slow_paths();
    optimizer.step(0.01);
    const std::vector<SlowPath> taken = take_slow_paths();
    if (contiguous) {
      EXPECT_TRUE(taken.empty());
    } else {
      ASSERT_EQ(taken.size(), 1u);
      EXPECT_EQ(taken[0].why, "a gradient that is not contiguous");
    }
    stepped.push_back(params[0].param.detach().cpu());
  }
  EXPECT_TRUE(stepped[0].equal(stepped[1]));
}

TEST(AdamW, WeightDecayOnlyWhereAsked) {
  std::vector<OptimParam> params{make_param("decayed", at::full({4, 4}, 2.0f)),
                                 make_param("kept", at::full({4}, 2.0f), false)};
  AdamWOptions options;
  options.weight_decay = 0.5;
  AdamW optimizer(params, options);
  for (const OptimParam& p : params) set_grad(p, at::zeros(p.param.sizes()));  // no Adam update, decay only
  optimizer.step(0.1);
  EXPECT_TRUE(params[0].param.detach().equal(at::full({4, 4}, 2.0f * (1.0f - 0.1f * 0.5f))));
  EXPECT_TRUE(params[1].param.detach().equal(at::full({4}, 2.0f)));
}

TEST(AdamW, ParametersWithoutGradientAreLeftAlone) {
  std::vector<OptimParam> params{make_param("a", at::ones({3, 3})), make_param("b", at::ones({3}))};
  AdamW optimizer(params, AdamWOptions{});
  set_grad(params[0], at::ones({3, 3}));
  optimizer.step(0.1);
  EXPECT_FALSE(params[0].param.detach().equal(at::ones({3, 3})));
  EXPECT_TRUE(params[1].param.detach().equal(at::ones({3})));
}

// Updates of 1e-4 at 1.0, where bf16's spacing is 2^-8 below and 2^-7 above: round to nearest would never
// move; stochastic rounding follows the fp32 master on average.
TEST(AdamW, Bf16MasterKeepsUpdatesFarBelowItsSpacingOnAverage) {
  const float start = 1.0f;
  const double lr = 1e-4;
  ASSERT_EQ((at::full({1}, start, at::kBFloat16).to(at::kFloat) - lr).to(at::kBFloat16).item<float>(), start)
      << "round to nearest would keep such an update";
  std::vector<OptimParam> bf16{make_param("p", at::full({64, 64}, start, at::kBFloat16))};
  std::vector<OptimParam> fp32{make_param("p", at::full({64, 64}, start))};
  AdamWOptions options;
  options.seed = 5;
  AdamW bf16_optimizer(bf16, options), fp32_optimizer(fp32, options);
  at::manual_seed(3);
  for (int step = 0; step < 300; ++step) {
    const at::Tensor grad = at::rand({64, 64}) + 0.5;  // positive: every element moves down by ~lr a step
    set_grad(bf16[0], grad);
    set_grad(fp32[0], grad);
    bf16_optimizer.step(lr);
    fp32_optimizer.step(lr);
  }
  const double fp32_mean = fp32[0].param.detach().mean().item<double>();
  const double bf16_mean = bf16[0].param.detach().to(at::kFloat).mean().item<double>();
  ASSERT_NEAR(fp32_mean, start - 300 * lr, 3e-3);  // the fp32 path moved by ~0.03
  // One element's rounding error is at most 2^-8; 4096 independent ones average to ~2e-5.
  EXPECT_NEAR(bf16_mean, fp32_mean, 2e-4);
  // An element stays put with probability ~(1 - 1e-4 / 2^-8)^300 ~ 4e-4 (~2 of 4096); round to nearest: all.
  EXPECT_LT((bf16[0].param.detach().to(at::kFloat) == start).sum().item<int64_t>(), 20);
}

TEST(AdamW, ToBfloat16StochasticIsUnbiasedAndPicksANeighbour) {
  const at::Tensor x = at::full({100000}, 1.0f + 0.3f * 0.0078125f);  // 30% of the way to the next bf16
  at::Generator gen = at::detail::createCPUGenerator(7);
  const at::Tensor rounded = to_bfloat16_stochastic(x, gen).to(at::kFloat);
  EXPECT_TRUE(((rounded == 1.0f).logical_or(rounded == 1.0078125f)).all().item<bool>());
  EXPECT_NEAR(rounded.mean().item<double>(), x[0].item<double>(), 1e-4);
}

struct ChunkCase {
  MomentStorage storage;
  at::ScalarType master;
};

class AdamWChunks : public ::testing::TestWithParam<ChunkCase> {};

// Rows 1, 3, 7 per piece and whole tensors give the same bytes: parameters and every state tensor.
TEST_P(AdamWChunks, AnyChunkSizeGivesIdenticalBytes) {
  const ChunkCase c = GetParam();
  at::manual_seed(21);
  const std::vector<at::Tensor> initial{at::randn({13, 37}), at::randn({29}), at::randn({7, 3, 16})};
  std::vector<std::vector<at::Tensor>> grads(4);
  for (auto& step_grads : grads)
    for (const at::Tensor& t : initial) step_grads.push_back(at::randn(t.sizes()) * 0.1);
  std::vector<std::vector<at::Tensor>> results;
  for (int64_t rows : {0, 1, 3, 7}) {
    std::vector<OptimParam> params;
    for (size_t i = 0; i < initial.size(); ++i)
      params.push_back(make_param("p" + std::to_string(i), initial[i].to(c.master), i != 1));
    AdamWOptions options;
    options.moments = c.storage;
    options.weight_decay = 0.01;
    options.step_chunk_rows = rows;
    options.seed = 77;
    AdamW optimizer(params, options);
    for (const auto& step_grads : grads) {
      for (size_t i = 0; i < params.size(); ++i) set_grad(params[i], step_grads[i]);
      optimizer.step(1e-2);
    }
    std::vector<at::Tensor> out = optim_test::values_of(params);
    for (const auto& named : optimizer.state_tensors()) out.push_back(named.second.clone());
    results.push_back(out);
  }
  for (size_t r = 1; r < results.size(); ++r)
    for (size_t t = 0; t < results[0].size(); ++t)
      EXPECT_TRUE(results[r][t].equal(results[0][t])) << "chunking " << r << ", tensor " << t;
}

TEST_P(AdamWChunks, SaveLoadThenStepEqualsSteppingStraight) {
  const ChunkCase c = GetParam();
  at::manual_seed(31);
  std::vector<OptimParam> params{make_param("w", at::randn({6, 32}).to(c.master)),
                                 make_param("n", at::randn({32}).to(c.master), false)};
  AdamWOptions options;
  options.moments = c.storage;
  options.seed = 1234;
  options.weight_decay = 0.1;
  AdamW straight(params, options);
  const auto step_all = [&](AdamW& opt, std::vector<OptimParam>& ps, int seed_base, int steps) {
    for (int s = 0; s < steps; ++s) {
      at::manual_seed(seed_base + s);
      for (const OptimParam& p : ps) set_grad(p, at::randn(p.param.sizes()));
      opt.step(3e-3);
    }
  };
  step_all(straight, params, 100, 3);
  // The checkpoint: values, state tensors, step count, SR state.
  std::vector<OptimParam> resumed = optim_test::copy_params(params);
  std::vector<std::pair<std::string, at::Tensor>> saved;
  for (const auto& [name, tensor] : straight.state_tensors()) saved.emplace_back(name, tensor.clone());
  const int64_t saved_steps = straight.step_count();
  const at::Tensor saved_rng = straight.rng_state().clone();
  step_all(straight, params, 200, 4);

  AdamWOptions other_seed = options;
  other_seed.seed = 999;  // the loaded SR state must win over the constructor's
  AdamW restarted(resumed, other_seed);
  restarted.load_state_tensors(saved, saved_steps);
  restarted.set_rng_state(saved_rng);
  EXPECT_EQ(restarted.step_count(), 3);
  step_all(restarted, resumed, 200, 4);
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(resumed[i].param.detach().equal(params[i].param.detach())) << params[i].name;
  const auto a = straight.state_tensors(), b = restarted.state_tensors();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].second.equal(b[i].second)) << a[i].first;
}

INSTANTIATE_TEST_SUITE_P(
    AllStorages, AdamWChunks,
    ::testing::Values(ChunkCase{MomentStorage::float32, at::kFloat}, ChunkCase{MomentStorage::float32, at::kBFloat16},
                      ChunkCase{MomentStorage::bfloat16, at::kFloat}, ChunkCase{MomentStorage::bfloat16, at::kBFloat16},
                      ChunkCase{MomentStorage::int8, at::kFloat}, ChunkCase{MomentStorage::int8, at::kBFloat16},
                      ChunkCase{MomentStorage::nvfp4, at::kFloat}, ChunkCase{MomentStorage::nvfp4, at::kBFloat16}),
    [](const ::testing::TestParamInfo<ChunkCase>& info) {
      return std::string(moment_storage_name(info.param.storage)) + "_master_" +
             (info.param.master == at::kFloat ? "float32" : "bfloat16");
    });


// The trainer's clipping: the factor handed to step() gives the bytes of scaling the gradients first, in fp32
// and rounded back to the gradient's dtype (libtorch 1.13's in-place mul_ of a bf16 tensor rounds the factor
// itself to bf16 first; 2.x does not: the fused update follows 2.x).
TEST(AdamW, ClipFactorInTheStepEqualsClippingTheGradientsFirst) {
  for (const at::ScalarType master : {at::kFloat, at::kBFloat16}) {
    for (const MomentStorage storage : kAllStorages) {
      at::manual_seed(5);
      const at::Tensor start = at::randn({9, 40}), grad = at::randn({9, 40});
      std::vector<OptimParam> clipped_first{make_param("w", start.to(master))};
      std::vector<OptimParam> factor_in_step{make_param("w", start.to(master))};
      AdamWOptions options;
      options.moments = storage;
      AdamW a(clipped_first, options), b(factor_in_step, options);
      set_grad(clipped_first[0], grad);
      set_grad(factor_in_step[0], grad);
      const double norm_a = std::sqrt(grad_square_sum(clipped_first).item<double>());
      at::Tensor g = clipped_first[0].param.mutable_grad();
      g.copy_(g.to(at::kFloat).mul(static_cast<float>(clip_factor(norm_a, 0.5))).to(g.scalar_type()));
      a.step(1e-2);
      const double norm_b = std::sqrt(grad_square_sum(factor_in_step).item<double>());
      const double factor = clip_factor(norm_b, 0.5);
      ASSERT_EQ(norm_a, norm_b);
      ASSERT_LT(factor, 0.1);  // clipping engaged
      b.step(1e-2, factor);
      EXPECT_TRUE(clipped_first[0].param.equal(factor_in_step[0].param)) << moment_storage_name(storage);
      const auto sa = a.state_tensors(), sb = b.state_tensors();
      for (size_t i = 0; i < sa.size(); ++i)
        EXPECT_TRUE(sa[i].second.equal(sb[i].second)) << sa[i].first << ", " << moment_storage_name(storage) << " moments, master " << c10::toString(master);
    }
  }
  EXPECT_EQ(clip_factor(0.3, 0.5), 1.0);
  EXPECT_EQ(clip_factor(std::nan(""), 0.5), 1.0);
  EXPECT_EQ(clip_factor(3.0, 0.0), 1.0);
}

}  // namespace
}  // namespace qwen3
