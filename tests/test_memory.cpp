// The one-step memory report and the memory design: the counting allocator counts, the memory model's
// prediction agrees with the measurement on CPU within 15% for several configurations, the report has the
// original's shape, and the optimizer-in-backward mode changes nothing but memory (and clipping).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "gpu_test.h"
#include "qwen3/checkpoint/checkpoint.h"
#include "qwen3/model/layout.h"
#include "qwen3/model/lm_loss.h"
#include "qwen3/model/model_loader.h"
#include "qwen3/trainer/memory_model.h"
#include "qwen3/trainer/step_prediction.h"
#include "qwen3/memory/memory_probe.h"
#include "qwen3/model/synth.h"
#include "qwen3/trainer/trainer.h"
#include "tiny_model_util.h"
#include "trainer/block_runner.h"
#include "trainer/train_setup.h"

namespace qwen3 {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// A phase's predicted peak (0 for a phase the plan lacks).
uint64_t phase_peak(const StepMemoryPlan& plan, const std::string& phase) {
  for (const PhaseMemory& p : plan.phases)
    if (p.phase == phase) return p.peak;
  return 0;
}

// Big enough that weights, moments, activations and temporaries all weigh something (a few MiB each), small
// enough for a one-second step; vocabulary of the tiny test tokenizer.
Qwen3Config report_config() {
  Qwen3Config c = test::trainable_tiny_config();
  c.hidden_size = 256;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.intermediate_size = 1024;
  return c;
}

SynthResult make_model(const test::TempDir& dir, const Qwen3Config& config, const std::string& name) {
  SynthOptions s;
  s.config = config;
  s.out_dir = dir.file(name);
  return write_synthetic_model(s);
}

std::string write_text(const test::TempDir& dir) {
  std::ofstream out(dir.file("text.txt"));
  const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "qwen"};
  for (int line = 0; line < 120; ++line) {
    for (int w = 0; w < 50; ++w) out << words[(line * 7 + w * 3) % 10] << ' ';
    out << '\n';
  }
  return dir.file("text.txt");
}

TrainOptions options_for(const SynthResult& m, const std::string& data) {
  TrainOptions o;
  o.weights = m.dat_path;
  o.config = m.config_path;
  o.tokenizer = test::tiny_tokenizer_path();
  o.data.path = data;
  o.data.format = DataFormat::text;
  o.data.pack = true;
  // Rows exactly seq_len wide, as the model counts them (it plans for full rows; best-fit rows of whole lines
  // can be shorter).
  o.data.pack_strategy = PackStrategy::stream;
  o.log_every = 0;
  o.schedule.lr = 1e-3;
  return o;
}

TEST(MemoryProbe, TheCountingAllocatorCountsCpuTensorsAndItsPeakResets) {
  MemoryProbe probe(c10::Device("cpu"));
  const uint64_t before = probe.read().allocated;
  {
    at::Tensor t = at::empty({1 << 20}, at::kFloat);  // 4 MiB
    const MemoryReading r = probe.read();
    EXPECT_EQ(r.allocated - before, 4u << 20);
    EXPECT_GE(r.peak, r.allocated);
    EXPECT_GT(r.rss, 0u);
    at::Tensor u = at::empty({1 << 18}, at::kDouble);  // 2 MiB more, then gone
  }
  const MemoryReading after = probe.read();
  EXPECT_EQ(after.allocated, before);
  EXPECT_GE(after.peak - before, 6u << 20) << "the peak remembers both tensors";
  probe.reset_peaks();
  EXPECT_EQ(probe.read().peak, before);
}

struct ReportCase {
  const char* name;
  const char* master;
  const char* moments;
  bool checkpoint, fused;
  int64_t last_layers = 0;
  const char* compute = "auto";
};

// One step of `c` on the model at seq 256 x 4 rows, its report written to `report`; the report read back.
nlohmann::json report_step(const SynthResult& m, const std::string& text, const ReportCase& c, const std::string& report) {
  TrainOptions o = options_for(m, text);
  o.steps = 1;
  o.data.seq_len = 256;
  o.data.batch_size = 4;
  o.master_dtype = parse_master_dtype(c.master);
  o.adamw.moments = moment_storage_from_name(c.moments);
  o.grad_checkpoint = c.checkpoint;
  o.fused_optimizer = c.fused;
  o.train_last_layers = c.last_layers;
  o.compute_dtype = parse_compute_dtype(c.compute);
  o.vram_report = report;
  run_training(o);
  return nlohmann::json::parse(test::slurp(report));
}

TEST(MemoryReport, PredictionMatchesTheMeasurementWithin15PercentOnCpu) {
  test::TempDir dir;
  const SynthResult m = make_model(dir, report_config(), "m");
  const std::string text = write_text(dir);
  const ReportCase cases[] = {{"plain fp32", "float32", "float32", false, false},
                              {"bf16 master, bf16 moments", "bfloat16", "bfloat16", false, false},
                              {"checkpointing", "float32", "nvfp4", true, false},
                              {"fused optimizer", "float32", "float32", false, true},
                              {"lean: bf16, int8, checkpointing, fused", "bfloat16", "int8", true, true},
                              {"last layer only (frozen blocks as codes)", "float32", "float32", false, false, 1},
                              {"fp32 master, bf16 compute", "float32", "float32", false, false, 0, "bfloat16"},
                              {"fp32 master, bf16 compute, checkpointing, fused", "float32", "int8", true, true, 0,
                               "bfloat16"}};
  for (const ReportCase& c : cases) {
    // bf16 compute is refused where this CPU's libtorch has no bf16 product.
    if (std::string(c.compute) == "bfloat16" && train_detail::cpu_bf16() == train_detail::CpuBf16::fails) continue;
    const nlohmann::json r = report_step(m, text, c, dir.file("report-" + std::to_string(&c - cases) + ".json"));
    ASSERT_EQ(r["Samples"].size(), step_phases().size()) << c.name;
    int compared = 0;
    for (size_t i = 0; i < step_phases().size(); ++i) {
      const auto& s = r["Samples"][i];
      EXPECT_EQ(s["Phase"], step_phases()[i]);
      const double measured = s["PeakMiB"].get<double>(), predicted = s["PredictedMiB"].get<double>();
      if (measured < 1.0) continue;  // "start": nothing allocated yet
      ++compared;
      EXPECT_NEAR(predicted, measured, 0.15 * measured) << c.name << ", phase " << s["Phase"];
    }
    EXPECT_EQ(compared, 6) << c.name;
  }
}

