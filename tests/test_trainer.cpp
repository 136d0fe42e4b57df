// The trainer end to end on tiny synth models: it learns, gradients reach every trainable tensor, resume is
// exact, checkpoints survive kill -9, signals stop cleanly, export happens, flags are checked.
#include <gtest/gtest.h>
#include <torch/utils.h>
#include <signal.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli_test_util.h"
#include "qwen3/base/slow_paths.h"
#include "qwen3/tokenizer/chat_format.h"
#include "qwen3/checkpoint/checkpoint.h"
#include "qwen3/model/generate.h"
#include "qwen3/model/model_loader.h"
#include "qwen3/nvfp4/nvfp4_linear.h"
#include "qwen3/model/synth.h"
#include "qwen3/trainer/trainer.h"
#include "tiny_model_util.h"
#include "qwen3/trainer/evaluate.h"
#include "trainer/train_setup.h"
#include "build_paths.h"

namespace qwen3 {
namespace {

SynthResult make_model(const test::TempDir& dir, const std::string& name = "m") {
  SynthOptions s;
  s.config = test::trainable_tiny_config();
  s.out_dir = dir.file(name);
  return write_synthetic_model(s);
}

const char* kPairs = "hi\tworld\nname?\tqwen\nabc\txyz\ncolor\tblue\n";

TrainOptions base_options(const SynthResult& m, const std::string& data);

// The four pairs written into `dir`, and the base options to train on them.
TrainOptions pair_options(const test::TempDir& dir, const SynthResult& m) {
  std::ofstream(dir.file("pairs.tsv")) << kPairs;
  return base_options(m, dir.file("pairs.tsv"));
}

TrainOptions base_options(const SynthResult& m, const std::string& data) {
  TrainOptions o;
  o.weights = m.dat_path;
  o.config = m.config_path;
  o.tokenizer = test::tiny_tokenizer_path();
  o.data.path = data;
  o.data.seq_len = 32;
  o.data.batch_size = 4;
  o.schedule.lr = 3e-3;
  o.log_every = 0;
  return o;
}

TEST(Trainer, OverfitsFourPairsUntilGreedyGenerationReproducesTheTargets) {
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  TrainOptions o = pair_options(dir, m);
  o.steps = 150;
  o.schedule.lr = 1e-2;
  o.output_dat = dir.file("trained.dat");
  const TrainSummary s = run_training(o);
  EXPECT_LT(s.last_loss, 0.05) << "first " << s.first_loss;
  ASSERT_EQ(s.exported, o.output_dat);

  const Tokenizer tok = Tokenizer::from_file(test::tiny_tokenizer_path());
  DatReader reader(o.output_dat);
  auto model = load_model(reader, load_config(m.config_path), at::kFloat, at::kCPU);
  GenerateOptions g;
  g.max_new_tokens = 12;
  g.stop_ids = {tok.added_token_id("<|im_end|>")};
  for (auto [prompt, target] : {std::pair{"hi", "world"}, {"name?", "qwen"}, {"abc", "xyz"}, {"color", "blue"}}) {
    const auto p = chat_generation_prompt(tok, std::nullopt, prompt);
    const auto out = generate(*model, std::vector<int64_t>(p.begin(), p.end()), g);
    std::vector<TokenId> ids(out.begin(), out.end());
    EXPECT_EQ(tok.decode(ids, /*skip_special=*/true), target) << prompt;
    EXPECT_EQ(out.back(), g.stop_ids[0]) << "the reply must end with <|im_end|>";
  }
}

// The slower-path records (docs/trainer.md, "Slow paths"): counted by what and why, taken once.
TEST(SlowPaths, RecordsAreCountedByWhatAndWhyAndTakenOnce) {
  take_slow_paths();
  record_slow_path("b", "y");
  record_slow_path("a", "x");
  record_slow_path("b", "y");
  record_slow_path("b", "z");
  const std::vector<SlowPath> taken = take_slow_paths();
  ASSERT_EQ(taken.size(), 3u);
  EXPECT_EQ(taken[0].what + "/" + taken[0].why + "/" + std::to_string(taken[0].count), "a/x/1");
  EXPECT_EQ(taken[1].what + "/" + taken[1].why + "/" + std::to_string(taken[1].count), "b/y/2");
  EXPECT_EQ(taken[2].what + "/" + taken[2].why + "/" + std::to_string(taken[2].count), "b/z/1");
  EXPECT_TRUE(take_slow_paths().empty());
}

// A path is warned of once a run, at the step that first took it; the totals keep counting.
TEST(SlowPaths, EachPathIsWarnedOfOnceARunAndCountedThroughIt) {
  std::vector<SlowPath> totals;
  std::vector<std::string> lines = slow_path_warnings(0, {{"fused RMSNorm", "a reason", 1}}, totals);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "set-up: slower path: fused RMSNorm (a reason), 1 time");
  lines = slow_path_warnings(3, {{"fused RMSNorm", "a reason", 4}, {"fused SwiGLU", "another", 72}}, totals);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "step 3: slower path: fused SwiGLU (another), 72 times");
  EXPECT_TRUE(slow_path_warnings(4, {{"fused SwiGLU", "another", 8}}, totals).empty());
  ASSERT_EQ(totals.size(), 2u);
  EXPECT_EQ(totals[0].count, 5);
  EXPECT_EQ(totals[1].count, 80);
}

// What a step's ops record as a slower path reaches the run's summary, counted by what and why (the after-step
// hook stands in for a GPU op that fell back), and what an earlier run left is not this run's; on a CPU the
// steps themselves record nothing (the reference ops are its path), plain or lean, packed rows included.
TEST(Trainer, SlowPathsOfItsStepsReachTheSummaryAndCpuStepsTakeNone) {
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  TrainOptions o = pair_options(dir, m);
  o.steps = 3;
  o.data.pack = true;
  for (const bool lean : {false, true}) {
    o.grad_checkpoint = o.fused_optimizer = lean;
    o.master_dtype = lean ? MasterDtype::bfloat16 : MasterDtype::float32;
    o.adamw.moments = moment_storage_from_name(lean ? "int8" : "float32");
    record_slow_path("left over", "an earlier run");
    const TrainSummary s = run_training(o);
    EXPECT_TRUE(s.slow_paths.empty()) << (lean ? "lean: " : "") << s.slow_paths.front().what << " ("
                                      << s.slow_paths.front().why << ")";
  }
  const TrainSummary s = run_training(o, nullptr, [](int64_t step) {
    record_slow_path("a stand-in op", step == 2 ? "in the second step" : "in a step");
  });
  ASSERT_EQ(s.slow_paths.size(), 2u);
  EXPECT_EQ(s.slow_paths[0].why, "in a step");
  EXPECT_EQ(s.slow_paths[0].count, 2);  // steps 1 and 3 (the last one's taken at the run's end)
  EXPECT_EQ(s.slow_paths[1].why, "in the second step");
  EXPECT_EQ(s.slow_paths[1].count, 1);
}

TEST(Trainer, GradientsReachEveryTrainableTensorAndOnlyThose) {
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  TrainOptions o = pair_options(dir, m);
  const Tokenizer tok = Tokenizer::from_file(test::tiny_tokenizer_path());
  TrainingData data(tok, o.data);
  for (int64_t last : {0, 1}) {
    o.train_last_layers = last;
    DatReader reader(m.dat_path);
    auto model = load_model(reader, load_config(m.config_path), at::kFloat, at::kCPU);
    train_detail::use_nvfp4_projections(*model, nvfp4::ScaleMode::rne, /*frozen_as_codes=*/false);
    const auto set = train_detail::select_trainable(*model, o);
    train_detail::compute_loss(*model, data.batch(0, 0), LossKind::cross_entropy).backward();
    size_t with_grad = 0;
    for (auto& [key, t] : model->named_weights()) {
      const bool trainable = t.requires_grad();
      EXPECT_EQ(t.grad().defined(), trainable) << key;
      if (trainable) {
        EXPECT_GT(t.grad().abs().sum().item<double>(), 0.0) << key;
        ++with_grad;
      }
    }
    EXPECT_EQ(with_grad, set.params.size());
    if (last == 1) {
      EXPECT_FALSE(model->blocks[0].q_proj.weight.requires_grad());
    }
  }
}

