#include "qwen3/dist/data_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
// Gloo where this libtorch has it (Debian's 1.13 and PyTorch's wheels build it; its headers need <gloo/...>,
// libgloo-dev on Debian). Without it the trainer runs one process and says why it cannot run more.
#if defined(USE_C10D_GLOO) && __has_include(<gloo/config.h>)
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#define QWEN3_HAVE_GLOO 1
#endif
#include <fmt/format.h>

#include <csignal>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "dist/c10d_backend.h"
#include "dist/tcp_store.h"
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

// The first line of a library's message (c10::Error appends a stack trace after it).
std::string first_line(const std::exception& e) {
  const auto* c10 = dynamic_cast<const c10::Error*>(&e);
  const std::string text = c10 ? c10->what_without_backtrace() : e.what();
  return text.substr(0, text.find('\n'));
}

// Turns off TCPStoreOptions::useLibUV where this libtorch has the field (PyTorch 2.2 and later); false where it
// has not (or it is off already): nothing to retry with. A template, so that a libtorch without the field never
// compiles the assignment.
template <typename Options>
auto without_libuv(Options& o, int) -> decltype(o.useLibUV, bool()) {
  if (!o.useLibUV) return false;
  o.useLibUV = false;
  return true;
}
template <typename Options>
bool without_libuv(Options&, long) {
  return false;
}

}  // namespace

c10::intrusive_ptr<c10d::TCPStore> make_tcp_store(const std::string& host, c10d::TCPStoreOptions options) {
  try {
    return c10::make_intrusive<c10d::TCPStore>(host, options);
  } catch (const std::exception& e) {
    if (std::string_view(e.what()).find("without libuv") == std::string_view::npos || !without_libuv(options, 0))
      throw;
  }
  return c10::make_intrusive<c10d::TCPStore>(host, options);
}

DistEnv dist_env_from_environment() {
  DistEnv env;
  if (!read_launcher(env, "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK") &&
      !read_launcher(env, "slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"))
    read_launcher(env, "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK");
  if (const char* addr = std::getenv("MASTER_ADDR")) env.master_addr = addr;
  // A port past 65535 was cast to 16 bits (99999 became 34463), and the rank waited there for peers that were
  // never coming; a word was called "not a rank or a count".
  if (const char* port = std::getenv("MASTER_PORT"); port && *port) {
    char* end = nullptr;
    const long v = std::strtol(port, &end, 10);
    if (*end != '\0' || v < 1 || v > 65535)
      throw UsageError(fmt::format("MASTER_PORT='{}' is not a TCP port (1 to 65535)", port));
    env.master_port = static_cast<int>(v);
  }
  return env;
}

c10::Device device_for_rank(const c10::Device& requested, const DistEnv& env) {
  if (!requested.is_cuda() || requested.has_index()) return requested;
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
}

struct DataParallel::Group {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<CollectiveBackend> pg;
  // Where the collectives' buffers live: the GPU for NCCL, the CPU for Gloo (a GPU run's tensors are staged
  // through host memory then: Gloo's reduce takes CPU tensors only).
  c10::Device staging = c10::Device(c10::kCPU);
};

