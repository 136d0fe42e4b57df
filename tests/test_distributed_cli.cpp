// Data parallel through the real binary (docs/distributed.md): two processes with torchrun's RANK / WORLD_SIZE,
// joined through a FileStore in a temporary folder (no port to fight over), Gloo over loopback.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <filesystem>
#include <fstream>

#include "cli_test_util.h"
#include "dist/tcp_store.h"
#include "qwen3/checkpoint/checkpoint.h"
#include "qwen3/model/synth.h"
#include "tiny_model_util.h"
#include "build_paths.h"

namespace qwen3 {
namespace {

namespace fs = std::filesystem;

struct Job {
  test::TempDir dir;
  SynthResult model;
  std::string base;
  explicit Job(const Qwen3Config& config = test::trainable_tiny_config()) {
    SynthOptions s;
    s.config = config;
    s.out_dir = dir.file("m");
    model = write_synthetic_model(s);
    std::ofstream pairs(dir.file("pairs.tsv"));
    const char* words[] = {"hi", "name?", "abc", "color", "sky", "two", "cat", "sea"};
    const char* answers[] = {"world", "qwen", "xyz", "blue", "high", "four", "meow", "salt"};
    for (int i = 0; i < 8; ++i) pairs << words[i] << '\t' << answers[i] << '\n';
    pairs.close();
    base = test::binary_command() + " train --weights " + model.dat_path + " --config " + model.config_path +
           " --tokenizer " + test::tiny_tokenizer_path() + " --train-data " + dir.file("pairs.tsv") +
           " --seq-len 32 --log-every 0 --lr 0.003";
  }
  // `ranks` processes of `args` (rank r's stdout/stderr in rR.out / rR.err), run together; their exit codes.
  std::vector<int> run(int ranks, const std::string& args, const std::string& name) const {
    return run_each(std::vector<std::string>(static_cast<size_t>(ranks), args), name);
  }
  // One process a rank, rank r with `args[r]` (which may name its own --train-data).
  std::vector<int> run_each(const std::vector<std::string>& args, const std::string& name) const {
    const int ranks = static_cast<int>(args.size());
    std::string script = "cd " + dir.path().string() + "\n";
    for (int r = 0; r < ranks; ++r) {
      const std::string& a = args[static_cast<size_t>(r)];
      std::string command = base;
      const std::string pairs = " --train-data " + dir.file("pairs.tsv");
      if (a.find("--train-data") != std::string::npos) command.erase(command.find(pairs), pairs.size());
      script += "(RANK=" + std::to_string(r) + " WORLD_SIZE=" + std::to_string(ranks) + " LOCAL_RANK=" +
                std::to_string(r) + " " + command + " " + a + " --dist-init file://" + dir.file(name + ".store") +
                " > " + name + "-r" + std::to_string(r) + ".out 2> " + name + "-r" + std::to_string(r) +
                ".err; echo $? > " + name + "-r" + std::to_string(r) + ".rc) &\n";
    }
    script += "wait\n";
    std::ofstream(dir.file(name + ".sh")) << script;
    test::run_shell("bash " + dir.file(name + ".sh"));
    std::vector<int> codes;
    for (int r = 0; r < ranks; ++r) codes.push_back(std::stoi(test::slurp(dir.file(name + "-r" + std::to_string(r) + ".rc"))));
    return codes;
  }
  std::string err(const std::string& name, int rank) const {
    return test::slurp(dir.file(name + "-r" + std::to_string(rank) + ".err"));
  }
  std::vector<double> losses(const std::string& metrics, const char* key = "loss") const {
    std::vector<double> out;
    std::ifstream in(dir.file(metrics));
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json m = nlohmann::json::parse(line);
      if (m.contains(key)) out.push_back(m[key].get<double>());
    }
    return out;
  }
};

// A TCP socket on a port the kernel picks, on every address (as a server holds one), listening when asked;
// closed when it goes.
class BoundSocket {
 public:
  explicit BoundSocket(bool listening) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof addr;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        (listening && ::listen(fd_, 1) != 0) || ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
      throw std::runtime_error(std::string("test socket: ") + std::strerror(errno));
    port_ = ntohs(addr.sin_port);
  }
  ~BoundSocket() {
    if (fd_ >= 0) ::close(fd_);
  }
  BoundSocket(const BoundSocket&) = delete;
  BoundSocket& operator=(const BoundSocket&) = delete;
  int port() const { return port_; }