// The leaf swap: a frozen projection's kernel holds its codes and its dense weight is gone (no reference is
// left anywhere: the tensor itself is destroyed), a trained one keeps its master under the straight-through
// kernel. With frozen_as_codes off every weight stays, which the first expectations catch.
TEST(Trainer, FrozenProjectionsAreSwappedForCodesAndTheirDenseWeightsGo) {
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  TrainOptions o = pair_options(dir, m);
  o.train_last_layers = 1;
  DatReader reader(m.dat_path);
  auto model = load_model(reader, load_config(m.config_path), at::kFloat, at::kCPU);
  train_detail::select_trainable(*model, o);
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> frozen;
  for (Projection* p : model->blocks[0].projections()) frozen.emplace_back(p->weight.getIntrusivePtr());
  const at::Tensor ids = at::randint(0, 64, {1, 5}, at::kLong);
  at::Tensor before;
  {
    torch::NoGradGuard no_grad;
    train_detail::use_nvfp4_projections(*model, o.scale_mode, /*frozen_as_codes=*/false);
    before = model->forward(ids);
  }
  train_detail::use_nvfp4_projections(*model, o.scale_mode, /*frozen_as_codes=*/true);
  for (size_t i = 0; i < frozen.size(); ++i) {
    EXPECT_FALSE(model->blocks[0].projections()[i]->weight.defined()) << i;
    EXPECT_TRUE(frozen[i].expired()) << i;
  }
  for (Projection* p : model->blocks[1].projections()) EXPECT_TRUE(p->weight.defined() && p->weight.requires_grad());
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(model->forward(ids).equal(before));  // the codes are the bytes the straight-through forward uses
}

// Data-parallel ranks evaluate their share of the batches; the shares' sums are the whole evaluation's.
TEST(Trainer, EvaluationSharedOutSumsToTheWhole) {
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  TrainOptions o = pair_options(dir, m);
  o.data.batch_size = 1;
  o.data.sample_mode = SampleMode::sequential;
  const Tokenizer tok = Tokenizer::from_file(test::tiny_tokenizer_path());
  const TrainingData data(tok, o.data);
  DatReader reader(m.dat_path);
  auto model = load_model(reader, load_config(m.config_path), at::kFloat, at::kCPU);
  const Evaluation whole = evaluate(*model, data);
  const Evaluation a = evaluate(*model, data, 0, 2), b = evaluate(*model, data, 1, 2);
  EXPECT_EQ(a.loss_tokens + b.loss_tokens, whole.loss_tokens);
  EXPECT_GT(a.loss_tokens, 0);
  EXPECT_GT(b.loss_tokens, 0);
  EXPECT_NEAR(a.loss_sum + b.loss_sum, whole.loss_sum, 1e-12 * whole.loss_sum);
  EXPECT_NEAR(whole.mean_loss, whole.loss_sum / static_cast<double>(whole.loss_tokens), 1e-15);
}

std::vector<double> losses_of(const std::string& jsonl) {
  std::ifstream in(jsonl);
  std::vector<double> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return out;
}

TEST(Trainer, ResumeEqualsAnUninterruptedRunBitForBit) {
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  std::ofstream(dir.file("text.txt")) << "the quick brown fox jumps over the lazy dog\nhello world, hello qwen\n"
                                      << "abc abc abc xyz xyz\nlorem ipsum dolor sit amet\n";
  for (const char* moments : {"float32", "int8"}) {
    TrainOptions o = base_options(m, dir.file("text.txt"));
    o.data.batch_size = 2;
    o.steps = 6;
    o.schedule.kind = LrScheduleKind::cosine;
    o.schedule.warmup_steps = 2;
    o.master_dtype = MasterDtype::bfloat16;
    o.adamw.moments = moment_storage_from_name(moments);
    o.metrics_jsonl = dir.file(std::string("straight-") + moments + ".jsonl");
    run_training(o);

    o.metrics_jsonl = dir.file(std::string("resumed-") + moments + ".jsonl");
    o.checkpoint_dir = dir.file(std::string("ckpt-") + moments);
    {
      // Stopped after step 3 exactly, as a SIGTERM arriving then would (the flag is polled after each step), then
      // resumed to 6.
      StopRequest stop;
      const TrainSummary s = run_training(o, &stop, [&stop](int64_t step) {
        if (step == 3) stop.signal.store(SIGTERM);
      });
      ASSERT_EQ(s.stop_signal, SIGTERM);
      ASSERT_EQ(s.final_step, 3);
    }
    o.resume = true;
    run_training(o);
    const auto straight = losses_of(dir.file(std::string("straight-") + moments + ".jsonl"));
    const auto resumed = losses_of(o.metrics_jsonl);
    ASSERT_EQ(straight.size(), 6u);
    ASSERT_EQ(resumed.size(), 6u) << "the resumed run continues where the stopped one ended";
    for (size_t i = 0; i < 6; ++i) EXPECT_EQ(straight[i], resumed[i]) << moments << " step " << i + 1;
  }
}

TEST(Trainer, ResumeRefusesAnotherModelOrIncompatibleFlags) {
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  TrainOptions o = pair_options(dir, m);
  o.steps = 1;
  o.checkpoint_dir = dir.file("ckpt");
  run_training(o);
  o.resume = true;
  o.master_dtype = MasterDtype::bfloat16;
  try {
    run_training(o);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("master_dtype"), std::string::npos) << e.what();
  }
  o.master_dtype = MasterDtype::float32;
  SynthOptions other;
  other.config = load_config(m.config_path);
  other.config.intermediate_size = 256;
  other.out_dir = dir.file("other");
  const SynthResult m2 = write_synthetic_model(other);
  o.weights = m2.dat_path;
  o.config = m2.config_path;
  EXPECT_THROW(run_training(o), Error);
}

// A checkpoint folder has the permissions the umask gives any folder the run makes (0755 under 022, 0750 under
// 027), as its files and the run's other folders do: made by mkdtemp it was 0700, unreadable to the run's group.
TEST(Checkpoint, AFolderHasTheUmasksPermissions) {
  test::TempDir dir;
  CheckpointState s;
  s.model_hash = "h";
  s.tensors.emplace_back("w", at::arange(4.0));
  for (const mode_t mask : {mode_t{022}, mode_t{027}}) {
    const mode_t before = ::umask(mask);
    s.step += 1;
    const std::string path = save_checkpoint(dir.file("ckpt"), s, 0);
    ::umask(before);
    struct stat info {};
    ASSERT_EQ(::stat(path.c_str(), &info), 0);
    EXPECT_EQ(info.st_mode & 0777, 0777 & ~mask) << path;
  }
}

// Entries fetched while the file is written (a shared-out optimizer state): in order, each let go before the next
// is fetched, so the process never holds them all; the file is the one of the same tensors given whole.
TEST(Checkpoint, FetchedTensorsAreWrittenInOrderOneAtATime) {
  test::TempDir dir;
  std::vector<at::Tensor> values;
  for (int i = 0; i < 4; ++i) values.push_back(at::randn({64, 32}));
  CheckpointState s;
  s.model_hash = "h";
  s.tensors.emplace_back("whole", at::arange(5.0));
  for (int i = 0; i < 4; ++i) s.tensors.emplace_back("fetched/" + std::to_string(i), at::Tensor());
  std::vector<size_t> asked;
  std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> previous;
  bool previous_released = true;
  s.fetch = [&](size_t index) {
    asked.push_back(index);
    previous_released = previous_released && (!previous || previous->expired());
    at::Tensor t = values[index - 1].clone();  // a fresh buffer, as a received one is
    previous = t.storage().getWeakStorageImpl();
    return t;
  };
  const std::string path = save_checkpoint(dir.file("ckpt"), s, 0);
  EXPECT_EQ(asked, (std::vector<size_t>{1, 2, 3, 4}));
  EXPECT_TRUE(previous_released) << "a fetched tensor was still held when the next was fetched";
  const CheckpointState back = load_checkpoint(path);
  ASSERT_EQ(back.tensors.size(), 5u);
  EXPECT_TRUE(back.tensors[0].second.equal(at::arange(5.0)));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(back.tensors[i + 1].first, "fetched/" + std::to_string(i));
    EXPECT_TRUE(back.tensors[i + 1].second.equal(values[i]));
  }
  CheckpointState no_fetch;
  no_fetch.tensors.emplace_back("missing", at::Tensor());
  EXPECT_THROW(save_checkpoint(dir.file("other"), no_fetch, 0), Error);
}

TEST(Checkpoint, KillDuringSaveLeavesTheLastCompleteCheckpointLoadable) {
  test::TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  CheckpointState s;
  s.model_hash = "h";
  s.tensors.emplace_back("big", at::randn({2048, 1024}));
  s.step = 1;
  save_checkpoint(ckpt, s, 0);
  for (int round = 0; round < 6; ++round) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      for (int64_t step = 2;; ++step) {
        s.step = step;
        save_checkpoint(ckpt, s, 2);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(30 + 37 * round));
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    const auto latest = latest_checkpoint(ckpt);
    ASSERT_TRUE(latest.has_value());
    const CheckpointState back = load_checkpoint(*latest);
    ASSERT_EQ(back.tensors.size(), 1u);
    EXPECT_TRUE(back.tensors[0].second.equal(s.tensors[0].second)) << *latest;
  }
}

