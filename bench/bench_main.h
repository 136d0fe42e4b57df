// main() for the CPU benchmarks: libtorch's thread count as qwen3-train sets it (include/qwen3/base/cpu_threads.h;
// OMP_NUM_THREADS still wins), recorded in the benchmark's context, so a figure is the tool's own.
#pragma once
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <string>

#include "qwen3/base/cpu_threads.h"

#define QWEN3_BENCHMARK_MAIN()                                                                              \
  int main(int argc, char** argv) {                                                                         \
    const qwen3::CpuThreadChoice cpu = qwen3::apply_cpu_threads(0);                                        \
    benchmark::AddCustomContext("cpu_threads", std::to_string(at::get_num_threads()) + " (" + cpu.why + ")"); \
    benchmark::Initialize(&argc, argv);                                                                     \
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;                                       \
    benchmark::RunSpecifiedBenchmarks();                                                                    \
    benchmark::Shutdown();                                                                                  \
    return 0;                                                                                               \
  }
