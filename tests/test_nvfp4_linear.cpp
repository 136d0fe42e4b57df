// The straight-through NVFP4 linear: forward against the dequantized weight, gradients against finite
// differences of the dequantized function (float64), against the W + (deq(Q(W)) - W).detach() formulation,
// and dW bit for bit equal to dYᵀ·X.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/version.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>

#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gpu_test.h"
#include "qwen3/base/error.h"
#include "qwen3/nvfp4/nvfp4_linear.h"
#include "qwen3/nvfp4/nvfp4_ops.h"

namespace qwen3::nvfp4 {
namespace {

at::Tensor dequantized_weight(const at::Tensor& weight, ScaleMode mode, at::ScalarType dtype) {
  const Quantized q = quantize(weight.detach(), mode);
  return dequantize(q.codes, q.scales, dtype);
}

TEST(SteLinear, ForwardIsTheProductWithTheDequantizedWeight) {
  at::manual_seed(21);
  const at::Tensor weight = at::randn({24, 64}) * 0.05;
  const at::Tensor x = at::randn({2, 3, 64});
  for (ScaleMode mode : {ScaleMode::rne, ScaleMode::search}) {
    const at::Tensor y = ste_linear(x, weight, mode);
    ASSERT_EQ(y.sizes(), (std::vector<int64_t>{2, 3, 24}));
    const at::Tensor expected = x.reshape({6, 64}).mm(dequantized_weight(weight, mode, at::kFloat).t()).view({2, 3, 24});
    EXPECT_TRUE(y.equal(expected)) << scale_mode_name(mode);
    // Not the dense product: the weight really was quantized.
    EXPECT_FALSE(y.allclose(at::matmul(x, weight.t()), 1e-4, 1e-4));
  }
}

TEST(SteLinear, OneNodeStraightToTheLeaves) {
  const at::Tensor weight = (at::randn({16, 32}) * 0.1).requires_grad_(true);
  const at::Tensor x = at::randn({5, 32}).requires_grad_(true);
  const at::Tensor y = ste_linear(x, weight);
  ASSERT_TRUE(y.grad_fn());
  const auto& edges = y.grad_fn()->next_edges();
  ASSERT_EQ(edges.size(), 2u);  // x and W; the scale mode is not a tensor
  for (const auto& edge : edges) {
    ASSERT_TRUE(edge.function);
    EXPECT_NE(edge.function->name().find("AccumulateGrad"), std::string::npos) << edge.function->name();
  }
}

TEST(SteLinear, WeightGradientIsExactlyDyTransposedTimesX) {
  at::manual_seed(22);
  const at::Tensor weight = (at::randn({32, 48}) * 0.05).requires_grad_(true);
  const at::Tensor x = at::randn({4, 7, 48}).requires_grad_(true);
  const at::Tensor grad_y = at::randn({4, 7, 32});
  ste_linear(x, weight, ScaleMode::search).backward(grad_y);
  EXPECT_TRUE(weight.grad().equal(grad_y.reshape({28, 32}).t().mm(x.detach().reshape({28, 48}))));
  const at::Tensor deq = dequantized_weight(weight, ScaleMode::search, at::kFloat);
  EXPECT_TRUE(x.grad().equal(grad_y.reshape({28, 32}).mm(deq).view({4, 7, 48})));
}

TEST(SteLinear, GradientsMatchTheDetachFormulation) {
  at::manual_seed(23);
  for (ScaleMode mode : {ScaleMode::rne, ScaleMode::search}) {
    const at::Tensor weight_init = at::randn({20, 32}) * 0.02;
    const at::Tensor x_init = at::randn({3, 6, 32});
    const at::Tensor mix = at::randn({3, 6, 20});

    const at::Tensor weight = weight_init.clone().requires_grad_(true);
    const at::Tensor x = x_init.clone().requires_grad_(true);
    (ste_linear(x, weight, mode) * mix).sum().backward();

    const at::Tensor weight_ref = weight_init.clone().requires_grad_(true);
    const at::Tensor x_ref = x_init.clone().requires_grad_(true);
    const at::Tensor deq = dequantized_weight(weight_ref, mode, at::kFloat);
    const at::Tensor weight_ste = weight_ref + (deq - weight_ref).detach();
    (at::matmul(x_ref, weight_ste.t()) * mix).sum().backward();

    EXPECT_TRUE(weight.grad().allclose(weight_ref.grad(), 1e-5, 1e-6)) << scale_mode_name(mode);
    EXPECT_TRUE(x.grad().allclose(x_ref.grad(), 1e-5, 1e-6)) << scale_mode_name(mode);
    EXPECT_GT(x.grad().abs().sum().item<float>(), 0.0f);
  }
}

// The gradient the STE promises is the exact gradient of f(x, V) = sum(mix ⊙ x·Vᵀ) at V = deq(Q(W)):
// central differences in float64 (exact up to rounding, f being bilinear).
TEST(SteLinear, GradientsMatchFiniteDifferencesOfTheDequantizedFunction) {
  at::manual_seed(24);
  const at::Tensor weight = (at::randn({6, 32}, at::kDouble) * 0.1).requires_grad_(true);
  const at::Tensor x = at::randn({2, 3, 32}, at::kDouble).requires_grad_(true);
  const at::Tensor mix = at::randn({2, 3, 6}, at::kDouble);
  const at::Tensor y = ste_linear(x, weight);
  EXPECT_EQ(y.scalar_type(), at::kDouble);
  (y * mix).sum().backward();

  const at::Tensor deq = dequantized_weight(weight, ScaleMode::rne, at::kDouble);
  auto f = [&](const at::Tensor& x_value, const at::Tensor& weight_value) {
    return (at::matmul(x_value, weight_value.t()) * mix).sum().item<double>();
  };
  const double step = 1e-3;
  const at::Tensor x_value = x.detach();
  const at::Tensor x_flat = x_value.view(-1);
  for (int64_t i = 0; i < x_flat.numel(); ++i) {
    const double saved = x_flat[i].item<double>();
    x_flat[i] = saved + step;
    const double up = f(x_value, deq);
    x_flat[i] = saved - step;
    const double down = f(x_value, deq);
    x_flat[i] = saved;
    ASSERT_NEAR(x.grad().view(-1)[i].item<double>(), (up - down) / (2 * step), 1e-9) << "x " << i;
  }
  const at::Tensor deq_flat = deq.view(-1);
  for (int64_t i = 0; i < deq_flat.numel(); ++i) {
    const double saved = deq_flat[i].item<double>();
    deq_flat[i] = saved + step;
    const double up = f(x_value, deq);
    deq_flat[i] = saved - step;
    const double down = f(x_value, deq);
    deq_flat[i] = saved;
    ASSERT_NEAR(weight.grad().view(-1)[i].item<double>(), (up - down) / (2 * step), 1e-9) << "W " << i;
  }
}

TEST(SteLinear, ReducedPrecisionActivationsKeepAnFp32MasterGradient) {
  at::manual_seed(25);
  const at::Tensor weight = (at::randn({16, 32}) * 0.05).requires_grad_(true);
  const at::Tensor x = at::randn({8, 32}).to(at::kBFloat16).requires_grad_(true);
  const at::Tensor y = ste_linear(x, weight);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  const at::Tensor grad_y = at::randn({8, 16}).to(at::kBFloat16);
  y.backward(grad_y);
  EXPECT_EQ(weight.grad().scalar_type(), at::kFloat);
  EXPECT_EQ(x.grad().scalar_type(), at::kBFloat16);
  EXPECT_TRUE(weight.grad().equal(grad_y.t().mm(x.detach()).to(at::kFloat)));
}

// On CUDA (libtorch 2.9+) an fp32 master's gradient from bf16 activations is cuBLAS's fp32 accumulator
// (product_in_dtype, which the sliced loss's head gradient uses too), not a bf16 product widened: against dYᵀ·X of the same bf16 values in fp32 it agrees to fp32's order of summation
// (a bf16-rounded gradient is off by up to 2^-9 relative).
TEST(SteLinear, GpuFp32MasterGradientIsNotRoundedToBf16) {
  QWEN3_GPU_TEST(at::hasCUDA());
#if !(TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9))
  GTEST_SKIP() << "libtorch " << TORCH_VERSION << " has no fp32-output product of bf16 operands (aten::mm.dtype)";
#endif
  at::manual_seed(26);
  const at::Tensor weight = (at::randn({256, 512}) * 0.05).to(at::kCUDA).requires_grad_(true);
  const at::Tensor x = at::randn({1024, 512}).to(at::kBFloat16).to(at::kCUDA).requires_grad_(true);
  const at::Tensor y = ste_linear(x, weight);
  const at::Tensor grad_y = at::randn({1024, 256}).to(at::kBFloat16).to(at::kCUDA);
  y.backward(grad_y);
  ASSERT_EQ(weight.grad().scalar_type(), at::kFloat);
  const at::Tensor exact = grad_y.to(at::kDouble).t().mm(x.detach().to(at::kDouble));
  const double error = ((weight.grad().to(at::kDouble) - exact).abs().max() / exact.abs().max()).item<double>();
  std::printf("fp32 master gradient from bf16 activations on CUDA: max error %.3g of the largest\n", error);
  EXPECT_LT(error, 1e-5);
}

// On CUDA at training shapes the codes and the bf16 operand come from one kernel, and with keep_operand the node
// saves that operand for dX: the output and both gradients are those of the two-kernel form (quantize, then
// dequantize, then the products), bit for bit, for an fp32 and a bf16 master.
TEST(SteLinear, GpuOperandFromTheQuantizePassGivesTheSameBytes) {
  QWEN3_GPU_TEST(at::hasCUDA());
  at::manual_seed(27);
  for (const at::ScalarType master : {at::kFloat, at::kBFloat16}) {
    const at::Tensor weight0 = (at::randn({384, 512}) * 0.05).to(master).to(at::kCUDA);
    const at::Tensor x0 = at::randn({1024, 512}).to(at::kBFloat16).to(at::kCUDA);
    const at::Tensor grad_y = at::randn({1024, 384}).to(at::kBFloat16).to(at::kCUDA);
    const Quantized q = quantize(weight0);
    const at::Tensor deq = dequantize(q.codes, q.scales, at::kBFloat16);
    const at::Tensor y_want = x0.mm(deq.t()), grad_x_want = grad_y.mm(deq);
    const at::Tensor grad_w_want = product_in_dtype(grad_y.t(), x0, master);
    for (const bool keep : {false, true}) {
      const at::Tensor x = x0.clone().requires_grad_(true), w = weight0.clone().requires_grad_(true);
      const at::Tensor y = ste_linear(x, w, ScaleMode::rne, keep);
      y.backward(grad_y);
      EXPECT_TRUE(y.equal(y_want)) << c10::toString(master) << " keep " << keep;
      EXPECT_TRUE(x.grad().equal(grad_x_want)) << c10::toString(master) << " keep " << keep;
      EXPECT_TRUE(w.grad().equal(grad_w_want)) << c10::toString(master) << " keep " << keep;
    }
    // Without a graph (a checkpointed block's first forward, evaluation) the pass writes the operand alone.
    const at::NoGradGuard no_grad;
    EXPECT_TRUE(ste_linear(x0, weight0.clone().requires_grad_(true), ScaleMode::rne, true).equal(y_want));
  }
}

// A weight's operand kept across steps (--keep-weight-operands always): on a CPU nothing is kept (the one path:
// ste_linear's bytes, the buffer untouched); a buffer that is not a bf16 tensor of the weight's shape is refused.
TEST(SteLinear, PersistentOperandIsSteLinearOnACpu) {
  at::manual_seed(28);
  const at::Tensor weight = (at::randn({48, 64}) * 0.05).requires_grad_(true);
  const at::Tensor x = at::randn({20, 64}).requires_grad_(true);
  const at::Tensor grad_y = at::randn({20, 48});
  const at::Tensor y_want = ste_linear(x, weight);
  y_want.backward(grad_y);
  const at::Tensor grad_x_want = x.grad().clone(), grad_w_want = weight.grad().clone();
  x.grad().zero_(), weight.grad().zero_();
  PersistentOperand kept{weight, at::zeros({48, 64}, at::kBFloat16), -1};
  const at::Tensor y = ste_linear_persistent(x, kept);
  y.backward(grad_y);
  EXPECT_TRUE(y.equal(y_want));
  EXPECT_TRUE(x.grad().equal(grad_x_want));
  EXPECT_TRUE(weight.grad().equal(grad_w_want));
  EXPECT_EQ(kept.version, -1) << "nothing made on a CPU";
  EXPECT_EQ(kept.operand.abs().sum().item<float>(), 0.0f);
  PersistentOperand wrong{weight, at::zeros({64, 48}, at::kBFloat16), -1};
  EXPECT_THROW(ste_linear_persistent(x, wrong), Error);
  PersistentOperand fp32{weight, at::zeros({48, 64}), -1};
  EXPECT_THROW(ste_linear_persistent(x, fp32), Error);
}

// On CUDA at training shapes: the first forward makes the operand (the bytes of ste_linear's, output and gradients
// too); while the weight's version stands the next forward multiplies the buffer as it is (what the update wrote:
// here a value written into it by hand shows it is read, not remade); an in-place change of the weight moves its
// version and the operand is made again.
TEST(SteLinear, GpuPersistentOperandIsMadeOnceAndRemadeWhenTheWeightChanges) {
  QWEN3_GPU_TEST(at::hasCUDA());
  at::manual_seed(29);
  const at::Tensor w = (at::randn({384, 512}) * 0.05).to(at::kCUDA).requires_grad_(true);
  const at::Tensor x0 = at::randn({1024, 512}).to(at::kBFloat16).to(at::kCUDA);
  const at::Tensor grad_y = at::randn({1024, 384}).to(at::kBFloat16).to(at::kCUDA);
  const at::Tensor x = x0.clone().requires_grad_(true);
  const at::Tensor y_want = ste_linear(x, w);
  y_want.backward(grad_y);
  const at::Tensor grad_x_want = x.grad().clone(), grad_w_want = w.grad().clone();
  PersistentOperand kept{w, at::empty({384, 512}, w.options().dtype(at::kBFloat16).requires_grad(false)), -1};
  const at::Tensor x1 = x0.clone().requires_grad_(true);
  w.grad().zero_();
  const at::Tensor y = ste_linear_persistent(x1, kept);
  y.backward(grad_y);
  EXPECT_TRUE(y.equal(y_want));
  EXPECT_TRUE(x1.grad().equal(grad_x_want));
  EXPECT_TRUE(w.grad().equal(grad_w_want));
  EXPECT_EQ(kept.version, w._version());
  const Quantized q = quantize(w.detach());
  EXPECT_TRUE(kept.operand.equal(dequantize(q.codes, q.scales, at::kBFloat16)));
  const at::NoGradGuard no_grad;
  kept.operand.fill_(0.5);  // as a raw write would: the weight's version does not move
  EXPECT_TRUE(ste_linear_persistent(x0, kept).equal(x0.mm(kept.operand.t())));
  w.mul_(2.0);  // an in-place change: the version moves, the operand is made again
  const Quantized q2 = quantize(w.detach());
  EXPECT_TRUE(ste_linear_persistent(x0, kept).equal(x0.mm(dequantize(q2.codes, q2.scales, at::kBFloat16).t())));
  EXPECT_EQ(kept.version, w._version());
}

// The products this thread runs while it lives (aten::mm, aten::addmm, aten::matmul), counted by a
// RecordFunction callback.
thread_local int64_t products_seen = 0;
class ProductCounter {
 public:
  ProductCounter()
      : handle_(at::addThreadLocalCallback(at::RecordFunctionCallback(&ProductCounter::start).needsInputs(false))) {
    products_seen = 0;
  }
  ~ProductCounter() { at::removeCallback(handle_); }
  int64_t count() const { return products_seen; }