TEST(TrainCli, FlagsAliasesAndSignals) {
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  std::ofstream(dir.file("pairs.tsv")) << kPairs << "no tab here\n";
  const std::string base = "train --weight " + m.dat_path + " --config " + m.config_path + " --tokenizer " +
                           test::tiny_tokenizer_path() + " --train-data " + dir.file("pairs.tsv") +
                           " --data-format tsv";
  auto r = test::run_cli(base + " --steps 2 --bogus 1");
  EXPECT_EQ(r.code, 2);
  r = test::run_cli(base + " --steps 2 --resume true");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--checkpoint-dir"), std::string::npos) << r.err;
  r = test::run_cli(base + " --steps two");
  EXPECT_EQ(r.code, 2);
  r = test::run_cli(base + " --steps 2 --strict-data");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("pairs.tsv:5"), std::string::npos) << r.err;
  r = test::run_cli(base + " --steps 2 --loss-mode scalar --step-chunk-rows 7 --resume false --output-dat " +
                    dir.file("out.dat"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("pairs.tsv:5"), std::string::npos) << "the bad line is reported: " << r.err;
  EXPECT_NE(r.err.find("step 2/2 | loss "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("a step asks for"), std::string::npos) << r.err;
  r = test::run_cli("inspect " + dir.file("out.dat"));
  EXPECT_EQ(r.code, 0) << r.err;
  // A step asking for more batches than an epoch has (4 samples in batches of 2, 3 a step) takes the epoch's 2,
  // and says so.
  r = test::run_cli(base + " --steps 1 --batch-size 2 --grad-accum-steps 3");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("--grad-accum-steps 3: a step asks for 3 batches but an epoch has 2; each step takes the "
                       "epoch's 2 (a global batch of 4 rows, not 6)"),
            std::string::npos)
      << r.err;

  // SIGTERM: the current step finishes, a checkpoint is written, exit code 143.
  const std::string metrics = dir.file("m.jsonl");
  const std::string cmd = test::binary_command() + " " + base + " --steps 100000 --log-every 0 --checkpoint-dir " +
                          dir.file("sig") + " --metrics-jsonl " + metrics + " 2>/dev/null";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  for (int i = 0; i < 600 && losses_of(metrics).empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 143);
  const auto latest = latest_checkpoint(dir.file("sig"));
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(load_checkpoint(*latest).step, static_cast<int64_t>(losses_of(metrics).size()));
}


// A stop inside a step (one process, between micro-batches) applies nothing of it: the checkpoint is the step
// before, and resuming from it trains exactly as the run that was never stopped.
TEST(Trainer, AStopInsideAStepAppliesNothingOfIt) {
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  TrainOptions o = pair_options(dir, m);
  o.data.batch_size = 1;
  o.grad_accum_steps = 4;
  o.steps = 3;
  o.metrics_jsonl = dir.file("straight.jsonl");
  run_training(o);

  o.metrics_jsonl = dir.file("stopped.jsonl");
  o.checkpoint_dir = dir.file("ckpt");
  StopRequest stop;  // asked before the run: step 1 stops before its second micro-batch
  stop.signal.store(SIGTERM);
  const TrainSummary inside = run_training(o, &stop);
  EXPECT_EQ(inside.stop_signal, SIGTERM);
  EXPECT_EQ(inside.steps_done, 0) << "step 1 stopped before its update";
  EXPECT_EQ(inside.final_step, 0);
  ASSERT_TRUE(latest_checkpoint(o.checkpoint_dir).has_value());
  EXPECT_EQ(load_checkpoint(*latest_checkpoint(o.checkpoint_dir)).step, 0);
  EXPECT_TRUE(losses_of(o.metrics_jsonl).empty()) << "no record of the stopped step";
  o.resume = true;
  run_training(o);  // resumed to 3
  const auto straight = losses_of(dir.file("straight.jsonl")), resumed = losses_of(o.metrics_jsonl);
  ASSERT_EQ(straight.size(), 3u);
  ASSERT_EQ(resumed.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(straight[i], resumed[i]) << "step " << i + 1;
}

// SIGTERM/SIGINT are obeyed within a second wherever the run is: while set-up waits (here for a second rank that
// never comes), and inside one long step (an accumulation of many micro-batches). Exit 143/130 both.
TEST(TrainCli, SignalsAreObeyedDuringSetUpAndInsideAStep) {
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  std::string lines;
  for (int i = 0; i < 400; ++i) lines += "question " + std::to_string(i) + "\tanswer " + std::to_string(i) + "\n";
  std::ofstream(dir.file("many.tsv")) << lines;
  const std::string base = test::binary_command() + " train --weights " + m.dat_path + " --config " + m.config_path +
                           " --tokenizer " + test::tiny_tokenizer_path() + " --train-data " + dir.file("many.tsv") +
                           " --seq-len 16 --steps 1";
  // Starts `command` (stderr to `err`), waits until `ready` says so, sends `sig`, and returns the exit code and
  // the seconds from the signal to the exit.
  const auto signal_run = [&](const std::string& command, const std::string& err, const std::function<bool()>& ready,
                              int sig) -> std::pair<int, double> {
    const pid_t pid = ::fork();
    if (pid == 0) {
      const std::string out = err.substr(0, err.rfind('.')) + ".out";  // stdout beside: step.err -> step.out
      ::execl("/bin/sh", "sh", "-c", ("exec " + command + " 2>" + err + " >" + out).c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    for (int i = 0; i < 600 && !ready(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ::kill(pid, sig);
    const auto sent = std::chrono::steady_clock::now();
    int status = 0;
    ::waitpid(pid, &status, 0);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
    return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), seconds};
  };
  const auto log_has = [](const std::string& path, const std::string& text) {
    return test::slurp(path).find(text) != std::string::npos;
  };

  // Set-up: rank 0 of two waits for rank 1 (up to --dist-timeout 120); the signal ends the wait.
  const std::string wait_err = dir.file("wait.err");
  const auto [wait_code, wait_s] = signal_run(
      "env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 " + base + " --dist-timeout 120 --dist-init file://" + dir.file("store"),
      wait_err, [&] { return std::filesystem::exists(dir.file("store")); }, SIGTERM);
  EXPECT_EQ(wait_code, 143) << test::slurp(wait_err);
  EXPECT_LT(wait_s, 10.0) << "obeyed at once, not after the rendezvous timeout";
  EXPECT_TRUE(log_has(wait_err, "stopped by a signal outside the steps")) << test::slurp(wait_err);

  // Inside a step: 400 micro-batches (a minute here); stopped before the next one, nothing of the step applied.
  const std::string step_err = dir.file("step.err");
  const auto [step_code, step_s] = signal_run(
      base + " --batch-size 1 --grad-accum-steps 400 --checkpoint-dir " + dir.file("ckpt"), step_err,
      [&] { return log_has(step_err, "setup took"); }, SIGINT);
  EXPECT_EQ(step_code, 130) << test::slurp(step_err);
  EXPECT_LT(step_s, 10.0) << test::slurp(step_err);
  EXPECT_TRUE(log_has(step_err, "of its 400 micro-batches, before its update")) << test::slurp(step_err);
  EXPECT_TRUE(log_has(dir.file("step.out"), "stopped by signal 2 before a step completed (still at step 0)"))
      << test::slurp(dir.file("step.out"));
  const auto latest = latest_checkpoint(dir.file("ckpt"));
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(load_checkpoint(*latest).step, 0);
}

// Flags that contradict each other, or would be silently ignored, are usage errors (exit 2) naming them, before
// anything loads where the flags alone decide it; --eval-data alone is scored once, after the last step.
TEST(TrainCli, ContradictoryOrIgnoredFlagsAreRefused) {
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  std::ofstream(dir.file("pairs.tsv")) << kPairs;
  const std::string base = "train --weights " + m.dat_path + " --config " + m.config_path + " --tokenizer " +
                           test::tiny_tokenizer_path() + " --train-data " + dir.file("pairs.tsv");
  const std::vector<std::pair<std::string, std::string>> refused = {
      {" --steps 2 --epochs 1", "not both"},
      {" --steps 2 --steps-per-epoch 3", "--steps-per-epoch applies with --epochs"},
      {" --steps 2 --synthetic", "drop --weights or --synthetic"},
      {" --steps 2 --eval-every 1", "--eval-every needs --eval-data"},
      {" --steps 2 --lr 1e-5 --min-lr 1", "train: --min-lr 1 exceeds --lr 1e-05"},
      {" --steps 2 --save-every-steps 1", "--save-every-steps and --keep-checkpoints apply with --checkpoint-dir"},
      {" --steps 2 --keep-checkpoints 5", "--save-every-steps and --keep-checkpoints apply with --checkpoint-dir"},
      {" --steps 2 --allow-data-change", "--allow-data-change applies with --resume"},
      {" --steps 2 --test-prompt hi", "--test-prompt applies with --test-max-tokens"},
      {" --steps 2 --test-max-tokens 4", "--test-max-tokens replies with the exported model: give --output-dat"},
      {" --steps 2 --system be --data-format text", "--system applies to pairs and chat records"},
      {" --steps 2 --train-lm-head", "--train-lm-head applies with --train-last-layers"},
      {" --steps 2 --warmup-steps 3", "--warmup-steps 3 exceeds --steps 2"},
      {" --epochs 1 --warmup-steps 30", "--warmup-steps 30 exceeds the 4 steps of --epochs 1"},
      {" --steps 2 --train-last-layers 1 --train-lm-head", "this model's head is its embedding"},
      {" --steps 2 --seq-len 100000", "beyond the model's max_position_embeddings"},
      {" --steps 2 --grad-accum-steps 2 --fused-optimizer", "--grad-accum-steps needs the plain update"},
      {" --steps 2 --grad-accum-steps 0", "--grad-accum-steps"},
      {" --steps 0", "give a positive --steps or --epochs"},
      {" --steps 2 --batch-size 65536 --seq-len 65536", "4294967296 tokens a micro-batch, above 2147483648"},
  };
  for (const auto& [flags, message] : refused) {
    const auto r = test::run_cli(base + flags);
    EXPECT_EQ(r.code, 2) << flags << ": " << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << flags << ": " << r.err;
  }
  // A missing flag is said before --synthetic writes its weights (it made them, then asked for --train-data).
  const auto synthetic = test::run_cli("train --synthetic --steps 1 --tokenizer " + test::tiny_tokenizer_path() +
                                       " --checkpoint-dir " + dir.file("synthetic-ck"));
  EXPECT_EQ(synthetic.code, 2) << synthetic.err;
  EXPECT_NE(synthetic.err.find("--train-data is required"), std::string::npos) << synthetic.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("synthetic-ck"))) << synthetic.err;
  // A config with fewer layers than the file would train (and export) part of the model: refused.
  nlohmann::json config = nlohmann::json::parse(std::ifstream(m.config_path));
  config["num_hidden_layers"] = 1;
  std::ofstream(dir.file("one_layer.json")) << config.dump();
  auto r = test::run_cli("train --weights " + m.dat_path + " --config " + dir.file("one_layer.json") + " --tokenizer " +
                         test::tiny_tokenizer_path() + " --train-data " + dir.file("pairs.tsv") + " --steps 1");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("the file has 2 layers, the config's num_hidden_layers is 1"), std::string::npos) << r.err;

  const std::string metrics = dir.file("m.jsonl");
  r = test::run_cli(base + " --steps 3 --eval-data " + dir.file("pairs.tsv") + " --metrics-jsonl " + metrics);
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream in(metrics);
  std::vector<bool> has_eval;
  for (std::string line; std::getline(in, line);) has_eval.push_back(nlohmann::json::parse(line).contains("eval_loss"));
  EXPECT_EQ(has_eval, std::vector<bool>({false, false, true}));
}