// A mixture-of-experts model: the report model's body with 16 experts of width 512, 4 a token (each token's MLP is
// twice the dense block's width), block 1 dense. The prediction counts a sparse block's MLP at k experts' width
// with the routing and the gathered rows; at the dense block's width (as before it knew experts) it was 9% under
// the measurement after forward and backward of the plain step, beyond this test's 5% (12% when checkpointed).
TEST(MemoryReport, MoePredictionMatchesTheMeasurementOnCpu) {
  test::TempDir dir;
  Qwen3Config config = report_config();
  config.num_experts = 16;
  config.num_experts_per_tok = 4;
  config.moe_intermediate_size = 512;
  config.norm_topk_prob = true;
  config.mlp_only_layers = {1};
  const SynthResult m = make_model(dir, config, "moe");
  const std::string text = write_text(dir);
  const ReportCase cases[] = {{"plain fp32", "float32", "float32", false, false},
                              {"checkpointing", "float32", "nvfp4", true, false},
                              {"fused optimizer", "float32", "float32", false, true}};
  for (const ReportCase& c : cases) {
    const nlohmann::json r = report_step(m, text, c, dir.file("moe-report-" + std::to_string(&c - cases) + ".json"));
    for (const auto& s : r["Samples"]) {
      const double measured = s["PeakMiB"].get<double>(), predicted = s["PredictedMiB"].get<double>();
      if (measured < 1.0) continue;
      // Checkpointed, the recompute's saved tensors are counted whole while a sparse block's backward frees them
      // expert by expert: over after backward by 8% with libtorch 1.13, 10.5% with PyTorch 2.x's CPU build.
      const double tolerance = c.checkpoint ? 0.12 : 0.05;
      EXPECT_NEAR(predicted, measured, tolerance * measured) << c.name << ", phase " << s["Phase"];
    }
  }
}

TEST(MemoryReport, HasTheOriginalShapeAndThisToolsFields) {
  test::TempDir dir;
  const SynthResult m = make_model(dir, test::trainable_tiny_config(), "m");
  TrainOptions o = options_for(m, write_text(dir));
  o.steps = 3;
  o.data.seq_len = 32;
  o.vram_report = dir.file("report.json");
  run_training(o);
  const nlohmann::json r = nlohmann::json::parse(test::slurp(o.vram_report));
  EXPECT_GT(r["Pid"].get<int64_t>(), 0);
  EXPECT_EQ(r["CreatedUtc"].get<std::string>().size(), std::string("2026-02-26T00:46:03.3073970Z").size());
  EXPECT_EQ(r["Device"], "cpu");
  EXPECT_EQ(r["Config"]["seq_len"], 32);
  EXPECT_EQ(r["Config"]["fused_optimizer"], false);
  EXPECT_EQ(r["Samples"].size(), step_phases().size()) << "the first step only";
  for (const auto& s : r["Samples"])
    for (const char* field : {"TimestampUtc", "Phase", "DurationMs", "AllocatedMiB", "ReservedMiB", "PeakMiB",
                              "RssMiB", "RssPeakMiB", "PredictedMiB", "PidMemoryMiB", "TotalMemoryMiB"})
      EXPECT_TRUE(s.contains(field)) << field;
  EXPECT_TRUE(r["Samples"][0]["ReservedMiB"].is_null()) << "no caching allocator on CPU";
  EXPECT_GT(r["Predicted"]["MomentsMiB"].get<double>(), 0);
  // The compute floor the step is held against (its products alone) is part of the predicted step.
  double predicted = 0;
  for (const auto& s : r["Samples"]) predicted += s["PredictedMs"].is_null() ? 0.0 : s["PredictedMs"].get<double>();
  EXPECT_GT(r["PredictedFloorMs"].get<double>(), 0) << predicted;
  EXPECT_LT(r["PredictedFloorMs"].get<double>(), predicted);
  // A CPU run draws on one memory with everything else (as on GB10): its one number is the RSS peak, against
  // the machine's MemTotal.
  double most = 0;
  for (const auto& s : r["Samples"]) {
    EXPECT_GE(s["PoolPeakMiB"].get<double>(), s["RssPeakMiB"].get<double>()) << s["Phase"];
    most = std::max(most, s["PoolPeakMiB"].get<double>());
  }
  EXPECT_EQ(r["PoolPeakMiB"].get<double>(), most);
  EXPECT_GT(r["PoolTotalMiB"].get<double>(), most);
}

// Packed rows: the report's time prediction counts attention as the flash node runs it, each sample of the
// first batch alone (what a GPU's rates assume, --predict-device h100; a CPU runs the masked rows whole), and
// says over what. Short lines, so that every row holds several samples.
TEST(MemoryReport, PackedRowsPredictAttentionOfTheFirstBatchsSamples) {
  test::TempDir dir;
  const SynthResult m = make_model(dir, test::trainable_tiny_config(), "m");
  {
    std::ofstream out(dir.file("short.txt"));
    for (int line = 0; line < 40; ++line) out << (line % 3 == 0 ? "hello qwen\n" : "the quick brown fox\n");
  }
  TrainOptions o = options_for(m, dir.file("short.txt"));
  o.steps = 1;
  o.data.seq_len = 32;
  o.data.batch_size = 2;
  o.predict_device = "h100";
  o.vram_report = dir.file("report.json");
  run_training(o);
  const nlohmann::json r = nlohmann::json::parse(test::slurp(o.vram_report));
  const Tokenizer tok = Tokenizer::from_file(test::tiny_tokenizer_path());
  const Batch first = TrainingData(tok, o.data).batch(0, 0);
  ASSERT_TRUE(first.document_ids.defined());
  const double samples = packed_attention_square(first.document_ids);
  EXPECT_EQ(r["PredictedWholeRowsSquare"].get<double>(), 2 * 32 * 32);
  EXPECT_EQ(r["PredictedAttentionSquare"].get<double>(), samples);
  EXPECT_LT(samples, 2 * 32 * 32 / 2) << "rows of several samples";
}

// The master weights of the newest checkpoint in `dir`, by name.
std::map<std::string, at::Tensor> master_weights(const std::string& dir) {
  std::map<std::string, at::Tensor> out;
  for (auto& [name, t] : load_checkpoint(*latest_checkpoint(dir), kMasterWeightPrefix).tensors) out[name] = t;
  return out;
}

// A few steps of the tiny model that end in a checkpoint in `dir/name`.
TrainOptions short_run(const SynthResult& m, const std::string& text, const test::TempDir& dir,
                       const std::string& name, int64_t steps = 3) {
  TrainOptions o = options_for(m, text);
  o.steps = steps;
  o.data.seq_len = 32;
  o.data.batch_size = 2;
  o.checkpoint_dir = dir.file(name);
  return o;
}

void expect_same_weights(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b,
                         const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [name, t] : a) EXPECT_TRUE(at::equal(t, b.at(name))) << name << ", " << what;
}

