# Every third-party dependency is wrapped in one interface target, so the rest of the build does not care
# whether it came from a Debian package or from a carried header-only copy (QWEN3_VENDOR_DIR).

find_package(Torch REQUIRED)
add_library(qwen3_torch INTERFACE)
target_link_libraries(qwen3_torch INTERFACE ${TORCH_LIBRARIES})
target_include_directories(qwen3_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
message(STATUS "libtorch ${Torch_VERSION} from ${TORCH_INSTALL_PREFIX}")
# ATen's at::parallel_for is an inline OpenMP loop: without -fopenmp in our own translation units it runs
# on one thread, whatever at::set_num_threads says.
find_package(OpenMP REQUIRED COMPONENTS CXX)
target_link_libraries(qwen3_torch INTERFACE OpenMP::OpenMP_CXX)

add_library(qwen3_json INTERFACE)
add_library(qwen3_cli11 INTERFACE)
add_library(qwen3_log INTERFACE)
if(QWEN3_VENDOR_DIR)
  target_include_directories(qwen3_json SYSTEM INTERFACE ${QWEN3_VENDOR_DIR})
  target_include_directories(qwen3_cli11 SYSTEM INTERFACE ${QWEN3_VENDOR_DIR})
  target_include_directories(qwen3_log SYSTEM INTERFACE ${QWEN3_VENDOR_DIR})
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

# A libtorch built with CUDA (the PyTorch one on the GPU machine) lets the tensor ops dispatch CUDA tensors
# to kernels/; Debian's libtorch is CPU-only.
if(TORCH_CUDA_LIBRARIES OR TARGET torch_cuda)
  set(QWEN3_TORCH_HAS_CUDA ON)
  target_compile_definitions(qwen3_torch INTERFACE QWEN3_TORCH_HAS_CUDA=1)
else()
  set(QWEN3_TORCH_HAS_CUDA OFF)
endif()
message(STATUS "libtorch with CUDA: ${QWEN3_TORCH_HAS_CUDA}")

# The tokenizer's regex (PCRE2, 8-bit code units) and NFC (libutf8proc): Debian's libpcre2-dev and
# libutf8proc-dev, or any install that find_path/find_library can see (CMAKE_PREFIX_PATH).
find_path(QWEN3_PCRE2_INCLUDE pcre2.h REQUIRED)
find_library(QWEN3_PCRE2_LIBRARY pcre2-8 REQUIRED)
find_path(QWEN3_UTF8PROC_INCLUDE utf8proc.h REQUIRED)
find_library(QWEN3_UTF8PROC_LIBRARY utf8proc REQUIRED)
add_library(qwen3_text INTERFACE)
target_include_directories(qwen3_text SYSTEM INTERFACE ${QWEN3_PCRE2_INCLUDE} ${QWEN3_UTF8PROC_INCLUDE})
target_link_libraries(qwen3_text INTERFACE ${QWEN3_PCRE2_LIBRARY} ${QWEN3_UTF8PROC_LIBRARY})
