# Every third-party dependency is wrapped in one interface target, so the rest of the build does not care
# whether it came from a Debian package or from a carried header-only copy (QWEN3_VENDOR_DIR).

find_package(Torch REQUIRED)
add_library(qwen3_torch INTERFACE)
target_link_libraries(qwen3_torch INTERFACE ${TORCH_LIBRARIES})
target_include_directories(qwen3_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
message(STATUS "libtorch ${Torch_VERSION} from ${TORCH_INSTALL_PREFIX}")

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