TEST(FusedOptimizer, WithoutClippingGivesTheBytesOfTheOrdinaryStep) {
  test::TempDir dir;
  const SynthResult m = make_model(dir, test::trainable_tiny_config(), "m");
  const std::string text = write_text(dir);
  for (bool checkpoint : {false, true}) {
    std::map<std::string, at::Tensor> weights[2];
    for (int fused = 0; fused < 2; ++fused) {
      TrainOptions o = short_run(m, text, dir, "ckpt-" + std::to_string(checkpoint) + std::to_string(fused));
      o.grad_clip = 0;
      o.master_dtype = MasterDtype::bfloat16;
      o.adamw.moments = MomentStorage::int8;
      o.grad_checkpoint = checkpoint;
      o.fused_optimizer = fused == 1;
      run_training(o);
      weights[fused] = master_weights(o.checkpoint_dir);
    }
    expect_same_weights(weights[0], weights[1], "checkpointing " + std::to_string(checkpoint));
  }
}

// The live tensor MiB the memory report measured at `phase` of one step of `m` on `rows` x 64 tokens: [0] the
// ordinary step, [1] with the optimizer in backward.
std::array<double, 2> live_mib_ordinary_and_fused(const SynthResult& m, const std::string& text,
                                                  const test::TempDir& dir, const std::string& phase, int64_t rows) {
  std::array<double, 2> live{-1, -1};
  for (int fused = 0; fused < 2; ++fused) {
    TrainOptions o = options_for(m, text);
    o.steps = 1;
    o.data.seq_len = 64;
    o.data.batch_size = rows;
    o.fused_optimizer = fused == 1;
    o.vram_report = dir.file(phase + "-" + std::to_string(fused) + ".json");
    run_training(o);
    const nlohmann::json report = nlohmann::json::parse(test::slurp(o.vram_report));
    for (const auto& sample : report["Samples"])
      if (sample["Phase"] == phase) live[fused] = sample["AllocatedMiB"].get<double>();
  }
  return live;
}

// Equal bytes alone would also pass if the flag did nothing: the blocks' gradients must be gone by the end of
// backward, as the report's live tensor bytes show.
TEST(FusedOptimizer, NoBlockGradientIsAliveAfterBackward) {
  test::TempDir dir;
  const Qwen3Config config = report_config();
  const SynthResult m = make_model(dir, config, "m");
  const std::array<double, 2> live = live_mib_ordinary_and_fused(m, write_text(dir), dir, "backward_done", 1);
  double block_grad_mib = 0;
  for (const auto& spec : qwen3_tensors(config.shape(), /*with_lm_head=*/false))
    if (spec.key.rfind("model.layers.", 0) == 0) {
      double n = 1;
      for (int64_t d : spec.shape) n *= static_cast<double>(d);
      block_grad_mib += n * 4 / kMiB;
    }
  EXPECT_NEAR(live[0] - live[1], block_grad_mib, 0.2) << "fp32 block gradients";
}

// The in-backward update runs each block as a node of its own that keeps the block's graph; the tensor it hands
// the next block is the block's output itself (a second handle on it), not a copy: after forward the live bytes
// are those of the ordinary step's graph. A copy a block was a·N·H bytes more each (0.35 GiB for Qwen3-4B at
// 2048 tokens).
TEST(FusedOptimizer, BlockOutputsAreHandedOnWithoutACopy) {
  test::TempDir dir;
  const Qwen3Config config = report_config();
  const SynthResult m = make_model(dir, config, "m");
  const int64_t rows = 4;
  const std::array<double, 2> live = live_mib_ordinary_and_fused(m, write_text(dir), dir, "forward_done", rows);
  const double block_output_mib = static_cast<double>(rows * 64 * config.hidden_size) * 4 / kMiB;  // fp32 compute
  std::printf("live after forward: ordinary %.2f MiB, in-backward update %.2f MiB (a block's output %.2f MiB)\n",
              live[0], live[1], block_output_mib);
  EXPECT_GE(live[0], 0.0) << "no forward_done sample";
  EXPECT_LT(std::abs(live[1] - live[0]), 0.5 * block_output_mib);
}

TEST(FusedOptimizer, ClipsEachBlockToItsShareAndResumesExactly) {
  test::TempDir dir;
  const SynthResult m = make_model(dir, test::trainable_tiny_config(), "m");
  const std::string text = write_text(dir);
  auto run = [&](const std::string& name, int64_t steps, bool resume, double clip) {
    TrainOptions o = short_run(m, text, dir, name, steps);
    o.grad_clip = clip;
    o.fused_optimizer = true;
    o.grad_checkpoint = true;
    o.resume = resume;
    run_training(o);
    return master_weights(o.checkpoint_dir);
  };
  const auto straight = run("straight", 4, false, 1e-3);
  run("resumed", 2, false, 1e-3);
  const auto resumed = run("resumed", 4, true, 1e-3);
  expect_same_weights(straight, resumed, "2 + 2 resumed steps against 4");
  // A limit far below the gradient's norm changes the result; one far above it does not.
  const auto unclipped = run("unclipped", 4, false, 0);
  const auto huge_limit = run("huge", 4, false, 1e9);
  bool any_differs = false;
  for (const auto& [name, t] : straight) {
    any_differs = any_differs || !at::equal(t, unclipped.at(name));
    EXPECT_TRUE(at::equal(unclipped.at(name), huge_limit.at(name))) << name;
  }
  EXPECT_TRUE(any_differs) << "clipping to 1e-3 must change the updates";
}

TEST(FrozenProjections, HeldAsCodesTrainLikeTheDenseCopies) {
  test::TempDir dir;
  const SynthResult m = make_model(dir, test::trainable_tiny_config(), "m");
  const std::string text = write_text(dir);
  std::map<std::string, at::Tensor> weights[2];
  for (int codes = 0; codes < 2; ++codes) {
    TrainOptions o = short_run(m, text, dir, "ckpt-" + std::to_string(codes));
    o.train_last_layers = 1;
    o.frozen_projections_as_codes = codes == 1;
    const TrainSummary s = run_training(o);
    // The codes path is really taken: the frozen block's seven projections, every forward.
    if (codes)
      EXPECT_EQ(s.frozen_code_products, 7 * s.steps_done);
    else
      EXPECT_EQ(s.frozen_code_products, 0);
    weights[codes] = master_weights(o.checkpoint_dir);
  }
  expect_same_weights(weights[0], weights[1], "frozen projections as codes");
}

TEST(InPlaceGradients, EmbeddingAndTiedHeadGradientsEqualAutogradsAccumulation) {
  test::TempDir dir;
  const SynthResult m = make_model(dir, test::trainable_tiny_config(/*tied=*/true), "m");
  const Qwen3Config config = load_config(m.config_path);
  DatReader reader(m.dat_path);
  at::Tensor grads[2];
  const at::Tensor ids = at::randint(0, config.vocab_size, {2, 12}, at::kLong);
  const at::Tensor targets = at::randint(0, config.vocab_size, {24}, at::kLong);
  for (int in_place = 0; in_place < 2; ++in_place) {
    auto model = load_model(reader, config, at::kFloat, c10::Device("cpu"), /*tie_head=*/true);
    model->embed_tokens.requires_grad_(true);
    const at::Tensor embeddings =
        in_place == 1 ? train_detail::embedding_into_grad(model->embed_tokens, ids) : model->embed(ids);
    const at::Tensor hidden = model->hidden_states_from_embeddings(embeddings);
    linear_cross_entropy(hidden.reshape({24, -1}), model->head_weight(), targets, int64_t{1} << 24, in_place == 1)
        .backward();
    grads[in_place] = model->embed_tokens.grad().clone();
  }
  EXPECT_TRUE(at::allclose(grads[0], grads[1], 1e-5, 1e-7));
  EXPECT_GT(grads[1].abs().sum().item<double>(), 0.0);
}

