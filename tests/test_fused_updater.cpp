// The in-backward update's clipping (--fused-optimizer, src/trainer/step_update.h): each group's factor is
// computed on the device and read by the update kernels, a non-finite group is left as it is, and the host never
// waits for the device while backward runs.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "gpu_test.h"
#include "grad_clip_host_run.h"
#include "optim_test_util.h"
#include "qwen3/optim/optim.h"
#include "trainer/step_update.h"

#if defined(QWEN3_TORCH_HAS_CUDA)
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace qwen3 {
namespace {

using optim_test::make_param;
using optim_test::values_of;
using train_detail::FusedUpdater;

std::vector<OptimParam> three_params(const at::Device& device) {
  at::manual_seed(31);
  return {make_param("a", at::randn({8, 64}).to(device)), make_param("b", at::randn({4, 64}).to(device)),
          make_param("c", at::randn({16, 64}).to(device))};
}

AdamWOptions options_for(MomentStorage moments) {
  AdamWOptions o;
  o.moments = moments;
  o.weight_decay = 0.01;
  return o;
}

// Group {a, b} is clipped (its norm above its share of the limit), group {c} has a NaN: against an optimizer
// stepped with the host's clip_factor, the first group's bytes are the same and the second is left untouched.
void check_groups(const at::Device& device, MomentStorage moments) {
  std::vector<OptimParam> params = three_params(device), reference = optim_test::copy_params(params);
  const std::vector<at::Tensor> before = values_of(params);
  AdamW fused(params, options_for(moments)), host(reference, options_for(moments));
  at::manual_seed(32);
  // A small norm (about 0.008) under a smaller limit: clip_factor's 1e-6 in the denominator shows in the bytes.
  const at::Tensor ga = at::randn({8, 64}).to(device) * 3e-4, gb = at::randn({4, 64}).to(device) * 3e-4;
  at::Tensor gc = at::randn({16, 64}).to(device);
  gc.index_put_({3, 5}, std::numeric_limits<float>::quiet_NaN());
  const double max_norm = 1e-4, trainable = 28 * 64;

  fused.begin_step();
  FusedUpdater updater(fused, max_norm, static_cast<int64_t>(trainable), 1e-3);
  updater.apply({{params[0].param, ga}, {params[1].param, gb}});
  updater.apply({{params[2].param, gc}});

  host.begin_step();
  const double square = (ga.to(at::kDouble).square().sum() + gb.to(at::kDouble).square().sum()).item<double>();
  // The square the updater's norm uses, summed as it sums them: on CUDA the clipping kernel's fp64 sums in its
  // order (kernels/grad_clip.cuh), on a CPU the fp32 square sums added in fp32.
  const double square_used = device.is_cuda()
                                 ? grad_clip_test::group_square_on_host(std::vector<at::Tensor>{ga, gb})
                                 : (square_sum_fp32(ga) + square_sum_fp32(gb)).to(at::kDouble).item<double>();
  ASSERT_NEAR(square_used, square, 1e-5 * square);
  const double limit = max_norm * std::sqrt(12 * 64 / trainable);
  const double scale = static_cast<float>(clip_factor(std::sqrt(square_used), limit));
  ASSERT_LT(scale, 0.1) << "the first group is clipped";
  host.update(0, ga, 1e-3, scale);
  host.update(1, gb, 1e-3, scale);

  for (int i = 0; i < 2; ++i) EXPECT_TRUE(at::equal(params[i].param.cpu(), reference[i].param.cpu())) << i;
  EXPECT_FALSE(at::equal(params[0].param.cpu(), before[0].cpu())) << "the first group was updated";
  EXPECT_TRUE(at::equal(params[2].param.cpu(), before[2].cpu())) << "the non-finite group is left as it is";
  const auto fused_state = fused.state_tensors(), host_state = host.state_tensors();
  ASSERT_EQ(fused_state.size(), host_state.size());
  // The reference never updated c: its state is c's initial one, which the fused optimizer must still hold.
  for (size_t i = 0; i < fused_state.size(); ++i)
    EXPECT_TRUE(at::equal(fused_state[i].second.cpu(), host_state[i].second.cpu())) << fused_state[i].first;
  ASSERT_TRUE(updater.square_sum().defined());
  EXPECT_FALSE(std::isfinite(updater.square_sum().item<double>())) << "the step's norm says it was not finite";
}

TEST(FusedUpdater, ClipsOnTheDeviceAsTheHostWouldAndSkipsANonFiniteGroup) {
  for (MomentStorage m : {MomentStorage::float32, MomentStorage::int8, MomentStorage::nvfp4}) {
    SCOPED_TRACE(static_cast<int>(m));
    check_groups(at::kCPU, m);
  }
}

TEST(FusedUpdater, GpuClipsOnTheDeviceAsTheHostWouldAndSkipsANonFiniteGroup) {
  QWEN3_GPU_TEST(at::hasCUDA());
  for (MomentStorage m : {MomentStorage::float32, MomentStorage::bfloat16, MomentStorage::int8, MomentStorage::nvfp4}) {
    SCOPED_TRACE(static_cast<int>(m));
    check_groups(at::Device(at::kCUDA, 0), m);
  }
}

// The point of the device-side factor: apply() returns while the device is still busy with earlier work (a
// kernel that spins for about a second), which a read of the factor on the host would have waited for.
TEST(FusedUpdater, GpuApplyDoesNotWaitForTheDevice) {
  QWEN3_GPU_TEST(at::hasCUDA());
#if defined(QWEN3_TORCH_HAS_CUDA)
  const at::Device cuda(at::kCUDA, 0);
  std::vector<OptimParam> params = three_params(cuda);
  AdamW opt(params, options_for(MomentStorage::int8));
  const at::Tensor ga = at::randn({8, 64}, at::TensorOptions().device(cuda));
  opt.begin_step();
  FusedUpdater updater(opt, 1.0, 28 * 64, 1e-3);
  at::cuda::sleep(int64_t{2} * 1000 * 1000 * 1000);  // ~1 s of spinning at ~2 GHz
  updater.apply({{params[0].param, ga}});
  EXPECT_EQ(cudaStreamQuery(c10::cuda::getCurrentCUDAStream().stream()), cudaErrorNotReady)
      << "apply() waited for the device";
  c10::cuda::getCurrentCUDAStream().synchronize();
  EXPECT_TRUE(std::isfinite(updater.square_sum().item<double>()));
#endif
}

// --overlap-update-sms: for its scope the products take cuBLASLt with ATen's SM carveout, as the autograd engine's
// thread that runs a CUDA backward sees them (a tensor hook runs there), and the settings found before come back
// when it ends; a product under it gives what it gives outside, up to the rounding of another kernel.
TEST(FusedUpdater, GpuProductSmCarveoutReachesBackwardForItsScope) {
  QWEN3_GPU_TEST(at::hasCUDA());
#if defined(QWEN3_TORCH_HAS_CUDA)
  if (!train_detail::product_sm_carveout_supported()) GTEST_SKIP() << "libtorch before 2.8: the flag is refused";
#if defined(QWEN3_PRODUCT_SM_CARVEOUT)
  at::Context& context = at::globalContext();
  const std::optional<int32_t> carveout_before = context._SMCarveout_EXPERIMENTAL();
  const at::BlasBackend backend_before = context.blasPreferredBackend();
  ASSERT_NE(carveout_before, std::optional<int32_t>(12));
  const at::Device cuda(at::kCUDA, 0);
  at::manual_seed(5);
  const at::Tensor a = at::randn({256, 512}, at::TensorOptions().device(cuda).dtype(at::kBFloat16));
  const at::Tensor w = at::randn({384, 512}, at::TensorOptions().device(cuda).dtype(at::kBFloat16));
  const at::Tensor outside = a.mm(w.t());
  std::optional<int32_t> seen_carveout;
  at::BlasBackend seen_backend = at::BlasBackend::Default;
  at::Tensor inside;
  {
    const train_detail::ProductSmCarveout carveout(12);
    EXPECT_EQ(context._SMCarveout_EXPERIMENTAL(), std::optional<int32_t>(12));
    inside = a.mm(w.t());
    const at::Tensor x = a.detach().clone().requires_grad_(true);
    at::Tensor y = x.mm(w.t());
    y.register_hook([&](const at::Tensor& g) {
      seen_carveout = at::globalContext()._SMCarveout_EXPERIMENTAL();
      seen_backend = at::globalContext().blasPreferredBackend();
      return g;
    });
    y.to(at::kFloat).sum().backward();
  }
  EXPECT_EQ(seen_carveout, std::optional<int32_t>(12));
  EXPECT_EQ(seen_backend, at::BlasBackend::Cublaslt);
  EXPECT_EQ(context._SMCarveout_EXPERIMENTAL(), carveout_before);
  EXPECT_EQ(context.blasPreferredBackend(), backend_before);
  EXPECT_TRUE(at::allclose(inside.to(at::kFloat), outside.to(at::kFloat), 1e-2, 1e-1));
  {
    const train_detail::ProductSmCarveout none(0);  // 0: nothing changes
    EXPECT_EQ(context._SMCarveout_EXPERIMENTAL(), carveout_before);
    EXPECT_EQ(context.blasPreferredBackend(), backend_before);
  }
#endif
#endif
}

// --overlap-update: the updates run on a stream of their own and give the bytes of the updates on the current
// one. The overlapped updater's gradients are made behind a kernel that spins for ~0.1 s on the current stream,
// so an update that did not wait for them would read them unwritten; they are temporaries, freed as apply()
// returns while a NaN fill on the current stream asks for memory of their size, which the allocator may hand
// out only if it was not told that the update's stream still reads them; and while the current stream spins
// again (~0.5 s, queued after the updates), a third stream that waits for the updater's alone reads the
// updated parameters: the updates did not queue behind the current stream's work.
TEST(FusedUpdater, GpuUpdatesOnTheirOwnStreamGiveTheSameBytes) {
  QWEN3_GPU_TEST(at::hasCUDA());
#if defined(QWEN3_TORCH_HAS_CUDA)
  const at::Device cuda(at::kCUDA, 0);
  for (MomentStorage m : {MomentStorage::float32, MomentStorage::nvfp4}) {
    SCOPED_TRACE(static_cast<int>(m));
    std::vector<OptimParam> inline_params = three_params(cuda), own_params = optim_test::copy_params(inline_params);
    AdamW inline_opt(inline_params, options_for(m)), own_opt(own_params, options_for(m));
    at::manual_seed(33);
    const at::Tensor ga = at::randn({8, 64}) * 3e-4, gb = at::randn({4, 64}) * 3e-4, gc = at::randn({16, 64});
    const double max_norm = 1e-4;
    const int64_t trainable = 28 * 64;
    inline_opt.begin_step();
    FusedUpdater inline_updater(inline_opt, max_norm, trainable, 1e-3);
    inline_updater.apply({{inline_params[0].param, ga.to(cuda)}, {inline_params[1].param, gb.to(cuda)}});
    inline_updater.apply({{inline_params[2].param, gc.to(cuda)}});
    std::vector<at::Tensor> expected;
    for (const auto& p : inline_params) expected.push_back(p.param.cpu());

    own_opt.begin_step();
    FusedUpdater own_updater(own_opt, max_norm, trainable, 1e-3);
    own_updater.overlap_on_own_stream(cuda);
    ASSERT_TRUE(own_updater.own_stream().has_value());
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream();
    // The host's gradients go to the device before the spin: a copy from pageable memory returns only once the
    // stream has run it, so copies queued behind the spin would make this thread wait for it (the GPU round of
    // 2026-11-27 saw "apply() waited" for that reason alone).
    const at::Tensor ga_device = ga.to(cuda), gb_device = gb.to(cuda), gc_device = gc.to(cuda);
    at::cuda::sleep(int64_t{200} * 1000 * 1000);  // ~0.1 s, before the gradients
    own_updater.apply({{own_params[0].param, ga_device.mul(1.0f)}, {own_params[1].param, gb_device.mul(1.0f)}});
    const at::Tensor fill = at::full({64 * 64}, std::numeric_limits<float>::quiet_NaN(), at::TensorOptions().device(cuda));
    own_updater.apply({{own_params[2].param, gc_device.mul(1.0f)}});
    EXPECT_EQ(cudaStreamQuery(current.stream()), cudaErrorNotReady) << "apply() waited for the device";
    at::cuda::sleep(int64_t{1000} * 1000 * 1000);  // ~0.5 s, after the updates
    const c10::cuda::CUDAStream third = c10::cuda::getStreamFromPool(false, cuda.index());
    at::cuda::CUDAEvent updated;
    updated.record(*own_updater.own_stream());
    updated.block(third);
    std::vector<at::Tensor> seen;
    {
      const c10::cuda::CUDAStreamGuard on_third(third);
      for (const auto& p : own_params) seen.push_back(p.param.cpu());
    }
    EXPECT_EQ(cudaStreamQuery(current.stream()), cudaErrorNotReady) << "the updates queued behind the current stream";
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(at::equal(seen[i], expected[i])) << "parameter " << i;
    own_updater.join();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto own_state = own_opt.state_tensors(), inline_state = inline_opt.state_tensors();
    ASSERT_EQ(own_state.size(), inline_state.size());
    for (size_t i = 0; i < own_state.size(); ++i)
      EXPECT_TRUE(at::equal(own_state[i].second.cpu(), inline_state[i].second.cpu())) << own_state[i].first;
    EXPECT_TRUE(at::equal(own_updater.square_sum().cpu(), inline_updater.square_sum().cpu()));
  }
#endif
}

}  // namespace
}  // namespace qwen3