// Errors name the file's role (eval data is not "training data"), --metrics-jsonl gets its folder made, and a
// checkpoint.json field of the wrong type is named (it printed nlohmann's type_error.302).
TEST(TrainCli, FilesAreNamedByRoleAndFoldersMade) {
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  std::ofstream(dir.file("pairs.tsv")) << kPairs;
  const std::string base = "train --weights " + m.dat_path + " --config " + m.config_path + " --tokenizer " +
                           test::tiny_tokenizer_path() + " --train-data " + dir.file("pairs.tsv") + " --steps 1";
  auto r = test::run_cli(base + " --eval-data " + dir.file("missing.tsv"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("eval data (--eval-data) " + dir.file("missing.tsv") + ": cannot open (No such file"),
            std::string::npos)
      << r.err;
  // A --model-dir that is no folder is named as such (it said "--weights is required").
  for (const auto& [folder, why] : {std::pair{dir.file("nowhere"), std::string(": no such folder")},
                                    std::pair{dir.file("pairs.tsv"), std::string(" is not a folder")}}) {
    r = test::run_cli("train --model-dir " + folder + " --train-data " + dir.file("pairs.tsv") + " --steps 1");
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find("train: --model-dir " + folder + why), std::string::npos) << r.err;
  }
  const std::string metrics = dir.file("runs/a/b/metrics.jsonl");
  // The report inside the checkpoint folder, which does not exist yet (the original's users wrote it there).
  const std::string report = dir.file("ck/step-memory.json");
  r = test::run_cli(base + " --metrics-jsonl " + metrics + " --checkpoint-dir " + dir.file("ck") + " --vram-report " +
                    report);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(losses_of(metrics).size(), 1u);
  EXPECT_TRUE(std::filesystem::exists(report)) << r.out;
  const auto latest = latest_checkpoint(dir.file("ck"));
  ASSERT_TRUE(latest.has_value());
  const std::string meta_path = *latest + "/checkpoint.json";
  nlohmann::json meta = nlohmann::json::parse(std::ifstream(meta_path));
  meta["step"] = "one";
  std::ofstream(meta_path) << meta.dump();
  r = test::run_cli("export --checkpoint " + dir.file("ck") + " --weights " + m.dat_path + " --out " + dir.file("x.dat"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("checkpoint.json: field \"step\" must be an integer, got \"one\""), std::string::npos) << r.err;
}

// Files that are not what they claim get one line naming the file and what is wrong, never the JSON library's
// text ("[json.exception..."): truncated or non-UTF-8 data, a config with 1e400 or a negative
// max_position_embeddings, a broken tokenizer_config.json, a tokenizer without the chat markers, checkpoint
// counters no run makes, a binary run config.
TEST(TrainCli, FilesThatAreNotWhatTheyClaimAreNamed) {
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  std::ofstream(dir.file("pairs.tsv")) << kPairs;
  const std::string tokenizer = test::tiny_tokenizer_path();
  const auto train = [&](const std::string& config, const std::string& tok, const std::string& data,
                         const std::string& more = "") {
    return test::run_cli("train --weights " + m.dat_path + " --config " + config + " --tokenizer " + tok +
                         " --train-data " + data + " --steps 1 " + more);
  };
  const auto expect_named = [](const test::CliResult& r, int code, const std::string& text, const std::string& what) {
    EXPECT_EQ(r.code, code) << what << ": " << r.err;
    EXPECT_NE(r.err.find(text), std::string::npos) << what << ": " << r.err;
    EXPECT_EQ(r.err.find("json.exception"), std::string::npos) << what << ": " << r.err;
  };
  const std::string chat = R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]})";
  std::ofstream(dir.file("truncated.json")) << "[" << chat << ", {\"messages\": [";
  expect_named(train(m.config_path, tokenizer, dir.file("truncated.json")), 1,
               "not a valid JSON array of records (parse error at line 1", "truncated array");
  expect_named(train(m.config_path, tokenizer, dir.file("pairs.tsv"), "--eval-data " + dir.file("truncated.json")), 1,
               "eval data (--eval-data) '" + dir.file("truncated.json") + "': not a valid JSON array", "eval data");
  std::ofstream(dir.file("latin1.jsonl")) << R"({"messages": [{"role": "user", "content": "caf)" << '\xe9'
                                          << R"("}, {"role": "assistant", "content": "ok"}]})" << "\n";
  expect_named(train(m.config_path, tokenizer, dir.file("latin1.jsonl")), 1,
               "latin1.jsonl:1: invalid UTF-8 at byte 47 of the line", "Latin-1 record");
  std::ofstream(dir.file("latin1.json")) << "[\n" << chat << ",\n" << test::slurp(dir.file("latin1.jsonl")) << "]";
  expect_named(train(m.config_path, tokenizer, dir.file("latin1.json")), 1, "latin1.json':3: invalid UTF-8 at byte",
               "Latin-1 array");

  nlohmann::json config = nlohmann::json::parse(std::ifstream(m.config_path));
  config["max_position_embeddings"] = -5;
  std::ofstream(dir.file("negative.json")) << config.dump();
  expect_named(train(dir.file("negative.json"), tokenizer, dir.file("pairs.tsv")), 1,
               "max_position_embeddings must be positive, got -5", "negative positions");
  std::ofstream(dir.file("huge.json")) << R"({"hidden_size": 1e400})";
  expect_named(train(dir.file("huge.json"), tokenizer, dir.file("pairs.tsv")), 1,
               "huge.json: invalid JSON: number overflow parsing '1e400'", "1e400");

  std::filesystem::create_directories(dir.file("tc"));
  std::filesystem::copy_file(tokenizer, dir.file("tc/tokenizer.json"));
  std::ofstream(dir.file("tc/tokenizer_config.json")) << R"({"chat_template": )";
  expect_named(train(m.config_path, dir.file("tc/tokenizer.json"), dir.file("pairs.tsv")), 1,
               "tokenizer_config.json: not valid JSON (parse error at line 1", "tokenizer_config.json");
  nlohmann::json tok = nlohmann::json::parse(std::ifstream(tokenizer));
  nlohmann::json added = nlohmann::json::array();
  for (const auto& a : tok["added_tokens"])
    if (a["content"] != "<|im_end|>") added.push_back(a);
  tok["added_tokens"] = added;
  std::ofstream(dir.file("no_im_end.json")) << tok.dump();
  std::ofstream(dir.file("chat.jsonl")) << chat << "\n";
  for (const std::string& data : {dir.file("chat.jsonl"), dir.file("pairs.tsv")})
    expect_named(train(m.config_path, dir.file("no_im_end.json"), data), 1,
                 "no_im_end.json has no special added token <|im_end|>", data);
  EXPECT_EQ(train(m.config_path, dir.file("no_im_end.json"), dir.file("pairs.tsv"), "--data-format text").code, 0)
      << "raw text needs no chat markers";

  ASSERT_EQ(train(m.config_path, tokenizer, dir.file("pairs.tsv"), "--checkpoint-dir " + dir.file("ck")).code, 0);
  const std::string meta_path = *latest_checkpoint(dir.file("ck")) + "/checkpoint.json";
  const nlohmann::json meta = nlohmann::json::parse(std::ifstream(meta_path));
  const std::pair<nlohmann::json, std::string> bad_steps[] = {
      {-5, "field \"step\" is -5, not a step count"},
      {int64_t{1} << 62, "field \"step\" is 4611686018427387904, not a step count"},
      {nlohmann::json::array({1}), "field \"step\" must be an integer, got [1]"}};
  for (const auto& [step, message] : bad_steps) {
    nlohmann::json changed = meta;
    changed["step"] = step;
    std::ofstream(meta_path) << changed.dump();
    expect_named(train(m.config_path, tokenizer, dir.file("pairs.tsv"), "--checkpoint-dir " + dir.file("ck") +
                                                                            " --resume"),
                 1, message, "resume, step " + step.dump());
    expect_named(test::run_cli("export --checkpoint " + dir.file("ck") + " --weights " + m.dat_path + " --out " +
                               dir.file("x.dat") + " --overwrite"),
                 1, message, "export, step " + step.dump());
  }
  nlohmann::json no_flags = meta;
  no_flags["flags"] = nullptr;
  std::ofstream(meta_path) << no_flags.dump();
  expect_named(test::run_cli("export --checkpoint " + dir.file("ck") + " --weights " + m.dat_path + " --out " +
                             dir.file("x.dat") + " --overwrite"),
               1, "field \"flags\" must be an object, got null", "flags null");

  std::ofstream(dir.file("garbage.toml")) << std::string("\x00\x01\x02garbage\xff", 11);
  expect_named(test::run_cli("train --config-file " + dir.file("garbage.toml")), 2, "garbage.toml:1:", "binary TOML");
}