 private:
  int fd_;
  int port_ = 0;
};

double worst_relative(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = a.size() == b.size() ? 0 : 1e9;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) worst = std::max(worst, std::fabs(a[i] / b[i] - 1));
  return worst;
}

// 2 ranks x batch 2 == 1 rank x batch 4, step for step, in every update mode; the replicas stay bitwise equal
// (checked by the run itself at its end) and only rank 0 writes. fp32 masters agree to 1e-5 relative (2e-6
// measured); a bf16 master's gradients are bf16, and two half-batch gradients summed then rounded differ from one
// full-batch gradient by bf16 rounding (4.9e-4 measured over 4 steps): 2e-3 there.
TEST(DistributedCli, TwoRanksTrainAsOneRankWithTheirCombinedBatch) {
  const Job job;
  const std::vector<std::tuple<std::string, std::string, double>> modes = {
      {"plain", "--eval-data " + job.dir.file("pairs.tsv") + " --eval-every 2", 1e-5},
      {"fused", "--fused-optimizer --grad-checkpoint", 1e-5},
      {"int8-bf16", "--optimizer-state-mode int8 --master-dtype bfloat16", 2e-3},
      {"accum", "--grad-accum-steps 2", 1e-5},
  };
  for (const auto& [name, flags, tolerance] : modes) {
    const std::string one = name + "-one.jsonl", two = name + "-two.jsonl";
    // With accumulation, rank batches of 1 x 2 micro-batches x 2 ranks against one rank's batch of 4.
    const std::string two_batch = name == "accum" ? "--batch-size 1" : "--batch-size 2";
    ASSERT_EQ(test::run_shell(job.base + " --steps 4 --batch-size 4 " + (name == "accum" ? "" : flags) +
                              " --metrics-jsonl " + job.dir.file(one)).code, 0) << name;
    const std::vector<int> codes = job.run(2, "--steps 4 " + two_batch + " " + flags + " --metrics-jsonl " +
                                                  job.dir.file(two) + " --checkpoint-dir " + job.dir.file(name + "-ck"),
                                           name);
    ASSERT_EQ(codes, std::vector<int>({0, 0})) << name << "\n" << job.err(name, 0) << job.err(name, 1);
    EXPECT_NE(job.err(name, 0).find("the 2 replicas are bitwise identical"), std::string::npos) << job.err(name, 0);
    const double worst = worst_relative(job.losses(two), job.losses(one));
    std::printf("%s: 2 ranks vs 1 rank, worst relative loss difference %.3g over 4 steps\n", name.c_str(), worst);
    EXPECT_LT(worst, tolerance) << name;
    // The eval set shared out over the ranks, summed: one process's eval loss, on weights that differ by the
    // training's rounding (1.8e-5 measured after 2 and 4 steps; the sharing itself is exact: Trainer test).
    if (name == "plain") {
      EXPECT_EQ(job.losses(two, "eval_loss").size(), 2u);
      EXPECT_LT(worst_relative(job.losses(two, "eval_loss"), job.losses(one, "eval_loss")), 1e-4);
    }
    EXPECT_EQ(job.losses(two).size(), 4u);
    EXPECT_EQ(fs::exists(job.dir.file(name + "-ck")), true);
  }
}

