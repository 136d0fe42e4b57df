// Qwen3's mixture-of-experts blocks (Qwen3MoeForCausalLM): the config, the key layout, and the sparse MLP against a
// dense re-computation of the same routing (every expert on every token, weighted by the routing weights, zero for
// the experts a token did not choose), forward and gradients, in float64 on the CPU.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard: ATen.h stopped including it in PyTorch 2.x
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <set>
#include <string>

#include "build_paths.h"
#include "cli_test_util.h"
#include "dat_test_util.h"
#include "gpu_test.h"
#include "qwen3/base/error.h"
#include "qwen3/config/config.h"
#include "qwen3/model/layout.h"
#include "qwen3/model/lm_loss.h"
#include "qwen3/convert/hf_export.h"
#include "qwen3/convert/safetensors.h"
#include "qwen3/dat/dat.h"
#include "qwen3/dat/dat_tensor.h"
#include "qwen3/model/model.h"
#include "qwen3/nvfp4/nvfp4_linear.h"
#include "qwen3/trainer/step_time_model.h"
#include "trainer/block_runner.h"
#include "trainer/router_balance.h"
#include "trainer/train_setup.h"

namespace qwen3 {
namespace {

// The model with every tensor drawn from one seeded stream (float64, projections ~ N(0, 1/in)).
std::unique_ptr<Qwen3Model> random_moe_model(const Qwen3Config& config) {
  auto model = std::make_unique<Qwen3Model>(config, at::kDouble, at::Device(at::kCPU), !config.tie_word_embeddings);
  at::manual_seed(7);
  for (auto& [key, t] : model->named_weights()) {
    at::NoGradGuard no_grad;
    at::Tensor w = t;
    if (w.dim() == 1)
      w.copy_(1 + 0.05 * at::randn(w.sizes(), at::kDouble));
    else
      w.copy_(at::randn(w.sizes(), at::kDouble) / std::sqrt(static_cast<double>(w.size(1))));
  }
  return model;
}

// transformers' routing written out densely: softmax in fp32, top k, renormalized, scattered into
// a [tokens, experts] matrix of weights; every expert on every token.
at::Tensor dense_moe_reference(const Qwen3Config& c, const Qwen3Block& b, const at::Tensor& h, at::Tensor* chosen_out) {
  const at::Tensor x = h.reshape({-1, h.size(-1)});
  const at::Tensor probs = at::softmax(at::linear(x, b.router), -1, at::kFloat);  // fp32, as transformers
  auto [weights, chosen] = at::topk(probs, c.num_experts_per_tok, -1);
  if (c.norm_topk_prob) weights = weights / weights.sum(-1, true);
  *chosen_out = chosen;
  const at::Tensor dense = at::zeros_like(x.new_zeros({x.size(0), c.num_experts})).scatter(1, chosen, weights.to(x.scalar_type()));
  at::Tensor out = at::zeros_like(x);
  for (size_t e = 0; e < b.experts.size(); ++e) {
    const ExpertMlp& ex = b.experts[e];
    const at::Tensor y = at::linear(at::silu(at::linear(x, ex.gate_proj.weight)) * at::linear(x, ex.up_proj.weight),
                                    ex.down_proj.weight);
    out = out + dense.narrow(1, static_cast<int64_t>(e), 1) * y;
  }
  return out.view(h.sizes());
}

TEST(Moe, ConfigReadsTransformersFieldsAndRefusesWhatItDoesNotCompute) {
  const Qwen3Config tiny = preset_config("qwen3-moe-tiny");
  const nlohmann::json j = tiny.to_json();
  EXPECT_EQ(j["architectures"][0], "Qwen3MoeForCausalLM");
  EXPECT_EQ(j["model_type"], "qwen3_moe");
  const Qwen3Config back = config_from_json(j, "round trip");
  EXPECT_EQ(back.num_experts, 8);
  EXPECT_EQ(back.num_experts_per_tok, 2);
  EXPECT_EQ(back.moe_intermediate_size, 64);
  EXPECT_TRUE(back.norm_topk_prob);
  EXPECT_EQ(back.mlp_only_layers, std::vector<int64_t>({1}));
  EXPECT_EQ(back.to_json(), j);
  // A qwen3_moe config without the MoE fields takes transformers' Qwen3MoeConfig defaults.
  nlohmann::json bare = preset_config("tiny").to_json();
  bare["model_type"] = "qwen3_moe";
  bare["moe_intermediate_size"] = 64;
  const Qwen3Config defaults = config_from_json(bare, "bare");
  EXPECT_EQ(defaults.num_experts, 128);
  EXPECT_EQ(defaults.num_experts_per_tok, 8);
  EXPECT_FALSE(defaults.norm_topk_prob);
  EXPECT_EQ(defaults.decoder_sparse_step, 1);
  const std::pair<std::function<void(nlohmann::json&)>, std::string> refused[] = {
      {[](nlohmann::json& c) { c["num_experts_per_tok"] = 9; }, "num_experts_per_tok must be from 1 to num_experts (8)"},
      {[](nlohmann::json& c) { c["moe_intermediate_size"] = 40; }, "moe_intermediate_size must be a positive multiple of 16"},
      {[](nlohmann::json& c) { c["mlp_only_layers"] = {7}; }, "mlp_only_layers names layer 7, outside 0..2"},
      {[](nlohmann::json& c) { c["mlp_only_layers"] = "all"; }, "field \"mlp_only_layers\" must be a list of layer indices"},
      {[](nlohmann::json& c) { c["decoder_sparse_step"] = 0; }, "decoder_sparse_step must be from 1"},
      {[](nlohmann::json& c) { c["num_experts"] = 0; }, "num_experts must be positive"},
      {[](nlohmann::json& c) { c["shared_expert_intermediate_size"] = 128; }, "shared_expert_intermediate_size"}};
  for (const auto& [change, message] : refused) {
    nlohmann::json c = j;
    change(c);
    try {
      config_from_json(c, "cfg.json");
      ADD_FAILURE() << "accepted: " << message;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cfg.json: " + message), std::string::npos) << e.what();
    }
  }
}

// The operands held for the run (--keep-weight-operands always, or backward under --grad-checkpoint): a bf16
// buffer of its weight's shape for each trained projection, none for a sparse block's experts (their grouped
// products make their own) nor for a frozen projection; mark_stale makes every entry's next forward make it again.
TEST(Moe, HeldOperandsHaveABufferForEachTrainedProjectionButTheExperts) {
  const Qwen3Config c = preset_config("qwen3-moe-tiny");
  auto model = random_moe_model(c);
  for (auto& [key, t] : model->named_weights()) t.requires_grad_(key.find(".k_proj.") == std::string::npos);
  const auto held = train_detail::make_persistent_operands(*model);
  size_t want = 0;
  for (Qwen3Block& b : model->blocks) {
    want += 3 + (b.sparse() ? 0 : 3);  // q, v, o (k is frozen here); gate, up, down of a dense block
    EXPECT_NE(held->find(b.q_proj.weight), nullptr);
    EXPECT_EQ(held->find(b.k_proj.weight), nullptr) << "frozen";
    for (const ExpertMlp& e : b.experts) EXPECT_EQ(held->find(e.gate_proj.weight), nullptr) << "an expert";
  }
  ASSERT_TRUE(model->blocks[0].sparse() && !model->blocks[1].sparse());
  EXPECT_NE(held->find(model->blocks[1].down_proj.weight), nullptr);
  EXPECT_EQ(held->entries.size(), want);
  for (nvfp4::PersistentOperand& e : held->entries) {
    EXPECT_EQ(e.operand.scalar_type(), at::kBFloat16);
    EXPECT_EQ(e.operand.sizes(), e.weight.sizes());
    e.version = e.weight._version();  // as a forward leaves it
  }
  held->mark_stale();
  for (const nvfp4::PersistentOperand& e : held->entries) EXPECT_EQ(e.version, -1);
}

TEST(Moe, LayoutHasTheRouterAndEachExpertInHuggingFaceOrder) {
  const Qwen3Config c = preset_config("qwen3-moe-tiny");
  std::vector<std::string> keys;
  for (const TensorSpec& t : qwen3_tensors(c.shape(), false)) keys.push_back(t.key);
  const auto at = [&](const std::string& key) {
    return static_cast<size_t>(std::find(keys.begin(), keys.end(), key) - keys.begin());
  };
  // Block 0 sparse: router after k_norm, then expert 0's gate, up, down, ..., expert 7's, then the norms.
  EXPECT_EQ(at("model.layers.0.mlp.gate.weight"), at("model.layers.0.self_attn.k_norm.weight") + 1);
  EXPECT_EQ(at("model.layers.0.mlp.experts.0.gate_proj.weight"), at("model.layers.0.mlp.gate.weight") + 1);
  EXPECT_EQ(at("model.layers.0.mlp.experts.7.down_proj.weight") + 1, at("model.layers.0.input_layernorm.weight"));
  EXPECT_EQ(at("model.layers.0.mlp.gate_proj.weight"), keys.size()) << "a sparse block has no dense MLP";
  // Block 1 is in mlp_only_layers: dense.
  EXPECT_LT(at("model.layers.1.mlp.gate_proj.weight"), keys.size());
  EXPECT_EQ(at("model.layers.1.mlp.gate.weight"), keys.size());
  for (const TensorSpec& t : qwen3_tensors(c.shape(), false)) {
    if (t.key == "model.layers.0.mlp.gate.weight") {
      EXPECT_EQ(t.shape, std::vector<int64_t>({8, 96}));
      EXPECT_FALSE(t.quantizable) << "the router is never quantized";
    }
    if (t.key == "model.layers.2.mlp.experts.3.down_proj.weight") {
      EXPECT_EQ(t.shape, std::vector<int64_t>({96, 64}));
      EXPECT_TRUE(t.quantizable);
    }
  }
  // The 30B-A3B preset: 48 sparse blocks of 128 experts; 30.5 B parameters.
  const ModelShape big = preset_config("qwen3-30b-a3b").shape();
  int64_t parameters = 0;
  for (const TensorSpec& t : qwen3_tensors(big, true)) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    parameters += n;
  }
  EXPECT_NEAR(static_cast<double>(parameters) / 1e9, 30.53, 0.01);
}

TEST(Moe, SparseBlockEqualsADenseRecomputationOfItsRouting) {
  for (const bool renormalize : {true, false}) {
    Qwen3Config c = preset_config("qwen3-moe-tiny");
    c.norm_topk_prob = renormalize;
    auto model = random_moe_model(c);
    Qwen3Block& b = model->blocks[0];
    ASSERT_TRUE(b.sparse());
    ASSERT_FALSE(model->blocks[1].sparse());
    std::vector<at::Tensor> params = {b.router};
    for (const ExpertMlp& e : b.experts)
      for (const Projection* p : {&e.gate_proj, &e.up_proj, &e.down_proj}) params.push_back(p->weight);
    for (at::Tensor& p : params) p.requires_grad_(true);
    at::manual_seed(11);
    const at::Tensor h0 = at::randn({3, 7, c.hidden_size}, at::kDouble);
    const at::Tensor probe = at::randn({3, 7, c.hidden_size}, at::kDouble);

    at::Tensor h = h0.clone().requires_grad_(true);
    const at::Tensor y = model->mlp(b, h);
    (y * probe).sum().backward();
    std::vector<at::Tensor> grads = {h.grad().clone()};
    for (at::Tensor& p : params) {
      grads.push_back(p.grad().clone());
      p.mutable_grad().reset();
    }

    at::Tensor chosen;
    at::Tensor href = h0.clone().requires_grad_(true);
    const at::Tensor yref = dense_moe_reference(c, b, href, &chosen);
    (yref * probe).sum().backward();
    EXPECT_TRUE(at::allclose(y, yref, 1e-12, 1e-12)) << (y - yref).abs().max().item<double>();
    EXPECT_TRUE(at::allclose(grads[0], href.grad(), 1e-12, 1e-12)) << "dL/dh";
    for (size_t i = 0; i < params.size(); ++i)
      EXPECT_TRUE(at::allclose(grads[i + 1], params[i].grad(), 1e-12, 1e-12))
          << (i == 0 ? std::string("router") : "expert " + std::to_string((i - 1) / 3) + " projection " +
                                                   std::to_string((i - 1) % 3));
    // The routing is not trivial: most experts serve some token, none serves all.
    const at::Tensor counts = at::bincount(chosen.reshape({-1}), {}, c.num_experts);
    EXPECT_GE(counts.gt(0).sum().item<int64_t>(), 6);
    EXPECT_LT(counts.max().item<int64_t>(), 21);
  }
}

// Expert kernels that offer a grouped product (switchable), by the STE linear (nvfp4) or by the dense weight: what
// the trainer installs on CUDA (SteProjection), usable on the CPU, where grouped_product is one product a group.
class GroupedTestKernel final : public ProjectionKernel {
 public:
  GroupedTestKernel(bool ste, const bool* offer) : ste_(ste), offer_(offer) {}
  at::Tensor apply(const at::Tensor& x, const at::Tensor& w) const override {
    return ste_ ? nvfp4::ste_linear(x, w) : x.mm(w.to(x.scalar_type()).t());
  }
  bool offers_grouped(const at::Tensor&) const override { return *offer_; }
  at::Tensor apply_grouped(const std::vector<const Projection*>& group, const at::Tensor& rows,
                           const RowGroups& groups) const override {
    std::vector<at::Tensor> weights;
    for (const Projection* p : group) weights.push_back(ste_ ? p->weight : p->weight.to(rows.scalar_type()));
    if (ste_) return nvfp4::ste_grouped_linear(rows, weights, groups.ends, groups.counts);
    return nvfp4::grouped_product(rows, at::stack(weights), groups.ends, groups.counts);
  }

