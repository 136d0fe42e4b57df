// Who a process is in a data-parallel job, from its launcher's environment (docs/distributed.md, "Launching").
#include <gtest/gtest.h>

#include <cstdlib>

#include "qwen3/base/error.h"
#include "qwen3/dist/data_parallel.h"

namespace qwen3 {
namespace {

// Sets the variables for its lifetime and clears every launcher variable around it.
class Environment {
 public:
  explicit Environment(std::initializer_list<std::pair<const char*, const char*>> vars) {
    clear();
    for (const auto& [name, value] : vars) ::setenv(name, value, 1);
  }
  ~Environment() { clear(); }

 private:
  static void clear() {
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID",
                             "SLURM_NTASKS", "SLURM_LOCALID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                             "OMPI_COMM_WORLD_LOCAL_RANK"})
      ::unsetenv(name);
  }
};

TEST(DistEnv, EachLauncherAndNone) {
  {
    const Environment e({});
    EXPECT_EQ(dist_env_from_environment().world_size, 1);
  }
  {
    const Environment e({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "10.0.0.1"},
                         {"MASTER_PORT", "29555"}});
    const DistEnv env = dist_env_from_environment();
    EXPECT_EQ(env.launcher, "torchrun");
    EXPECT_EQ(env.rank, 3);
    EXPECT_EQ(env.world_size, 8);
    EXPECT_EQ(env.local_rank, 1);
    EXPECT_EQ(env.master_addr, "10.0.0.1");
    EXPECT_EQ(env.master_port, 29555);
  }
  {
    const Environment e({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}});
    EXPECT_EQ(dist_env_from_environment().launcher, "slurm");
  }
  {
    const Environment e({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
    EXPECT_EQ(dist_env_from_environment().launcher, "openmpi");
  }
  {  // an allocation's task count alone (a shell inside salloc) is one process, not a job
    const Environment e({{"SLURM_NTASKS", "4"}, {"WORLD_SIZE", "4"}});
    EXPECT_EQ(dist_env_from_environment().world_size, 1);
  }
}

TEST(DistEnv, BadValuesAreUsageErrors) {
  for (const auto& vars : std::vector<std::vector<std::pair<const char*, const char*>>>{
           {{"RANK", "2"}, {"WORLD_SIZE", "2"}}, {{"RANK", "x"}, {"WORLD_SIZE", "2"}}, {{"RANK", "0"}}}) {
    Environment e({});
    for (const auto& [name, value] : vars) ::setenv(name, value, 1);
    EXPECT_THROW(dist_env_from_environment(), UsageError) << vars.front().second;
  }
  // A port is a port: 99999 was cast to 16 bits (34463), where the rank waited for peers that never came.
  for (const char* port : {"99999", "0", "abc", "-1"}) {
    Environment e({{"MASTER_PORT", port}});
    try {
      dist_env_from_environment();
      ADD_FAILURE() << port;
    } catch (const UsageError& error) {
      EXPECT_EQ(std::string(error.what()), std::string("MASTER_PORT='") + port + "' is not a TCP port (1 to 65535)");
    }
  }
  const Environment port({{"MASTER_PORT", "65535"}});
  EXPECT_EQ(dist_env_from_environment().master_port, 65535);
  // --dist-init's form, in one process too (it was looked at only when there were ranks to join).
  EXPECT_THROW(DataParallel(DistEnv{}, "http://x", std::chrono::milliseconds(1000), c10::Device("cpu")), UsageError);
  EXPECT_NO_THROW(DataParallel(DistEnv{}, "file:///tmp/x", std::chrono::milliseconds(1000), c10::Device("cpu")));
}

// One process per GPU: `--device cuda` lands on the rank's LOCAL_RANK; an explicit index or the CPU stays.
TEST(DistEnv, TheLocalRankPicksTheGpu) {
  DistEnv env;
  env.world_size = 4;
  env.rank = 3;
  env.local_rank = 1;
  EXPECT_EQ(device_for_rank(c10::Device("cuda"), env), c10::Device("cuda:1"));
  EXPECT_EQ(device_for_rank(c10::Device("cuda:0"), env), c10::Device("cuda:0"));
  EXPECT_EQ(device_for_rank(c10::Device("cpu"), env), c10::Device("cpu"));
  EXPECT_EQ(device_for_rank(c10::Device("cuda"), DistEnv{}), c10::Device("cuda:0"));
}

// One process: no group, no backend; the collectives are the identity.
TEST(DistEnv, OneProcessHasNoBackend) {
  DataParallel one(DistEnv{}, "", std::chrono::milliseconds(1000), c10::Device("cuda"));
  EXPECT_EQ(one.backend(), "");
  EXPECT_EQ(one.all_reduce_sum(int64_t{5}, "a count"), 5);
}

}  // namespace
}  // namespace qwen3