// The CUDA side of the model against the first GPU round's measurement (H200, 2026-11-26, docs/memory.md
// "Measured: Qwen3-4B on one H200"): Qwen3-4B at 2048 tokens, packed text rows, the peak allocated tensor MiB of
// each phase of the first step. The model had counted the activations libtorch's CPU ops keep (7% high here);
// it now counts what the fused CUDA kernels save. The fast step's forward and backward figures are that
// measurement less the copy of each block's output the in-backward update's runner held then (a·N·H a block, 360
// MiB; the runner hands the output on without one since: FusedOptimizer.BlockOutputsAreHandedOnWithoutACopy).
TEST(MemoryModel, CudaPredictionMatchesTheFirstGpuRound) {
  const Qwen3Config config = preset_config("qwen3-4b");
  const c10::Device cuda(c10::kCUDA, 0);
  struct Measured {
    const char* name;
    bool lean;
    double forward, backward, optimizer;  // MiB
    double tolerance;
  };
  const double block_output_copies =  // a block's bf16 output, [2048, hidden], each block
      static_cast<double>(config.num_hidden_layers) * 2048 * static_cast<double>(config.hidden_size) * 2 / kMiB;
  for (const Measured& m : {Measured{"fast", false, 56615.4 - block_output_copies, 58377.5 - block_output_copies,
                                     47954.3, 0.01},
                            Measured{"lean", true, 12712.8, 13799.3, 12930.8, 0.02}}) {
    TrainOptions o;
    o.data.seq_len = 2048;
    o.data.batch_size = 1;
    o.fused_optimizer = true;
    // As that round ran: the fast step kept its codes (auto now keeps the operands where the device holds them);
    // lean within its tolerance with each block's recompute making its operands (auto now holds the first
    // forward's through the recompute where the device holds them: 7 GB more for the run).
    o.keep_weight_operands = m.lean ? KeepWeightOperands::recompute : KeepWeightOperands::off;
    if (m.lean) {
      o.master_dtype = MasterDtype::bfloat16;
      o.adamw.moments = MomentStorage::nvfp4;
      o.grad_checkpoint = true;
    }
    const StepMemoryPlan plan = predict(o, config, cuda).memory;
    const auto peak = [&](const std::string& phase) { return static_cast<double>(phase_peak(plan, phase)) / kMiB; };
    EXPECT_NEAR(peak("forward_done"), m.forward, m.tolerance * m.forward) << m.name;
    EXPECT_NEAR(peak("backward_done"), m.backward, m.tolerance * m.backward) << m.name;
    EXPECT_NEAR(peak("optimizer_step_done"), m.optimizer, m.tolerance * m.optimizer) << m.name;
  }
}

// --overlap-update: a block's gradients (and its update's temporaries) stay alive through the next block's
// backward, which runs beside its update; nothing else moves. Qwen3-4B's blocks are alike: the backward peak rises
// by those gradients less the first block's saved activations, which are freed before the second block's spike
// (so more than nothing and less than the gradients and temporaries); forward and the optimizer step do not move.
TEST(MemoryModel, OverlappedUpdatesKeepOneBlocksGradientsThroughTheNext) {
  const Qwen3Config config = preset_config("qwen3-4b");
  const c10::Device cuda(c10::kCUDA, 0);
  TrainOptions o;
  o.data.seq_len = 2048;
  o.fused_optimizer = true;
  o.keep_weight_operands = KeepWeightOperands::off;  // the saved activations this test's bounds count
  const StepMemoryPlan inline_plan = predict(o, config, cuda).memory;
  o.overlap_update = true;
  const StepMemoryPlan overlap_plan = predict(o, config, cuda).memory;
  // A block's trained parameters (fp32 gradients: 4 bytes each): its seven projections and two norms.
  const uint64_t H = 2560, I = 9728, Q = 32 * 128, KV = 8 * 128;
  const uint64_t block_grads = 4 * (H * Q + 2 * H * KV + Q * H + 3 * H * I + 2 * H + 2 * 128);
  const uint64_t rise = phase_peak(overlap_plan, "backward_done") - phase_peak(inline_plan, "backward_done");
  EXPECT_GT(rise, block_grads / 4);
  EXPECT_LE(rise, 2 * block_grads);
  EXPECT_EQ(phase_peak(overlap_plan, "forward_done"), phase_peak(inline_plan, "forward_done"));
  EXPECT_EQ(phase_peak(overlap_plan, "optimizer_step_done"), phase_peak(inline_plan, "optimizer_step_done"));
  // On the CPU there is no stream to run beside: the same plan.
  const c10::Device cpu(c10::kCPU);
  o.overlap_update = false;
  const uint64_t cpu_inline = predict(o, config, cpu).memory.peak();
  o.overlap_update = true;
  EXPECT_EQ(predict(o, config, cpu).memory.peak(), cpu_inline);
}