// A mixture-of-experts model goes through data parallel and ZeRO-1 as the dense one does (no expert parallelism:
// docs/distributed.md): each rank routes its own tokens, and 2 ranks x batch 2 take the step of 1 rank x batch 4.
// With 64 experts and one a token, most experts get no token on either rank: in one process such an expert has no
// gradient and AdamW leaves it alone; the ranks sum zeros for it, and without the summed "had a gradient" flags
// they would step it (weight decay moving it by lr x 0.5 of itself, up to 2e-4 here). One step, so that no routing
// can flip between the runs; a first Adam step is about lr x sign(g), so the summed gradients' rounding moves an
// element whose gradient is near 0 by up to ~1e-5: the tolerance.
TEST(DistributedCli, AMixtureOfExpertsTakesTheOneRankStep) {
  Qwen3Config moe = test::trainable_tiny_config();
  moe.num_experts = 64;
  moe.num_experts_per_tok = 1;
  moe.moe_intermediate_size = 16;
  moe.mlp_only_layers = {1};
  const Job job(moe);
  for (const auto& [name, flags] : std::vector<std::pair<std::string, std::string>>{
           {"moe-plain", ""}, {"moe-fused", "--fused-optimizer --grad-checkpoint"}, {"moe-shard", "--shard-optimizer-state"}}) {
    const std::string common = " --steps 1 --weight-decay 0.5 " + flags + " --checkpoint-dir ";
    ASSERT_EQ(test::run_shell(job.base + " --batch-size 4" + common + job.dir.file(name + "-one")).code, 0) << name;
    const std::vector<int> codes = job.run(2, "--batch-size 2" + common + job.dir.file(name + "-two"), name);
    ASSERT_EQ(codes, std::vector<int>({0, 0})) << name << "\n" << job.err(name, 0) << job.err(name, 1);
    const auto one = load_checkpoint(*latest_checkpoint(job.dir.file(name + "-one")));
    const auto two = load_checkpoint(*latest_checkpoint(job.dir.file(name + "-two")));
    ASSERT_EQ(one.tensors.size(), two.tensors.size());
    int experts = 0;
    for (size_t i = 0; i < one.tensors.size(); ++i) {
      const auto& [key, a] = one.tensors[i];
      const at::Tensor& b = two.tensors[i].second;
      ASSERT_EQ(key, two.tensors[i].first);
      experts += key.find(".mlp.experts.") != std::string::npos;
      EXPECT_TRUE(at::allclose(a.to(at::kDouble), b.to(at::kDouble), 1e-5, 2e-5))
          << name << " " << key << ": max |diff| " << (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
    }
    EXPECT_GT(experts, 64) << "the experts' tensors are in the checkpoint";
  }
}

// --shard-optimizer-state (ZeRO-1): each rank updates its share and sends it; the run is the unshared one to the
// bit (the same random streams), its checkpoint is the same bytes (the state gathered to rank 0), and it resumes
// on one rank. With int8 moments and a bf16 master, where the stochastic rounding would show a changed stream.
// Ranks started with another defining option or other data refuse to start, every one naming what differs (they
// trained and exited 0, their replicas apart from the first step); paths of the same content are no difference.
TEST(DistributedCli, RanksThatWouldTrainDifferentRunsRefuseToStart) {
  const Job job;
  std::ofstream(job.dir.file("other.tsv")) << "hi\tthere\n";
  std::filesystem::copy_file(job.dir.file("pairs.tsv"), job.dir.file("same.tsv"));
  const std::string common = " --steps 1 --dist-timeout 60";
  const auto codes = job.run_each({common + " --seed 1", common + " --seed 2 --batch-size 2 --train-data " +
                                                            job.dir.file("other.tsv")},
                                  "differ");
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(codes[static_cast<size_t>(r)], 1) << job.err("differ", r);
    EXPECT_NE(job.err("differ", r).find("the ranks were started with different --train-data's content, batch_size, seed"),
              std::string::npos)
        << job.err("differ", r);
  }
  EXPECT_NE(job.err("differ", 1).find("rank 1: batch_size = 2 differs from rank 0's"), std::string::npos)
      << job.err("differ", 1);
  // The same content at another path is the same run.
  const auto same = job.run_each({common, common + " --train-data " + job.dir.file("same.tsv")}, "same");
  EXPECT_EQ(same, std::vector<int>({0, 0})) << job.err("same", 0) << job.err("same", 1);
}