// Options are types parsed once at the CLI; every JSON that records them (checkpoints, reports) writes names.
TEST(TrainOptionsJson, WritesNamesAndParsesThemBack) {
  TrainOptions o;
  o.master_dtype = MasterDtype::bfloat16;
  o.compute_dtype = ComputeDtype::float32;
  o.loss = LossKind::scalar_l1;
  o.schedule.kind = LrScheduleKind::cosine;
  const nlohmann::json j = to_json(o);
  EXPECT_EQ(j["master_dtype"], "bfloat16");
  EXPECT_EQ(j["compute_dtype"], "float32");
  EXPECT_EQ(j["loss"], "scalar");
  EXPECT_EQ(j["lr_schedule"], "cosine");
  EXPECT_EQ(parse_master_dtype(j["master_dtype"]), o.master_dtype);
  EXPECT_EQ(parse_compute_dtype(j["compute_dtype"]), o.compute_dtype);
  EXPECT_EQ(parse_loss_kind(j["loss"]), o.loss);
  EXPECT_EQ(parse_lr_schedule_kind(j["lr_schedule"]), o.schedule.kind);
  EXPECT_THROW(parse_loss_kind("mse"), UsageError);
  // A checkpoint's flags are a subset of the same names.
  const nlohmann::json flags = train_detail::resume_flags(o, /*world_size=*/2);
  EXPECT_EQ(flags["loss"], "scalar");
  EXPECT_EQ(flags["global_batch"], o.data.batch_size * o.grad_accum_steps * 2);
  EXPECT_FALSE(flags.contains("lr")) << "the learning rate may change on resume";
}

TEST(Trainer, LossDecreasesOnPlainText) {
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  std::ofstream(dir.file("text.txt")) << "the quick brown fox jumps over the lazy dog\n"
                                      << "a stitch in time saves nine\nall that glitters is not gold\n";
  TrainOptions o = base_options(m, dir.file("text.txt"));
  o.steps = 30;
  o.data.format = DataFormat::text;
  o.metrics_jsonl = dir.file("m.jsonl");
  run_training(o);
  const auto losses = losses_of(o.metrics_jsonl);
  ASSERT_EQ(losses.size(), 30u);
  EXPECT_LT(losses.back(), 0.5 * losses.front());
  for (double l : losses) EXPECT_TRUE(std::isfinite(l));
}

TEST(TrainCli, SyntheticWeightsAndTheAfterExportSelfTest) {
  test::TempDir dir;
  const SynthResult m = make_model(dir);  // only its config.json is used: --synthetic makes the weights
  std::ofstream(dir.file("pairs.tsv")) << kPairs;
  auto r = test::run_cli("train --synthetic true --config " + m.config_path +
                         " --tokenizer " + test::tiny_tokenizer_path() + " --train-data " + dir.file("pairs.tsv") +
                         " --steps 60 --lr 1e-2 --batch-size 4" +
                         " --checkpoint-dir " + dir.file("ck") + " --output-dat " + dir.file("out.dat") +
                         " --test-max-tokens 8 --test-prompt hi");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("self-test: hi -> world"), std::string::npos) << r.out;
  r = test::run_cli("train --synthetic --config " + m.config_path + " --tokenizer " + test::tiny_tokenizer_path() +
                    " --train-data " + dir.file("pairs.tsv") + " --steps 1 --test-max-tokens 8");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--output-dat"), std::string::npos) << r.err;

  // A new run over the old one in the same --checkpoint-dir, with another config: --overwrite trains the config
  // asked for (the old run's random weights drawn anew), where it once trained the old run's in its place; a
  // resume with another config is refused.
  nlohmann::json two = nlohmann::json::parse(test::slurp(m.config_path));
  two["num_hidden_layers"] = 1;
  std::ofstream(dir.file("one-layer.json")) << two.dump();
  const std::string rerun = "train --synthetic --config " + dir.file("one-layer.json") + " --tokenizer " +
                            test::tiny_tokenizer_path() + " --train-data " + dir.file("pairs.tsv") +
                            " --steps 1 --checkpoint-dir " + dir.file("ck");
  r = test::run_cli(rerun + " --resume");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("holds the random weights of another run (another config than --config)"),
            std::string::npos)
      << r.err;
  r = test::run_cli(rerun + " --overwrite");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(load_config(dir.file("ck/synthetic-model/config.json")).num_hidden_layers, 1);
}


// The per-step losses of a short run on the four pairs, with `change` applied to the base options.
std::vector<double> pair_run_losses(const test::TempDir& dir, const SynthResult& m, const std::string& name,
                                    const std::function<void(TrainOptions&)>& change) {
  TrainOptions o = pair_options(dir, m);
  change(o);
  o.metrics_jsonl = dir.file(name + ".jsonl");
  run_training(o);
  return losses_of(o.metrics_jsonl);
}

// The four pairs as HF chat JSONL and as an alpaca JSON array render to the TSV pairs' tokens and masks, so the
// three runs are the same run, loss for loss.
TEST(Trainer, ChatAndAlpacaRecordsTrainExactlyAsTheSamePairsInTsv) {
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  const std::pair<const char*, const char*> pairs[] = {{"hi", "world"}, {"name?", "qwen"}, {"abc", "xyz"}, {"color", "blue"}};
  std::ofstream chat(dir.file("pairs.jsonl"));
  nlohmann::json alpaca = nlohmann::json::array();
  for (const auto& [prompt, target] : pairs) {
    chat << nlohmann::json{{"messages", {{{"role", "user"}, {"content", prompt}}, {{"role", "assistant"}, {"content", target}}}}}
         << "\n";
    alpaca.push_back({{"instruction", prompt}, {"input", ""}, {"output", target}});
  }
  chat.close();
  std::ofstream(dir.file("pairs.json")) << alpaca.dump(1);
  std::vector<double> runs[3];
  int i = 0;
  for (const char* file : {"pairs.tsv", "pairs.jsonl", "pairs.json"}) {
    TrainOptions o = pair_options(dir, m);
    o.data.path = dir.file(file);
    o.steps = 3;
    o.metrics_jsonl = dir.file(std::string(file) + ".metrics");
    run_training(o);
    runs[i++] = losses_of(o.metrics_jsonl);
  }
  ASSERT_EQ(runs[0].size(), 3u);
  EXPECT_EQ(runs[1], runs[0]);
  EXPECT_EQ(runs[2], runs[0]);
}