// --keep-weight-operands on CUDA at training shapes: each trained projection holds its bf16 operand (2 bytes an
// element) from forward to its backward where it held its codes (9/16): Qwen3-4B's fast step, fused, at 2048 tokens
// (its peak in backward, where every block's saved tensors are alive) rises by exactly that difference over the
// block projections; the optimizer step, after backward, does not move. On a CPU nothing is kept.
TEST(MemoryModel, KeptWeightOperandsHoldTwoBytesAnElementUntilBackward) {
  const Qwen3Config config = preset_config("qwen3-4b");
  const c10::Device cuda(c10::kCUDA, 0);
  TrainOptions o;
  o.data.seq_len = 2048;
  o.fused_optimizer = true;
  o.keep_weight_operands = KeepWeightOperands::off;
  const StepMemoryPlan codes = predict(o, config, cuda).memory;
  o.keep_weight_operands = KeepWeightOperands::backward;
  const StepMemoryPlan kept = predict(o, config, cuda).memory;
  const uint64_t H = 2560, I = 9728, Q = 32 * 128, KV = 8 * 128;
  const uint64_t projections = 36 * (H * Q + 2 * H * KV + Q * H + 3 * H * I);
  EXPECT_EQ(kept.saved_operands, 2 * projections);
  EXPECT_EQ(kept.saved_codes, 0u);
  EXPECT_EQ(codes.saved_codes, projections * 9 / 16);
  EXPECT_EQ(codes.saved_operands, 0u);
  EXPECT_EQ(phase_peak(kept, "forward_done") - phase_peak(codes, "forward_done"), 2 * projections - projections * 9 / 16);
  EXPECT_EQ(phase_peak(kept, "backward_done") - phase_peak(codes, "backward_done"), 2 * projections - projections * 9 / 16);
  EXPECT_EQ(phase_peak(kept, "optimizer_step_done"), phase_peak(codes, "optimizer_step_done"));
  // Kept across steps (always): the operands are held the whole run, counted in the weights, and nothing more is
  // saved for backward than with them kept until backward less the operands themselves.
  o.keep_weight_operands = KeepWeightOperands::always;
  const StepMemoryPlan persistent = predict(o, config, cuda).memory;
  EXPECT_EQ(persistent.weights, codes.weights + 2 * projections);
  EXPECT_EQ(persistent.saved_operands, 0u);
  EXPECT_EQ(persistent.saved_codes, 0u);
  EXPECT_EQ(phase_peak(persistent, "backward_done"), phase_peak(kept, "backward_done"));
  EXPECT_EQ(phase_peak(persistent, "optimizer_step_done"), phase_peak(codes, "optimizer_step_done") + 2 * projections);
  o.keep_weight_operands = KeepWeightOperands::backward;
  // Below the one-pass shapes (the NVFP4 kernel reads the codes) and on a CPU: nothing to keep.
  o.data.seq_len = 8;
  EXPECT_EQ(predict(o, config, cuda).memory.saved_operands, 0u);
  o.data.seq_len = 2048;
  EXPECT_EQ(predict(o, config, c10::Device(c10::kCPU)).memory.saved_operands, 0u);
}

// A memory-first step at 2048 tokens: bf16 masters, compressed moments, checkpointed, updated in backward.
TrainOptions lean_options(MomentStorage moments) {
  TrainOptions o;
  o.data.seq_len = 2048;
  o.master_dtype = MasterDtype::bfloat16;
  o.adamw.moments = moments;
  o.grad_checkpoint = true;
  o.fused_optimizer = true;
  return o;
}

// A sparse block's experts on CUDA run as grouped products, which save their codes whatever --keep-weight-operands
// says: under checkpointing Qwen3-30B-A3B's backward spike holds the other projections' operands made by the
// recompute (2 bytes an element where their codes took 9/16) and the experts' codes either way; held from the first
// forward through the recompute (backward), every block's other projections have a buffer for the run, and the
// experts none.
TEST(MemoryModel, GroupedExpertsKeepTheirCodes) {
  const Qwen3Config config = preset_config("qwen3-30b-a3b");
  const c10::Device cuda(c10::kCUDA, 0);
  uint64_t others = 0;  // one block's trained projections outside the experts
  for (const auto& spec : qwen3_tensors(config.shape(), !config.tie_word_embeddings))
    if (spec.quantizable && spec.key.rfind("model.layers.0.", 0) == 0 &&
        spec.key.find(".mlp.experts.") == std::string::npos) {
      uint64_t n = 1;
      for (int64_t d : spec.shape) n *= static_cast<uint64_t>(d);
      others += n;
    }
  TrainOptions o = lean_options(MomentStorage::nvfp4);
  o.keep_weight_operands = KeepWeightOperands::off;
  const StepMemoryPlan codes = predict(o, config, cuda).memory;
  o.keep_weight_operands = KeepWeightOperands::recompute;
  const StepMemoryPlan kept = predict(o, config, cuda).memory;
  EXPECT_EQ(phase_peak(kept, "backward_done") - phase_peak(codes, "backward_done"), 2 * others - others * 9 / 16);
  o.keep_weight_operands = KeepWeightOperands::backward;
  const StepMemoryPlan held = predict(o, config, cuda).memory;
  EXPECT_EQ(held.weights, codes.weights + 2 * others * static_cast<uint64_t>(config.num_hidden_layers));
  EXPECT_EQ(held.saved_operands, 0u);
}

// Under --grad-checkpoint, backward holds the operand the first forward makes through the recompute to backward: a
// buffer each trained projection for the run (counted with the weights: 2 bytes an element), where recompute holds
// one block's at its backward. Qwen3-4B's lean step at 2048 tokens: the weights rise by the projections' operands;
// the backward peak by them less the one block's that recompute held.
TEST(MemoryModel, OperandsHeldThroughTheRecomputeTakeABufferForTheRun) {
  const Qwen3Config config = preset_config("qwen3-4b");
  const c10::Device cuda(c10::kCUDA, 0);
  TrainOptions o = lean_options(MomentStorage::int8);
  o.keep_weight_operands = KeepWeightOperands::recompute;
  const StepMemoryPlan recompute = predict(o, config, cuda).memory;
  o.keep_weight_operands = KeepWeightOperands::backward;
  const StepMemoryPlan held = predict(o, config, cuda).memory;
  const uint64_t H = 2560, I = 9728, Q = 32 * 128, KV = 8 * 128;
  const uint64_t block = H * Q + 2 * H * KV + Q * H + 3 * H * I;
  EXPECT_EQ(held.weights, recompute.weights + 2 * 36 * block);
  EXPECT_EQ(held.saved_operands, 0u);
  EXPECT_EQ(phase_peak(held, "backward_done") - phase_peak(recompute, "backward_done"), 2 * 36 * block - 2 * block);
  EXPECT_EQ(phase_peak(held, "forward_done") - phase_peak(recompute, "forward_done"), 2 * 36 * block);
}

// auto holds the operands across steps, written by the update (always), where every update is bound by its bytes
// with the operand and without it and the step-time model predicts the step faster: a GB10 (273 GB/s), the fast
// and the lean Qwen3-4B step; not an H100 or an H200, whose operand-writing updates are bound by their kernels'
// rates; nor with data parallel or for a mixture-of-experts model (always's own conditions).
TEST(MemoryModel, AutoKeepsOperandsAcrossStepsWhereTheUpdateIsBoundByItsBytes) {
  const Qwen3Config config = preset_config("qwen3-4b");
  const c10::Device cuda(c10::kCUDA, 0);
  TrainOptions o;
  o.data.seq_len = 2048;
  o.fused_optimizer = true;
  for (const bool lean : {false, true}) {
    o.master_dtype = lean ? MasterDtype::bfloat16 : MasterDtype::float32;
    o.adamw.moments = lean ? MomentStorage::int8 : MomentStorage::float32;
    o.grad_checkpoint = lean;
    o.predict_world_size = 1;
    o.predict_device = "gb10";
    const WeightOperandsChoice across = choose_weight_operands(o, config, cuda);
    EXPECT_TRUE(across.written_by_update()) << across.why;
    EXPECT_NE(across.why.find("bound by its bytes on gb10"), std::string::npos) << across.why;
    TrainOptions made = o;
    made.keep_weight_operands = KeepWeightOperands::backward;
    EXPECT_LT(predict(o, config, cuda).time.total_ms(), predict(made, config, cuda).time.total_ms()) << lean;
    TrainOptions decided = o;
    decided.keep_weight_operands = across.decided;
    EXPECT_TRUE(updates_bound_by_bytes(predict(o, config, cuda).time, decided, device_rates("gb10")));
    for (const char* device : {"h100", "h200"}) {
      o.predict_device = device;
      const WeightOperandsChoice made_by_forward = choose_weight_operands(o, config, cuda);
      EXPECT_FALSE(made_by_forward.written_by_update()) << device << ": " << made_by_forward.why;
      TrainOptions always = o;
      always.keep_weight_operands = KeepWeightOperands::always;
      EXPECT_FALSE(updates_bound_by_bytes(predict(always, config, cuda).time, always, device_rates(device)))
          << device << (lean ? " lean" : " fast");
    }
    o.predict_device = "gb10";
    o.predict_world_size = 2;
    EXPECT_FALSE(choose_weight_operands(o, config, cuda).written_by_update()) << "data parallel";
  }
  TrainOptions moe = o;
  moe.predict_world_size = 1;
  EXPECT_FALSE(choose_weight_operands(moe, preset_config("qwen3-30b-a3b"), cuda).written_by_update());
}

