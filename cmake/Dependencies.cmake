# Every third-party dependency is wrapped in one interface target, so the rest of the build does not care
# whether it came from a Debian package or from a carried header-only copy (QWEN3_VENDOR_DIR).

# A CUDA libtorch's cmake (PyTorch 2.5-2.7's public/cuda.cmake, and Debian's 2.6) looks for the NVTX 3 headers in
# PyTorch's own source tree, which a project using an installed libtorch never has, then falls back to linking
# CUDA::nvToolsExt; CUDA 12.9 and 13 ship NVTX only as the header-only nvtx3 and have no such library, and the
# configure stops ("The link interface of target torch::nvtoolsext contains: CUDA::nvToolsExt but the target was
# not found"). Nothing of ours calls NVTX: where the toolkit lacks the library, CUDA::nvToolsExt is defined here,
# before PyTorch's cmake runs, as the header-only nvtx3 (an empty target where CMake has no nvtx3 either).
# scripts/cuda-libtorch-check.sh configures against Debian's 2.6 and CUDA 13 and fails without this.
if(NOT QWEN3_CUDA STREQUAL "OFF")
  # The toolkit by its real path ($CUDA_HOME, else /usr/local/cuda, a symlink to the versioned folder), for
  # both nvcc and CUDAToolkit: the include folder that every translation unit of the core and the tests gets is
  # then spelled the same under any PATH (a developer's shell has /usr/local/cuda/bin, CI's only a wrapper
  # script in /usr/local/bin), and ccache hits across the two (it missed on all of them).
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    set(_qwen3_nvcc "")
    if(DEFINED ENV{CUDA_HOME} AND EXISTS "$ENV{CUDA_HOME}/bin/nvcc")
      set(_qwen3_nvcc "$ENV{CUDA_HOME}/bin/nvcc")
    elseif(EXISTS /usr/local/cuda/bin/nvcc)
      set(_qwen3_nvcc /usr/local/cuda/bin/nvcc)
    endif()
    if(_qwen3_nvcc)
      file(REAL_PATH "${_qwen3_nvcc}" CMAKE_CUDA_COMPILER)
    endif()
  endif()
  # A given compiler that is a wrapper script (not in a toolkit's bin/) leaves CUDAToolkit to its own search.
  if(CMAKE_CUDA_COMPILER AND NOT CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT})
    get_filename_component(_qwen3_cuda_bin "${CMAKE_CUDA_COMPILER}" DIRECTORY)
    get_filename_component(_qwen3_cuda_root "${_qwen3_cuda_bin}" DIRECTORY)
    if(EXISTS "${_qwen3_cuda_root}/include/cuda_runtime.h")
      set(CUDAToolkit_ROOT "${_qwen3_cuda_root}")
    endif()
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND NOT TARGET CUDA::nvToolsExt)
    add_library(CUDA::nvToolsExt INTERFACE IMPORTED)
    if(TARGET CUDA::nvtx3)
      target_link_libraries(CUDA::nvToolsExt INTERFACE CUDA::nvtx3)
    endif()
    message(STATUS "CUDA ${CUDAToolkit_VERSION} has no nvToolsExt library: CUDA::nvToolsExt stands for the nvtx3 headers")
  endif()
  # The same cmake also runs the old FindCUDA, which takes the toolkit's root from the first nvcc on PATH: a
  # wrapper script such as /usr/local/bin/nvcc (CI machines have one, without /usr/local/cuda/bin on PATH) makes
  # it look for the headers and cudart under /usr/local and stop ("Could NOT find CUDA (missing:
  # CUDA_INCLUDE_DIRS CUDA_CUDART_LIBRARY)"). It gets the folder above the nvcc CUDAToolkit found instead,
  # which is how FindCUDA itself derives the root from a real nvcc.
  if(CUDAToolkit_FOUND AND NOT CUDA_TOOLKIT_ROOT_DIR)
    get_filename_component(_qwen3_cuda_root "${CUDAToolkit_BIN_DIR}" DIRECTORY)
    set(CUDA_TOOLKIT_ROOT_DIR "${_qwen3_cuda_root}" CACHE PATH "CUDA toolkit root for FindCUDA")
  endif()