TEST(DistributedCli, ShardedOptimizerStateIsTheUnsharedRunBitForBit) {
  const Job job;
  for (const std::string update : {"plain", "fused"}) {
    const std::string flags = "--steps 3 --batch-size 2 --optimizer-state-mode int8 --master-dtype bfloat16 " +
                              std::string(update == "fused" ? "--fused-optimizer " : "");
    const std::string plain = update + "-plain", shard = update + "-shard";
    ASSERT_EQ(job.run(2, flags + "--checkpoint-dir " + job.dir.file(plain) + " --metrics-jsonl " +
                             job.dir.file(plain + ".jsonl"),
                      plain),
              std::vector<int>({0, 0}));
    ASSERT_EQ(job.run(2, flags + "--shard-optimizer-state --checkpoint-dir " + job.dir.file(shard) + " --metrics-jsonl " +
                             job.dir.file(shard + ".jsonl"),
                      shard),
              std::vector<int>({0, 0}))
        << job.err(shard, 0) << job.err(shard, 1);
    EXPECT_EQ(job.losses(shard + ".jsonl"), job.losses(plain + ".jsonl")) << update;
    EXPECT_NE(job.err(shard, 0).find("the 2 replicas are bitwise identical"), std::string::npos);
    const auto a = load_checkpoint(*latest_checkpoint(job.dir.file(plain)));
    const auto b = load_checkpoint(*latest_checkpoint(job.dir.file(shard)));
    ASSERT_EQ(a.tensors.size(), b.tensors.size());
    for (size_t i = 0; i < a.tensors.size(); ++i) {
      EXPECT_EQ(a.tensors[i].first, b.tensors[i].first);
      EXPECT_TRUE(a.tensors[i].second.equal(b.tensors[i].second)) << update << " " << a.tensors[i].first;
    }
    // The shared-out checkpoint resumes on one rank with the same global batch.
    const auto r = test::run_shell(job.base + " --steps 4 --batch-size 4 " +
                                   std::string(update == "fused" ? "--fused-optimizer " : "") +
                                   "--optimizer-state-mode int8 --master-dtype bfloat16 --resume --checkpoint-dir " +
                                   job.dir.file(shard));
    EXPECT_EQ(r.code, 0) << r.err;
  }
}

// The launcher path without --dist-init: MASTER_ADDR:MASTER_PORT, a TCPStore served by rank 0 (a free port of
// --shard-optimizer-state sums each gradient onto its owner only and a rank then drops the gradients it does not
// own: after backward, rank 0 of 2 holds about half of them (its share) where the unshared run holds all. Read
// from the measured report's allocated tensor bytes (exact, the counting allocator), on a model whose gradients
// (15 MiB in fp32) stand well above the rest.
TEST(DistributedCli, ShardedRanksHoldTheirShareOfTheGradients) {
  Job job;
  SynthOptions s;
  s.config = test::trainable_tiny_config();
  s.config.hidden_size = 256;
  s.config.num_hidden_layers = 4;
  s.config.num_attention_heads = 8;
  s.config.num_key_value_heads = 2;
  s.config.head_dim = 32;
  s.config.intermediate_size = 1024;
  s.out_dir = job.dir.file("mid");
  const SynthResult mid = write_synthetic_model(s);
  job.base = test::binary_command() + " train --weights " + mid.dat_path + " --config " + mid.config_path +
             " --tokenizer " + test::tiny_tokenizer_path() + " --train-data " + job.dir.file("pairs.tsv") +
             " --seq-len 32 --log-every 0";
  double held[2] = {0, 0};
  for (int sharded = 0; sharded < 2; ++sharded) {
    const std::string name = sharded ? "held-shard" : "held-plain";
    const std::string report = job.dir.file(name + ".json");
    ASSERT_EQ(job.run(2, std::string("--steps 1 --batch-size 2 ") + (sharded ? "--shard-optimizer-state " : "") +
                             "--vram-report " + report,
                      name),
              std::vector<int>({0, 0}))
        << job.err(name, 0) << job.err(name, 1);
    const nlohmann::json r = nlohmann::json::parse(test::slurp(report));
    double batch_ready = -1, backward_done = -1;
    for (const auto& sample : r["Samples"]) {
      if (sample["Phase"] == "batch_ready") batch_ready = sample["AllocatedMiB"].get<double>();
      if (sample["Phase"] == "backward_done") backward_done = sample["AllocatedMiB"].get<double>();
      // The memory model knows the share: each phase's predicted peak within 15% of the measured one.
      const double measured = sample["PeakMiB"].get<double>(), predicted = sample["PredictedMiB"].get<double>();
      if (measured >= 1.0) {
        EXPECT_NEAR(predicted, measured, 0.15 * measured) << name << " " << sample["Phase"];
      }
    }
    ASSERT_GE(batch_ready, 0);
    ASSERT_GE(backward_done, 0);
    held[sharded] = backward_done - batch_ready;
  }
  std::printf("gradients held after backward: %.1f MiB unshared, %.1f MiB sharded (rank 0 of 2)\n", held[0], held[1]);
  EXPECT_GT(held[0], 14.0);
  EXPECT_LT(held[1], 0.65 * held[0]);
  EXPECT_GT(held[1], 0.35 * held[0]);
}