// The same losses, and the blocks really recomputed in backward (4 steps x 2 blocks), not kept; with
// --grad-checkpoint-blocks 1 the first block only (4 x 1), and auto on this machine (a tiny model: every block's
// activations fit) none.
TEST(Trainer, GradCheckpointingChangesNothingButMemory) {
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  std::vector<double> runs[4];
  const int64_t blocks[] = {TrainOptions::kCheckpointAllBlocks, TrainOptions::kCheckpointAllBlocks, 1,
                            TrainOptions::kCheckpointBlocksAuto};
  const int64_t recomputed[] = {0, 4 * 2, 4 * 1, 0};
  for (int ckpt = 0; ckpt < 4; ++ckpt) {
    TrainOptions o = pair_options(dir, m);
    o.steps = 4;
    o.grad_checkpoint = ckpt >= 1;
    o.grad_checkpoint_blocks = blocks[ckpt];
    o.metrics_jsonl = dir.file("m" + std::to_string(ckpt) + ".jsonl");
    const TrainSummary s = run_training(o);
    EXPECT_EQ(s.recomputed_blocks, recomputed[ckpt]) << ckpt;
    runs[ckpt] = losses_of(o.metrics_jsonl);
  }
  ASSERT_EQ(runs[0].size(), 4u);
  for (int ckpt = 1; ckpt < 4; ++ckpt) EXPECT_EQ(runs[ckpt], runs[0]) << ckpt;
}


// Gradient accumulation: N micro-batches of b rows make the step one batch of N·b rows makes (fp32: equal to
// rounding), with and without checkpointing; the data per epoch is the same, so are the steps per epoch. The
// losses of steps 2 and 3 follow from the updates before them (worst relative difference 9e-8 measured;
// weights are not compared element by element: Adam turns the rounding of a near-zero gradient into a
// full-size step of either sign).
TEST(Trainer, AccumulatedMicroBatchesEqualOneBigBatch) {
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  const std::tuple<int64_t, int64_t, bool> shapes[] = {{4, 1, false}, {2, 2, false}, {1, 4, true}, {1, 4, false}};
  std::vector<double> runs[4];
  for (int i = 0; i < 4; ++i) {
    const auto [batch, accum, ckpt] = shapes[i];
    TrainOptions o = pair_options(dir, m);
    o.data.batch_size = batch;
    o.grad_accum_steps = accum;
    o.grad_checkpoint = ckpt;
    o.epochs = 3;
    o.metrics_jsonl = dir.file("g" + std::to_string(i) + ".jsonl");
    const TrainSummary s = run_training(o);
    EXPECT_EQ(s.steps_done, 3) << i;  // 4 pairs: one step an epoch in every shape
    runs[i] = losses_of(o.metrics_jsonl);
  }
  double worst = 0;
  for (int i = 1; i < 4; ++i) {
    ASSERT_EQ(runs[i].size(), runs[0].size());
    for (size_t k = 0; k < runs[0].size(); ++k) worst = std::max(worst, std::fabs(runs[i][k] / runs[0][k] - 1));
  }
  std::printf("accumulated vs one batch: worst relative loss difference %.3g (losses %.4f %.4f %.4f)\n", worst,
              runs[0][0], runs[0][1], runs[0][2]);
  EXPECT_LT(worst, 1e-5);
  EXPECT_LT(runs[0][2], runs[0][0]);  // and it trains
}

// Packed rows keep their document mask and restarted positions through checkpointing's recompute and the
// in-backward update: the same losses either way.
TEST(Trainer, PackedRowsTrainTheSameWithCheckpointingAndTheFusedUpdate) {
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  std::vector<double> runs[3];
  for (int mode = 0; mode < 3; ++mode) {
    TrainOptions o = pair_options(dir, m);
    o.steps = 3;
    o.data.pack = true;
    o.data.seq_len = 48;  // two or three pairs a row
    o.grad_checkpoint = mode >= 1;
    o.fused_optimizer = mode == 2;
    o.grad_clip = 0;  // the fused update clips per group: off, so the three runs are one
    o.metrics_jsonl = dir.file("p" + std::to_string(mode) + ".jsonl");
    run_training(o);
    runs[mode] = losses_of(o.metrics_jsonl);
  }
  ASSERT_EQ(runs[0].size(), 3u);
  EXPECT_EQ(runs[1], runs[0]);
  EXPECT_EQ(runs[2], runs[0]);
}

// bf16 compute over fp32 masters (--compute-dtype bfloat16): over 30 steps of overfitting (loss 5.9 -> 0.004)
// every step's loss is within 3% of the fp32-compute run's first loss (0.9% measured: bf16 keeps 8 bits, so
// relative differences are ~1e-2 while the loss is large, and the tail near zero is where small absolute
// differences live), without being the same run (the compute dtype is really used).
TEST(Trainer, Bf16ComputeFollowsFp32ComputeOnTheTinyModel) {
  if (train_detail::cpu_bf16() == train_detail::CpuBf16::fails)
    GTEST_SKIP() << "this CPU's libtorch has no bf16 product";
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  std::vector<double> runs[2];
  for (int bf16 = 0; bf16 < 2; ++bf16)
    runs[bf16] = pair_run_losses(dir, m, "c" + std::to_string(bf16), [&](TrainOptions& o) {
      o.steps = 30;
      o.schedule.lr = 1e-2;
      o.compute_dtype = bf16 ? ComputeDtype::bfloat16 : ComputeDtype::float32;
    });
  ASSERT_EQ(runs[0].size(), 30u);
  ASSERT_EQ(runs[1].size(), 30u);
  EXPECT_NE(runs[0], runs[1]);
  double worst = 0;
  for (size_t i = 0; i < runs[0].size(); ++i) worst = std::max(worst, std::fabs(runs[1][i] - runs[0][i]) / runs[0][0]);
  std::printf("bf16 compute vs fp32: worst |loss difference| / first loss = %.5f (first %.4f vs %.4f, last %.4f vs %.4f)\n",
              worst, runs[1][0], runs[0][0], runs[1].back(), runs[0].back());
  EXPECT_LT(worst, 0.03);
  EXPECT_LT(runs[1].back(), 0.5 * runs[1][0]);  // and it trains
}

// Where the CPU's libtorch cannot multiply bf16 (Debian's aarch64 libtorch on Grace), auto computes in float32
// and an explicit bfloat16 is refused with the reason, instead of oneDNN's raw exception in the first product.
// Where the CPU multiplies bf16 without dot-product instructions (x86-64 before AVX512-BF16), auto computes in
// float32 too (bf16 products are several times slower there) and an explicit bfloat16 is taken.
TEST(Trainer, WithoutCpuBf16ProductsAutoComputesInFloat32AndBfloat16IsRefused) {
  using train_detail::CpuBf16;
  TrainOptions o;
  o.master_dtype = MasterDtype::bfloat16;
  const c10::Device cpu(c10::kCPU), cuda(c10::kCUDA, 0);
  EXPECT_EQ(train_detail::compute_scalar_type(o, cpu, CpuBf16::native), at::kBFloat16);
  EXPECT_EQ(train_detail::compute_scalar_type(o, cpu, CpuBf16::emulated), at::kFloat);
  EXPECT_EQ(train_detail::compute_scalar_type(o, cpu, CpuBf16::fails), at::kFloat);
  EXPECT_EQ(train_detail::compute_scalar_type(o, cuda, CpuBf16::fails), at::kBFloat16);
  o.master_dtype = MasterDtype::float32;  // auto follows an fp32 master on every CPU
  for (CpuBf16 c : {CpuBf16::native, CpuBf16::emulated, CpuBf16::fails})
    EXPECT_EQ(train_detail::compute_scalar_type(o, cpu, c), at::kFloat);
  o.compute_dtype = ComputeDtype::bfloat16;
  EXPECT_EQ(train_detail::compute_scalar_type(o, cpu, CpuBf16::native), at::kBFloat16);
  EXPECT_EQ(train_detail::compute_scalar_type(o, cpu, CpuBf16::emulated), at::kBFloat16);
  try {
    train_detail::compute_scalar_type(o, cpu, CpuBf16::fails);
    ADD_FAILURE() << "bfloat16 compute without bf16 products was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--compute-dtype bfloat16"), std::string::npos) << e.what();
  }
  EXPECT_EQ(train_detail::compute_scalar_type(o, cuda, CpuBf16::fails), at::kBFloat16);