 private:
  bool ste_;
  const bool* offer_;
};

void install_grouped_test_kernels(Qwen3Model& model, bool ste, const bool* offer) {
  const auto kernel = std::make_shared<GroupedTestKernel>(ste, offer);
  for (Qwen3Block& b : model.blocks)
    for (ExpertMlp& e : b.experts)
      for (Projection* p : {&e.gate_proj, &e.up_proj, &e.down_proj}) p->kernel = kernel;
}

// One sparse block's output and the gradients of its input, router and expert weights (undefined where a
// weight got none) for the routing of h0.
struct BlockRun {
  at::Tensor y, dh;
  std::vector<at::Tensor> grads;
};

BlockRun run_sparse_block(Qwen3Model& model, const at::Tensor& h0, const at::Tensor& probe) {
  Qwen3Block& b = model.blocks[0];
  std::vector<at::Tensor> params = {b.router};
  for (const ExpertMlp& e : b.experts)
    for (const Projection* p : {&e.gate_proj, &e.up_proj, &e.down_proj}) params.push_back(p->weight);
  for (at::Tensor& p : params) p.requires_grad_(true), p.mutable_grad().reset();
  at::Tensor h = h0.clone().requires_grad_(true);
  BlockRun run;
  run.y = model.mlp(b, h);
  (run.y.to(at::kDouble) * probe).sum().backward();
  run.dh = h.grad();
  for (at::Tensor& p : params) run.grads.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
  return run;
}

// The grouped form of a sparse block (three grouped products over the tokens sorted by expert: one launch a
// projection kind on CUDA) against one expert after another: in float64 with dense kernels, and with the NVFP4
// straight-through kernels in float32 (bf16 products throw in oneDNN in the arm64 lane's libtorch under qemu,
// for the loop as for the grouped form), where the forward and every weight gradient must be the same bytes
// (each token's outputs summed in the order of its experts, each expert's product and weight gradient the same
// operation on the same rows); the input's gradient sums a token's k copies in another order (expand's sum, not
// autograd's accumulation), so it agrees to float32 rounding. Sixteen experts and three tokens
// leave some experts unrouted: no gradient for them in either form.
TEST(Moe, GroupedExpertsAreTheExpertLoop) {
  for (const bool ste : {false, true}) {
    Qwen3Config c = preset_config("qwen3-moe-tiny");
    c.num_experts = 16, c.num_experts_per_tok = 4;  // 4: the order of a token's sums shows in its bytes
    auto model = random_moe_model(c);
    if (ste) {
      at::NoGradGuard no_grad;
      for (auto& [key, t] : model->named_weights()) t.set_data(t.to(at::kFloat));
    }
    bool offer = false;
    install_grouped_test_kernels(*model, ste, &offer);
    at::manual_seed(5);
    const at::ScalarType dtype = ste ? at::kFloat : at::kDouble;
    const at::Tensor h0 = at::randn({1, 3, c.hidden_size}, at::kDouble).to(dtype);
    const at::Tensor probe = at::randn({1, 3, c.hidden_size}, at::kDouble);
    const BlockRun loop = run_sparse_block(*model, h0, probe);
    offer = true;
    const BlockRun grouped = run_sparse_block(*model, h0, probe);
    const std::string kind = ste ? "nvfp4 fp32" : "dense fp64";
    if (ste) {
      EXPECT_TRUE(at::equal(grouped.y, loop.y)) << kind << ": max |diff| " << (grouped.y - loop.y).abs().max().item<double>();
    }
    EXPECT_TRUE(at::allclose(grouped.y, loop.y, 1e-12, 1e-12)) << kind;
    const double dh_scale = loop.dh.abs().max().item<double>();
    EXPECT_TRUE(at::allclose(grouped.dh.to(at::kDouble), loop.dh.to(at::kDouble), 0, (ste ? 1e-5 : 1e-12) * dh_scale)) << kind;
    int unrouted = 0;
    for (size_t i = 0; i < loop.grads.size(); ++i) {
      const std::string what = kind + (i == 0 ? std::string(" router") : " expert " + std::to_string((i - 1) / 3) + " projection " + std::to_string((i - 1) % 3));
      if (!loop.grads[i].defined()) {
        ++unrouted;
        // The dense test kernel stacks its weights (at::stack's backward gives every one a gradient, zero where
        // unrouted); the nvfp4 node leaves an unrouted weight without one, as the loop does.
        if (ste)
          EXPECT_FALSE(grouped.grads[i].defined()) << what;
        else
          EXPECT_TRUE(grouped.grads[i].defined() && grouped.grads[i].abs().max().item<double>() == 0) << what;
        continue;
      }
      ASSERT_TRUE(grouped.grads[i].defined()) << what;
      if (ste)
        EXPECT_TRUE(at::equal(grouped.grads[i], loop.grads[i])) << what;
      else
        EXPECT_TRUE(at::allclose(grouped.grads[i], loop.grads[i], 1e-12, 1e-12)) << what;
    }
    EXPECT_GT(unrouted, 0) << kind << ": 3 tokens, 4 of 16 experts each";
  }
}

// On a GPU: the grouped form as the trainer runs it there (one at::_grouped_mm a projection kind where the
// libtorch has it, PyTorch 2.8+; else a product a group) against the expert loop, bf16 activations over fp32
// weights with the NVFP4 straight-through kernels, at a width where the grouped GEMM's alignment rules hold.
// cuBLAS and the grouped GEMM may sum in other orders: agreement to bf16 rounding.
TEST(Moe, GpuGroupedExpertsFollowTheExpertLoop) {
  QWEN3_GPU_TEST(at::hasCUDA());
  Qwen3Config c = preset_config("qwen3-moe-tiny");
  c.num_experts = 32, c.num_experts_per_tok = 4, c.moe_intermediate_size = 128;
  auto model = std::make_unique<Qwen3Model>(c, at::kFloat, at::Device(at::kCUDA), !c.tie_word_embeddings);
  at::manual_seed(7);
  for (auto& [key, t] : model->named_weights()) {
    at::NoGradGuard no_grad;
    at::Tensor w = t;
    w.copy_(w.dim() == 1 ? 1 + 0.05 * at::randn(w.sizes()) : at::randn(w.sizes()) / std::sqrt(static_cast<double>(w.size(1))));
  }
  model->set_compute_dtype(at::kBFloat16);
  bool offer = false;
  install_grouped_test_kernels(*model, /*ste=*/true, &offer);
  const at::Tensor h0 = at::randn({2, 300, c.hidden_size}).to(at::kBFloat16).to(at::kCUDA);
  const at::Tensor probe = at::randn({2, 300, c.hidden_size}, at::kDouble).to(at::kCUDA);
  const BlockRun loop = run_sparse_block(*model, h0, probe);
  offer = true;
  const BlockRun grouped = run_sparse_block(*model, h0, probe);
  const auto close = [](const at::Tensor& got, const at::Tensor& want) {
    const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
    return ((g - w).norm() / w.norm()).item<double>();
  };
  EXPECT_LT(close(grouped.y, loop.y), 1e-2);
  EXPECT_LT(close(grouped.dh, loop.dh), 1e-2);
  for (size_t i = 0; i < loop.grads.size(); ++i) {
    ASSERT_EQ(grouped.grads[i].defined(), loop.grads[i].defined()) << i;
    if (loop.grads[i].defined()) {
      EXPECT_LT(close(grouped.grads[i], loop.grads[i]), 1e-2) << "gradient " << i;
    }
  }
  std::cout << "grouped products on CUDA: " << (nvfp4::native_grouped_product(h0) ? "at::_grouped_mm" : "a product a group")
            << "\n";
}

// transformers' load_balancing_loss_func as it is written there: the one-hot of the top k [L·N, k, E] and the
// attention mask expanded over the blocks, the slots and the experts.
at::Tensor transformers_balance_loss(const std::vector<at::Tensor>& logits, int64_t k, const at::Tensor& mask) {
  const at::Tensor all = at::cat(logits, 0);
  const int64_t E = all.size(1), L = static_cast<int64_t>(logits.size()), N = logits[0].size(0);
  const at::Tensor routing = at::softmax(all, -1, at::kFloat);
  const at::Tensor expert_mask = at::one_hot(std::get<1>(at::topk(routing, k, -1)), E).to(at::kFloat);
  const at::Tensor m = mask.to(at::kFloat).reshape({1, N}).expand({L, N}).reshape({L * N});
  const at::Tensor slots = m.view({-1, 1, 1}).expand_as(expert_mask);
  const at::Tensor tokens_per_expert = (expert_mask * slots).sum(0) / slots.sum(0);
  const at::Tensor experts = m.view({-1, 1}).expand_as(routing);
  const at::Tensor router_prob_per_expert = (routing * experts).sum(0) / experts.sum(0);
  return (tokens_per_expert * router_prob_per_expert.unsqueeze(0)).sum() * static_cast<double>(E);
}

TEST(Moe, LoadBalancingLossIsTransformersOnesInValueAndGradient) {
  at::manual_seed(3);
  std::vector<at::Tensor> logits, reference;
  for (int b = 0; b < 3; ++b) logits.push_back(at::randn({10, 8}).requires_grad_(true));
  for (const at::Tensor& l : logits) reference.push_back(l.detach().clone().requires_grad_(true));
  const at::Tensor mask = at::tensor({1, 1, 1, 0, 1, 1, 0, 0, 1, 1}, at::kLong).to(at::kBool);
  for (const bool masked : {false, true}) {
    const at::Tensor m = masked ? mask : at::ones({10}, at::kBool);
    const at::Tensor ours = load_balancing_loss(logits, 2, masked ? mask : at::Tensor());
    const at::Tensor theirs = transformers_balance_loss(reference, 2, m);
    EXPECT_NEAR(ours.item<double>(), theirs.item<double>(), 1e-6) << "masked " << masked;
    ours.backward();
    theirs.backward();
    for (size_t i = 0; i < logits.size(); ++i) {
      EXPECT_TRUE(at::allclose(logits[i].grad(), reference[i].grad(), 1e-5, 1e-7)) << "block " << i;
      logits[i].mutable_grad().reset();
      reference[i].mutable_grad().reset();
    }
  }
  // Uniform routing: f_e = k/E on average, P_e = 1/E: the loss is k.
  EXPECT_NEAR(load_balancing_loss({at::zeros({16, 8})}, 2).item<double>(), 2.0, 1e-6);
  EXPECT_THROW(load_balancing_loss({}, 2), Error);
}

// The trained load-balancing loss (trainer/router_balance.h): language-model loss plus coefficient × the
// load-balancing loss of all sparse blocks, differentiated as one graph, against the observer's way — the
// language-model loss alone, its gradient completed by the observer inside each block's router node — with the
// blocks as plain graph nodes and as recomputed segments (--grad-checkpoint). Padding positions (mask 0) count
// for neither. A large coefficient, so that the loss's share of the router gradients is far above the tolerance.
TEST(Moe, TheLoadBalancingLossTrainsAcrossBlockSegments) {
  const Qwen3Config c = preset_config("qwen3-moe-tiny");
  const double coefficient = 0.5;
  at::manual_seed(11);
  const at::Tensor ids = at::randint(0, 1000, {2, 9}, at::kLong), targets = at::randint(0, 1000, {18}, at::kLong);
  at::Tensor mask = at::ones({2, 9}, at::kBool);
  mask.narrow(1, 6, 3)[1].fill_(false);
  const auto lm_loss = [&](Qwen3Model& m) { return at::cross_entropy_loss(m.forward(ids).reshape({18, -1}), targets); };
  const auto gradients = [](Qwen3Model& m) {
    std::vector<at::Tensor> g;
    for (auto& [key, t] : m.named_weights()) {
      g.push_back(t.grad().defined() ? t.grad().clone() : at::zeros_like(t));
      t.mutable_grad().reset();
    }
    return g;
  };
  auto reference = random_moe_model(c);
  for (auto& [key, t] : reference->named_weights()) t.requires_grad_(true);
  reference->set_router_logits_recording(true);
  const at::Tensor lm = lm_loss(*reference);
  const at::Tensor balance = load_balancing_loss(reference->take_router_logits(), c.num_experts_per_tok, mask);
  (lm + coefficient * balance).backward();
  const std::vector<at::Tensor> want = gradients(*reference);
  for (const bool recompute : {false, true}) {
    auto model = random_moe_model(c);
    for (auto& [key, t] : model->named_weights()) t.requires_grad_(true);
    train_detail::TrainingBlockRunner runner(recompute);
    train_detail::RouterBalanceLoss observer(c.num_hidden_layers, c.num_experts, c.num_experts_per_tok, coefficient);
    model->set_block_runner(&runner);
    observer.begin(mask, 1.0);
    model->set_router_observer(&observer);
    lm_loss(*model).backward();
    model->set_router_observer(nullptr);
    model->set_block_runner(nullptr);
    EXPECT_EQ(runner.recomputed_blocks(), recompute ? 3 : 0);
    const at::Tensor value = observer.finish();
    ASSERT_TRUE(value.defined());
    EXPECT_NEAR(value.item<double>(), balance.item<double>(), 1e-6) << "recompute " << recompute;
    const std::vector<at::Tensor> got = gradients(*model);
    size_t i = 0;
    for (auto& [key, t] : model->named_weights()) {
      // fp32 softmax in both (transformers computes the probabilities in fp32): agreement to fp32 precision.
      EXPECT_TRUE(at::allclose(got[i], want[i], 1e-5, 1e-6 * want[i].abs().max().item<double>()))
          << key << " recompute " << recompute << ": max |diff| " << (got[i] - want[i]).abs().max().item<double>() << " of " << want[i].abs().max().item<double>();
      ++i;
    }
  }
}

TEST(Moe, RouterLogitsAreRecordedOnlyWhenAsked) {
  auto model = random_moe_model(preset_config("qwen3-moe-tiny"));
  const at::Tensor ids = at::randint(0, 1000, {2, 5}, at::kLong);
  model->hidden_states(ids);
  EXPECT_TRUE(model->take_router_logits().empty());
  model->set_router_logits_recording(true);
  model->hidden_states(ids);
  const std::vector<at::Tensor> logits = model->take_router_logits();
  ASSERT_EQ(logits.size(), 2u) << "blocks 0 and 2 are sparse, 1 is dense";
  EXPECT_EQ(logits[0].sizes(), at::IntArrayRef({10, 8}));
  EXPECT_TRUE(model->take_router_logits().empty()) << "taken";
}

// A token of Qwen3-30B-A3B goes through 8 of each block's 128 experts: the model FLOPs (and so the MFU and the
// step-time model's products) count its ~3.0 B active parameters without the input embedding (Qwen's "3.3B
// activated" with it: 0.31 B), not the 30 B it holds.
TEST(Moe, ModelFlopsCountTheActiveExpertsOnly) {
  const Qwen3Config c = preset_config("qwen3-30b-a3b");
  const double attention = 12.0 * 48 * (32 * 128) * 2048;
  const double active = (model_flops_per_token(c, 2048) - attention) / 6;
  EXPECT_NEAR(active / 1e9, 3.04, 0.01);
}

// A whole MoE model through the binary: synth writes it (NVFP4 experts, a dense router), inspect lists it, and
// generate runs it.
TEST(MoeCli, SynthInspectAndGenerate) {
  test::TempDir dir;
  auto r = test::run_cli("synth --preset qwen3-moe-tiny --out-dir " + dir.file("m"));
  ASSERT_EQ(r.code, 0) << r.err;
  r = test::run_cli("inspect " + dir.file("m/model.dat") + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("model.layers.2.mlp.experts.7.down_proj.weight.qdata"), std::string::npos);
  EXPECT_NE(r.out.find("\"model.layers.0.mlp.gate.weight\""), std::string::npos);
  r = test::run_cli("generate --weights " + dir.file("m/model.dat") + " --config " + dir.file("m/config.json") +
                    " --prompt-ids '1 2 3 4' --max-new-tokens 3 --print-ids --ignore-eos");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(r.out.empty());
  // eval --logits-out writes each sparse block's chosen experts beside the logits (experts.K, [blocks, positions,
  // k]): what the transformers lane compares with transformers' router. Two distinct experts of 8 a position.
  std::ofstream(dir.file("ids.txt")) << "5 6 7 8 9 10\n";
  r = test::run_cli("eval --weights " + dir.file("m/model.dat") + " --config " + dir.file("m/config.json") +
                    " --token-ids-file " + dir.file("ids.txt") + " --logits-out " + dir.file("out.safetensors"));
  ASSERT_EQ(r.code, 0) << r.err;
  const SafetensorsFile file(dir.file("out.safetensors"));
  const SafetensorsTensor* experts = file.find("experts.0");
  ASSERT_NE(experts, nullptr);
  EXPECT_EQ(experts->dtype, "I64");
  EXPECT_EQ(experts->shape, std::vector<int64_t>({2, 5, 2})) << "blocks 0 and 2 are sparse; 5 scored positions";
  std::vector<int64_t> chosen(20);
  file.read_range(*experts, 0, chosen.data(), chosen.size() * sizeof(int64_t));
  for (size_t i = 0; i < chosen.size(); i += 2) {
    EXPECT_TRUE(chosen[i] >= 0 && chosen[i] < 8 && chosen[i + 1] >= 0 && chosen[i + 1] < 8) << i;
    EXPECT_NE(chosen[i], chosen[i + 1]) << i;
  }
}

// The tiny MoE trains as the dense model does (every expert an NVFP4 straight-through linear, the router dense),
// resumes bit for bit (int8 moments, bf16 master) and exports a .dat that generate runs.
TEST(MoeCli, TrainsResumesBitExactlyAndExports) {
  test::TempDir dir;
  ASSERT_EQ(test::run_cli("synth --preset qwen3-moe-tiny --out-dir " + dir.file("m")).code, 0);
  std::ofstream(dir.file("pairs.tsv")) << "a\tb\nc\td\ne\tf\ng\th\n";
  const std::string base = "train --model-dir " + dir.file("m") + " --tokenizer " + test::tiny_tokenizer_path() +
                           " --train-data " + dir.file("pairs.tsv") +
                           " --batch-size 2 --lr 1e-3 --optimizer-state-mode int8 --master-dtype bfloat16";
  auto r = test::run_cli(base + " --steps 4 --output-dir " + dir.file("straight"));
  ASSERT_EQ(r.code, 0) << r.err;
  r = test::run_cli(base + " --steps 2 --output-dir " + dir.file("resumed"));
  ASSERT_EQ(r.code, 0) << r.err;
  r = test::run_cli(base + " --steps 4 --output-dir " + dir.file("resumed") + " --resume --overwrite");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto losses = [&](const std::string& run) {
    std::vector<double> out;
    std::ifstream in(dir.file(run + "/metrics.jsonl"));
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
    return out;
  };
  ASSERT_EQ(losses("straight").size(), 4u);
  EXPECT_EQ(losses("straight"), losses("resumed"));
  EXPECT_LT(losses("straight").back(), losses("straight").front());
  EXPECT_EQ(test::slurp(dir.file("straight/model.dat")), test::slurp(dir.file("resumed/model.dat")));
  r = test::run_cli("generate --weights " + dir.file("straight/model.dat") + " --config " + dir.file("m/config.json") +
                    " --prompt-ids '1 2 3' --max-new-tokens 2 --print-ids --ignore-eos");
  EXPECT_EQ(r.code, 0) << r.err;
  // A config that asks for the load-balancing loss (output_router_logits, as transformers reads it) trains with
  // it: its value in every metrics line and the progress line, a different model than without it, and resuming
  // repeats it bit for bit.
  nlohmann::json config = nlohmann::json::parse(std::ifstream(dir.file("m/config.json")));
  config["output_router_logits"] = true;
  config["router_aux_loss_coef"] = 0.5;
  std::ofstream(dir.file("aux.json")) << config.dump();
  const std::string aux = base + " --config " + dir.file("aux.json") + " --log-every 1";
  r = test::run_cli(aux + " --steps 4 --output-dir " + dir.file("aux"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("load-balancing loss: trained with coefficient 0.5"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" | aux "), std::string::npos) << r.err;
  std::ifstream metrics(dir.file("aux/metrics.jsonl"));
  int lines = 0;
  for (std::string line; std::getline(metrics, line); ++lines) {
    const nlohmann::json m = nlohmann::json::parse(line);
    ASSERT_TRUE(m.contains("router_aux_loss")) << line;
    // Two of eight experts a token: 2 when perfectly balanced, more otherwise, never below 2 by much.
    EXPECT_GT(m["router_aux_loss"].get<double>(), 1.5) << line;
  }
  EXPECT_EQ(lines, 4);
  EXPECT_EQ(losses("aux").front(), losses("straight").front()) << "the same language-model loss before any update";
  EXPECT_NE(test::slurp(dir.file("aux/model.dat")), test::slurp(dir.file("straight/model.dat")));
  ASSERT_EQ(test::run_cli(aux + " --steps 2 --output-dir " + dir.file("aux-resumed")).code, 0);
  r = test::run_cli(aux + " --steps 4 --output-dir " + dir.file("aux-resumed") + " --resume --overwrite");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(losses("aux"), losses("aux-resumed"));
  EXPECT_EQ(test::slurp(dir.file("aux/model.dat")), test::slurp(dir.file("aux-resumed/model.dat")));
  // The in-backward update with checkpointing: the blocks recomputed and applied one by one, the loss still trained.
  r = test::run_cli(aux + " --steps 2 --fused-optimizer --grad-checkpoint --output-dir " + dir.file("aux-fused"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto first_record = [&](const std::string& run) {
    std::ifstream in(dir.file(run + "/metrics.jsonl"));
    std::string line;
    std::getline(in, line);
    return nlohmann::json::parse(line);
  };
  EXPECT_NEAR(first_record("aux-fused")["router_aux_loss"].get<double>(),
              first_record("aux")["router_aux_loss"].get<double>(), 1e-6)
      << "the first step's value does not depend on how the update runs";
  EXPECT_FALSE(first_record("straight").contains("router_aux_loss")) << "not asked for: not trained";
}

TEST(Moe, AnExpertsGateAndUpShareTheirSecondLevelScale) {
  const std::string e = "model.layers.3.mlp.experts.17.";
  EXPECT_EQ(nvfp4_scale_group(e + "gate_proj.weight"), nvfp4_scale_group(e + "up_proj.weight"));
  EXPECT_NE(nvfp4_scale_group(e + "gate_proj.weight"), nvfp4_scale_group(e + "down_proj.weight"));
  EXPECT_NE(nvfp4_scale_group(e + "gate_proj.weight"), nvfp4_scale_group("model.layers.3.mlp.experts.16.up_proj.weight"));
  EXPECT_NE(nvfp4_scale_group(e + "gate_proj.weight"), nvfp4_scale_group("model.layers.3.mlp.gate_proj.weight"));
  EXPECT_EQ(nvfp4_scale_group("model.layers.3.mlp.gate.weight"), "model.layers.3.mlp.gate.weight");
}

// The Hugging Face layouts of a trained MoE: Qwen3MoeForCausalLM with per-expert keys; nvfp4-hf keeps the routers
// bf16 and lists them (with lm_head) among ModelOpt's excluded modules, and an expert's gate and up share their
// second-level scale (vLLM fuses them into one w13); both convert back to the very weights exported as .dat.
TEST(MoeCli, ExportsHuggingFaceLayoutsThatConvertBack) {
  test::TempDir dir;
  ASSERT_EQ(test::run_cli("synth --preset qwen3-moe-tiny --out-dir " + dir.file("m")).code, 0);
  std::ofstream(dir.file("pairs.tsv")) << "a\tb\nc\td\n";
  auto r = test::run_cli("train --model-dir " + dir.file("m") + " --tokenizer " + test::tiny_tokenizer_path() +
                         " --train-data " + dir.file("pairs.tsv") + " --steps 2 --lr 1e-3 --output-dir " + dir.file("run"));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string from = " --checkpoint " + dir.file("run/checkpoints") + " --weights " + dir.file("m/model.dat") +
                           " --no-tokenizer --out ";
  for (const std::string format : {"hf", "nvfp4-hf"}) {
    const std::string out = dir.file(format);
    r = test::run_cli("export --format " + format + from + out);
    ASSERT_EQ(r.code, 0) << r.err;
    const nlohmann::json config = nlohmann::json::parse(std::ifstream(out + "/config.json"));
    EXPECT_EQ(config["architectures"][0], "Qwen3MoeForCausalLM");
    EXPECT_EQ(config["model_type"], "qwen3_moe");
    EXPECT_EQ(config["num_experts"], 8);
    const SafetensorsFile file(out + "/model.safetensors");
    EXPECT_NE(file.find("model.layers.2.mlp.experts.7.down_proj.weight"), nullptr) << format;
    ASSERT_NE(file.find("model.layers.0.mlp.gate.weight"), nullptr);
    EXPECT_EQ(file.find("model.layers.0.mlp.gate.weight")->dtype, "BF16") << "the router stays dense";
    if (format == "nvfp4-hf") {
      const std::vector<std::string> excluded = config["quantization_config"]["ignore"];
      EXPECT_EQ(excluded, std::vector<std::string>({"lm_head", "model.layers.0.mlp.gate", "model.layers.2.mlp.gate"}));
      for (int e = 0; e < 8; ++e) {
        const std::string p = "model.layers.2.mlp.experts." + std::to_string(e) + ".";
        float gate = 0, up = 0;
        file.read_range(*file.find(p + "gate_proj.weight_scale_2"), 0, &gate, 4);
        file.read_range(*file.find(p + "up_proj.weight_scale_2"), 0, &up, 4);
        EXPECT_EQ(gate, up) << p;
      }
    }
    r = test::run_cli("convert --hf-dir " + out + " --out " + dir.file(format + "-back/model.dat") + " --nvfp4");
    ASSERT_EQ(r.code, 0) << r.err;
  }
  r = test::run_cli("export --checkpoint " + dir.file("run/checkpoints") + " --weights " + dir.file("m/model.dat") +
                    " --out " + dir.file("exported.dat"));
  ASSERT_EQ(r.code, 0) << r.err;
  const DatReader exported(dir.file("exported.dat")), back(dir.file("nvfp4-hf-back/model.dat"));
  size_t experts = 0;
  for (const DatEntry& e : exported.entries()) {
    if (e.key.find(".mlp.experts.") == std::string::npos) continue;
    ++experts;
    EXPECT_TRUE(read_tensor(back, back.at(e.key)).equal(read_tensor(exported, e))) << e.key;
  }
  EXPECT_EQ(experts, 2u * 8 * 3 * 2) << "two sparse blocks, 8 experts, 3 projections, codes and scales";
}

}  // namespace
}  // namespace qwen3