// the loopback, found by binding port 0).
TEST(DistributedCli, TcpStoreFromMasterAddrAndPort) {
  const Job job;
  const int port = BoundSocket(/*listening=*/false).port();  // free now: closed again at once
  const std::string env = "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) + " WORLD_SIZE=2 ";
  const std::string flags = " --steps 2 --batch-size 2 --dist-timeout 30";
  const std::string script = "cd " + job.dir.path().string() + "\n(" + env + "RANK=0 " + job.base + flags +
                             " --metrics-jsonl m.jsonl 2> r0.err; echo $? > r0.rc) &\n(" + env + "RANK=1 " + job.base +
                             flags + " 2> r1.err; echo $? > r1.rc) &\nwait\n";
  std::ofstream(job.dir.file("tcp.sh")) << script;
  test::run_shell("bash " + job.dir.file("tcp.sh"));
  EXPECT_EQ(test::slurp(job.dir.file("r0.rc")), "0\n") << test::slurp(job.dir.file("r0.err"));
  EXPECT_EQ(test::slurp(job.dir.file("r1.rc")), "0\n") << test::slurp(job.dir.file("r1.err"));
  EXPECT_EQ(job.losses("m.jsonl").size(), 2u);
}

// torchrun's agent serves the store itself (TORCHELASTIC_USE_AGENT_STORE=True): every rank is a client, and each
// restart attempt (TORCHELASTIC_RESTART_COUNT) works under its own prefix, as PyTorch's workers do, because the
// agent's store keeps the earlier attempt's keys. This test plays the agent: a TCPStore server in this process,
// and two attempts of a 2-rank job on it.
TEST(DistributedCli, TorchrunAgentStoreAcrossRestarts) {
  const Job job;
  c10d::TCPStoreOptions o;
  o.port = 0;
  o.isServer = true;
  o.waitWorkers = false;
  o.timeout = std::chrono::seconds(60);
  const auto agent = make_tcp_store("127.0.0.1", o);
  const std::string env = "TORCHELASTIC_USE_AGENT_STORE=True MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                          std::to_string(agent->getPort()) + " WORLD_SIZE=2 ";
  const std::string flags = " --steps 2 --batch-size 2 --dist-timeout 30";
  for (const std::string attempt : {"0", "1"}) {
    const std::string run_env = env + "TORCHELASTIC_RESTART_COUNT=" + attempt + " ";
    const std::string a = "a" + attempt;
    const std::string script = "cd " + job.dir.path().string() + "\n(" + run_env + "RANK=0 " + job.base + flags +
                               " --metrics-jsonl " + a + ".jsonl 2> " + a + "r0.err; echo $? > " + a + "r0.rc) &\n(" +
                               run_env + "RANK=1 " + job.base + flags + " 2> " + a + "r1.err; echo $? > " + a +
                               "r1.rc) &\nwait\n";
    std::ofstream(job.dir.file(a + ".sh")) << script;
    test::run_shell("bash " + job.dir.file(a + ".sh"));
    EXPECT_EQ(test::slurp(job.dir.file(a + "r0.rc")), "0\n") << "attempt " << attempt << ": " << test::slurp(job.dir.file(a + "r0.err"));
    EXPECT_EQ(test::slurp(job.dir.file(a + "r1.rc")), "0\n") << "attempt " << attempt << ": " << test::slurp(job.dir.file(a + "r1.err"));
    EXPECT_EQ(job.losses(a + ".jsonl").size(), 2u) << "attempt " << attempt;
  }
  EXPECT_GT(agent->getNumKeys(), 0) << "the ranks joined through the agent's store";
}