// auto decides by the memory model against the device: on CUDA the operands held from the forward that makes them
// where the peak with them stays within 90% of the device's memory (an H100's 80 GB holds the fast Qwen3-4B step at
// 2048 tokens with them, not four such rows), else codes, or under --grad-checkpoint each block's recompute's
// (the checkpointed step of fp32 masters without the in-backward update fits an H200 with every operand held
// through the recompute, not an H100); codes on a CPU. The other values are taken as given. predict() counts what
// the choice decides.
TEST(MemoryModel, AutoKeepsWeightOperandsWhereTheStepStillFits) {
  const Qwen3Config config = preset_config("qwen3-4b");
  const c10::Device cuda(c10::kCUDA, 0), cpu(c10::kCPU);
  TrainOptions o;
  o.data.seq_len = 2048;
  o.fused_optimizer = true;
  o.predict_device = "h100";
  const WeightOperandsChoice fits = choose_weight_operands(o, config, cuda);
  EXPECT_TRUE(fits.keep()) << fits.why;
  EXPECT_NE(fits.why.find("within 90%"), std::string::npos) << fits.why;
  EXPECT_GT(predict(o, config, cuda).memory.saved_operands, 0u);
  o.data.batch_size = 4;
  const WeightOperandsChoice too_big = choose_weight_operands(o, config, cuda);
  EXPECT_FALSE(too_big.keep()) << too_big.why;
  EXPECT_NE(too_big.why.find("above 90%"), std::string::npos) << too_big.why;
  EXPECT_EQ(predict(o, config, cuda).memory.saved_operands, 0u);
  TrainOptions kept_anyway = o;
  kept_anyway.keep_weight_operands = KeepWeightOperands::backward;
  EXPECT_TRUE(choose_weight_operands(kept_anyway, config, cuda).keep());
  o.predict_device = "h200";  // 141 GB: four rows fit
  EXPECT_TRUE(choose_weight_operands(o, config, cuda).keep());
  o.grad_checkpoint = true;
  o.predict_device = "h100";
  o.data.batch_size = 1;
  const WeightOperandsChoice held = choose_weight_operands(o, config, cuda);
  EXPECT_TRUE(held.keep() && held.persistent() && !held.written_by_update()) << held.why;
  EXPECT_NE(held.why.find("through the recompute"), std::string::npos) << held.why;
  EXPECT_EQ(held.decided, KeepWeightOperands::backward);
  o.fused_optimizer = false;  // every fp32 gradient alive before the update: the operands no longer fit an H100
  const WeightOperandsChoice recomputed = choose_weight_operands(o, config, cuda);
  EXPECT_TRUE(recomputed.keep() && !recomputed.persistent()) << recomputed.why;
  EXPECT_NE(recomputed.why.find("each block's recompute"), std::string::npos) << recomputed.why;
  EXPECT_NE(recomputed.why.find("above 90%"), std::string::npos) << recomputed.why;
  EXPECT_EQ(recomputed.decided, KeepWeightOperands::recompute);
  EXPECT_TRUE(recomputed.warning.empty()) << recomputed.warning;
  // Asked for where auto would not hold them: held, with a warning for the log.
  TrainOptions asked = o;
  asked.keep_weight_operands = KeepWeightOperands::backward;
  const WeightOperandsChoice held_anyway = choose_weight_operands(asked, config, cuda);
  EXPECT_TRUE(held_anyway.persistent()) << held_anyway.why;
  EXPECT_NE(held_anyway.warning.find("--keep-weight-operands backward: the memory model's peak"), std::string::npos)
      << held_anyway.warning;
  EXPECT_NE(held_anyway.warning.find("above 90%"), std::string::npos) << held_anyway.warning;
  EXPECT_TRUE(held.warning.empty()) << held.warning;
  TrainOptions codes = o;
  codes.keep_weight_operands = KeepWeightOperands::off;
  EXPECT_EQ(predict(o, config, cuda).memory.weights, predict(codes, config, cuda).memory.weights);
  o.predict_device = "h200";
  EXPECT_TRUE(choose_weight_operands(o, config, cuda).persistent());
  o.predict_device = "h100";
  o.fused_optimizer = true;
  o.data.batch_size = 4;
  const uint64_t checkpointed_kept = phase_peak(predict(o, config, cuda).memory, "backward_done");
  o.keep_weight_operands = KeepWeightOperands::off;
  EXPECT_FALSE(choose_weight_operands(o, config, cuda).keep());
  // Checkpointed, a block's operands (2 bytes an element) against its codes (9/16) at the backward spike.
  EXPECT_LT(phase_peak(predict(o, config, cuda).memory, "backward_done"), checkpointed_kept);
  o.keep_weight_operands = KeepWeightOperands::auto_select;
  o.grad_checkpoint = false;
  o.data.batch_size = 1;
  EXPECT_FALSE(choose_weight_operands(o, config, cpu).keep());
  // No operand is made to keep with fp32 compute or below 17 tokens (the NVFP4 kernel reads the codes), whatever
  // the flag says.
  o.keep_weight_operands = KeepWeightOperands::backward;
  o.data.seq_len = 16;
  EXPECT_FALSE(choose_weight_operands(o, config, cuda).keep());
  o.data.seq_len = 2048;
  o.compute_dtype = ComputeDtype::float32;
  EXPECT_FALSE(choose_weight_operands(o, config, cuda).keep());
  o.compute_dtype = ComputeDtype::bfloat16;
  EXPECT_TRUE(choose_weight_operands(o, config, cuda).keep());
  EXPECT_FALSE(choose_weight_operands(o, config, cuda).persistent());
  // Across steps only when asked: auto never chooses it before the GPU round has measured it.
  o.keep_weight_operands = KeepWeightOperands::always;
  const WeightOperandsChoice always = choose_weight_operands(o, config, cuda);
  EXPECT_TRUE(always.keep() && always.persistent()) << always.why;
}