#if defined(__x86_64__)
  EXPECT_NE(train_detail::cpu_bf16(), CpuBf16::fails) << "x86-64 libtorch multiplies bf16 (oneDNN or its own)";
  // The instruction-set read against the kernel's own account of the CPU (/proc/cpuinfo's flags).
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line) && line.rfind("flags", 0) != 0) {
  }
  if (!line.empty()) {
    std::istringstream flags(line.substr(line.find(':') + 1));
    bool bf16 = false;
    for (std::string f; flags >> f;) bf16 = bf16 || f == "avx512_bf16" || f == "amx_bf16";
    EXPECT_EQ(train_detail::cpu_bf16() == CpuBf16::native, bf16) << line;
  }
#endif
}

// The log says why a CPU run's compute dtype differs from what its flags suggest, and warns of an explicit bf16
// without bf16 instructions; nothing where there is nothing to say.
TEST(Trainer, ComputeDtypeNoteSaysWhyACpuRunComputesAsItDoes) {
  using train_detail::CpuBf16;
  using train_detail::compute_dtype_note;
  TrainOptions o;
  const c10::Device cpu(c10::kCPU), cuda(c10::kCUDA, 0);
  for (CpuBf16 c : {CpuBf16::native, CpuBf16::emulated, CpuBf16::fails})
    EXPECT_EQ(compute_dtype_note(o, cpu, c).text, "");  // fp32 master, auto: float32 everywhere
  o.master_dtype = MasterDtype::bfloat16;
  EXPECT_EQ(compute_dtype_note(o, cpu, CpuBf16::native).text, "");
  EXPECT_EQ(compute_dtype_note(o, cuda, CpuBf16::emulated).text, "");
  const auto emulated = compute_dtype_note(o, cpu, CpuBf16::emulated);
  EXPECT_NE(emulated.text.find("no bfloat16 dot-product instructions"), std::string::npos) << emulated.text;
  EXPECT_FALSE(emulated.warn);
  EXPECT_NE(compute_dtype_note(o, cpu, CpuBf16::fails).text.find("cannot multiply"), std::string::npos);
  o.compute_dtype = ComputeDtype::bfloat16;
  EXPECT_EQ(compute_dtype_note(o, cpu, CpuBf16::native).text, "");
  EXPECT_TRUE(compute_dtype_note(o, cpu, CpuBf16::emulated).warn);
  o.compute_dtype = ComputeDtype::float32;
  EXPECT_EQ(compute_dtype_note(o, cpu, CpuBf16::emulated).text, "");
}

// With bf16 compute, activations are bf16, the logits fp32, and the fp32 masters get fp32 gradients: every
// trainable tensor and only those.
TEST(Trainer, Bf16ComputeGivesFp32GradientsToExactlyTheTrainableTensors) {
  if (train_detail::cpu_bf16() == train_detail::CpuBf16::fails)
    GTEST_SKIP() << "this CPU's libtorch has no bf16 product";
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  TrainOptions o = pair_options(dir, m);
  o.train_last_layers = 1;
  const Tokenizer tok = Tokenizer::from_file(test::tiny_tokenizer_path());
  TrainingData data(tok, o.data);
  DatReader reader(m.dat_path);
  auto model = load_model(reader, load_config(m.config_path), at::kFloat, at::kCPU);
  model->set_compute_dtype(at::kBFloat16);
  train_detail::use_nvfp4_projections(*model, nvfp4::ScaleMode::rne, /*frozen_as_codes=*/false);
  const auto set = train_detail::select_trainable(*model, o);
  const Batch batch = data.batch(0, 0);
  {
    torch::NoGradGuard no_grad;
    EXPECT_EQ(model->hidden_states(batch.input_ids).scalar_type(), at::kBFloat16);
    EXPECT_EQ(model->forward(batch.input_ids).scalar_type(), at::kFloat);
  }
  train_detail::compute_loss(*model, batch, LossKind::cross_entropy).backward();
  size_t with_grad = 0;
  for (auto& [key, t] : model->named_weights()) {
    EXPECT_EQ(t.grad().defined(), t.requires_grad()) << key;
    if (!t.requires_grad()) continue;
    EXPECT_EQ(t.grad().scalar_type(), at::kFloat) << key;
    EXPECT_GT(t.grad().abs().sum().item<double>(), 0.0) << key;
    EXPECT_TRUE(t.grad().isfinite().all().item<bool>()) << key;
    ++with_grad;
  }
  EXPECT_EQ(with_grad, set.params.size());
  EXPECT_FALSE(model->blocks[0].q_proj.weight.requires_grad());
}


// Re-saving a step that exists swaps the new copy in: its content is the new one, nothing is left behind, and a
// SIGKILL at any moment of repeated re-saves leaves a complete step-N (one of the two states).
TEST(Checkpoint, ResavingAStepNeverLeavesItMissingOrEmpty) {
  test::TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  CheckpointState a, b;
  a.model_hash = b.model_hash = "h";
  a.step = b.step = 1;
  a.tensors.emplace_back("t", at::zeros({512, 512}));
  b.tensors.emplace_back("t", at::ones({512, 512}));
  save_checkpoint(ckpt, a, 0);
  const std::string path = save_checkpoint(ckpt, b, 0);
  EXPECT_TRUE(load_checkpoint(path).tensors[0].second.equal(b.tensors[0].second));
  size_t entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(ckpt)) entries += e.path() == path ? 1 : 100;
  EXPECT_EQ(entries, 1u) << "a temporary or an old copy was left behind";
  for (int round = 0; round < 6; ++round) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0)
      for (int i = 0;; ++i) save_checkpoint(ckpt, i % 2 ? a : b, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + 23 * round));
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    const auto latest = latest_checkpoint(ckpt);
    ASSERT_TRUE(latest.has_value()) << "round " << round;
    const at::Tensor t = load_checkpoint(*latest).tensors.at(0).second;
    EXPECT_TRUE(t.equal(a.tensors[0].second) || t.equal(b.tensors[0].second));
  }
}