DataParallel::DataParallel(const DistEnv& env, const std::string& init, std::chrono::milliseconds timeout,
                           const c10::Device& device)
    : env_(env), timeout_(timeout) {
  constexpr std::string_view kFile = "file://";
  // Its form is checked in one process too: a script's flag is wrong before it is ever run by a launcher.
  if (!init.empty() && init.rfind(kFile, 0) != 0)
    throw UsageError("--dist-init '" + init + "': give file://PATH, or nothing for MASTER_ADDR:MASTER_PORT");
  if (env_.world_size <= 1) return;
  // A peer that dies mid-collective closes its sockets, and Gloo's next write to one raises SIGPIPE, which
  // killed this rank silently (exit 141) instead of letting the collective fail with its message and exit 1.
  // Python-launched PyTorch ignores SIGPIPE from the start; so does a rank of ours from joining on.
  std::signal(SIGPIPE, SIG_IGN);
  bool nccl = false;
#ifdef QWEN3_HAVE_NCCL
  nccl = device.is_cuda();
#endif
#ifndef QWEN3_HAVE_GLOO
  if (!nccl)
    throw Error(fmt::format("{} rank {} of {}: this build's libtorch has no c10d Gloo (USE_C10D_GLOO and the gloo "
                            "headers){}, so it trains in one process only (docs/distributed.md)",
                            env_.launcher, env_.rank, env_.world_size,
                            device.is_cuda() ? " nor NCCL" : " and NCCL runs on CUDA devices only"));
#endif
  group_ = std::make_unique<Group>();
  backend_ = nccl ? "nccl" : "gloo";
  if (!init.empty()) {
    group_->store = c10::make_intrusive<c10d::FileStore>(init.substr(kFile.size()), env_.world_size);
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
    try {
      group_->store = make_tcp_store(env_.master_addr, o);
    } catch (const std::exception& e) {
      throw Error(fmt::format("{} rank {} of {}: cannot {} the store at MASTER_ADDR:MASTER_PORT {}:{} ({}): {}",
                              env_.launcher, env_.rank, env_.world_size, o.isServer ? "serve" : "reach",
                              env_.master_addr, env_.master_port,
                              o.isServer ? "is the port taken?" : "is rank 0 or torchrun's agent up?",
                              first_line(e)));
    }
    // The agent's store outlives the workers: after a restart (torchrun --max-restarts) it still holds the
    // previous attempt's keys, Gloo's peer addresses among them. Each attempt works under its own prefix, the one
    // PyTorch's own workers use, so a restarted job never reads a dead peer's address.
    if (agent_store) {
      const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
      group_->store = c10::make_intrusive<c10d::PrefixStore>(
          std::string("/worker/attempt_") + (attempt && *attempt ? attempt : "0"), group_->store);
    }
  }
  group_->store->setTimeout(timeout);
  // Gloo's address: loopback on one machine, the hostname's across machines.
  const bool one_machine =
      init.rfind(kFile, 0) == 0 || env_.master_addr == "127.0.0.1" || env_.master_addr == "localhost";
  try {
    if (nccl)
      join_nccl(device);
    else
      join_gloo(one_machine);
  } catch (const std::exception& e) {
    throw Error(fmt::format("rank {} of {}: cannot join the {} process group within {} s: {}", env_.rank,
                            env_.world_size, backend_, timeout.count() / 1000, first_line(e)));
  }
}

// Each is called only where the constructor found its backend compiled in (the other build has an empty body).
void DataParallel::join_nccl([[maybe_unused]] const c10::Device& device) {
#ifdef QWEN3_HAVE_NCCL
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout_;
  group_->staging = device;
  group_->pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(group_->store, env_.rank, env_.world_size, options);
#endif
}

void DataParallel::join_gloo([[maybe_unused]] bool one_machine) {
#ifdef QWEN3_HAVE_GLOO
  auto options = c10d::ProcessGroupGloo::Options::create(timeout_);
  if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME"))  // the user's choice of interface
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(iface));
  else if (one_machine)
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  else
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  group_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(group_->store, env_.rank, env_.world_size, options);
#endif
}

DataParallel::~DataParallel() = default;

void DataParallel::all_reduce_sum(std::vector<at::Tensor>& tensors, const char* what) {
  all_reduce_sum_async(tensors, what)->wait();
}

void DataParallel::broadcast(at::Tensor& tensor, int root, const char* what) {
  if (!group_) return;
  at::Tensor t = tensor.is_contiguous() && tensor.device() == group_->staging ? tensor
                                                                            : tensor.to(group_->staging).contiguous();
  // A broadcast moves bytes, but Gloo takes only the types it knows (no bf16, no int16): 16-bit values travel
  // as fp16 of the same bits, untouched.
  std::vector<at::Tensor> data = {t.element_size() == 2 ? t.view(at::kHalf) : t};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  try {
    group_->pg->broadcast(data, options)->wait(timeout_);
  } catch (const std::exception& e) {
    throw Error(fmt::format("rank {} of {}: broadcast of the {} failed (another rank died or stalled past "
                            "--dist-timeout?): {}",
                            env_.rank, env_.world_size, what, first_line(e)));
  }
  if (t.unsafeGetTensorImpl() != tensor.unsafeGetTensorImpl()) tensor.copy_(t);
}

// One collective a dtype: the tensors of a bucket flattened into one buffer (a tensor alone that is already the
// buffer's dtype and contiguous is reduced in place).
struct DataParallel::Pending::Bucket {
  std::vector<size_t> members;  // indices into tensors_
  at::Tensor flat;
  c10::intrusive_ptr<c10d::Work> work;
};