endif()

find_package(Torch REQUIRED)
add_library(qwen3_torch INTERFACE)
target_link_libraries(qwen3_torch INTERFACE ${TORCH_LIBRARIES})
target_include_directories(qwen3_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
message(STATUS "libtorch ${Torch_VERSION} from ${TORCH_INSTALL_PREFIX}")
# libstdc++ first among every program's shared libraries. PyTorch's wheels (built against an old system
# libstdc++ with a newer toolset) carry parts of libstdc++ linked in statically, std::filesystem among them, and
# export those copies (pytorch/pytorch#133437; weak since 2.9, which still interposes): a program that lists
# libtorch before libstdc++, as the compiler's own -lstdc++ at the end of the link does, binds its
# std::filesystem calls to libtorch's copies, not to the libstdc++ its headers were written for. The second GPU
# round's test processes (PyTorch 2.11 wheel, Ubuntu 24.04) died at pc 0 in the first test that made a temporary
# folder. With libstdc++ named first the dynamic linker finds its definitions first. (LinkOrder tests check.)
# Named by its file, libstdc++.so.6, not -lstdc++: the third round (2026-11-27) still died in libtorch.so's
# remove_all with -lstdc++ first. -lstdc++ takes the first libstdc++.so or libstdc++.a in the compiler's folders;
# that machine's compiler is a copy of Ubuntu's GCC under /opt/gcc, whose libstdc++.so is a relative link into
# the system's tree, and where such a link leads nowhere the archive is taken, which at the head of the line
# pulls nothing in (a likely cause, unconfirmed: gpu-check's test-gpu link row says where remove_all was bound).
# The file the compiler names (-print-file-name) can only be the shared library; where it names none, -lstdc++
# as before. Removal goes through remove_tree (nftw) either way.
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  set(_qwen3_sysroot "")
  if(CMAKE_SYSROOT)
    set(_qwen3_sysroot "--sysroot=${CMAKE_SYSROOT}")
  endif()
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} ${_qwen3_sysroot} -print-file-name=libstdc++.so.6
                  OUTPUT_VARIABLE QWEN3_LIBSTDCXX OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(IS_ABSOLUTE "${QWEN3_LIBSTDCXX}" AND EXISTS "${QWEN3_LIBSTDCXX}")
    get_filename_component(QWEN3_LIBSTDCXX "${QWEN3_LIBSTDCXX}" REALPATH)
  else()
    set(QWEN3_LIBSTDCXX "-lstdc++")
  endif()
  message(STATUS "libstdc++ named first on every program's link line: ${QWEN3_LIBSTDCXX}")
  target_link_options(qwen3_torch INTERFACE
                      "SHELL:-Wl,--push-state,--no-as-needed ${QWEN3_LIBSTDCXX} -Wl,--pop-state")
endif()
# PyTorch 2.14's headers refuse anything older than C++20 (#error in ATen.h); 2.13 and older take C++17.
if(Torch_VERSION VERSION_GREATER_EQUAL 2.14 AND CMAKE_CXX_STANDARD LESS 20)
  message(STATUS "libtorch ${Torch_VERSION} requires C++20: compiling the C++ sources as C++20")
  set(CMAKE_CXX_STANDARD 20)
endif()
# ATen's at::parallel_for is an inline OpenMP loop: without -fopenmp in our own translation units it runs
# on one thread, whatever at::set_num_threads says.
find_package(OpenMP REQUIRED COMPONENTS CXX)
target_link_libraries(qwen3_torch INTERFACE OpenMP::OpenMP_CXX)