 private:
  static std::unique_ptr<at::ObserverContext> start(const at::RecordFunction& fn) {
    const std::string name = fn.name();
    if (name == "aten::mm" || name == "aten::addmm" || name == "aten::matmul") ++products_seen;
    return nullptr;
  }
  at::CallbackHandle handle_;
};

// ProductOutput::unread (a checkpointed block's last product, run again only to be differentiated): the node saves
// and differentiates as ever, the gradients those of the computed node bit for bit, and its forward runs no
// product (the count fails where the product is run).
void expect_unread_node_differentiates_without_a_product(const at::Device device, at::ScalarType activations) {
  at::manual_seed(30);
  const at::Tensor weight0 = (at::randn({384, 512}) * 0.05).to(device);
  const at::Tensor x0 = at::randn({64, 512}).to(activations).to(device);
  const at::Tensor grad_y = at::randn({64, 384}).to(activations).to(device);
  for (const bool keep : {false, true}) {
    at::Tensor grads[2][2];
    for (const ProductOutput output : {ProductOutput::computed, ProductOutput::unread}) {
      const at::Tensor x = x0.clone().requires_grad_(true), w = weight0.clone().requires_grad_(true);
      at::Tensor y;
      int64_t products = 0;
      {
        const ProductCounter counter;
        y = ste_linear(x, w, ScaleMode::rne, keep, output);
        products = counter.count();
      }
      const bool unread = output == ProductOutput::unread;
      EXPECT_EQ(products, unread ? 0 : 1) << device << " keep " << keep << " unread " << unread;
      EXPECT_EQ(y.sizes(), (std::vector<int64_t>{64, 384}));
      y.backward(grad_y);
      grads[unread][0] = x.grad(), grads[unread][1] = w.grad();
    }
    EXPECT_TRUE(grads[1][0].equal(grads[0][0])) << device << " keep " << keep;
    EXPECT_TRUE(grads[1][1].equal(grads[0][1])) << device << " keep " << keep;
  }
}

TEST(SteLinear, UnreadOutputNodeDifferentiatesWithoutAProduct) {
  expect_unread_node_differentiates_without_a_product(at::kCPU, at::kFloat);
}

TEST(SteLinear, GpuUnreadOutputNodeDifferentiatesWithoutAProduct) {
  QWEN3_GPU_TEST(at::hasCUDA());
  expect_unread_node_differentiates_without_a_product(at::Device(at::kCUDA, 0), at::kBFloat16);
}

TEST(SteLinear, OnlyRequestedGradientsAreComputed) {
  const at::Tensor weight = (at::randn({16, 32}) * 0.05).requires_grad_(true);
  const at::Tensor x = at::randn({4, 32});
  ste_linear(x, weight).sum().backward();
  EXPECT_TRUE(weight.grad().defined());
  EXPECT_FALSE(x.grad().defined());
}

TEST(SteLinear, MismatchedShapesAreErrors) {
  EXPECT_THROW(ste_linear(at::randn({2, 32}), at::randn({8, 48})), Error);
  EXPECT_THROW(ste_linear(at::randn({2, 24}), at::randn({8, 24})), Error);  // 24 is not a multiple of 16
}

// Projections of one input as one node (a block's q, k and v): each output and weight gradient is ste_linear's bit
// for bit, dX is the sum of theirs (each product adding into one buffer: the same terms, rounded in another
// order), an output that no loss reaches gives no gradient through it, and its refusals. fp32 on the CPU, and on
// a GPU at training shapes: bf16 activations with fp32 and bf16 masters, the codes or the operand kept, and kept
// operands across steps.
void expect_shared_input_is_separate_nodes(const at::Tensor& x0, const std::vector<at::Tensor>& weights0,
                                           bool keep_operand, bool persistent, const std::string& what) {
  std::vector<at::Tensor> grads_y;
  for (const at::Tensor& w : weights0) grads_y.push_back(at::randn({x0.size(0), w.size(0)}).to(x0.dtype()).to(x0.device()));
  // Separate nodes.
  const at::Tensor x1 = x0.clone().requires_grad_(true);
  std::vector<at::Tensor> w1, y1;
  for (const at::Tensor& w : weights0) w1.push_back(w.clone().requires_grad_(true));
  for (const at::Tensor& w : w1) y1.push_back(ste_linear(x1, w, ScaleMode::rne, keep_operand));
  torch::autograd::backward(y1, grads_y);
  // One node.
  const at::Tensor x2 = x0.clone().requires_grad_(true);
  std::vector<at::Tensor> w2;
  for (const at::Tensor& w : weights0) w2.push_back(w.clone().requires_grad_(true));
  std::vector<PersistentOperand> entries;
  for (const at::Tensor& w : w2) entries.push_back({w, at::empty(w.sizes(), w.options().dtype(at::kBFloat16).requires_grad(false)), -1});
  std::vector<PersistentOperand*> kept;
  for (PersistentOperand& e : entries) kept.push_back(persistent ? &e : nullptr);
  const std::vector<at::Tensor> y2 = ste_linear_shared_input(x2, w2, kept, ScaleMode::rne, keep_operand);
  ASSERT_EQ(y2.size(), weights0.size()) << what;
  EXPECT_NE(y2[0].grad_fn()->name().find("SteSharedInputFunction"), std::string::npos) << what;
  torch::autograd::backward(y2, grads_y);
  for (size_t i = 0; i < weights0.size(); ++i) {
    EXPECT_TRUE(y2[i].equal(y1[i])) << what << " output " << i;
    EXPECT_TRUE(w2[i].grad().equal(w1[i].grad())) << what << " weight gradient " << i;
  }
  const at::Tensor a = x2.grad().to(at::kFloat), b = x1.grad().to(at::kFloat);
  const double scale = b.abs().max().item<double>();
  const double bound = x0.scalar_type() == at::kBFloat16 ? 1.0 / 64 : 1e-5;
  EXPECT_LE((a - b).abs().max().item<double>(), bound * scale) << what << ": dX is the sum of the products";
  EXPECT_GT(scale, 0) << what;
}

TEST(SteSharedInput, IsTheSeparateNodesOnTheCpu) {
  at::manual_seed(31);
  const at::Tensor x = at::randn({20, 64});
  const std::vector<at::Tensor> weights = {at::randn({48, 64}) * 0.05, at::randn({16, 64}) * 0.05, at::randn({16, 64}) * 0.05};
  expect_shared_input_is_separate_nodes(x, weights, false, false, "cpu");
  expect_shared_input_is_separate_nodes(x, weights, true, true, "cpu, operands asked for");
  // Only the first and last outputs reach the loss: the middle weight gets no gradient, dX is theirs.
  const at::Tensor xs = x.clone().requires_grad_(true);
  std::vector<at::Tensor> ws;
  for (const at::Tensor& w : weights) ws.push_back(w.clone().requires_grad_(true));
  const std::vector<at::Tensor> y = ste_linear_shared_input(xs, ws, {nullptr, nullptr, nullptr});
  (y[0].sum() + y[2].sum()).backward();
  EXPECT_FALSE(ws[1].grad().defined());
  const at::Tensor xr = x.clone().requires_grad_(true);
  (ste_linear(xr, weights[0]).sum() + ste_linear(xr, weights[2]).sum()).backward();
  EXPECT_TRUE(at::allclose(xs.grad(), xr.grad(), 1e-5, 1e-6));
  // Refusals: no weights, a kept-operand list of another length, a weight of another width.
  EXPECT_THROW(ste_linear_shared_input(x, {}, {}), Error);
  EXPECT_THROW(ste_linear_shared_input(x, weights, {nullptr}), Error);
  EXPECT_THROW(ste_linear_shared_input(x, {weights[0], at::randn({16, 48})}, {nullptr, nullptr}), Error);
}

TEST(SteSharedInput, GpuIsTheSeparateNodes) {
  QWEN3_GPU_TEST(at::hasCUDA());
  at::manual_seed(32);
  const at::Tensor x = at::randn({1024, 512}).to(at::kBFloat16).to(at::kCUDA);
  for (const at::ScalarType master : {at::kFloat, at::kBFloat16}) {
    const std::vector<at::Tensor> weights = {(at::randn({512, 512}) * 0.05).to(master).to(at::kCUDA),
                                             (at::randn({128, 512}) * 0.05).to(master).to(at::kCUDA),
                                             (at::randn({128, 512}) * 0.05).to(master).to(at::kCUDA)};
    for (const bool keep : {false, true})
      expect_shared_input_is_separate_nodes(x, weights, keep, false, std::string(c10::toString(master)) + (keep ? " kept" : " codes"));
    expect_shared_input_is_separate_nodes(x, weights, false, true, std::string(c10::toString(master)) + " across steps");
  }
}

// The grouped straight-through linear (a sparse block's experts): each group's rows times its weight as
// ste_linear computes them, bit for bit on the CPU, with an empty group among them; the same without a graph (no
// codes kept: a checkpointed block's first forward); and its refusals.
TEST(SteGroupedLinear, EachGroupIsSteLinearAndNoGraphChangesNothing) {
  at::manual_seed(3);
  const std::vector<int64_t> counts = {3, 0, 5};
  const at::Tensor rows = at::randn({8, 32});
  const at::Tensor ends = at::tensor({3, 3, 8}, at::kInt);
  std::vector<at::Tensor> weights;
  for (int g = 0; g < 3; ++g) weights.push_back(at::randn({16, 32}));
  const at::Tensor grouped = ste_grouped_linear(rows, weights, ends, counts);
  ASSERT_EQ(grouped.sizes(), at::IntArrayRef({8, 16}));
  EXPECT_TRUE(at::equal(grouped.narrow(0, 0, 3), ste_linear(rows.narrow(0, 0, 3), weights[0])));
  EXPECT_TRUE(at::equal(grouped.narrow(0, 3, 5), ste_linear(rows.narrow(0, 3, 5), weights[2])));
  {
    at::NoGradGuard no_grad;
    EXPECT_TRUE(at::equal(ste_grouped_linear(rows, weights, ends, counts), grouped));
  }
  EXPECT_THROW(ste_grouped_linear(rows, {weights[0], weights[1]}, ends, counts), Error);  // 2 weights, 3 groups
  EXPECT_THROW(ste_grouped_linear(rows, {weights[0], at::randn({16, 48}), weights[2]}, ends, counts), Error);
  EXPECT_THROW(grouped_product(rows, at::randn({3, 16, 32}), ends, {3, 0, 4}), Error);  // 7 rows counted, 8 given
  EXPECT_THROW(grouped_product(rows, at::randn({2, 16, 32}), ends, counts), Error);     // 2 matrices, 3 groups
}

}  // namespace
}  // namespace qwen3::nvfp4