DataParallel::Pending::~Pending() = default;

namespace {
// The dtype a tensor is summed in: Gloo in libtorch 1.13 has no 16-bit sum, so 16-bit floats are summed in fp32
// and rounded back (the same on every rank).
at::ScalarType sum_type(at::ScalarType t, const char* what) {
  if (t == at::kFloat || t == at::kBFloat16 || t == at::kHalf) return at::kFloat;
  if (t == at::kDouble || t == at::kLong) return t;
  throw Error(std::string("all-reduce of the ") + what + ": " + c10::toString(t) + " tensors are not summed");
}
}  // namespace

std::unique_ptr<DataParallel::Pending> DataParallel::all_reduce_sum_async(std::vector<at::Tensor> tensors,
                                                                           const char* what) {
  return launch_sum(std::move(tensors), -1, what);
}

std::unique_ptr<DataParallel::Pending> DataParallel::reduce_sum_async(std::vector<at::Tensor> tensors, int root,
                                                                       const char* what) {
  if (root < 0 || root >= env_.world_size)
    throw Error(fmt::format("reduce of the {}: rank {} is not in a world of {}", what, root, env_.world_size));
  return launch_sum(std::move(tensors), root, what);
}

std::unique_ptr<DataParallel::Pending> DataParallel::launch_sum(std::vector<at::Tensor> tensors, int root,
                                                                const char* what) {
  auto pending = std::unique_ptr<Pending>(new Pending());
  pending->owner_ = this;
  pending->what_ = what;
  pending->root_ = root;
  if (!group_ || tensors.empty()) return pending;
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble, at::kLong}) {
    Pending::Bucket bucket;
    std::vector<at::Tensor> parts;
    for (size_t i = 0; i < tensors.size(); ++i)
      if (sum_type(tensors[i].scalar_type(), what) == dtype) {
        bucket.members.push_back(i);
        parts.push_back(tensors[i].to(group_->staging, dtype).reshape({-1}));
      }
    if (parts.empty()) continue;
    const at::Tensor& only = tensors[bucket.members.front()];
    const bool in_place = parts.size() == 1 && only.scalar_type() == dtype && only.is_contiguous() &&
                          only.device() == group_->staging;
    bucket.flat = in_place ? only : at::cat(parts);
    std::vector<at::Tensor> data = {bucket.flat};
    try {
      if (root < 0) {
        bucket.work = group_->pg->allreduce(data);
      } else {
        c10d::ReduceOptions options;
        options.rootRank = root;
        bucket.work = group_->pg->reduce(data, options);
      }
    } catch (const std::exception& e) {  // c10::Error, or Gloo's own exceptions when a peer is gone
      throw Error(fmt::format("rank {} of {}: {} of the {} failed (another rank died or stalled past "
                              "--dist-timeout?): {}",
                              env_.rank, env_.world_size, root < 0 ? "all-reduce" : "reduce", what, first_line(e)));
    }
    pending->buckets_.push_back(std::move(bucket));
  }
  pending->tensors_ = std::move(tensors);
  return pending;
}

void DataParallel::Pending::wait() {
  const auto t0 = std::chrono::steady_clock::now();
  for (Bucket& bucket : buckets_) {
    try {
      bucket.work->wait(owner_->timeout_);
    } catch (const std::exception& e) {
      throw Error(fmt::format("rank {} of {}: {} of the {} failed (another rank died or stalled past "
                              "--dist-timeout?): {}",
                              owner_->env_.rank, owner_->env_.world_size, root_ < 0 ? "all-reduce" : "reduce",
                              what_, first_line(e)));
    }
    if (root_ >= 0 && root_ != owner_->env_.rank) continue;  // not this rank's sum: nothing to copy back
    if (bucket.flat.unsafeGetTensorImpl() == tensors_[bucket.members.front()].unsafeGetTensorImpl()) continue;
    int64_t at = 0;
    for (size_t i : bucket.members) {
      at::Tensor& t = tensors_[i];
      t.copy_(bucket.flat.narrow(0, at, t.numel()).view(t.sizes()));
      at += t.numel();
    }
  }
  if (!buckets_.empty())
    owner_->wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  buckets_.clear();
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
