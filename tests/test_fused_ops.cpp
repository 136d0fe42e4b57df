// The fused activation kernels' element rules (kernels/fused_ops.cuh), run on the host against the model's
// libtorch formulas (model/activation_ops.h's reference forms), forward and backward, fp32 and bf16: every CI
// run checks the arithmetic the GPU does. On a CUDA libtorch with a GPU, the fused autograd nodes against the
// reference forms on the device as well.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "fused_ops.cuh"
#include "gpu_test.h"
#include "qwen3/base/slow_paths.h"
#include "model/activation_ops.h"
#include "qwen3/model/model.h"

namespace qwen3 {
namespace {

namespace f = kernels::fused;

// The largest difference in units of the dtype's spacing at the reference's magnitude (bf16: 2^-8 relative).
double worst_relative(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  return ((g - w).abs() / (w.abs() + 1e-30)).max().item<double>();
}

std::vector<float> values_of(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kFloat).contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

at::Tensor tensor_of(const std::vector<float>& v, at::IntArrayRef shape, at::ScalarType dtype) {
  return at::tensor(v, at::kFloat).view(shape).to(dtype);
}

class FusedOps : public ::testing::TestWithParam<at::ScalarType> {};

// RoPE's rules (the lane form head_norm_rope.cu runs, through rope_pair) against libtorch's ops, byte for byte.
TEST_P(FusedOps, RopeForwardAndBackwardAreLibtorchsBytes) {
  const at::ScalarType dtype = GetParam();
  const bool bf16 = dtype == at::kBFloat16;
  const int64_t B = 2, T = 7, heads = 3, d = 16;
  at::manual_seed(4);
  const at::Tensor x = at::randn({B, T, heads, d}).to(dtype);
  const auto [cos, sin] = rope_tables(d, 1e6, 5, T, at::kCPU);
  at::Tensor xr = x.clone().requires_grad_(true);
  const at::Tensor want = reference::rotary(xr, cos, sin);
  const at::Tensor dy = at::randn(want.sizes()).to(dtype);
  want.backward(dy);
  std::vector<float> out = values_of(x), grad = values_of(dy);
  const std::vector<float> c = values_of(cos), s = values_of(sin);
  for (int64_t row = 0; row < B * T * heads; ++row) {
    const int64_t t = (row / heads) % T;
    for (int64_t i = 0; i < d / 2; ++i) {
      float& x1 = out[row * d + i];
      float& x2 = out[row * d + i + d / 2];
      float& g1 = grad[row * d + i];
      float& g2 = grad[row * d + i + d / 2];
      const float c1 = c[t * d + i], s1 = s[t * d + i], c2 = c[t * d + i + d / 2], s2 = s[t * d + i + d / 2];
      if (bf16) {
        f::rope_pair<true>(x1, x2, c1, s1, c2, s2);
        f::rope_pair_backward<true>(g1, g2, c1, s1, c2, s2);
      } else {
        f::rope_pair<false>(x1, x2, c1, s1, c2, s2);
        f::rope_pair_backward<false>(g1, g2, c1, s1, c2, s2);
      }
    }
  }
  EXPECT_TRUE(tensor_of(out, x.sizes(), dtype).equal(want.detach()));
  EXPECT_TRUE(tensor_of(grad, x.sizes(), dtype).equal(xr.grad()));
}

TEST_P(FusedOps, SwigluForwardAndBackwardFollowLibtorch) {
  const at::ScalarType dtype = GetParam();
  const bool bf16 = dtype == at::kBFloat16;
  at::manual_seed(5);
  const at::Tensor gate = (at::randn({64, 48}) * 3).to(dtype), up = at::randn({64, 48}).to(dtype);
  at::Tensor g = gate.clone().requires_grad_(true), u = up.clone().requires_grad_(true);
  const at::Tensor want = reference::swiglu(g, u);
  const at::Tensor dh = at::randn(want.sizes()).to(dtype);
  want.backward(dh);
  const std::vector<float> gv = values_of(gate), uv = values_of(up), dv = values_of(dh);
  std::vector<float> out(gv.size()), dg(gv.size()), du(gv.size());
  for (size_t i = 0; i < gv.size(); ++i) {
    out[i] = bf16 ? f::swiglu<true>(gv[i], uv[i]) : f::swiglu<false>(gv[i], uv[i]);
    if (bf16)
      f::swiglu_backward<true>(dv[i], gv[i], uv[i], dg[i], du[i]);
    else
      f::swiglu_backward<false>(dv[i], gv[i], uv[i], dg[i], du[i]);
  }
  // exp differs between libm and libtorch's vectorized one by an ulp, which a bf16 rounding can turn into one
  // bf16 step of silu and then of the product: within 2^-6 of the largest magnitude (fp32: 1e-5).
  const double bound = bf16 ? 1.0 / 64 : 1e-5;
  const auto within = [&](const std::vector<float>& got, const at::Tensor& want_t) {
    const at::Tensor w = want_t.to(at::kFloat);
    return (tensor_of(got, gate.sizes(), at::kFloat) - w).abs().max().item<double>() <=
           bound * w.abs().max().item<double>();
  };
  EXPECT_TRUE(within(out, want.detach()));
  EXPECT_TRUE(within(du, u.grad()));
  EXPECT_TRUE(within(dg, g.grad()));
}

TEST_P(FusedOps, RmsNormForwardAndBackwardFollowLibtorch) {
  const at::ScalarType dtype = GetParam();
  const bool bf16 = dtype == at::kBFloat16;
  const int64_t rows = 37, cols = 96;
  const double eps = 1e-6;
  at::manual_seed(6);
  const at::Tensor x = (at::randn({rows, cols}) * 2).to(dtype);
  const at::Tensor weight = (1 + 0.1 * at::randn({cols}));  // an fp32 master over activations of `dtype`
  at::Tensor xr = x.clone().requires_grad_(true), wr = weight.clone().requires_grad_(true);
  const at::Tensor want = reference::rms_norm(xr, wr, eps);
  const at::Tensor dy = at::randn(want.sizes()).to(dtype);
  want.backward(dy);
  const std::vector<float> xv = values_of(x), wv = values_of(weight), dv = values_of(dy);
  std::vector<float> y(xv.size()), dx(xv.size()), dw(cols, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    float squares = 0;
    for (int64_t c = 0; c < cols; ++c) squares = std::fma(xv[r * cols + c], xv[r * cols + c], squares);
    const float rstd = f::rmsnorm_rstd(squares, cols, static_cast<float>(eps));
    float dot = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const float v = xv[r * cols + c];
      y[r * cols + c] = bf16 ? f::rmsnorm_output<true>(v, rstd, wv[c]) : f::rmsnorm_output<false>(v, rstd, wv[c]);
      const float g = bf16 ? f::rmsnorm_grad_n<true>(dv[r * cols + c], wv[c]) : f::rmsnorm_grad_n<false>(dv[r * cols + c], wv[c]);
      dot = std::fma(g, f::mul_rn(v, rstd), dot);
    }
    for (int64_t c = 0; c < cols; ++c) {
      const float n = f::mul_rn(xv[r * cols + c], rstd);
      const float g = bf16 ? f::rmsnorm_grad_n<true>(dv[r * cols + c], wv[c]) : f::rmsnorm_grad_n<false>(dv[r * cols + c], wv[c]);
      dx[r * cols + c] = f::round_to<false>(f::rmsnorm_dx(g, n, dot / static_cast<float>(cols), rstd));
      dw[c] = f::add_rn(dw[c], bf16 ? f::rmsnorm_dw_term<true>(dv[r * cols + c], n) : f::rmsnorm_dw_term<false>(dv[r * cols + c], n));
    }
  }
  const double bound = bf16 ? 1.0 / 64 : 1e-4;
  EXPECT_LE(worst_relative(tensor_of(y, x.sizes(), dtype), want.detach()), bf16 ? 1.0 / 128 : 1e-6);
  const at::Tensor dx_ref = xr.grad().to(at::kFloat);
  EXPECT_LE((tensor_of(dx, x.sizes(), at::kFloat) - dx_ref).abs().max().item<double>(),
            bound * dx_ref.abs().max().item<double>());
  EXPECT_EQ(wr.grad().scalar_type(), at::kFloat);
  EXPECT_LE((tensor_of(dw, {cols}, at::kFloat) - wr.grad()).abs().max().item<double>(),
            bound * wr.grad().abs().max().item<double>());
}

// The RMSNorm weight gradient's runs of chunks (fused_ops.cuh, kDwRuns): every chunk in exactly one run, in
// order, the runs as even as integers allow, so no warp of the summing kernel walks more than its share.
TEST(FusedOpsRules, DwRunsPartitionTheChunksEvenly) {
  for (int64_t chunks : {int64_t{1}, int64_t{2}, int64_t{17}, int64_t{31}, int64_t{32}, int64_t{33}, int64_t{64},
                         int64_t{100}, int64_t{2048}, int64_t{65535}}) {
    EXPECT_EQ(f::dw_run_first(chunks, 0), 0) << chunks;
    EXPECT_EQ(f::dw_run_first(chunks, f::kDwRuns), chunks) << chunks;
    const int64_t most = (chunks + f::kDwRuns - 1) / f::kDwRuns;
    for (int run = 0; run < f::kDwRuns; ++run) {
      const int64_t size = f::dw_run_first(chunks, run + 1) - f::dw_run_first(chunks, run);
      EXPECT_GE(size, most - 1) << chunks << " run " << run;
      EXPECT_LE(size, most) << chunks << " run " << run;
    }
  }
}

// On a GPU: the fused autograd nodes against the reference forms on the same device tensors.
TEST_P(FusedOps, GpuNodesFollowTheReferenceForms) {
  QWEN3_GPU_TEST(at::hasCUDA());  // a CUDA libtorch and a device
  const at::ScalarType dtype = GetParam();
  const at::Device cuda(at::kCUDA, 0);
  ASSERT_TRUE(fused_activation_ops_take(at::zeros({1}, at::TensorOptions().device(cuda).dtype(dtype))));
  at::manual_seed(7);
  const double bound = dtype == at::kBFloat16 ? 1.0 / 32 : 1e-4;
  const auto close = [&](const at::Tensor& a, const at::Tensor& b) {
    const at::Tensor af = a.to(at::kFloat), bf = b.to(at::kFloat);
    return (af - bf).abs().max().item<double>() <= bound * (bf.abs().max().item<double>() + 1e-12);
  };
  // RMSNorm over [tokens, 2560] with an fp32 weight.
  const at::Tensor x = at::randn({300, 2560}, at::TensorOptions().device(cuda)).to(dtype);
  const at::Tensor w = 1 + 0.1 * at::randn({2560}, at::TensorOptions().device(cuda));
  at::Tensor x1 = x.clone().requires_grad_(true), w1 = w.clone().requires_grad_(true);
  at::Tensor x2 = x.clone().requires_grad_(true), w2 = w.clone().requires_grad_(true);
  const at::Tensor y1 = rms_norm(x1, w1, 1e-6), y2 = reference::rms_norm(x2, w2, 1e-6);
  const at::Tensor dy = at::randn_like(y2);
  y1.backward(dy);
  y2.backward(dy);
  EXPECT_TRUE(close(y1, y2));
  EXPECT_TRUE(close(x1.grad(), x2.grad()));
  EXPECT_TRUE(close(w1.grad(), w2.grad()));
  // RoPE over [2, 64, 8, 128]: the same bytes.
  const auto [cos, sin] = rope_tables(128, 1e6, 0, 64, cuda);
  const at::Tensor q = at::randn({2, 64, 8, 128}, at::TensorOptions().device(cuda)).to(dtype);
  at::Tensor q1 = q.clone().requires_grad_(true), q2 = q.clone().requires_grad_(true);
  const at::Tensor r1 = rotary(q1, cos, sin), r2 = reference::rotary(q2, cos, sin);
  const at::Tensor dr = at::randn_like(r2);
  r1.backward(dr);
  r2.backward(dr);
  EXPECT_TRUE(r1.equal(r2));
  EXPECT_TRUE(q1.grad().equal(q2.grad()));
  // Packed rows: a table row for every token ([B, T, d], positions restarting with each sample) through the
  // kernel too, not the reference (the node says which ran).
  const at::Tensor positions = at::arange(64, at::kLong).remainder(at::tensor({13, 29}, at::kLong).unsqueeze(1)).to(cuda);
  const auto [packed_cos, packed_sin] = rope_tables_at(128, 1e6, positions);
  at::Tensor p1 = q.clone().requires_grad_(true), p2 = q.clone().requires_grad_(true);
  const at::Tensor o1 = rotary(p1, packed_cos, packed_sin), o2 = reference::rotary(p2, packed_cos, packed_sin);
  EXPECT_NE(o1.grad_fn()->name().find("RotaryFunction"), std::string::npos) << o1.grad_fn()->name();
  o1.backward(dr);
  o2.backward(dr);
  EXPECT_TRUE(o1.equal(o2));
  EXPECT_TRUE(p1.grad().equal(p2.grad()));
  // SwiGLU over [300, 9728].
  const at::Tensor g = at::randn({300, 9728}, at::TensorOptions().device(cuda)).to(dtype);
  const at::Tensor u = at::randn({300, 9728}, at::TensorOptions().device(cuda)).to(dtype);
  at::Tensor g1 = g.clone().requires_grad_(true), u1 = u.clone().requires_grad_(true);
  at::Tensor g2 = g.clone().requires_grad_(true), u2 = u.clone().requires_grad_(true);
  const at::Tensor h1 = swiglu(g1, u1), h2 = reference::swiglu(g2, u2);
  const at::Tensor dh = at::randn_like(h2);
  h1.backward(dh);
  h2.backward(dh);
  EXPECT_TRUE(close(h1, h2));
  EXPECT_TRUE(close(g1.grad(), g2.grad()));
  EXPECT_TRUE(close(u1.grad(), u2.grad()));
}

// The q/k norms and RoPE as one node (head_norm_rotary): on a GPU the fused kernels' node, whose bytes are the
// two nodes' it replaces (rms_norm's, then rotary's), forward and both gradients, with the rows' tables and with a
// table row a token, an fp32 and a bf16 weight; a width the kernels do not take goes to the two nodes.
TEST_P(FusedOps, GpuHeadNormRopeNodeGivesTheTwoNodesBytes) {
  QWEN3_GPU_TEST(at::hasCUDA());
  const at::ScalarType dtype = GetParam();
  const at::Device cuda(at::kCUDA, 0);
  at::manual_seed(11);
  const at::Tensor x = at::randn({2, 64, 8, 128}, at::TensorOptions().device(cuda)).to(dtype);
  const at::Tensor positions = at::arange(64, at::kLong).remainder(at::tensor({13, 29}, at::kLong).unsqueeze(1)).to(cuda);
  const auto [row_cos, row_sin] = rope_tables(128, 1e6, 0, 64, cuda);
  const auto [token_cos, token_sin] = rope_tables_at(128, 1e6, positions);
  for (const at::ScalarType weight_dtype : {at::kFloat, at::kBFloat16})
    for (const bool per_token : {false, true}) {
      const at::Tensor& cos = per_token ? token_cos : row_cos;
      const at::Tensor& sin = per_token ? token_sin : row_sin;
      const at::Tensor w = (1 + 0.1 * at::randn({128}, at::TensorOptions().device(cuda))).to(weight_dtype);
      at::Tensor x1 = x.clone().requires_grad_(true), w1 = w.clone().requires_grad_(true);
      at::Tensor x2 = x.clone().requires_grad_(true), w2 = w.clone().requires_grad_(true);
      const at::Tensor y1 = head_norm_rotary(x1, w1, 1e-6, cos, sin), y2 = rotary(rms_norm(x2, w2, 1e-6), cos, sin);
      EXPECT_NE(y1.grad_fn()->name().find("HeadNormRopeFunction"), std::string::npos) << y1.grad_fn()->name();
      const at::Tensor dy = at::randn_like(y2);
      y1.backward(dy);
      y2.backward(dy);
      EXPECT_TRUE(y1.equal(y2)) << per_token;
      EXPECT_TRUE(x1.grad().equal(x2.grad())) << per_token;
      EXPECT_TRUE(w1.grad().equal(w2.grad())) << per_token;
    }
  const at::Tensor wide = at::randn({1, 4, 2, 136}, at::TensorOptions().device(cuda)).to(dtype);
  const auto [wide_cos, wide_sin] = rope_tables(136, 1e6, 0, 4, cuda);
  const at::Tensor y = head_norm_rotary(wide.requires_grad_(true), at::ones({136}, wide.options()), 1e-6, wide_cos, wide_sin);
  EXPECT_EQ(y.grad_fn()->name().find("HeadNormRopeFunction"), std::string::npos) << y.grad_fn()->name();
}

// RMSNorm handing its input on (rms_norm_and_input): on a GPU the gradient the stream gives x is added by the
// norm's backward kernel, with the bytes of autograd's sum of the two (rms_norm's node, then the stream's use of x).
TEST_P(FusedOps, GpuNormAndInputGivesAutogradsSum) {
  QWEN3_GPU_TEST(at::hasCUDA());
  const at::ScalarType dtype = GetParam();
  const at::Device cuda(at::kCUDA, 0);
  at::manual_seed(17);
  const at::Tensor x = at::randn({2, 100, 2560}, at::TensorOptions().device(cuda)).to(dtype);
  const at::Tensor w = 1 + 0.1 * at::randn({2560}, at::TensorOptions().device(cuda));
  const at::Tensor delta = at::randn_like(x), dy = at::randn_like(x), dout = at::randn_like(x);
  at::Tensor x1 = x.clone().requires_grad_(true), w1 = w.clone().requires_grad_(true);
  at::Tensor x2 = x.clone().requires_grad_(true), w2 = w.clone().requires_grad_(true);
  const auto [y1, passed] = rms_norm_and_input(x1, w1, 1e-6);
  EXPECT_NE(y1.grad_fn()->name().find("RmsNormFunction"), std::string::npos) << y1.grad_fn()->name();
  const at::Tensor y2 = rms_norm(x2, w2, 1e-6);
  EXPECT_TRUE(y1.equal(y2));
  EXPECT_TRUE(passed.equal(x1));
  torch::autograd::backward({y1, passed + delta}, {dy, dout});
  torch::autograd::backward({y2, x2 + delta}, {dy, dout});
  EXPECT_TRUE(x1.grad().equal(x2.grad()));
  EXPECT_TRUE(w1.grad().equal(w2.grad()));
}

// Elsewhere (this CPU) rms_norm_and_input is the norm and x itself.
TEST(FusedOpsNormAndInput, IsTheNormAndTheInputOnTheCpu) {
  at::manual_seed(5);
  const at::Tensor x = at::randn({3, 7, 64}), w = 1 + 0.1 * at::randn({64});
  const auto [y, passed] = rms_norm_and_input(x, w, 1e-6);
  EXPECT_TRUE(passed.is_same(x));
  EXPECT_TRUE(y.equal(reference::rms_norm(x, w, 1e-6)));
}

// Elsewhere (this CPU) head_norm_rotary is the two ops; the widths the fused kernels take.
TEST(FusedOpsHeadNormRope, IsTheNormThenRopeOnTheCpu) {
  for (const int64_t d : {16, 32, 64, 128, 256}) EXPECT_TRUE(fused_head_norm_rope_takes(d)) << d;
  for (const int64_t d : {0, 8, 24, 48, 96, 136, 512}) EXPECT_FALSE(fused_head_norm_rope_takes(d)) << d;
  at::manual_seed(3);
  const at::Tensor x = at::randn({2, 5, 3, 64});
  const at::Tensor w = 1 + 0.1 * at::randn({64});
  const auto [cos, sin] = rope_tables(64, 1e6, 2, 5, at::kCPU);
  at::Tensor x1 = x.clone().requires_grad_(true), x2 = x.clone().requires_grad_(true);
  take_slow_paths();
  const at::Tensor y1 = head_norm_rotary(x1, w, 1e-6, cos, sin);
  EXPECT_TRUE(take_slow_paths().empty()) << "on a CPU the two ops are the path, not a slower one";
  const at::Tensor y2 = reference::rotary(reference::rms_norm(x2, w, 1e-6), cos, sin);
  EXPECT_TRUE(y1.equal(y2));
  y1.sum().backward();
  y2.sum().backward();
  EXPECT_TRUE(x1.grad().equal(x2.grad()));
}

// On a GPU, heads the fused pass does not take (here: not 16-byte aligned) run as the two ops, with the same
// values, and the slower path is recorded with its reason; aligned ones record nothing.
TEST(FusedOpsHeadNormRope, GpuMisalignedHeadsTakeARecordedSlowerPath) {
  QWEN3_GPU_TEST(at::hasCUDA());
  const at::Device cuda(at::kCUDA, 0);
  const auto bf16 = at::TensorOptions().device(cuda).dtype(at::kBFloat16);
  const int64_t n = 2 * 8 * 4 * 128;
  at::manual_seed(5);
  const at::Tensor aligned = at::randn({n}, bf16).view({2, 8, 4, 128});
  const at::Tensor shifted = at::empty({n + 1}, bf16).narrow(0, 1, n).view({2, 8, 4, 128}).copy_(aligned);
  const at::Tensor w = 1 + 0.1 * at::randn({128}, at::TensorOptions().device(cuda));
  const auto [cos, sin] = rope_tables(128, 1e6, 0, 8, cuda);
  take_slow_paths();
  head_norm_rotary(aligned, w, 1e-6, cos, sin);
  EXPECT_TRUE(take_slow_paths().empty());
  const at::Tensor two_ops = head_norm_rotary(shifted, w, 1e-6, cos, sin);
  EXPECT_TRUE(two_ops.equal(rotary(rms_norm(shifted, w, 1e-6), cos, sin)));
  const std::vector<SlowPath> taken = take_slow_paths();
  const auto it = std::find_if(taken.begin(), taken.end(),
                               [](const SlowPath& p) { return p.what == "fused q/k norm with RoPE"; });
  ASSERT_NE(it, taken.end()) << "the misaligned heads' fall-back was not recorded";
  EXPECT_EQ(it->why, "heads or weight not 16-byte aligned");
  EXPECT_EQ(it->count, 1);
}

// On a GPU float16 activations are none of the kernels' dtypes: each op runs as libtorch's and says so, once a call.
TEST(FusedOpsHeadNormRope, GpuHalfActivationsTakeRecordedSlowerPaths) {
  QWEN3_GPU_TEST(at::hasCUDA());
  const at::Device cuda(at::kCUDA, 0);
  const auto half = at::TensorOptions().device(cuda).dtype(at::kHalf);
  const at::Tensor x = at::randn({2, 8, 4, 16}, half), w = at::ones({16}, half);
  const auto [cos, sin] = rope_tables(16, 1e6, 0, 8, cuda);
  take_slow_paths();
  rms_norm(x, w, 1e-6);
  rotary(x, cos, sin);
  swiglu(x, x);
  const std::vector<SlowPath> taken = take_slow_paths();
  ASSERT_EQ(taken.size(), 3u);
  for (const SlowPath& p : taken) {
    EXPECT_EQ(p.why, "activations in float16 (the kernels take float32 and bfloat16)") << p.what;
    EXPECT_EQ(p.count, 1) << p.what;
  }
  EXPECT_EQ(taken[0].what + ", " + taken[1].what + ", " + taken[2].what, "fused RMSNorm, fused RoPE, fused SwiGLU");
}

INSTANTIATE_TEST_SUITE_P(Fp32AndBf16, FusedOps, ::testing::Values(at::kFloat, at::kBFloat16),
                         [](const ::testing::TestParamInfo<at::ScalarType>& info) {
                           return std::string(info.param == at::kFloat ? "float32" : "bfloat16");
                         });

}  // namespace
}  // namespace qwen3
