// The Qwen3 forward against a deliberately plain float64 reference written from qwen3.md (loops over tokens,
// heads and features, no shared code with src/model), plus the KV cache, chunked prefill, sampling and loading.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/utils.h>
#include <torch/version.h>

#include <cmath>
#include <set>

#include "dat_test_util.h"
#include "gpu_test.h"
#include "qwen3/dat/dat_tensor.h"
#include "qwen3/model/generate.h"
#include "qwen3/model/model.h"
#include "qwen3/model/model_loader.h"
#include "qwen3/nvfp4/nvfp4_linear.h"
#include "qwen3/nvfp4/nvfp4_ops.h"
#include "qwen3/model/synth.h"
#include "trainer/block_runner.h"

namespace qwen3 {
namespace {

Qwen3Config tiny_config(bool tied) {
  Qwen3Config c;
  c.hidden_size = 48;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;  // != 48 / 4
  c.intermediate_size = 64;
  c.vocab_size = 97;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000;
  c.tie_word_embeddings = tied;
  c.eos_token_ids = {3};
  return c;
}

void randomize(Qwen3Model& m, uint64_t seed, double scale = 1.0) {
  torch::NoGradGuard g;
  at::manual_seed(seed);
  for (auto& [key, t] : m.named_weights()) {
    if (t.dim() == 1)
      t.normal_(1.0, 0.1);
    else
      t.normal_(0.0, scale / std::sqrt(static_cast<double>(t.size(1))));
  }
}

using Vec = std::vector<double>;
Vec row(const at::Tensor& w, int64_t r) {  // one row of a 2-D float64 tensor
  const at::Tensor c = w.to(at::kDouble).contiguous();
  return Vec(c.data_ptr<double>() + r * c.size(1), c.data_ptr<double>() + (r + 1) * c.size(1));
}
Vec matvec(const at::Tensor& w, const Vec& x) {  // w [out, in]
  Vec y(w.size(0));
  for (int64_t o = 0; o < w.size(0); ++o) {
    const Vec wr = row(w, o);
    double s = 0;
    for (size_t i = 0; i < x.size(); ++i) s += wr[i] * x[i];
    y[o] = s;
  }
  return y;
}
Vec rmsnorm(const Vec& x, const at::Tensor& w, double eps) {
  double ms = 0;
  for (double v : x) ms += v * v;
  ms /= x.size();
  const at::Tensor wd = w.to(at::kDouble).contiguous();
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] / std::sqrt(ms + eps) * wd.data_ptr<double>()[i];
  return y;
}
void rope(double* v, int64_t d, int64_t pos, double theta) {  // rotate-half form, on one head
  Vec out(d);
  for (int64_t i = 0; i < d / 2; ++i) {
    const double angle = pos * std::pow(theta, -2.0 * i / d);
    out[i] = v[i] * std::cos(angle) - v[i + d / 2] * std::sin(angle);
    out[i + d / 2] = v[i + d / 2] * std::cos(angle) + v[i] * std::sin(angle);
  }
  std::copy(out.begin(), out.end(), v);
}

// Logits [T, V] of one sequence.
std::vector<Vec> reference_logits(Qwen3Model& m, const std::vector<int64_t>& ids) {
  const Qwen3Config& c = m.config();
  const int64_t T = ids.size(), nh = c.num_attention_heads, nkv = c.num_key_value_heads, d = c.head_dim;
  std::vector<Vec> x(T);
  for (int64_t t = 0; t < T; ++t) x[t] = row(m.embed_tokens, ids[t]);
  for (const auto& b : m.blocks) {
    std::vector<Vec> q(T), k(T), v(T);
    for (int64_t t = 0; t < T; ++t) {
      const Vec h = rmsnorm(x[t], b.input_layernorm, c.rms_norm_eps);
      q[t] = matvec(b.q_proj.weight, h), k[t] = matvec(b.k_proj.weight, h), v[t] = matvec(b.v_proj.weight, h);
      for (int64_t hq = 0; hq < nh; ++hq) {
        Vec head(q[t].begin() + hq * d, q[t].begin() + (hq + 1) * d);
        head = rmsnorm(head, b.q_norm, c.rms_norm_eps);
        rope(head.data(), d, t, c.rope_theta);
        std::copy(head.begin(), head.end(), q[t].begin() + hq * d);
      }
      for (int64_t hk = 0; hk < nkv; ++hk) {
        Vec head(k[t].begin() + hk * d, k[t].begin() + (hk + 1) * d);
        head = rmsnorm(head, b.k_norm, c.rms_norm_eps);
        rope(head.data(), d, t, c.rope_theta);
        std::copy(head.begin(), head.end(), k[t].begin() + hk * d);
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      Vec attn(nh * d, 0.0);
      for (int64_t hq = 0; hq < nh; ++hq) {
        const int64_t hk = hq / (nh / nkv);
        Vec score(t + 1);
        double mx = -1e300;
        for (int64_t s = 0; s <= t; ++s) {
          double dot = 0;
          for (int64_t i = 0; i < d; ++i) dot += q[t][hq * d + i] * k[s][hk * d + i];
          score[s] = dot / std::sqrt(static_cast<double>(d));
          mx = std::max(mx, score[s]);
        }
        double z = 0;
        for (auto& sc : score) z += (sc = std::exp(sc - mx));
        for (int64_t s = 0; s <= t; ++s)
          for (int64_t i = 0; i < d; ++i) attn[hq * d + i] += score[s] / z * v[s][hk * d + i];
      }
      const Vec o = matvec(b.o_proj.weight, attn);
      for (size_t i = 0; i < o.size(); ++i) x[t][i] += o[i];
      const Vec h = rmsnorm(x[t], b.post_attention_layernorm, c.rms_norm_eps);
      const Vec g = matvec(b.gate_proj.weight, h), u = matvec(b.up_proj.weight, h);
      Vec act(g.size());
      for (size_t i = 0; i < g.size(); ++i) act[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
      const Vec down = matvec(b.down_proj.weight, act);
      for (size_t i = 0; i < down.size(); ++i) x[t][i] += down[i];
    }
  }
  const at::Tensor head = m.has_separate_lm_head() ? m.named_weights().back().second : m.embed_tokens;
  std::vector<Vec> out(T);
  for (int64_t t = 0; t < T; ++t) out[t] = matvec(head, rmsnorm(x[t], m.final_norm, c.rms_norm_eps));
  return out;
}

double max_rel_diff(const at::Tensor& got, const std::vector<Vec>& want) {
  double num = 0, den = 0;
  for (size_t t = 0; t < want.size(); ++t)
    for (size_t j = 0; j < want[t].size(); ++j) {
      const double g = got[t][j].item<double>();
      num = std::max(num, std::abs(g - want[t][j]));
      den = std::max(den, std::abs(want[t][j]));
    }
  return num / den;
}

TEST(Model, LogitsMatchThePlainReference) {
  for (bool tied : {false, true}) {
    Qwen3Model m(tiny_config(tied), at::kDouble, at::kCPU, /*separate_lm_head=*/!tied);
    randomize(m, 11);
    const std::vector<int64_t> ids = {5, 17, 42, 42, 96, 0, 63, 8, 31};
    torch::NoGradGuard g;
    const at::Tensor logits = m.forward(at::tensor(ids, at::kLong).unsqueeze(0))[0];
    EXPECT_LT(max_rel_diff(logits, reference_logits(m, ids)), 1e-5) << "tied=" << tied;
  }
}

TEST(Model, ChunkedPrefillEqualsOneShotAndCachedDecodingEqualsRecompute) {
  Qwen3Model m(tiny_config(false), at::kFloat, at::kCPU, true);
  randomize(m, 5, 3.0);
  torch::NoGradGuard g;
  const std::vector<int64_t> prompt = {1, 9, 27, 81, 50, 2, 77, 13, 64, 12, 40};
  const at::Tensor ids = at::tensor(prompt, at::kLong).unsqueeze(0);
  const at::Tensor full = m.forward(ids);
  KVCache cache = m.make_cache(1, 32);
  std::vector<at::Tensor> parts;
  for (int64_t s = 0; s < ids.size(1); s += 4) parts.push_back(m.forward(ids.narrow(1, s, std::min<int64_t>(4, ids.size(1) - s)), &cache));
  EXPECT_TRUE(at::allclose(at::cat(parts, 1), full, 1e-4, 1e-5));

  GenerateOptions opt;
  opt.max_new_tokens = 12;
  opt.prefill_chunk = 3;
  const auto cached = generate(m, prompt, opt);
  std::vector<int64_t> seq = prompt, recomputed;
  for (int i = 0; i < 12; ++i) {
    const at::Tensor l = m.forward(at::tensor(seq, at::kLong).unsqueeze(0))[0][-1];
    recomputed.push_back(l.argmax().item<int64_t>());
    seq.push_back(recomputed.back());
  }
  EXPECT_EQ(cached, recomputed);
}

TEST(Model, GenerationStopsAtStopIdsAndRejectsBadIds) {
  Qwen3Model m(tiny_config(true), at::kFloat, at::kCPU, false);
  randomize(m, 2, 3.0);
  GenerateOptions opt;
  opt.max_new_tokens = 20;
  const auto free_run = generate(m, {4, 5, 6}, opt);
  ASSERT_EQ(free_run.size(), 20u);
  opt.stop_ids = {free_run[2]};
  const auto stopped = generate(m, {4, 5, 6}, opt);
  EXPECT_EQ(stopped.back(), free_run[2]);
  EXPECT_LE(stopped.size(), 3u);
  EXPECT_THROW(generate(m, {4, 500}, opt), Error);
  EXPECT_THROW(sequence_loss(m, {4}), Error);
}

TEST(Sampler, GreedyTopKTopPAndSeeds) {
  const at::Tensor logits = at::tensor({1.0f, 5.0f, 2.0f, 4.9f});
  EXPECT_EQ(Sampler({}).next(logits), 1);
  SamplingOptions top1;
  top1.temperature = 1.0, top1.top_k = 1;
  EXPECT_EQ(Sampler(top1).next(logits), 1);
  // The top token alone holds more than p: it must be chosen, not nothing.
  const at::Tensor peaked = at::tensor({0.0f, 10.0f, 0.0f, 0.0f});
  SamplingOptions nucleus;
  nucleus.temperature = 1.0, nucleus.top_p = 0.5;
  Sampler s(nucleus);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.next(peaked), 1);
  // top-p 0.9 over {5.0, 4.9} (≈ 0.47 each, rest ≈ 0.06): only ids 1 and 3 can appear.
  nucleus.top_p = 0.9;
  Sampler s2(nucleus);
  std::set<int64_t> seen;
  for (int i = 0; i < 200; ++i) seen.insert(s2.next(logits));
  EXPECT_EQ(seen, (std::set<int64_t>{1, 3}));
  SamplingOptions warm;
  warm.temperature = 2.0, warm.seed = 9;
  Sampler a(warm), b(warm);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(a.next(logits), b.next(logits));
  SamplingOptions bad;
  bad.top_p = 0;
  EXPECT_THROW(Sampler{bad}, UsageError);
}

TEST(ModelLoader, LoadsNvfp4AndDenseFilesAndListsProblems) {
  test::TempDir dir;
  SynthOptions opt;
  opt.config = preset_config("tiny");
  opt.config.num_hidden_layers = 2;
  opt.out_dir = dir.file("m");
  const SynthResult r = write_synthetic_model(opt);
  DatReader reader(r.dat_path);
  auto model = load_model(reader, opt.config, at::kFloat, at::kCPU);
  EXPECT_TRUE(model->has_separate_lm_head());
  const at::Tensor q = model->blocks[1].q_proj.weight;
  const at::Tensor want = nvfp4::dequantize(read_tensor(reader, reader.at("model.layers.1.self_attn.q_proj.weight.qdata")),
                                            read_tensor(reader, reader.at("model.layers.1.self_attn.q_proj.weight.scale")), at::kFloat);
  EXPECT_TRUE(q.equal(want));
  EXPECT_TRUE(model->final_norm.equal(read_tensor(reader, reader.at("model.norm.weight")).to(at::kFloat)));
  const auto loss = sequence_loss(*model, {9707, 4337, 13, 151645});
  EXPECT_EQ(loss.tokens, 3);
  EXPECT_TRUE(std::isfinite(loss.loss));

  Qwen3Config wrong = opt.config;
  wrong.num_hidden_layers = 3;
  wrong.intermediate_size = 512;
  try {
    load_model(reader, wrong, at::kFloat, at::kCPU);
    ADD_FAILURE();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("missing 'model.layers.2.self_attn.q_proj.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'model.layers.0.mlp.gate_proj.weight' is [256, 96] in the file, the config needs [512, 96]"),
              std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace qwen3

namespace qwen3 {
namespace {

// Packed rows: two sequences in one row, with positions restarting and attention kept within each, give the
// hidden states each sequence gets alone (to the fp32 rounding of the softmax, which runs in fp32 whatever the
// dtype: 5e-7 measured); without the layout the second sequence differs by orders of magnitude more.
TEST(Model, PackedRowsEqualTheirSequencesAlone) {
  Qwen3Model m(tiny_config(false), at::kDouble, at::kCPU, true);
  randomize(m, 31);
  torch::NoGradGuard no_grad;
  const at::Tensor a = at::randint(0, 97, {1, 5}, at::kLong), b = at::randint(0, 97, {1, 7}, at::kLong);
  const at::Tensor row = at::cat({a, b}, 1);
  const PackedRows packed{at::cat({at::arange(5, at::kLong), at::arange(7, at::kLong)}).unsqueeze(0),
                          at::cat({at::zeros({5}, at::kLong), at::ones({7}, at::kLong)}).unsqueeze(0)};
  const at::Tensor together = m.hidden_states_from_embeddings(m.embed(row), nullptr, &packed);
  const at::Tensor alone = at::cat({m.hidden_states(a), m.hidden_states(b)}, 1);
  const double packed_error = (together - alone).abs().max().item<double>();
  const at::Tensor unmasked = m.hidden_states(row);
  const double unmasked_error = (unmasked.narrow(1, 5, 7) - alone.narrow(1, 5, 7)).abs().max().item<double>();
  std::printf("packed rows vs alone: max |difference| %.3g with the layout, %.3g without\n", packed_error, unmasked_error);
  EXPECT_LT(packed_error, 1e-5);
  EXPECT_GT(unmasked_error, 1e-2);
}

// The segments a variable-length attention kernel gets: a run of one document id in a row is one, padding (-1)
// too, and every row starts one; offsets over the rows flattened.
TEST(Model, PackedSegmentOffsetsFollowTheDocumentRuns) {
  const at::Tensor documents = at::tensor({0, 0, 0, 1, 1, -1, 0, 1, 1, 1, 2, 2}, at::kLong).view({2, 6});
  const at::Tensor offsets = packed_segment_offsets(documents);
  EXPECT_EQ(offsets.scalar_type(), at::kInt);
  EXPECT_TRUE(offsets.equal(at::tensor({0, 3, 5, 6, 7, 10, 12}, at::kInt))) << offsets;
  // One document a row (every row starts a segment even when its id equals the last row's).
  EXPECT_TRUE(packed_segment_offsets(at::zeros({3, 4}, at::kLong)).equal(at::tensor({0, 4, 8, 12}, at::kInt)));
  // The longest segment sizes the flash kernel's grid: here the second row's 1, 1, 1 (3 tokens), not a row's 6.
  EXPECT_EQ(longest_segment(offsets), 3);
  EXPECT_EQ(longest_segment(at::tensor({0, 2, 9, 10}, at::kInt)), 7) << "the longest in the middle";
  EXPECT_EQ(longest_segment(at::tensor({0}, at::kInt)), 0);
  // What the flash node's attention over them costs (the step-time model's attention_square): 3² + 2² + 1² in the
  // first row, 1² + 3² + 2² in the second; one document a row, B·T².
  EXPECT_EQ(packed_attention_square(documents), 9 + 4 + 1 + 1 + 9 + 4);
  EXPECT_EQ(packed_attention_square(at::zeros({3, 4}, at::kLong)), 3 * 16);
  // The flash kernel's conditions, one predicate for full and packed rows (the memory and step-time models share
  // it): CUDA, half precision, head_dim a multiple of 8 up to 256.
  EXPECT_TRUE(flash_attention_takes(at::kCUDA, at::kBFloat16, 128));
  EXPECT_FALSE(flash_attention_takes(at::kCPU, at::kBFloat16, 128));
  EXPECT_FALSE(flash_attention_takes(at::kCUDA, at::kFloat, 128));
  EXPECT_FALSE(flash_attention_takes(at::kCUDA, at::kBFloat16, 512));
  EXPECT_FALSE(flash_attention_takes(at::kCUDA, at::kBFloat16, 132)) << "the kernel refuses heads not of 8s";
  // On a CPU (and wherever the flash kernel does not apply) packed rows keep the mask.
  const at::Tensor layout = packed_attention_layout(documents, at::kCPU, at::kBFloat16, 128);
  EXPECT_EQ(layout.scalar_type(), at::kBool);
  EXPECT_EQ(layout.sizes(), at::IntArrayRef({2, 1, 6, 6}));
}

// On CUDA with bf16, packed rows run each sample through the variable-length flash kernel: the hidden states and
// the input gradients of two samples in one row equal each sample's own run, to bf16's rounding.
TEST(Model, GpuPackedRowsRunPerSampleAndEqualTheirSequencesAlone) {
  QWEN3_GPU_TEST(at::hasCUDA());
  Qwen3Model m(tiny_config(false), at::kBFloat16, at::kCUDA, true);
  randomize(m, 31);
  const at::Tensor layout =
      packed_attention_layout(at::zeros({1, 12}, at::kLong), at::kCUDA, at::kBFloat16, tiny_config(false).head_dim);
#if TORCH_VERSION_MAJOR >= 2
  EXPECT_EQ(layout.scalar_type(), at::kInt) << "the flash path is not taken";
#endif
  const at::Tensor a = at::randint(0, 97, {1, 5}, at::kLong), b = at::randint(0, 97, {1, 7}, at::kLong);
  const PackedRows packed{at::cat({at::arange(5, at::kLong), at::arange(7, at::kLong)}).unsqueeze(0),
                          at::cat({at::zeros({5}, at::kLong), at::ones({7}, at::kLong)}).unsqueeze(0)};
  const at::Tensor x = m.embed(at::cat({a, b}, 1)).detach().requires_grad_(true);
  const at::Tensor together = m.hidden_states_from_embeddings(x, nullptr, &packed);
  together.to(at::kFloat).square().sum().backward();
  const at::Tensor xa = m.embed(a).detach().requires_grad_(true), xb = m.embed(b).detach().requires_grad_(true);
  const at::Tensor ha = m.hidden_states_from_embeddings(xa), hb = m.hidden_states_from_embeddings(xb);
  (ha.to(at::kFloat).square().sum() + hb.to(at::kFloat).square().sum()).backward();
  const auto relative = [](const at::Tensor& got, const at::Tensor& want) {
    return ((got.to(at::kFloat) - want.to(at::kFloat)).abs().max() / want.to(at::kFloat).abs().max()).item<double>();
  };
  const double hidden_error = relative(together, at::cat({ha, hb}, 1));
  const double grad_error = relative(x.grad(), at::cat({xa.grad(), xb.grad()}, 1));
  std::printf("packed rows on CUDA vs alone: hidden %.3g, input gradient %.3g (relative to the largest)\n",
              hidden_error, grad_error);
  EXPECT_LT(hidden_error, 3e-2);
  EXPECT_LT(grad_error, 3e-2);
}

// The straight-through linear, counting its products (forward and recomputed) and, where given a count, the
// nodes asked for without a product (apply_unread).
class CountingSteKernel final : public ProjectionKernel {
 public:
  explicit CountingSteKernel(int64_t* products, int64_t* unread = nullptr) : products_(products), unread_(unread) {}
  at::Tensor apply(const at::Tensor& x, const at::Tensor& weight) const override {
    ++*products_;
    return nvfp4::ste_linear(x, weight);
  }
  at::Tensor apply_unread(const at::Tensor& x, const at::Tensor& weight) const override {
    if (unread_ == nullptr) return apply(x, weight);
    ++*unread_;
    return nvfp4::ste_linear(x, weight, nvfp4::ScaleMode::rne, false, nvfp4::ProductOutput::unread);
  }

 private:
  int64_t* products_;
  int64_t* unread_;
};

// The embedding's gradient goes into the table's .grad(), added to what is there (a tied head's gradient), each
// token's rows summed: on the CPU in their order (index_add_); on a GPU with many repeats of few tokens, the same
// bytes every run (no atomics) and the sums within fp32 rounding of float64 ones.
void expect_embedding_gradient_sums_rows(const at::Device device) {
  at::manual_seed(41);
  const int64_t vocab = 16, hidden = 64;
  const at::Tensor ids = at::randint(0, vocab, {8, 512}, at::kLong).to(device);
  const at::Tensor grad_rows = at::randn({8, 512, hidden}).to(device);
  const at::Tensor before = at::randn({vocab, hidden}).to(device);
  std::vector<at::Tensor> runs;
  for (int run = 0; run < 3; ++run) {
    const at::Tensor table = at::randn({vocab, hidden}).to(device).requires_grad_(true);
    table.mutable_grad() = before.clone();
    train_detail::embedding_into_grad(table, ids).backward(grad_rows);
    runs.push_back(table.grad().clone());
  }
  for (int run = 1; run < 3; ++run) EXPECT_TRUE(runs[run].equal(runs[0])) << device << " run " << run;
  const at::Tensor want = before.to(at::kDouble).cpu().index_add(0, ids.reshape({-1}).cpu(),
                                                                  grad_rows.reshape({-1, hidden}).to(at::kDouble).cpu());
  EXPECT_LE((runs[0].cpu().to(at::kDouble) - want).abs().max().item<double>(), 1e-4 * want.abs().max().item<double>());
  if (!device.is_cuda()) {
    const at::Tensor exact = before.clone().index_add_(0, ids.reshape({-1}), grad_rows.reshape({-1, hidden}));
    EXPECT_TRUE(runs[0].equal(exact)) << "the CPU adds the rows in their order";
  }
}

TEST(BlockRunner, EmbeddingGradientSumsEachTokensRows) { expect_embedding_gradient_sums_rows(at::kCPU); }

TEST(BlockRunner, GpuEmbeddingGradientIsTheSameEveryRun) {
  QWEN3_GPU_TEST(at::hasCUDA());
  expect_embedding_gradient_sums_rows(at::Device(at::kCUDA, 0));
}

// A kernel that offers the shared-input node on any device (the trainer's offers it on CUDA), counting its calls.
class SharedInputCountingKernel final : public ProjectionKernel {
 public:
  SharedInputCountingKernel(int64_t* single, int64_t* shared) : single_(single), shared_(shared) {}
  at::Tensor apply(const at::Tensor& x, const at::Tensor& weight) const override {
    ++*single_;
    return nvfp4::ste_linear(x, weight);
  }
  bool offers_shared_input(const at::Tensor&) const override { return true; }
  std::vector<at::Tensor> apply_shared_input(const std::vector<const Projection*>& group,
                                             const at::Tensor& x) const override {
    ++*shared_;
    std::vector<at::Tensor> weights;
    for (const Projection* p : group) weights.push_back(p->weight);
    return nvfp4::ste_linear_shared_input(x, weights, std::vector<nvfp4::PersistentOperand*>(group.size(), nullptr));
  }

 private:
  int64_t *single_, *shared_;
};

// Where the kernels offer it, a block's q, k, v and its gate, up run as two shared-input nodes (o and down alone),
// with the logits of one product a projection; a group whose kernels are not all of one type runs one a projection.
TEST(Model, SharedInputProjectionsRunAsOneNodeWhereOffered) {
  Qwen3Model m(tiny_config(false), at::kFloat, at::kCPU, true);
  randomize(m, 23);
  const at::Tensor ids = at::randint(0, 97, {2, 9}, at::kLong);
  int64_t plain_products = 0;
  const auto plain = std::make_shared<const CountingSteKernel>(&plain_products);
  for (Projection* p : m.projections()) p->kernel = plain;
  const at::Tensor want = m.forward(ids);
  int64_t single = 0, shared = 0;
  const auto kernel = std::make_shared<const SharedInputCountingKernel>(&single, &shared);
  for (Projection* p : m.projections()) p->kernel = kernel;
  const at::Tensor got = m.forward(ids);
  const auto layers = static_cast<int64_t>(m.blocks.size());
  EXPECT_EQ(shared, 2 * layers);
  EXPECT_EQ(single, 2 * layers);
  EXPECT_TRUE(got.equal(want));
  single = shared = plain_products = 0;
  for (Qwen3Block& b : m.blocks) b.k_proj.kernel = plain;  // q, k, v no longer of one kernel type
  EXPECT_TRUE(m.forward(ids).equal(want));
  EXPECT_EQ(shared, layers);
  EXPECT_EQ(single, 4 * layers);
  EXPECT_EQ(plain_products, layers);
}

// The trainer's block runner with activation checkpointing gives the gradients of the model's own run, and
// really recomputes (the counts fail with recompute off), each block without its last product, whose output
// nothing reads (down_proj's node made without it: the counts fail where the recompute runs it); limited to the
// first block (--grad-checkpoint-blocks 1), that block alone.
TEST(BlockRunner, ActivationCheckpointingGivesIdenticalGradients) {
  at::Tensor grads[3][2];  // [checkpointing: none, all, the first block][frozen first block?] -> gradients
  for (int frozen = 0; frozen < 2; ++frozen) {
    for (int ckpt = 0; ckpt < 3; ++ckpt) {
      Qwen3Model m(tiny_config(false), at::kFloat, at::kCPU, true);
      randomize(m, 21);
      for (auto& [key, t] : m.named_weights()) t.requires_grad_(true);  // the model's weights are plain tensors
      int64_t products = 0, unread = 0;  // projections run, forward and recomputed; nodes without a product
      const auto kernel = std::make_shared<const CountingSteKernel>(&products, &unread);
      for (Projection* p : m.projections()) p->kernel = kernel;
      train_detail::TrainingBlockRunner runner(/*recompute=*/ckpt >= 1, /*recomputed_blocks=*/ckpt == 2 ? 1 : -1);
      m.set_block_runner(&runner);
      if (frozen) {
        m.embed_tokens.requires_grad_(false);
        for (const at::Tensor* t : m.blocks[0].tensors()) const_cast<at::Tensor*>(t)->requires_grad_(false);
      }
      const at::Tensor ids = at::randint(0, 97, {2, 9}, at::kLong);
      m.forward(ids).pow(2).mean().backward();
      // Checkpointing really recomputes: every block that has something to differentiate (a frozen first block
      // under a frozen embedding has not) runs six of its seven projections again in backward, and down_proj's
      // node without its product.
      const auto layers = static_cast<int64_t>(m.blocks.size());
      const int64_t recomputed = ckpt == 1 ? layers - frozen : ckpt == 2 ? 1 - frozen : 0;
      EXPECT_EQ(runner.recomputed_blocks(), recomputed) << "ckpt=" << ckpt << " frozen=" << frozen;
      EXPECT_EQ(products, 7 * layers + 6 * recomputed) << "ckpt=" << ckpt << " frozen=" << frozen;
      EXPECT_EQ(unread, recomputed) << "ckpt=" << ckpt << " frozen=" << frozen;
      std::vector<at::Tensor> flat;
      for (auto& [key, t] : m.named_weights())
        flat.push_back(t.grad().defined() ? t.grad().reshape({-1}) : at::zeros({0}));
      grads[ckpt][frozen] = at::cat(flat);
      m.set_block_runner(nullptr);
    }
    EXPECT_GT(grads[0][frozen].abs().sum().item<double>(), 0.0);
    EXPECT_TRUE(grads[1][frozen].equal(grads[0][frozen])) << "frozen=" << frozen;
    EXPECT_TRUE(grads[2][frozen].equal(grads[0][frozen])) << "frozen=" << frozen;
  }
}

}  // namespace
}  // namespace qwen3
