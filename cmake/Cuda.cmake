# The CUDA kernels (kernels/) are plain CUDA C++ behind a raw-pointer header; they need nvcc, not a CUDA
# libtorch. QWEN3_CUDA=AUTO builds them whenever nvcc is found, so CI (nvcc, no GPU) compiles them every run.
set(QWEN3_HAVE_CUDA OFF)
set(QWEN3_CUDA_ARCHS_STRING "none")
if(NOT QWEN3_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  # CMAKE_CUDA_COMPILER: chosen in Dependencies.cmake, before PyTorch's cmake looks for the toolkit.
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(QWEN3_HAVE_CUDA ON)
  elseif(QWEN3_CUDA STREQUAL "ON")
    message(FATAL_ERROR "QWEN3_CUDA=ON but no CUDA compiler (nvcc) was found")
  else()
    message(STATUS "nvcc not found: building without the CUDA kernels")
  endif()
endif()

if(QWEN3_HAVE_CUDA)
  # Hopper (H100/H200) first; Blackwell consumer/GB10 (DGX Spark) as well. Our own variable, set on the target
  # below: a CUDA libtorch's cmake (found before this file) sets CMAKE_CUDA_ARCHITECTURES to OFF and appends
  # its own -gencode flags to CMAKE_CUDA_FLAGS, which would replace this list with PyTorch's.
  set(QWEN3_CUDA_ARCHITECTURES "90;120;121" CACHE STRING "CUDA architectures of the kernels in kernels/")
  string(REGEX REPLACE "-gencode[= ]+arch=[^ ]+" "" CMAKE_CUDA_FLAGS "${CMAKE_CUDA_FLAGS}")
  if(NOT CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES ${QWEN3_CUDA_ARCHITECTURES})  # enable_language checks a value is set
  endif()
  enable_language(CUDA)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit REQUIRED)
  string(REPLACE ";" "," QWEN3_CUDA_ARCHS_STRING "${QWEN3_CUDA_ARCHITECTURES}")
  file(GLOB QWEN3_KERNEL_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/kernels/*.cu)
  add_library(qwen3_kernels STATIC ${QWEN3_KERNEL_SOURCES})
  target_include_directories(qwen3_kernels PUBLIC ${CMAKE_SOURCE_DIR}/kernels)
  target_link_libraries(qwen3_kernels PUBLIC CUDA::cudart_static)
  set_target_properties(qwen3_kernels PROPERTIES POSITION_INDEPENDENT_CODE ON CUDA_SEPARABLE_COMPILATION OFF
                                                 CUDA_ARCHITECTURES "${QWEN3_CUDA_ARCHITECTURES}")
  target_compile_options(qwen3_kernels PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo>)
  message(STATUS "CUDA kernels: nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${QWEN3_CUDA_ARCHITECTURES}")
endif()
