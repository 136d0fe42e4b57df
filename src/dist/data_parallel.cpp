#include "qwen3/dist/data_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
// Gloo where this libtorch has it (Debian's 1.13 and PyTorch's wheels build it; its headers need <gloo/...>,
// libgloo-dev on Debian). Without it the trainer runs one process and says why it cannot run more.
#if defined(USE_C10D_GLOO) && __has_include(<gloo/config.h>)
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#define QWEN3_HAVE_GLOO 1
#endif
#include <fmt/format.h>

#include <cstdlib>
#include <optional>
#include <string_view>

#include "qwen3/base/error.h"

namespace qwen3 {
namespace {

std::optional<int> env_int(const char* name) {
  const char* text = std::getenv(name);
  if (!text || !*text) return std::nullopt;
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (*end != '\0' || v < 0 || v > (1 << 24)) throw UsageError(fmt::format("{}='{}' is not a rank or a count", name, text));
  return static_cast<int>(v);
}

// One launcher's variables: rank, world size, local rank (optional). The rank decides: a launcher sets it for
// each process it starts, while a world size alone is an allocation's (Slurm's salloc sets SLURM_NTASKS for a
// shell that then runs one process), not a rank of a job.
bool read_launcher(DistEnv& env, const char* launcher, const char* rank, const char* size, const char* local) {
  const auto r = env_int(rank), w = env_int(size);
  if (!r) return false;
  if (!w) throw UsageError(fmt::format("{}: {} is set but {} is not", launcher, rank, size));
  if (*w < 1 || *r >= *w) throw UsageError(fmt::format("{}: {}={} is not below {}={}", launcher, rank, *r, size, *w));
  env.launcher = launcher;
  env.rank = *r;
  env.world_size = *w;
  env.local_rank = env_int(local).value_or(0);
  return true;
}

}  // namespace

DistEnv dist_env_from_environment() {
  DistEnv env;
  if (!read_launcher(env, "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK") &&
      !read_launcher(env, "slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"))
    read_launcher(env, "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK");
  if (const char* addr = std::getenv("MASTER_ADDR")) env.master_addr = addr;
  if (const auto port = env_int("MASTER_PORT")) env.master_port = *port;
  return env;
}

struct DataParallel::Group {
  c10::intrusive_ptr<c10d::Store> store;
#ifdef QWEN3_HAVE_GLOO
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
#else
  c10::intrusive_ptr<c10d::ProcessGroup> pg;  // never made: the constructor refuses a world of more than one
#endif
};

DataParallel::DataParallel(const DistEnv& env, const std::string& init, std::chrono::milliseconds timeout)
    : env_(env), timeout_(timeout) {
  if (env_.world_size <= 1) return;
#ifndef QWEN3_HAVE_GLOO
  throw Error(fmt::format("{} rank {} of {}: this build's libtorch has no c10d Gloo (USE_C10D_GLOO and the gloo "
                          "headers), so it trains in one process only (docs/distributed.md)",
                          env_.launcher, env_.rank, env_.world_size));
#else
  group_ = std::make_unique<Group>();
  constexpr std::string_view kFile = "file://";
  if (init.rfind(kFile, 0) == 0) {
    group_->store = c10::make_intrusive<c10d::FileStore>(init.substr(kFile.size()), env_.world_size);
  } else if (!init.empty()) {
    throw UsageError("--dist-init '" + init + "': give file://PATH, or nothing for MASTER_ADDR:MASTER_PORT");
  } else {
    if (env_.master_addr.empty())
      throw UsageError(fmt::format("{} rank {} of {}: MASTER_ADDR is not set (or pass --dist-init file://PATH)",
                                   env_.launcher, env_.rank, env_.world_size));
    c10d::TCPStoreOptions o;
    o.port = static_cast<std::uint16_t>(env_.master_port);
    // torchrun's agent already serves a store on MASTER_PORT when it says so: every rank is then a client.
    const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
    const bool agent_store = agent && (std::string_view(agent) == "True" || std::string_view(agent) == "true" ||
                                       std::string_view(agent) == "1");
    o.isServer = env_.rank == 0 && !agent_store;
    o.numWorkers = static_cast<std::size_t>(env_.world_size);
    o.timeout = timeout;
    group_->store = c10::make_intrusive<c10d::TCPStore>(env_.master_addr, o);
  }
  group_->store->setTimeout(timeout);
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  // Loopback on one machine; the hostname's address across machines (GLOO_SOCKET_IFNAME picks an interface).
  if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME"))
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(iface));
  else if (init.rfind(kFile, 0) == 0 || env_.master_addr == "127.0.0.1" || env_.master_addr == "localhost")
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  else
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  try {
    group_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(group_->store, env_.rank, env_.world_size, options);
  } catch (const c10::Error& e) {
    throw Error(fmt::format("rank {} of {}: cannot join the process group within {} s: {}", env_.rank,
                            env_.world_size, timeout.count() / 1000, e.what_without_backtrace()));
  }
#endif
}

DataParallel::~DataParallel() = default;