add_library(qwen3_json INTERFACE)
add_library(qwen3_cli11 INTERFACE)
add_library(qwen3_toml INTERFACE)
add_library(qwen3_log INTERFACE)
# QWEN3_VENDOR_DIR is what scripts/gather-deps.sh writes: include/ (header-only libraries, pcre2.h, utf8proc.h),
# lib/ (static libpcre2-8.a, libutf8proc.a), src/googletest and src/benchmark (built in-tree, below). A flat
# folder of headers (no include/) still works for the header-only part.
set(QWEN3_VENDOR_INCLUDE "")
if(QWEN3_VENDOR_DIR)
  get_filename_component(QWEN3_VENDOR_DIR "${QWEN3_VENDOR_DIR}" ABSOLUTE BASE_DIR "${CMAKE_SOURCE_DIR}")
  if(EXISTS "${QWEN3_VENDOR_DIR}/include")
    set(QWEN3_VENDOR_INCLUDE "${QWEN3_VENDOR_DIR}/include")
  else()
    set(QWEN3_VENDOR_INCLUDE "${QWEN3_VENDOR_DIR}")
  endif()
  message(STATUS "Carried dependencies: ${QWEN3_VENDOR_DIR}")
endif()
if(QWEN3_VENDOR_DIR)
  target_include_directories(qwen3_json SYSTEM INTERFACE ${QWEN3_VENDOR_INCLUDE})
  target_include_directories(qwen3_cli11 SYSTEM INTERFACE ${QWEN3_VENDOR_INCLUDE})
  target_include_directories(qwen3_log SYSTEM INTERFACE ${QWEN3_VENDOR_INCLUDE})
  target_compile_definitions(qwen3_log INTERFACE SPDLOG_HEADER_ONLY SPDLOG_FMT_EXTERNAL FMT_HEADER_ONLY)
else()
  find_package(nlohmann_json 3.9 REQUIRED)
  find_package(CLI11 2.1 REQUIRED)
  find_package(fmt REQUIRED)
  find_package(spdlog REQUIRED)
  target_link_libraries(qwen3_json INTERFACE nlohmann_json::nlohmann_json)
  target_link_libraries(qwen3_cli11 INTERFACE CLI11::CLI11)
  target_link_libraries(qwen3_log INTERFACE spdlog::spdlog fmt::fmt)
endif()

# toml++ (Debian's libtomlplusplus-dev, or the carried headers): used header-only, in the one translation unit
# that reads flag files (src/cli/flag_file.cpp defines TOML_HEADER_ONLY), so no library is linked.
find_path(QWEN3_TOMLPP_INCLUDE toml++/toml.h PATHS ${QWEN3_VENDOR_INCLUDE})
if(NOT QWEN3_TOMLPP_INCLUDE)
  message(FATAL_ERROR "toml++ not found (toml++/toml.h): install libtomlplusplus-dev (scripts/setup.sh does)")
endif()
target_include_directories(qwen3_toml SYSTEM INTERFACE ${QWEN3_TOMLPP_INCLUDE})

# A libtorch built with CUDA (the PyTorch one on the GPU machine) lets the tensor ops dispatch CUDA tensors
# to kernels/; Debian's libtorch is CPU-only.
if(TORCH_CUDA_LIBRARIES OR TARGET torch_cuda)
  set(QWEN3_TORCH_HAS_CUDA ON)
  target_compile_definitions(qwen3_torch INTERFACE QWEN3_TORCH_HAS_CUDA=1)
else()
  set(QWEN3_TORCH_HAS_CUDA OFF)
endif()
message(STATUS "libtorch with CUDA: ${QWEN3_TORCH_HAS_CUDA}")

