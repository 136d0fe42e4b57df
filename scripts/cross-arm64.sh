#!/usr/bin/env bash
# Cross-builds qwen3-train for aarch64 (DGX Spark's Grace CPU) on an x86-64 Debian 12 machine and runs tests under
# qemu-user: docs/dgx-spark.md. One command from a clean checkout:
#
#   scripts/cross-arm64.sh            # sysroot (once), build into build-arm64/, the unit tests under qemu
#   scripts/cross-arm64.sh --all      # every test (cli and slow too: over an hour under emulation)
#   scripts/cross-arm64.sh --build-only
#   scripts/cross-arm64.sh --prepare      # only the cross tools and the sysroot (.ci/run: while the native build runs)
#
# Why a sysroot instead of `dpkg --add-architecture arm64` + `apt-get install libtorch-dev:arm64`: Debian's
# libtorch-dev (and python3-dev, which it depends on) is not Multi-Arch: same, so the arm64 package would replace
# the amd64 one the native build needs. mmdebstrap unpacks Debian's own arm64 packages and their dependencies into
# a sysroot without touching the host's package database; the compiler is Debian's cross gcc 12.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The sysroot is unpacked once per machine into a cache shared by every clone (as ccache is; CI builds a fresh
# clone each run), and .deps/arm64-sysroot points at it. QWEN3_ARM64_SYSROOT names another folder.
cache=${XDG_CACHE_HOME:-$HOME/.cache}/qwen3-train/arm64-sysroot
sysroot=${QWEN3_ARM64_SYSROOT:-$cache}
build_dir=${BUILD_DIR:-$root/build-arm64}
mode=unit
case "${1:-}" in
  "") ;;
  --all) mode=all ;;
  --build-only) mode=none ;;
  --prepare) mode=prepare ;;
  *) echo "usage: scripts/cross-arm64.sh [--all|--build-only|--prepare]" >&2; exit 2 ;;
esac

# The native build's packages (scripts/setup.sh) and the cross tools.
"$root/scripts/setup.sh" mmdebstrap qemu-user-static crossbuild-essential-arm64
# The same libraries as scripts/setup.sh, for arm64 (the header-only ones too: one sysroot, one set of versions).
arm64_packages=libtorch-dev,nlohmann-json3-dev,libcli11-dev,libtomlplusplus-dev,libspdlog-dev,libfmt-dev,libgtest-dev,libbenchmark-dev
arm64_packages+=,libpcre2-dev,libutf8proc-dev,libgloo-dev,libopenblas0-pthread,libc6-dev,libstdc++-12-dev

# shellcheck source=scripts/cached-root.sh
. "$root/scripts/cached-root.sh"
if needs_cached_root cross-arm64 "$sysroot" "$arm64_packages" QWEN3_ARM64_SYSROOT; then
  echo "cross-arm64: unpacking Debian 12 arm64 packages into $sysroot" >&2
  make_cached_root_dir "$sysroot"
  mirror=$(host_debian_mirror)
  # --variant=extract: unpack only (no maintainer scripts, which would need arm64 code to run).
  mmdebstrap --quiet --variant=extract --architectures=arm64 --format=directory --include="$arm64_packages" \
    bookworm "$sysroot.partial" "deb $mirror bookworm main" "deb $mirror bookworm-updates main" \
    "deb ${mirror%/debian}/debian-security bookworm-security main"
  # Unpacked, not installed: absolute symlinks point into the host and the alternatives that the maintainer
  # scripts would make (libblas.so.3 -> OpenBLAS) do not exist. Make both right inside the sysroot.
  find "$sysroot.partial" -type l -lname '/*' ! -path "$sysroot.partial/dev/*" | while read -r link; do
    target=$(readlink "$link")
    ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$sysroot.partial$target")" "$link"
  done
  libdir=$sysroot.partial/usr/lib/aarch64-linux-gnu
  ln -sfn openblas-pthread/libblas.so.3 "$libdir/libblas.so.3"
  ln -sfn openblas-pthread/liblapack.so.3 "$libdir/liblapack.so.3"
  ln -sfn openblas-pthread/libopenblas.so.0 "$libdir/libopenblas.so.0"  # found through ld.so.cache when installed
  stamp_cached_root "$sysroot" "$arm64_packages"
fi
[ "$mode" != prepare ] || exit 0

if [ -z "${QWEN3_ARM64_SYSROOT:-}" ]; then
  mkdir -p "$root/.deps"
  if [ -e "$root/.deps/arm64-sysroot" ] && [ ! -L "$root/.deps/arm64-sysroot" ]; then
    echo "cross-arm64: $root/.deps/arm64-sysroot is a folder, not the link this script makes; remove it" >&2
    exit 1
  fi
  ln -sfn "$sysroot" "$root/.deps/arm64-sysroot"  # the toolchain file's default: re-configures find it too
fi
export QWEN3_ARM64_SYSROOT=$sysroot
# The benchmarks are not built: nothing here can time an arm64 machine (qemu's timings mean nothing).
BUILD_DIR=$build_dir CMAKE_ARGS="-DCMAKE_TOOLCHAIN_FILE=$root/cmake/toolchain-aarch64-linux-gnu.cmake -DQWEN3_CUDA=OFF -DQWEN3_BUILD_BENCH=OFF ${CMAKE_ARGS:-}" \
  "$root/scripts/build.sh"
[ "$(od -An -tx1 -j18 -N2 "$build_dir/qwen3-train" | tr -d ' ')" = b700 ] ||  # ELF e_machine 183: AArch64
   { echo "cross-arm64: $build_dir/qwen3-train is not an aarch64 binary" >&2; exit 1; }

# qemu-user runs one guest thread per host thread; libtorch's intra-op pool adds nothing under emulation. (Count
# the cores first: nproc honours OMP_NUM_THREADS.)
jobs=$(nproc)
export OMP_NUM_THREADS=1
cd "$build_dir"
qemu-aarch64-static -L "$sysroot" "$build_dir/qwen3-train" --version  # explicit emulator: binfmt_misc not needed
case $mode in
  unit) ctest --output-on-failure -j "$jobs" -L unit ;;
  all) ctest --output-on-failure -j "$jobs" --timeout 7200 ;;  # the smoke alone takes about an hour under qemu
  none) ;;
esac
