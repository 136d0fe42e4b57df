// The one way a test says that it needs a CUDA device. scripts/gpu-check.sh runs every test whose full name
// contains "Gpu" on the GPU machine (and under compute-sanitizer's memcheck, racecheck and synccheck), so a test
// that needs a device must be named so: QWEN3_GPU_TEST fails any test that is not, on every machine (a CPU CI run
// included), before it skips for want of a device. TestConventions.GpuTestsSkipOnlyThroughTheMacro keeps every
// device check of the tests inside this macro.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace qwen3::test {

inline bool named_as_gpu_test() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (info == nullptr) return false;
  return (std::string(info->test_suite_name()) + "." + info->name()).find("Gpu") != std::string::npos;
}

// QWEN3_GPU_TEST_SMALL=1: the GPU tests take their smaller shapes only, so that racecheck (which instruments every
// shared-memory access) runs the whole set within its share of one device call. The full shapes run otherwise.
inline bool small_gpu_shapes() {
  const char* v = std::getenv("QWEN3_GPU_TEST_SMALL");
  return v != nullptr && std::string(v) == "1";
}

}  // namespace qwen3::test

#define QWEN3_GPU_TEST(device_present)                                                                      \
  ASSERT_TRUE(::qwen3::test::named_as_gpu_test())                                                           \
      << "a test that needs a CUDA device has 'Gpu' in its suite or test name: scripts/gpu-check.sh runs and " \
         "sanitizes exactly those (--gtest_filter='*Gpu*')";                                                  \
  if (!(device_present)) GTEST_SKIP() << "no CUDA device"