# NCCL's header. A libtorch built with NCCL exports USE_C10D_NCCL on torch_cuda, so ProcessGroupNCCL.hpp (which
# src/dist includes) includes <nccl.h>, and the libtorch does not ship it: PyTorch's pip wheel keeps it in the
# nvidia-nccl package beside torch (site-packages/nvidia/nccl/include), Debian in libnccl-dev. It is looked for
# there, in the folders above the Torch package (the wheel's layout), then on the usual paths; without it the
# configure stops here rather than the build at the first #include. QWEN3_NCCL_INCLUDE_DIR names it outright.
if(TARGET torch_cuda)
  get_target_property(_qwen3_torch_cuda_defs torch_cuda INTERFACE_COMPILE_DEFINITIONS)
  if(_qwen3_torch_cuda_defs MATCHES "USE_C10D_NCCL")
    set(_qwen3_nccl_hints "")
    get_filename_component(_qwen3_up "${Torch_DIR}" ABSOLUTE)
    foreach(_qwen3_level RANGE 6)
      file(GLOB _qwen3_found LIST_DIRECTORIES true "${_qwen3_up}/nvidia/*/include")
      list(APPEND _qwen3_nccl_hints ${_qwen3_found})
      get_filename_component(_qwen3_up "${_qwen3_up}" DIRECTORY)
    endforeach()
    find_path(QWEN3_NCCL_INCLUDE_DIR nccl.h HINTS ${_qwen3_nccl_hints} ${TORCH_INCLUDE_DIRS}
              DOC "folder holding nccl.h (PyTorch's wheel: site-packages/nvidia/nccl/include)")
    if(NOT QWEN3_NCCL_INCLUDE_DIR)
      message(FATAL_ERROR "This libtorch (${TORCH_INSTALL_PREFIX}) is built with NCCL (torch_cuda defines "
        "USE_C10D_NCCL), so its ProcessGroupNCCL.hpp needs nccl.h, which is neither beside its headers nor in a "
        "nvidia/*/include folder above ${Torch_DIR}. Install the NCCL headers matching the wheel (pip's "
        "nvidia-nccl package, Debian's libnccl-dev) or pass -DQWEN3_NCCL_INCLUDE_DIR=<folder with nccl.h>.")
    endif()
    # First on the path: a CUDA toolkit may ship an nccl.h of another version (CUDA 13's /usr/local/cuda/include
    # does), and the header must be the one the libtorch was built against.
    target_include_directories(qwen3_torch SYSTEM BEFORE INTERFACE "${QWEN3_NCCL_INCLUDE_DIR}")
    message(STATUS "NCCL headers: ${QWEN3_NCCL_INCLUDE_DIR}")
  endif()
endif()

# The tokenizer's regex (PCRE2, 8-bit code units) and NFC (libutf8proc): Debian's libpcre2-dev and
# libutf8proc-dev, or any install that find_path/find_library can see (CMAKE_PREFIX_PATH).
# With QWEN3_VENDOR_DIR holding lib/libpcre2-8.a: the carried headers and static archives only.
add_library(qwen3_text INTERFACE)
if(QWEN3_VENDOR_DIR AND EXISTS "${QWEN3_VENDOR_DIR}/lib/libpcre2-8.a")
  find_path(QWEN3_PCRE2_INCLUDE pcre2.h PATHS "${QWEN3_VENDOR_INCLUDE}" NO_DEFAULT_PATH REQUIRED)
  find_library(QWEN3_PCRE2_LIBRARY NAMES libpcre2-8.a PATHS "${QWEN3_VENDOR_DIR}/lib" NO_DEFAULT_PATH REQUIRED)
  find_path(QWEN3_UTF8PROC_INCLUDE utf8proc.h PATHS "${QWEN3_VENDOR_INCLUDE}" NO_DEFAULT_PATH REQUIRED)
  find_library(QWEN3_UTF8PROC_LIBRARY NAMES libutf8proc.a PATHS "${QWEN3_VENDOR_DIR}/lib" NO_DEFAULT_PATH REQUIRED)
  find_package(Threads REQUIRED)  # PCRE2's JIT allocator takes a mutex (in libc only since glibc 2.34)
  target_link_libraries(qwen3_text INTERFACE Threads::Threads)
else()
  find_path(QWEN3_PCRE2_INCLUDE pcre2.h REQUIRED)
  find_library(QWEN3_PCRE2_LIBRARY pcre2-8 REQUIRED)
  find_path(QWEN3_UTF8PROC_INCLUDE utf8proc.h REQUIRED)
  find_library(QWEN3_UTF8PROC_LIBRARY utf8proc REQUIRED)
endif()
target_include_directories(qwen3_text SYSTEM INTERFACE ${QWEN3_PCRE2_INCLUDE} ${QWEN3_UTF8PROC_INCLUDE})
target_link_libraries(qwen3_text INTERFACE ${QWEN3_PCRE2_LIBRARY} ${QWEN3_UTF8PROC_LIBRARY})