// The same step is never saved twice in a run: a signal right after --save-every-steps saved, and --resume with
// --steps at or below the checkpoint's step, leave the checkpoint on disk as it is.
TEST(Trainer, AStepOnDiskIsNotSavedAgain) {
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  TrainOptions o = pair_options(dir, m);
  o.checkpoint_dir = dir.file("ckpt");
  o.steps = 3;
  o.save_every_steps = 1;
  StopRequest interrupted;
  interrupted.signal.store(SIGINT);
  TrainSummary s = run_training(o, &interrupted);  // step 1, its periodic save, then the signal
  EXPECT_EQ(s.final_step, 1);
  EXPECT_EQ(s.checkpoints_saved, 1);
  const std::string step1 = *latest_checkpoint(o.checkpoint_dir);
  const auto written = std::filesystem::last_write_time(step1 + "/tensors.dat");
  struct stat before {};
  ASSERT_EQ(::stat((step1 + "/tensors.dat").c_str(), &before), 0);
  o.resume = true;
  o.steps = 1;  // nothing left to do
  s = run_training(o);
  EXPECT_EQ(s.checkpoints_saved, 0);
  struct stat after {};
  ASSERT_EQ(::stat((step1 + "/tensors.dat").c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino);
  EXPECT_EQ(std::filesystem::last_write_time(step1 + "/tensors.dat"), written);
}


// One step of the pairs, checkpointed into dir/ckpt: the options (for a resume) and the checkpoint's path.
std::pair<TrainOptions, std::string> one_checkpointed_step(const test::TempDir& dir, const SynthResult& m) {
  TrainOptions o = pair_options(dir, m);
  o.checkpoint_dir = dir.file("ckpt");
  o.steps = 1;
  run_training(o);
  return {o, *latest_checkpoint(o.checkpoint_dir)};
}

// A diverged state is never saved, and a poisoned checkpoint is never resumed from.
TEST(Trainer, NonFiniteStatesAreNotSavedNorResumed) {
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  auto [o, good] = one_checkpointed_step(dir, m);
  // A learning rate that is finite as a flag but not in fp32 (1e39): the first update makes the weights infinite
  // while the loss and the norm it was computed from were fine, so the step is not skipped; its save is refused.
  o.resume = true;
  o.steps = 3;
  o.save_every_steps = 1;
  o.schedule.lr = 1e39;
  try {
    run_training(o);
    FAIL() << "a diverged state was saved";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("refusing to save step 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(good), std::string::npos) << e.what();
  }
  EXPECT_EQ(*latest_checkpoint(o.checkpoint_dir), good);
  // A poisoned checkpoint (written by hand, newer than the good one) is passed over on resume.
  CheckpointState poisoned = load_checkpoint(good);
  poisoned.step = 5;
  poisoned.tensors[0].second = poisoned.tensors[0].second.clone().fill_(std::nan(""));
  save_checkpoint(o.checkpoint_dir, poisoned, 0);
  o.schedule.lr = 3e-3;
  o.steps = 1;
  o.save_every_steps = 0;
  const TrainSummary s = run_training(o);
  EXPECT_EQ(s.final_step, 1) << "resumed from the finite step-1, not the poisoned step-5";
}

// A checkpoint whose file changed after it was written (a disk's or a copy's fault) is never resumed from: every
// tensor's bytes are hashed into checkpoint.json as they are written, and checked as they are read. Resume passes
// over it to an older checkpoint (it once resumed from the changed moments silently); a checkpoint from before
// the hashes is read as it was.
TEST(Trainer, ACheckpointChangedOnDiskIsNotResumedFrom) {
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  auto [o, good] = one_checkpointed_step(dir, m);
  CheckpointState later = load_checkpoint(good);
  later.step = 5;
  const std::string changed = save_checkpoint(o.checkpoint_dir, later, 0);
  const std::string tensors = changed + "/tensors.dat";
  {
    std::fstream f(tensors, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(0, std::ios::end);
    const std::streamoff middle = f.tellg() / 2;  // inside a tensor's payload: the headers are a few hundred bytes
    f.seekg(middle);
    char byte = 0;
    f.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x10);
    f.seekp(middle);
    f.write(&byte, 1);
  }
  try {
    load_checkpoint(changed);
    ADD_FAILURE() << "a changed tensor was read back";
  } catch (const CheckpointDamaged& e) {
    EXPECT_NE(std::string(e.what()).find("is not the tensor saved there"), std::string::npos) << e.what();
  }
  o.resume = true;
  const TrainSummary s = run_training(o);
  EXPECT_EQ(s.final_step, 1) << "resumed from step-1, not the changed step-5";
  // Without the hashes (a checkpoint from before them) nothing is checked, and it is read as it is.
  nlohmann::json meta = nlohmann::json::parse(test::slurp(good + "/checkpoint.json"));
  ASSERT_EQ(meta["tensor_hashes"].size(), later.tensors.size());
  meta.erase("tensor_hashes");
  std::ofstream(good + "/checkpoint.json") << meta.dump();
  EXPECT_EQ(load_checkpoint(good).tensors.size(), later.tensors.size());
  // The hash sees one bit anywhere, and the length.
  std::vector<unsigned char> bytes(77);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 37);
  const std::string whole = tensor_bytes_hash(bytes.data(), bytes.size());
  EXPECT_NE(tensor_bytes_hash(bytes.data(), bytes.size() - 1), whole);
  std::set<std::string> seen = {whole};
  for (size_t bit = 0; bit < bytes.size() * 8; ++bit) {
    bytes[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    seen.insert(tensor_bytes_hash(bytes.data(), bytes.size()));
    bytes[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
  }
  EXPECT_EQ(seen.size(), bytes.size() * 8 + 1) << "every one-bit change has its own hash";
}

TEST(TrainCli, NonFiniteFloatFlagsAreUsageErrors) {
  for (const char* flag : {"--grad-clip nan", "--lr inf", "--beta2 nan", "--weight-decay -inf", "--min-lr nan"}) {
    const auto r = test::run_cli(std::string("train --weights w --config c --tokenizer t --train-data d --steps 1 ") + flag);
    EXPECT_EQ(r.code, 2) << flag;
    EXPECT_NE(r.err.find("must be a finite number"), std::string::npos) << r.err;
  }
}


// One trainer per checkpoint directory: a second one (another process, or another lock in this one) is refused
// at once, naming the holder's pid; a directory that cannot be one is refused before anything loads.
TEST(Checkpoint, ADirectoryHasOneTrainerAtATime) {
  test::TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  {
    const CheckpointDirLock held(ckpt);
    try {
      const CheckpointDirLock second(ckpt);
      FAIL() << "two locks on one directory";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("pid " + std::to_string(::getpid())), std::string::npos) << e.what();
    }
    const auto r = test::run_cli("train --weights w.dat --config c.json --tokenizer t.json --train-data d.tsv "
                                 "--steps 1 --checkpoint-dir " + ckpt);
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("in use by another trainer (pid " + std::to_string(::getpid()) + ")"), std::string::npos)
        << r.err;
  }
  EXPECT_NO_THROW(CheckpointDirLock{ckpt});  // released with its holder
  std::ofstream(dir.file("file")) << "x";
  const auto r = test::run_cli("train --weights w.dat --config c.json --tokenizer t.json --train-data d.tsv "
                               "--steps 1 --checkpoint-dir " + dir.file("file"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("not usable as a checkpoint directory"), std::string::npos) << r.err;
}


// --resume with nothing to resume is an error (a typo, or a step-N folder given as the checkpoint folder),
// unless --resume-if-present.
TEST(Trainer, ResumeWithNothingToResumeIsAnError) {
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  TrainOptions o = pair_options(dir, m);
  o.steps = 1;
  o.resume = true;
  o.checkpoint_dir = dir.file("ckpt/step-00000004");
  try {
    run_training(o);
    FAIL() << "trained from the weights";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("give its parent folder"), std::string::npos) << e.what();
  }
  o.checkpoint_dir = dir.file("empty");
  EXPECT_THROW(run_training(o), Error);
  o.resume_if_present = true;
  EXPECT_EQ(run_training(o).final_step, 1);
}


// Resuming with another weights file of the same layout is refused, as export refuses it.
TEST(Trainer, ResumeRefusesAnotherFileOfTheSameLayout) {
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  SynthOptions other;
  other.config = test::trainable_tiny_config();
  other.seed = 12345;
  other.out_dir = dir.file("other");
  const SynthResult o_model = write_synthetic_model(other);
  TrainOptions o = pair_options(dir, m);
  o.checkpoint_dir = dir.file("ckpt");
  o.steps = 1;
  run_training(o);
  o.resume = true;
  o.steps = 2;
  o.weights = o_model.dat_path;
  try {
    run_training(o);
    FAIL() << "resumed onto another model's frozen tensors";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stored values differ"), std::string::npos) << e.what();
  }
  o.weights = m.dat_path;
  EXPECT_EQ(run_training(o).final_step, 2);
}


// checkpoint.json names the moment storage; a file from before (the ordinal) still resumes.
TEST(Trainer, CheckpointNamesTheMomentStorageAndReadsOldOrdinals) {
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  TrainOptions o = pair_options(dir, m);
  o.checkpoint_dir = dir.file("ckpt");
  o.steps = 1;
  o.adamw.moments = MomentStorage::int8;
  run_training(o);
  const std::string json_path = *latest_checkpoint(o.checkpoint_dir) + "/checkpoint.json";
  nlohmann::json meta = nlohmann::json::parse(test::slurp(json_path));
  EXPECT_EQ(meta["flags"]["optimizer_state_mode"], "int8");
  meta["flags"]["optimizer_state_mode"] = 2;  // as older versions wrote it
  std::ofstream(json_path) << meta.dump(2);
  o.resume = true;
  o.steps = 2;
  o.adamw.moments = MomentStorage::nvfp4;
  try {
    run_training(o);
    FAIL() << "resumed int8 moments as nvfp4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer_state_mode (checkpoint \"int8\", now \"nvfp4\")"), std::string::npos)
        << e.what();
  }
  o.adamw.moments = MomentStorage::int8;
  EXPECT_EQ(run_training(o).final_step, 2);
}


// Holding the directory's lock, a trainer removes the temporaries of interrupted saves it finds there.
TEST(Checkpoint, TheLockHolderRemovesStaleSaveTemporaries) {
  test::TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  std::filesystem::create_directories(ckpt + "/.step-00000003.tmp-Ab12Cd/x");
  std::filesystem::create_directories(ckpt + "/.step-00000002.old-Ab12Cd");
  std::filesystem::create_directories(ckpt + "/step-00000001");
  const CheckpointDirLock lock(ckpt);
  EXPECT_FALSE(std::filesystem::exists(ckpt + "/.step-00000003.tmp-Ab12Cd"));
  EXPECT_FALSE(std::filesystem::exists(ckpt + "/.step-00000002.old-Ab12Cd"));
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/step-00000001"));
}


TEST(Trainer, MetricsOnAFullDeviceAreAnError) {
  test::TempDir dir;
  const SynthResult m = make_model(dir);
  TrainOptions o = pair_options(dir, m);
  o.steps = 1;
  o.metrics_jsonl = "/dev/full";
  try {
    run_training(o);
    FAIL() << "metrics written to a full device passed for success";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/full: write failed"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace qwen3