// --grad-checkpoint-blocks: the first N blocks recomputed, the others keeping their activations (and, with the
// operands held through the recompute, a buffer for the recomputed blocks' operands only). The peak falls as N
// grows, from the step without checkpointing (N = 0) to the fully checkpointed one (all). auto takes the fewest
// whose step fits 90% of the device: none for Qwen3-4B's fast step at 2048 × 1 on an H100 (nor at 2048 × 2, whose
// operands then stay codes: with no block recomputed, auto does not fall back to the recompute's operands), some but
// not all at 2048 × 4 (the fewest: one fewer does not fit), and all where even that does not fit (48 rows); a CPU's limit is
// the machine's memory. Explicit counts and all are taken as given; without --grad-checkpoint nothing is recomputed.
TEST(MemoryModel, CheckpointedBlocksAreTheFewestWhoseStepFits) {
  const Qwen3Config config = preset_config("qwen3-4b");
  const int64_t layers = config.num_hidden_layers;
  const c10::Device cuda(c10::kCUDA, 0);
  TrainOptions o;
  o.data.seq_len = 2048;
  o.fused_optimizer = true;
  o.predict_device = "h100";
  const auto peak = [&](const TrainOptions& t) { return predict(t, config, cuda).memory.peak(); };
  const uint64_t none = peak(o);
  o.grad_checkpoint = true;
  const uint64_t all = peak(o);
  uint64_t previous = none;
  for (const int64_t k : {int64_t{0}, int64_t{9}, int64_t{18}, int64_t{27}, layers}) {
    o.grad_checkpoint_blocks = k;
    const CheckpointBlocksChoice c = choose_checkpoint_blocks(o, config, cuda);
    EXPECT_EQ(c.decided, k) << c.why;
    const uint64_t p = peak(o);
    if (k == 0) {
      EXPECT_EQ(p, none);
    }
    if (k == layers) {
      EXPECT_EQ(p, all);
    }
    EXPECT_LE(p, previous) << k;
    if (k > 0 && k < layers) {
      EXPECT_LT(p, previous) << k;
    }
    previous = p;
  }
  o.grad_checkpoint_blocks = TrainOptions::kCheckpointAllBlocks;
  EXPECT_EQ(choose_checkpoint_blocks(o, config, cuda).decided, TrainOptions::kCheckpointAllBlocks);
  o.grad_checkpoint_blocks = TrainOptions::kCheckpointBlocksAuto;
  const CheckpointBlocksChoice fits = choose_checkpoint_blocks(o, config, cuda);
  EXPECT_EQ(fits.decided, 0) << fits.why;
  EXPECT_NE(fits.why.find("within 90%"), std::string::npos) << fits.why;
  o.data.batch_size = 2;
  EXPECT_EQ(choose_checkpoint_blocks(o, config, cuda).decided, 0);
  EXPECT_EQ(predict(o, config, cuda).operands.decided, KeepWeightOperands::off);
  o.data.batch_size = 4;
  const CheckpointBlocksChoice some = choose_checkpoint_blocks(o, config, cuda);
  EXPECT_GT(some.decided, 0) << some.why;
  EXPECT_LT(some.decided, layers) << some.why;
  const double limit = kWeightOperandsMemoryShare * static_cast<double>(device_memory_bytes(cuda, "h100"));
  TrainOptions at = o;
  at.grad_checkpoint_blocks = some.decided;
  EXPECT_LE(static_cast<double>(peak(at)), limit);
  at.grad_checkpoint_blocks = some.decided - 1;
  EXPECT_GT(static_cast<double>(peak(at)), limit) << "the fewest";
  EXPECT_EQ(predict(o, config, cuda).checkpoint.decided, some.decided);
  o.data.batch_size = 48;
  const CheckpointBlocksChoice over = choose_checkpoint_blocks(o, config, cuda);
  EXPECT_EQ(over.decided, TrainOptions::kCheckpointAllBlocks) << over.why;
  EXPECT_NE(over.why.find("above 90%"), std::string::npos) << over.why;
  // The CPU: against the machine's memory, which holds the tiny model's step whole.
  TrainOptions tiny;
  tiny.data.seq_len = 64;
  tiny.grad_checkpoint = true;
  tiny.grad_checkpoint_blocks = TrainOptions::kCheckpointBlocksAuto;
  EXPECT_EQ(choose_checkpoint_blocks(tiny, test::trainable_tiny_config(), c10::Device(c10::kCPU)).decided, 0);
  tiny.grad_checkpoint = false;
  EXPECT_EQ(choose_checkpoint_blocks(tiny, test::trainable_tiny_config(), c10::Device(c10::kCPU)).decided,
            TrainOptions::kCheckpointAllBlocks);
}

// --shard-optimizer-state with N ranks: a rank's moments are 1/N of them, the rest of its step unchanged; without
// the flag the world size changes nothing (every rank holds everything).
TEST(MemoryModel, ShardedOptimizerStateIsPerRank) {
  TrainOptions o;
  o.data.seq_len = 64;
  o.adamw.moments = MomentStorage::float32;
  const Qwen3Config config = test::trainable_tiny_config();
  const c10::Device cuda(c10::kCUDA, 0);
  const StepMemoryPlan one = predict(o, config, cuda).memory;
  o.predict_world_size = 8;
  EXPECT_EQ(predict(o, config, cuda).memory.moments, one.moments);
  o.shard_optimizer_state = true;
  const StepMemoryPlan shard = predict(o, config, cuda).memory;
  EXPECT_EQ(shard.moments, (one.moments + 7) / 8);
  EXPECT_EQ(shard.weights, one.weights);
  EXPECT_EQ(one.peak() - shard.peak(), one.moments - shard.moments);
}

