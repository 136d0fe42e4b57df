// How many threads the CPU work of this process uses (libtorch's intra-op pool: products, the optimizer's rows).
//
// libtorch's default is the number of physical cores as its cpuinfo library counts them, which on some virtual
// machines is wrong: on the 2-core KVM machines this project is built on (AMD EPYC, topoext exposed) cpuinfo
// counts one core, so every CPU run used half the machine. Linux's own topology (sysfs, over the CPUs this
// process may run on) is the count used here; docs/performance.md has the measurements.
#pragma once
#include <string>

namespace qwen3 {

struct CpuThreadInputs {
  int flag = 0;                // --threads; 0: not given
  bool env_set = false;        // OMP_NUM_THREADS or MKL_NUM_THREADS set (libtorch has applied it)
  int library_default = 1;     // at::get_num_threads() before any change
  int physical_cores = 0;      // cores of the CPUs in this process's affinity mask; 0: unknown
  int processes_per_machine = 1;  // ranks sharing the machine (the launcher's local world size)
};

struct CpuThreadChoice {
  int threads = 1;
  std::string why;  // one phrase for the log: "--threads", "OMP_NUM_THREADS", "2 cores", ...
};

// The flag wins; then the environment the user set for libtorch; then Linux's physical cores shared out among
// the ranks on this machine (at least 1 each); libtorch's own default only where the cores are unknown.
CpuThreadChoice choose_cpu_threads(const CpuThreadInputs& in);

// Distinct (package, core) pairs among the CPUs of sched_getaffinity, from /sys/devices/system/cpu/cpuN/topology;
// 0 where that cannot be read.
int physical_cores_available();

// LOCAL_WORLD_SIZE (torchrun), OMPI_COMM_WORLD_LOCAL_SIZE, SLURM_NTASKS_PER_NODE or the first count of
// SLURM_TASKS_PER_NODE; else WORLD_SIZE where RANK is set by hand and MASTER_ADDR is absent or loopback (one
// machine); else 1.
int processes_per_machine_from_environment();

// Reads the process's environment and topology, chooses, and sets libtorch's pool to the choice (the binary's
// start and the CPU benchmarks' main). `flag`: --threads, 0 when not given.
CpuThreadChoice apply_cpu_threads(int flag);

}  // namespace qwen3