void DataParallel::all_reduce_sum(std::vector<at::Tensor>& tensors, const char* what) {
  if (!group_ || tensors.empty()) return;
  // Gloo in libtorch 1.13 has no 16-bit sum: those are summed in fp32 and rounded back (the same on every rank).
  std::vector<std::pair<at::Tensor, at::Tensor>> narrow;  // (original, fp32 copy)
  for (at::Tensor& t : tensors)
    if (t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf) {
      narrow.emplace_back(t, t.to(at::kFloat));
      t = narrow.back().second;
    }
  struct Restore {
    std::vector<std::pair<at::Tensor, at::Tensor>>& narrow;
    std::vector<at::Tensor>& tensors;
    ~Restore() {
      size_t k = 0;
      for (at::Tensor& t : tensors)
        if (k < narrow.size() && t.unsafeGetTensorImpl() == narrow[k].second.unsafeGetTensorImpl()) {
          narrow[k].first.copy_(t);
          t = narrow[k++].first;
        }
    }
  } restore{narrow, tensors};
  // One flat buffer a dtype: one collective instead of one per tensor.
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble, at::kLong}) {
    std::vector<at::Tensor> same;
    for (const at::Tensor& t : tensors)
      if (t.scalar_type() == dtype) same.push_back(t);
    if (same.empty()) continue;
    std::vector<at::Tensor> flat = {same.size() == 1 ? same[0].contiguous() : at::cat(
                                                           [&] {
                                                             std::vector<at::Tensor> parts;
                                                             for (const at::Tensor& t : same) parts.push_back(t.reshape({-1}));
                                                             return parts;
                                                           }())};
    try {
      const auto t0 = std::chrono::steady_clock::now();
      group_->pg->allreduce(flat)->wait(timeout_);
      wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } catch (const c10::Error& e) {
      throw Error(fmt::format("rank {} of {}: all-reduce of the {} failed (another rank died or stalled past "
                              "--dist-timeout?): {}",
                              env_.rank, env_.world_size, what, e.what_without_backtrace()));
    }
    if (same.size() == 1) {
      if (!same[0].is_contiguous()) same[0].copy_(flat[0]);
      continue;
    }
    int64_t at = 0;
    for (at::Tensor& t : same) {
      t.copy_(flat[0].narrow(0, at, t.numel()).view(t.sizes()));
      at += t.numel();
    }
  }
  for (const at::Tensor& t : tensors)
    if (t.scalar_type() != at::kFloat && t.scalar_type() != at::kDouble && t.scalar_type() != at::kLong)
      throw Error(std::string("all-reduce of the ") + what + ": " + c10::toString(t.scalar_type()) +
                  " tensors are not reduced");
}

void DataParallel::broadcast(at::Tensor& tensor, int root, const char* what) {
  if (!group_) return;
  at::Tensor t = tensor.is_contiguous() ? tensor : tensor.contiguous();
  // A broadcast moves bytes, but Gloo takes only the types it knows (no bf16, no int16): 16-bit values travel
  // as fp16 of the same bits, untouched.
  std::vector<at::Tensor> data = {t.element_size() == 2 ? t.view(at::kHalf) : t};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  try {
    group_->pg->broadcast(data, options)->wait(timeout_);
  } catch (const c10::Error& e) {
    throw Error(fmt::format("rank {} of {}: broadcast of the {} failed (another rank died or stalled past "
                            "--dist-timeout?): {}",
                            env_.rank, env_.world_size, what, e.what_without_backtrace()));
  }
  if (!tensor.is_contiguous()) tensor.copy_(t);
}

struct DataParallel::Pending::Work {
  c10::intrusive_ptr<c10d::Work> work;
};

DataParallel::Pending::~Pending() = default;

std::unique_ptr<DataParallel::Pending> DataParallel::all_reduce_sum_async(std::vector<at::Tensor> tensors,
                                                                           const char* what) {
  auto pending = std::unique_ptr<Pending>(new Pending());
  pending->owner_ = this;
  pending->what_ = what;
  if (!group_ || tensors.empty()) return pending;
  std::vector<at::Tensor> parts;
  for (const at::Tensor& t : tensors) parts.push_back(t.to(at::kFloat).reshape({-1}));
  pending->flat_ = at::cat(parts);
  pending->tensors_ = std::move(tensors);
  std::vector<at::Tensor> data = {pending->flat_};
  pending->work_ = std::make_unique<Pending::Work>();
  pending->work_->work = group_->pg->allreduce(data);
  return pending;
}

void DataParallel::Pending::wait() {
  if (!work_) return;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    work_->work->wait(owner_->timeout_);
  } catch (const c10::Error& e) {
    throw Error(fmt::format("rank {} of {}: all-reduce of the {} failed (another rank died or stalled past "
                            "--dist-timeout?): {}",
                            owner_->env_.rank, owner_->env_.world_size, what_, e.what_without_backtrace()));
  }
  owner_->wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t at = 0;
  for (at::Tensor& t : tensors_) {
    t.copy_(flat_.narrow(0, at, t.numel()).view(t.sizes()));
    at += t.numel();
  }
  work_.reset();
}

double DataParallel::all_reduce_sum(double value, const char* what) {
  if (!group_) return value;
  std::vector<at::Tensor> t = {at::full({1}, value, at::kDouble)};
  all_reduce_sum(t, what);
  return t[0].item<double>();
}

int64_t DataParallel::all_reduce_sum(int64_t value, const char* what) {
  if (!group_) return value;
  std::vector<at::Tensor> t = {at::full({1}, value, at::kLong)};
  all_reduce_sum(t, what);
  return t[0].item<int64_t>();
}

std::vector<int64_t> DataParallel::all_gather(int64_t value, const char* what) {
  if (!group_) return {value};
  std::vector<at::Tensor> t = {at::zeros({env_.world_size}, at::kLong)};
  t[0][env_.rank] = value;
  all_reduce_sum(t, what);
  return std::vector<int64_t>(t[0].data_ptr<int64_t>(), t[0].data_ptr<int64_t>() + env_.world_size);
}

}  // namespace qwen3