TEST(VramReportCli, PredictOnlyAndBadFlags) {
  test::TempDir dir;
  const SynthResult m = make_model(dir, test::trainable_tiny_config(), "m");
  const test::CliResult p = test::run_cli("vram-report --predict-only --config " + m.config_path +
                                          " --seq-len 64 --fused-optimizer --grad-checkpoint --device cuda");
  EXPECT_EQ(p.code, 0) << p.err;
  for (const std::string& phase : step_phases()) EXPECT_NE(p.out.find(phase), std::string::npos) << phase;
  // What --keep-weight-operands decided, and the codes and operands each saved for backward (none under
  // checkpointing, where auto holds the first forward's operands through the recompute: the tiny step fits any
  // device, and they are counted with the weights).
  EXPECT_NE(p.out.find("product operands for backward: kept from the first forward through the recompute to "
                       "backward (auto: "),
            std::string::npos)
      << p.out;
  EXPECT_NE(p.out.find("(NVFP4 codes 0.0, bf16 weight operands 0.0)"), std::string::npos) << p.out;
  // The time model counts no update hidden beside backward, and says so where --overlap-update asks for one.
  EXPECT_EQ(p.out.find("--overlap-update:"), std::string::npos) << p.out;
  const test::CliResult overlap = test::run_cli("vram-report --predict-only --config " + m.config_path +
                                                " --seq-len 64 --fused-optimizer --overlap-update --device cuda");
  EXPECT_EQ(overlap.code, 0) << overlap.err;
  EXPECT_NE(overlap.out.find("--overlap-update: the time above counts each block's update after its backward"),
            std::string::npos)
      << overlap.out;
  EXPECT_EQ(overlap.out.find("--overlap-update-sms"), std::string::npos) << overlap.out;
  // --overlap-update-sms: nor what the products lose by the SMs they leave to the update.
  const test::CliResult carveout =
      test::run_cli("vram-report --predict-only --config " + m.config_path +
                    " --seq-len 64 --fused-optimizer --overlap-update --overlap-update-sms 16 --device cuda");
  EXPECT_EQ(carveout.code, 0) << carveout.err;
  EXPECT_NE(carveout.out.find("nor what backward's products lose by leaving 16 SMs to it (--overlap-update-sms)"),
            std::string::npos)
      << carveout.out;
  const test::CliResult unchecked = test::run_cli("vram-report --predict-only --config " + m.config_path +
                                                  " --seq-len 64 --device cuda");
  EXPECT_EQ(unchecked.code, 0) << unchecked.err;
  // 2 blocks x (q 64x64, k and v 32x64, o 64x64, gate, up and down 64x128) = 73,728 elements x 2 bytes = 0.14 MiB.
  EXPECT_NE(unchecked.out.find("(NVFP4 codes 0.0, bf16 weight operands 0.1)"), std::string::npos) << unchecked.out;
  const test::CliResult no_out = test::run_cli("vram-report --weights " + m.dat_path + " --config " + m.config_path);
  EXPECT_EQ(no_out.code, 2);
  EXPECT_NE(no_out.err.find("--out"), std::string::npos) << no_out.err;
  const test::CliResult with_export = test::run_cli("vram-report --out " + dir.file("r.json") + " --output-dat " +
                                                    dir.file("x.dat") + " --weights " + m.dat_path);
  EXPECT_EQ(with_export.code, 2);
  EXPECT_NE(with_export.err.find("--output-dat"), std::string::npos) << with_export.err;
  // Its help lists only flags it takes: none of a run's length, checkpoints, export or evaluation.
  const test::CliResult help = test::run_cli("vram-report --help");
  EXPECT_EQ(help.code, 0);
  for (const char* flag : {"--output-dat", "--resume", "--checkpoint-dir", "--steps ", "--epochs", "--eval-every"})
    EXPECT_EQ(help.out.find(flag), std::string::npos) << flag;
  EXPECT_NE(help.out.find("--seq-len"), std::string::npos);
  std::ofstream(dir.file("pairs.tsv")) << "hi\tworld\n";
  // A missing folder is made (as for --metrics-jsonl); one that cannot be (a file stands in its way) is refused
  // before the step.
  const std::string train = " --weights " + m.dat_path + " --config " + m.config_path + " --tokenizer " +
                            test::tiny_tokenizer_path() + " --train-data " + dir.file("pairs.tsv");
  const test::CliResult unwritable = test::run_cli("vram-report --out " + dir.file("pairs.tsv/r.json") + train);
  EXPECT_EQ(unwritable.code, 1);
  EXPECT_NE(unwritable.err.find("pairs.tsv/r.json: cannot create its folder"), std::string::npos) << unwritable.err;
  EXPECT_EQ(unwritable.err.find("step 1/1"), std::string::npos) << "refused before the step";
  const test::CliResult made = test::run_cli("vram-report --out " + dir.file("new/dir/r.json") + train);
  EXPECT_EQ(made.code, 0) << made.err;
  EXPECT_TRUE(std::filesystem::exists(dir.file("new/dir/r.json")));
  const test::CliResult bad_moments = test::run_cli("vram-report --predict-only --config " + m.config_path +
                                                    " --optimizer-state-mode int4");
  EXPECT_EQ(bad_moments.code, 2);
  EXPECT_NE(bad_moments.err.find("int4"), std::string::npos) << bad_moments.err;
  // Flags another makes meaningless are refused as `train` refuses them (exit 2, the command and both flags
  // named), with or without --predict-only: its figures would otherwise describe a step the flags do not ask for.
  for (const std::string& mode : {std::string(" --predict-only"), " --out " + dir.file("refused.json")}) {
    for (const auto& [flags, named] : std::vector<std::pair<std::string, std::string>>{
             {" --overlap-update", "--overlap-update runs the in-backward updates beside backward: it needs "
                                   "--fused-optimizer"},
             {" --fused-optimizer --grad-accum-steps 2", "--grad-accum-steps needs the plain update"},
             {" --pack-strategy stream", "--pack-strategy applies with --pack only"},
             {" --train-lm-head", "--train-lm-head applies with --train-last-layers"},
             {" --synthetic", "--synthetic trains random weights of --config's shape: drop --weights"}}) {
      const test::CliResult r = test::run_cli("vram-report" + mode + train + flags);
      EXPECT_EQ(r.code, 2) << mode << flags << "\n" << r.err;
      EXPECT_NE(r.err.find("vram-report: " + named), std::string::npos) << mode << flags << "\n" << r.err;
      EXPECT_EQ(r.err.find("step 1/1"), std::string::npos) << "refused before the step";
    }
  }
}

// The report's first reading comes before anything has reached the device; in a fresh process the CUDA caching
// allocator then has no statistics yet and threw "Invalid device argument ...: did you call init?" (the first
// GPU round: every `train --device cuda --vram-report` stopped there, while smoke, which reports nothing, ran).
// A child process, so that no earlier test has initialised CUDA.
TEST(VramReportCli, GpuReportOfAFreshProcessReadsEveryPhase) {
  QWEN3_GPU_TEST(at::hasCUDA());
  test::TempDir dir;
  const SynthResult m = make_model(dir, report_config(), "m");
  const std::string report = dir.file("report.json");
  const test::CliResult r = test::run_cli("train --weights " + m.dat_path + " --config " + m.config_path +
                                          " --tokenizer " + test::tiny_tokenizer_path() + " --train-data " +
                                          write_text(dir) + " --data-format text --pack --seq-len 128 --steps 1" +
                                          " --log-every 0 --device cuda --vram-report " + report);
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(test::slurp(report));
  std::vector<std::string> phases;
  for (const auto& sample : j["Samples"]) {
    phases.push_back(sample["Phase"].get<std::string>());
    if (sample["Phase"] == "forward_done") {
      EXPECT_GT(sample["PeakMiB"].get<double>(), 0.0);
    }
  }
  for (const std::string& phase : step_phases())
    EXPECT_NE(std::find(phases.begin(), phases.end(), phase), phases.end()) << phase;
}

}  // namespace
}  // namespace qwen3
