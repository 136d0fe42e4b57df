# Cross build for 64-bit Arm Linux (DGX Spark's Grace CPU) with Debian's cross toolchain
# (crossbuild-essential-arm64) against a sysroot of Debian's own arm64 packages; scripts/cross-arm64.sh makes the
# sysroot and drives the build. Tests run under qemu-user (CMAKE_CROSSCOMPILING_EMULATOR).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

# The toolchain file is read again inside every try_compile, where only the environment survives: the sysroot
# comes from QWEN3_ARM64_SYSROOT, by default the folder the script fills.
if(DEFINED ENV{QWEN3_ARM64_SYSROOT})
  set(QWEN3_ARM64_SYSROOT "$ENV{QWEN3_ARM64_SYSROOT}")
else()
  get_filename_component(QWEN3_ARM64_SYSROOT "${CMAKE_CURRENT_LIST_DIR}/../.deps/arm64-sysroot" ABSOLUTE)
endif()
if(NOT EXISTS "${QWEN3_ARM64_SYSROOT}/usr/lib/aarch64-linux-gnu")
  message(FATAL_ERROR "no arm64 sysroot at ${QWEN3_ARM64_SYSROOT}: run scripts/cross-arm64.sh (or set QWEN3_ARM64_SYSROOT)")
endif()

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_SYSROOT "${QWEN3_ARM64_SYSROOT}")
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Libraries, headers and CMake packages from the sysroot only; programs (protoc, python) from the host.
set(CMAKE_FIND_ROOT_PATH "${QWEN3_ARM64_SYSROOT}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# The sysroot's libraries are unpacked, not installed: no ld.so.cache, so the linker and qemu are told where the
# shared libraries' own dependencies are.
set(CMAKE_EXE_LINKER_FLAGS_INIT "-Wl,-rpath-link,${QWEN3_ARM64_SYSROOT}/usr/lib/aarch64-linux-gnu -Wl,-rpath-link,${QWEN3_ARM64_SYSROOT}/lib/aarch64-linux-gnu -Wl,-rpath-link,${QWEN3_ARM64_SYSROOT}/usr/lib/aarch64-linux-gnu/openblas-pthread")
set(CMAKE_SHARED_LINKER_FLAGS_INIT "${CMAKE_EXE_LINKER_FLAGS_INIT}")
set(CMAKE_CROSSCOMPILING_EMULATOR "qemu-aarch64-static;-L;${QWEN3_ARM64_SYSROOT}")
