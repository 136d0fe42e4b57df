// Data-parallel training on PyTorch's c10d (docs/distributed.md): who this process is, from the launcher's
// environment (torchrun, Slurm, Open MPI), and the few collectives the trainer needs, over a Gloo process group
// (CPU tensors). At world size 1 there is no process group and every collective is the identity, so the
// single-process trainer runs the same code.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace qwen3 {

struct DistEnv {
  int rank = 0, world_size = 1, local_rank = 0;
  std::string launcher = "none";  // torchrun | slurm | openmpi | none
  std::string master_addr;        // MASTER_ADDR (torchrun; Slurm and Open MPI jobs set it themselves)
  int master_port = 29500;        // MASTER_PORT
};

// torchrun's RANK / WORLD_SIZE / LOCAL_RANK (+ MASTER_ADDR / MASTER_PORT), else Slurm's SLURM_PROCID /
// SLURM_NTASKS / SLURM_LOCALID, else Open MPI's OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK; none: one process.
// UsageError naming the variable for a value that is not a number or a rank outside the world.
DistEnv dist_env_from_environment();

// The device a rank trains on: `--device cuda` without an index means the GPU of the rank's LOCAL_RANK (one
// process per GPU, as torchrun starts them); anything else as given.
c10::Device device_for_rank(const c10::Device& requested, const DistEnv& env);

class DataParallel {
 public:
  // `init`: "" (MASTER_ADDR:MASTER_PORT, a TCPStore served by rank 0) or "file://PATH" (a FileStore: one
  // machine, or a shared file system; what the tests use). `timeout`: how long a collective may wait for the
  // other ranks before this one fails with an error naming the step (a dead or stalled rank). `device`: where
  // the rank trains; a CUDA device takes NCCL where this libtorch has it (PyTorch's CUDA builds), else Gloo
  // with the buffers staged through host memory.
  DataParallel(const DistEnv& env, const std::string& init, std::chrono::milliseconds timeout,
               const c10::Device& device = c10::Device(c10::kCPU));
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  bool is_main() const { return env_.rank == 0; }
  const DistEnv& env() const { return env_; }
  // "gloo" or "nccl"; "" at world size 1 (no process group).
  const std::string& backend() const { return backend_; }

  // Sums over all ranks, in place. `what` names the collective in a timeout's message.
  void all_reduce_sum(std::vector<at::Tensor>& tensors, const char* what);
  double all_reduce_sum(double value, const char* what);
  int64_t all_reduce_sum(int64_t value, const char* what);
  // `root`'s tensor to every rank, in place (any dtype: 16-bit ones travel as fp16 bits).
  void broadcast(at::Tensor& tensor, int root, const char* what);
  // A sum over the ranks launched now and finished by wait(), which copies the sums back into the tensors and
  // adds the time it waited to wait_seconds(): the trainer launches a block's gradients as soon as its backward
  // has made them, so the reduction runs while the blocks before it are differentiated. One collective a dtype
  // (fp32, with 16-bit floats summed in fp32; f64; i64); all_reduce_sum is this, waited for at once.
  class Pending {
   public:
    ~Pending();
    void wait();

   private:
    friend class DataParallel;
    struct Bucket;
    DataParallel* owner_ = nullptr;
    std::vector<at::Tensor> tensors_;
    std::vector<Bucket> buckets_;
    std::string what_;
    int root_ = -1;  // -1: every rank receives the sum
  };
  std::unique_ptr<Pending> all_reduce_sum_async(std::vector<at::Tensor> tensors, const char* what);
  // The same sum delivered to `root` only (c10d's reduce): half a ring all-reduce's traffic. After wait() the
  // other ranks' tensors hold nothing meaningful (c10d may use them as scratch): they are to be dropped.
  std::unique_ptr<Pending> reduce_sum_async(std::vector<at::Tensor> tensors, int root, const char* what);
  // Seconds spent waiting in all-reduces so far (the blocking ones and the waits of the launched ones).
  double wait_seconds() const { return wait_seconds_; }

  // Every rank's value, in rank order (a small integer per rank: resume steps to compare).
  std::vector<int64_t> all_gather(int64_t value, const char* what);

 private:
  struct Group;
  DistEnv env_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<Group> group_;
  std::string backend_;
  double wait_seconds_ = 0;
  void join_nccl(const c10::Device& device);
  void join_gloo(bool one_machine);
  std::unique_ptr<Pending> launch_sum(std::vector<at::Tensor> tensors, int root, const char* what);
};

}  // namespace qwen3