# GoogleTest and Google Benchmark built in-tree from source folders (the GPU machine has neither package):
# QWEN3_GTEST_SOURCE_DIR / QWEN3_BENCHMARK_SOURCE_DIR, by default QWEN3_VENDOR_DIR's src/googletest and
# src/benchmark. A two-line <Pkg>Config.cmake in the build folder makes tests/ and bench/'s find_package()
# accept the in-tree targets (GTest::gtest_main, benchmark::benchmark), so those files need no second path.
set(QWEN3_GTEST_SOURCE_DIR "" CACHE PATH "GoogleTest source tree to build in-tree (empty: find_package(GTest))")
set(QWEN3_BENCHMARK_SOURCE_DIR "" CACHE PATH "Google Benchmark source tree to build in-tree (empty: find_package(benchmark))")
if(QWEN3_VENDOR_DIR AND NOT QWEN3_GTEST_SOURCE_DIR AND EXISTS "${QWEN3_VENDOR_DIR}/src/googletest/CMakeLists.txt")
  set(QWEN3_GTEST_SOURCE_DIR "${QWEN3_VENDOR_DIR}/src/googletest")
endif()
if(QWEN3_VENDOR_DIR AND NOT QWEN3_BENCHMARK_SOURCE_DIR AND EXISTS "${QWEN3_VENDOR_DIR}/src/benchmark/CMakeLists.txt")
  set(QWEN3_BENCHMARK_SOURCE_DIR "${QWEN3_VENDOR_DIR}/src/benchmark")
endif()
set(QWEN3_FIND_REDIRECTS "${CMAKE_BINARY_DIR}/qwen3-find-redirects")
if(QWEN3_BUILD_TESTS AND QWEN3_GTEST_SOURCE_DIR)
  set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  add_subdirectory("${QWEN3_GTEST_SOURCE_DIR}" "${CMAKE_BINARY_DIR}/_deps/googletest" EXCLUDE_FROM_ALL)
  if(NOT TARGET GTest::gtest_main)  # googletest >= 1.13 defines them itself
    add_library(GTest::gtest ALIAS gtest)
    add_library(GTest::gtest_main ALIAS gtest_main)
  endif()
  file(WRITE "${QWEN3_FIND_REDIRECTS}/GTestConfig.cmake" "# in-tree: ${QWEN3_GTEST_SOURCE_DIR}\nset(GTest_FOUND TRUE)\n")
  set(GTest_DIR "${QWEN3_FIND_REDIRECTS}" CACHE PATH "" FORCE)
  message(STATUS "GoogleTest: built from ${QWEN3_GTEST_SOURCE_DIR}")
endif()
if(QWEN3_BUILD_BENCH AND QWEN3_BENCHMARK_SOURCE_DIR)
  foreach(option BENCHMARK_ENABLE_TESTING BENCHMARK_ENABLE_GTEST_TESTS BENCHMARK_ENABLE_INSTALL BENCHMARK_INSTALL_DOCS
                 BENCHMARK_ENABLE_WERROR BENCHMARK_ENABLE_LIBPFM BENCHMARK_ENABLE_DOXYGEN)
    set(${option} OFF CACHE BOOL "" FORCE)
  endforeach()
  set(GIT_VERSION "0.0.0")  # Debian's source reads no git tags; "0.0.0" makes it take project()'s version
  add_subdirectory("${QWEN3_BENCHMARK_SOURCE_DIR}" "${CMAKE_BINARY_DIR}/_deps/benchmark" EXCLUDE_FROM_ALL)
  unset(GIT_VERSION)
  file(WRITE "${QWEN3_FIND_REDIRECTS}/benchmarkConfig.cmake" "# in-tree: ${QWEN3_BENCHMARK_SOURCE_DIR}\nset(benchmark_FOUND TRUE)\n")
  set(benchmark_DIR "${QWEN3_FIND_REDIRECTS}" CACHE PATH "" FORCE)
  message(STATUS "Google Benchmark: built from ${QWEN3_BENCHMARK_SOURCE_DIR}")
endif()