// The launcher itself: PyTorch's torchrun (--standalone: its own rendezvous store and agent; --no-python: the
// binary is the worker; --local-addr: the agent's store on loopback, whatever the host name resolves to) starts
// two ranks that train as one process does with their combined batch. Runs where
// torchrun is installed (scripts/torch2-check.sh's Debian 13 root has python3-torch); skips elsewhere.
TEST(DistributedCli, UnderTorchrunItself) {
  if (test::run_shell("command -v torchrun").code != 0) GTEST_SKIP() << "torchrun is not installed here";
  // A PyTorch built without libuv (Debian's) cannot run its own torchrun: tests/torchrun_no_libuv.py is torchrun
  // with the socket transport as the store's default. Where the plain torchrun can make a store, it runs.
  const bool libuv =
      test::run_shell("python3 -c 'import torch.distributed as d; d.TCPStore(\"127.0.0.1\", 0, is_master=True)'").code == 0;
  const std::string torchrun =
      libuv ? std::string("torchrun") : "python3 " + test::source_dir() + "/tests/torchrun_no_libuv.py";
  const Job job;
  ASSERT_EQ(test::run_shell(job.base + " --steps 3 --batch-size 4 --metrics-jsonl " + job.dir.file("one.jsonl")).code, 0);
  const auto r = test::run_shell("cd " + job.dir.path().string() +
                                 " && timeout 120 " + torchrun +
                                 " --standalone --local-addr 127.0.0.1 --nproc-per-node 2 --max-restarts 0 --no-python " +
                                 job.base + " --steps 3 --batch-size 2 --dist-timeout 60 --metrics-jsonl " +
                                 job.dir.file("two.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE((r.out + r.err).find("the 2 replicas are bitwise identical"), std::string::npos) << r.out << r.err;
  EXPECT_NE((r.out + r.err).find("data parallel: 2 ranks (torchrun, gloo), this is rank 0 on cpu"), std::string::npos) << r.out << r.err;
  EXPECT_EQ(job.losses("two.jsonl").size(), 3u);
  EXPECT_LT(worst_relative(job.losses("two.jsonl"), job.losses("one.jsonl")), 1e-5);
}

// A MASTER_PORT that rank 0 cannot serve (something else listens there): one named error, without libtorch's own
// log lines above it (c10d's socket warnings through glog, unless TORCH_CPP_LOG_LEVEL asks for them).
TEST(DistributedCli, ATakenMasterPortIsOneNamedError) {
  const Job job;
  const BoundSocket taken(/*listening=*/true);
  const std::string port = std::to_string(taken.port());
  const auto r = test::run_shell("MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " WORLD_SIZE=2 RANK=0 " + job.base +
                                 " --steps 1 --dist-timeout 5");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("error: torchrun rank 0 of 2: cannot serve the store at MASTER_ADDR:MASTER_PORT 127.0.0.1:" + port),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("[c10d]"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("InitGoogleLogging"), std::string::npos) << r.err;
}

// A checkpoint of 2 ranks resumes on 1 rank with the same global batch, as the 2 ranks would have continued.
TEST(DistributedCli, TwoRankCheckpointResumesOnOneRank) {
  const Job job;
  ASSERT_EQ(job.run(2, "--steps 2 --batch-size 2 --checkpoint-dir " + job.dir.file("ck"), "first"),
            std::vector<int>({0, 0}));
  fs::copy(job.dir.file("ck"), job.dir.file("ck2"), fs::copy_options::recursive);
  fs::remove(job.dir.file("ck2/.lock"));
  ASSERT_EQ(test::run_shell(job.base + " --steps 4 --batch-size 4 --resume --checkpoint-dir " + job.dir.file("ck") +
                            " --metrics-jsonl " + job.dir.file("one.jsonl")).code, 0);
  ASSERT_EQ(job.run(2, "--steps 4 --batch-size 2 --resume --checkpoint-dir " + job.dir.file("ck2") +
                           " --metrics-jsonl " + job.dir.file("two.jsonl"), "second"),
            std::vector<int>({0, 0}))
      << job.err("second", 0) << job.err("second", 1);
  EXPECT_EQ(job.losses("one.jsonl").size(), 2u);
  EXPECT_LT(worst_relative(job.losses("two.jsonl"), job.losses("one.jsonl")), 1e-5);
}

// A signal to one rank stops the job after one step on every rank (the ranks agree on it), and rank 0 writes one
// complete checkpoint of that step.
TEST(DistributedCli, ASignalToOneRankStopsTheJobWithOneCheckpoint) {
  const Job job;
  const std::string common = " --steps 100000 --batch-size 2 --checkpoint-dir " + job.dir.file("ck") +
                             " --dist-timeout 30 --dist-init file://" + job.dir.file("s.store");
  const std::string script = "cd " + job.dir.path().string() + "\n" +
                             "RANK=0 WORLD_SIZE=2 " + job.base + common + " --metrics-jsonl m.jsonl 2> r0.err &\n" +
                             "p0=$!\nRANK=1 WORLD_SIZE=2 " + job.base + common + " 2> r1.err &\np1=$!\n" +
                             "for i in $(seq 300); do [ -s m.jsonl ] && [ $(wc -l < m.jsonl) -ge 3 ] && break; sleep 0.1; done\n" +
                             "kill -TERM $p1\nwait $p0; echo $? > r0.rc\nwait $p1; echo $? > r1.rc\n";
  std::ofstream(job.dir.file("sig.sh")) << script;
  test::run_shell("bash " + job.dir.file("sig.sh"));
  EXPECT_EQ(test::slurp(job.dir.file("r0.rc")), "143\n") << test::slurp(job.dir.file("r0.err"));
  EXPECT_EQ(test::slurp(job.dir.file("r1.rc")), "143\n") << test::slurp(job.dir.file("r1.err"));
  const auto last = latest_checkpoint(job.dir.file("ck"));
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(load_checkpoint(*last, "\x01").step, static_cast<int64_t>(job.losses("m.jsonl").size()));
}

// A rank that dies: the survivor fails with a message naming the collective, within the timeout; a rank whose
// peer never comes fails to join within it. (Ranks started with other step counts now refuse to start: the dead
// rank is killed.)
TEST(DistributedCli, ADeadRankMakesTheOtherExitWithAnError) {
  const Job job;
  // Rank 1 is killed (SIGKILL) once step 1 is done; both were started for a thousand steps.
  const std::string common = " --steps 1000 --batch-size 2 --dist-timeout 5 --dist-init file://" + job.dir.file("d.store");
  std::string script = "cd " + job.dir.path().string() + "\n(RANK=0 WORLD_SIZE=2 " + job.base + common +
                       " --metrics-jsonl m.jsonl 2> r0.err; echo $? > r0.rc) &\nRANK=1 WORLD_SIZE=2 " + job.base + common +
                       " 2> r1.err &\np1=$!\nfor i in $(seq 600); do [ -s m.jsonl ] && break; sleep 0.05; done\n"
                       "kill -9 $p1\nwait\n";
  std::ofstream(job.dir.file("dead.sh")) << script;
  const auto t0 = std::chrono::steady_clock::now();
  test::run_shell("bash " + job.dir.file("dead.sh"));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(std::stoi(test::slurp(job.dir.file("r0.rc"))), 1);
  const std::string err = test::slurp(job.dir.file("r0.err"));
  EXPECT_NE(err.find("error: rank 0 of 2: "), std::string::npos) << err;
  EXPECT_NE(err.find("failed (another rank died or stalled past --dist-timeout?)"), std::string::npos) << err;
  EXPECT_LT(seconds, 30) << err;
  // Alone in a world of two.
  const auto r = test::run_shell("RANK=0 WORLD_SIZE=2 " + job.base + " --steps 1 --dist-timeout 2 --dist-init file://" +
                                 job.dir.file("alone.store"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("error: rank 0 of 2"), std::string::npos) << r.err;
  const auto bad = test::run_shell("RANK=2 WORLD_SIZE=2 " + job.base + " --steps 1");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("RANK=2 is not below WORLD_SIZE=2"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace qwen3