namespace qwen3::nvfp4 {
namespace {

// The two CUDA products: below kNvfp4KernelMaxRows rows the NVFP4 kernel, from there cuBLAS on the weight
// dequantized into the reused scratch. Against each other (the kernel within the fp32-accumulation bound of
// the cuBLAS product of the same bf16 operands) and the scratch's reuse (a later product of another weight
// does not change an earlier result). Needs a CUDA libtorch and a GPU; skipped otherwise.
TEST(Nvfp4Product, GpuKernelAndScratchPathsAgreeOnQwen3Shapes) {
  QWEN3_GPU_TEST(at::hasCUDA());  // a CUDA libtorch and a device
  const at::Device cuda(at::kCUDA, 0);
  at::manual_seed(3);
  std::vector<std::pair<int64_t, int64_t>> shapes{{2560, 4096}, {2560, 1024}, {9728, 2560}};
  if (test::small_gpu_shapes()) shapes.resize(1);
  for (const auto& [k, n] : shapes) {
    const Quantized w = quantize((at::randn({n, k}) * 0.02).to(cuda));
    const Quantized other = quantize((at::randn({n, k}) * 0.02).to(cuda));
    for (int64_t m : {int64_t{1}, int64_t{16}, kNvfp4KernelMaxRows - 1, kNvfp4KernelMaxRows, int64_t{1024}}) {
      const at::Tensor x = at::randn({m, k}, at::TensorOptions().device(cuda)).to(at::kBFloat16);
      const at::Tensor reference = x.to(at::kFloat).mm(dequantize(w.codes, w.scales, at::kFloat).t());
      const at::Tensor y = quantized_product(x, w.codes, w.scales);
      quantized_product(x, other.codes, other.scales);  // reuses the scratch
      ASSERT_EQ(y.scalar_type(), at::kBFloat16);
      // bf16 output of an fp32-accumulated product: within a few bf16 ulps of the fp32 reference.
      const double bound = 4.0 * std::ldexp(1.0, -8) * reference.abs().max().item<double>() + 1e-6;
      EXPECT_LE((y.to(at::kFloat) - reference).abs().max().item<double>(), bound) << m << " x " << k << " x " << n;
      if (m >= kNvfp4KernelMaxRows) {  // the scratch path is exactly cuBLAS on the dequantized weight
        EXPECT_TRUE(y.equal(x.mm(dequantize(w.codes, w.scales, at::kBFloat16).t()))) << m;
      }
    }
  }
}

}  // namespace
}  // namespace qwen3::nvfp4
