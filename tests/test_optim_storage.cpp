// Moment storages: bytes per parameter, the encodings' error and bias, and how closely each compressed mode
// follows the fp32 optimizer on a toy regression (the figures are in docs/optim.md).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "optim/counter_random.h"
#include "optim/moment_codec.h"
#include "optim_test_util.h"
#include "qwen3/base/error.h"
#include "qwen3/optim/optim.h"

namespace qwen3 {
namespace {

using optim_test::make_param;
using optim_test::set_grad;

TEST(OptimStorage, StateBytesPerParameter) {
  struct Expected {
    MomentStorage storage;
    double bytes_per_param;  // for rows that are whole blocks
  };
  for (const Expected e : {Expected{MomentStorage::float32, 8.0}, Expected{MomentStorage::bfloat16, 4.0},
                           Expected{MomentStorage::int8, 2.0 * (1 + 4.0 / 64)},
                           Expected{MomentStorage::nvfp4, 2.0 * (0.5 + 1.0 / 16 + 4.0 / 256)}}) {
    std::vector<OptimParam> params{make_param("w", at::zeros({40, 256})), make_param("n", at::zeros({128}))};
    AdamWOptions options;
    options.moments = e.storage;
    const AdamW optimizer(params, options);
    const double extra_for_the_vector = e.storage == MomentStorage::nvfp4 ? 2.0 * 4 * (1 - 128.0 / 256) : 0.0;
    EXPECT_EQ(optimizer.state_bytes(),
              static_cast<uint64_t>(e.bytes_per_param * (40 * 256 + 128) + extra_for_the_vector))
        << moment_storage_name(e.storage);
    EXPECT_EQ(moment_state_bytes({40, 256}, e.storage) + moment_state_bytes({128}, e.storage),
              optimizer.state_bytes());
  }
  // A row that is not a whole number of blocks is padded: 37 columns take 64 (int8) or 48 (nvfp4).
  EXPECT_EQ(moment_state_bytes({3, 37}, MomentStorage::int8), 2u * 3 * (64 + 4));
  EXPECT_EQ(moment_state_bytes({3, 37}, MomentStorage::nvfp4), 2u * 3 * (24 + 3 + 4));
  EXPECT_EQ(moment_state_bytes({3, 37}, MomentStorage::float32), 8u * 3 * 37);
}

// Storing the same values under many random keys and decoding gives their values on average: the stochastic
// rounding is unbiased (for v: in v itself, which is what the moving average needs).
void expect_unbiased_storage(MomentStorage storage, bool second_moment, double max_single_error,
                             double max_mean_error) {
  at::manual_seed(8);
  const at::Tensor magnitudes = at::pow(10.0, at::rand({4, 64}) * 3 - 4);  // 1e-4 .. 1e-1 in every block
  const at::Tensor values = second_moment ? magnitudes.pow(2) : magnitudes * (at::rand({4, 64}) - 0.5).sign();
  AdamW::ParamState state = optim_detail::allocate_moments(storage, {4, 64}, at::kCPU);
  at::Tensor sum = at::zeros({4, 64}, at::kDouble);
  const int draws = 2000;
  double worst_single = 0;
  for (int key = 0; key < draws; ++key) {
    if (second_moment) {
      optim_detail::store_exp_avg_sq(state, storage, 0, values, 1000 + key);
    } else {
      optim_detail::store_exp_avg(state, storage, 0, values, 1000 + key);
    }
    const at::Tensor decoded = second_moment ? optim_detail::load_exp_avg_sq(state, storage, 0, 4)
                                             : optim_detail::load_exp_avg(state, storage, 0, 4);
    worst_single = std::max(worst_single, ((decoded - values).abs() / values.abs()).max().item<double>());
    sum += decoded.to(at::kDouble);
  }
  const at::Tensor mean_error = ((sum / draws - values.to(at::kDouble)).abs() / values.abs()).max();
  std::printf("%s %s: worst single relative error %.3g, worst relative error of the mean %.3g\n",
              moment_storage_name(storage), second_moment ? "v" : "m", worst_single, mean_error.item<double>());
  EXPECT_LE(worst_single, max_single_error);
  EXPECT_LE(mean_error.item<double>(), max_mean_error);
}

TEST(OptimStorage, Bf16MomentsAreUnbiased) {
  expect_unbiased_storage(MomentStorage::bfloat16, false, 1.0 / 128, 1e-3);
  expect_unbiased_storage(MomentStorage::bfloat16, true, 1.0 / 128, 1e-3);
}

TEST(OptimStorage, Int8LogSecondMomentKeepsEveryMagnitudeWithinOneLevel) {
  // v spans six decades inside each 64-block; the log grid's levels are 2^(1/8) apart.
  expect_unbiased_storage(MomentStorage::int8, true, std::exp2(1.0 / 8) - 1, 5e-3);
}

TEST(OptimStorage, NvFp4MomentsAreUnbiasedAboveTheirBlockRange) {
  // Values a few times apart only (nvfp4 resolves ~12x within a block); unbiased, one grid step at most.
  at::manual_seed(9);
  for (bool second_moment : {false, true}) {
    const at::Tensor values = (at::rand({2, 32}) + 0.5) * (second_moment ? 1e-6 : -3e-2);
    AdamW::ParamState state = optim_detail::allocate_moments(MomentStorage::nvfp4, {2, 32}, at::kCPU);
    at::Tensor sum = at::zeros({2, 32}, at::kDouble);
    for (int key = 0; key < 4000; ++key) {
      if (second_moment) {
        optim_detail::store_exp_avg_sq(state, MomentStorage::nvfp4, 0, values, key);
        sum += optim_detail::load_exp_avg_sq(state, MomentStorage::nvfp4, 0, 2).to(at::kDouble);
      } else {
        optim_detail::store_exp_avg(state, MomentStorage::nvfp4, 0, values, key);
        sum += optim_detail::load_exp_avg(state, MomentStorage::nvfp4, 0, 2).to(at::kDouble);
      }
    }
    const double mean_error = ((sum / 4000 - values.to(at::kDouble)).abs() / values.abs()).max().item<double>();
    EXPECT_LT(mean_error, 0.02) << (second_moment ? "v" : "m");
  }
}

TEST(OptimStorage, NvFp4SecondMomentIsNeverZeroInANonZeroBlock) {
  const at::Tensor v = at::cat({at::full({1, 15}, 1e-12f), at::full({1, 1}, 1.0f)}, 1);
  AdamW::ParamState state = optim_detail::allocate_moments(MomentStorage::nvfp4, {1, 16}, at::kCPU);
  for (int key = 0; key < 50; ++key) {
    optim_detail::store_exp_avg_sq(state, MomentStorage::nvfp4, 0, v, key);
    const at::Tensor decoded = optim_detail::load_exp_avg_sq(state, MomentStorage::nvfp4, 0, 1);
    // Floored at the block's smallest level, (0.5 * scale)^2, about (1/12)^2 of the block maximum.
    ASSERT_GE(decoded.min().item<float>(), 1.0f / 144 * 0.9f);
    ASSERT_LE(decoded.narrow(1, 0, 15).max().item<float>(), 1.0f / 144 * 1.1f);
  }
}

TEST(OptimStorage, RandomBitsDoNotDependOnTheCut) {
  const at::Tensor whole = optim_detail::random_bits(42, 0, 10, 33, at::kCPU);
  const at::Tensor rows_3_to_9 = optim_detail::random_bits(42, 3 * 33, 7, 33, at::kCPU);
  EXPECT_TRUE(whole.narrow(0, 3, 7).equal(rows_3_to_9));
  const at::Tensor uniform = optim_detail::uniform_from_bits(optim_detail::random_bits(7, 0, 1000, 1000, at::kCPU));
  EXPECT_NEAR(uniform.mean().item<double>(), 0.5, 1e-3);
  EXPECT_NEAR(uniform.var().item<double>(), 1.0 / 12, 1e-3);
  EXPECT_GE(uniform.min().item<float>(), 0.0f);
  EXPECT_LT(uniform.max().item<float>(), 1.0f);
  // Neighbouring keys are unrelated streams.
  const at::Tensor other = optim_detail::uniform_from_bits(optim_detail::random_bits(8, 0, 1000, 1000, at::kCPU));
  const double correlation = ((uniform - 0.5) * (other - 0.5)).mean().item<double>() * 12;
  EXPECT_LT(std::fabs(correlation), 5e-3);
}

// Trains the toy regression with every storage from the same start, and compares with the fp32-moment run:
// the distance between the weights relative to the distance fp32 travelled (dominated by the weights of the
// 1e-3-scale inputs, which the loss hardly constrains), the same distance measured on the predictions X w^T
// (what the loss sees), and the final loss.
TEST(OptimStorage, CompressedModesTrackTheFp32Optimizer) {
  const optim_test::ToyRegression problem;
  const int steps = 400;
  const auto train = [&](MomentStorage storage, at::ScalarType master) {
    std::vector<OptimParam> params = problem.initial_params(master);
    AdamWOptions options;
    options.moments = storage;
    options.seed = 11;
    AdamW optimizer(params, options);
    const LrSchedule schedule{LrScheduleKind::cosine, 1e-2, 20, steps, 1e-3};
    for (int step = 0; step < steps; ++step) {
      problem.loss_and_grad(params);
      optimizer.step(schedule.at(step));
    }
    return std::make_pair(params[0].param.detach().to(at::kFloat), problem.loss_and_grad(params));
  };
  const at::Tensor start = problem.initial_params(at::kFloat)[0].param.detach();
  const auto [reference, reference_loss] = train(MomentStorage::float32, at::kFloat);
  const auto predictions = [&](const at::Tensor& w) { return at::matmul(problem.inputs, w.t()); };
  std::printf("float32 moments: start loss %.4g, final loss %.4g\n",
              problem.loss_and_grad(problem.initial_params(at::kFloat)), reference_loss);
  struct Bound {
    MomentStorage storage;
    at::ScalarType master;
    double max_weight_distance, max_prediction_distance, max_loss_ratio;
  };
  for (const Bound b : {Bound{MomentStorage::float32, at::kBFloat16, 0.08, 0.02, 1.04},
                        Bound{MomentStorage::bfloat16, at::kFloat, 0.02, 0.005, 1.01},
                        Bound{MomentStorage::int8, at::kFloat, 0.2, 0.02, 1.03},
                        Bound{MomentStorage::nvfp4, at::kFloat, 0.6, 0.06, 1.03}}) {
    const auto [weight, loss] = train(b.storage, b.master);
    const double weight_distance = ((weight - reference).norm() / (reference - start).norm()).item<double>();
    const double prediction_distance = ((predictions(weight) - predictions(reference)).norm() /
                                        (predictions(reference) - predictions(start)).norm())
                                           .item<double>();
    std::printf("%s moments, %s master: weight distance %.4f, prediction distance %.4f, loss %.4g (x%.4f)\n",
                moment_storage_name(b.storage), b.master == at::kFloat ? "float32" : "bfloat16", weight_distance,
                prediction_distance, loss, loss / reference_loss);
    EXPECT_LT(weight_distance, b.max_weight_distance) << moment_storage_name(b.storage);
    EXPECT_LT(prediction_distance, b.max_prediction_distance) << moment_storage_name(b.storage);
    EXPECT_LT(loss / reference_loss, b.max_loss_ratio) << moment_storage_name(b.storage);
  }
}

TEST(OptimStorage, LoadRejectsStateOfAnotherShapeOrMode) {
  std::vector<OptimParam> params{make_param("w", at::zeros({4, 32}))};
  AdamWOptions int8;
  int8.moments = MomentStorage::int8;
  AdamW optimizer(params, int8);
  AdamWOptions fp32;
  AdamW other_mode(optim_test::copy_params(params), fp32);
  EXPECT_THROW(optimizer.load_state_tensors(other_mode.state_tensors(), 1), Error);
  auto state = optimizer.state_tensors();
  state[0].second = at::zeros({4, 16}, at::kChar);
  EXPECT_THROW(optimizer.load_state_tensors(state, 1), Error);
  auto extra = optimizer.state_tensors();
  extra.emplace_back("w.unknown", at::zeros({1}));
  EXPECT_THROW(optimizer.load_state_tensors(extra, 1), Error);
  EXPECT_THROW(optimizer.load_state_tensors(optimizer.state_tensors(), -1), Error);
  EXPECT_THROW(optimizer.set_rng_state(at::zeros({2}, at::kLong)), Error);
}

TEST(OptimStorage, BadOptionsAndParametersAreErrors) {
  const auto with = [](auto change) {
    AdamWOptions o;
    change(o);
    return o;
  };
  const std::vector<OptimParam> ok{make_param("w", at::zeros({2, 2}))};
  EXPECT_THROW(AdamW(ok, with([](AdamWOptions& o) { o.beta1 = 1.0; })), UsageError);
  EXPECT_THROW(AdamW(ok, with([](AdamWOptions& o) { o.beta2 = -0.1; })), UsageError);
  EXPECT_THROW(AdamW(ok, with([](AdamWOptions& o) { o.eps = 0; })), UsageError);
  EXPECT_THROW(AdamW(ok, with([](AdamWOptions& o) { o.step_chunk_rows = -1; })), UsageError);
  EXPECT_THROW(AdamW({make_param("d", at::zeros({2}, at::kDouble))}, AdamWOptions{}), Error);
  EXPECT_THROW(AdamW({make_param("w", at::zeros({2})), make_param("w", at::zeros({2}))}, AdamWOptions{}), Error);
}

}  // namespace
}  // namespace qwen3
