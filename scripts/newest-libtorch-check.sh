#!/usr/bin/env bash
# Compiles (syntax only) the sources whose code depends on libtorch's version against the newest libtorch Debian
# has (unstable's libtorch-dev, headers only), on any machine. The other lanes build against 1.13 (Debian 12),
# 2.6 (Debian 13, CPU and CUDA headers); the branches for newer releases — at::_grouped_mm (2.8+) for the
# mixture-of-experts block's grouped products, aten::mm.dtype (2.9+) for fp32 weight gradients — are what a GPU
# machine's PyTorch wheel compiles, and would otherwise first compile there (docs/build.md, "CI"). Then again with
# QWEN3_TORCH_HAS_CUDA, as a CUDA build of that libtorch compiles them (where the CUDA toolkit's headers are).
#
#   scripts/newest-libtorch-check.sh            # the check
#   scripts/newest-libtorch-check.sh --prepare  # only fetch and unpack the package (.ci/run: during the native build)
#
# What: the libtorch-dev package unstable lists now is unpacked (dpkg -x, nothing installed) once per machine
# into a cache shared by every clone; a later run keeps that one. PyTorch 2.14 needs C++20: the check compiles
# with -std=c++20, as cmake/Dependencies.cmake configures such a build.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/qwen3-train/newest-libtorch
prepare_only=0
case "${1:-}" in
  "") ;;
  --prepare) prepare_only=1 ;;
  *) echo "usage: scripts/newest-libtorch-check.sh [--prepare]" >&2; exit 2 ;;
esac
. "$root/scripts/cached-root.sh"
if [ ! -f "$cache/.qwen3-packages" ]; then
  mirror=$(host_debian_mirror)
  index=$(curl -fsSL --retry 3 "$mirror/dists/sid/main/binary-amd64/Packages.xz" | xz -dc)
  deb=$(awk '/^Package: libtorch-dev$/ { found = 1 } found && /^Filename: / { print $2; exit }' <<<"$index")
  [ -n "$deb" ] || { echo "newest-libtorch-check: no libtorch-dev in $mirror unstable" >&2; exit 1; }
  echo "newest-libtorch-check: unpacking $deb into $cache" >&2
  make_cached_root_dir "$cache"
  mkdir -p "$cache.partial"
  curl -fsSL --retry 3 -o "$cache.partial/package.deb" "$mirror/$deb"
  dpkg -x "$cache.partial/package.deb" "$cache.partial"
  rm "$cache.partial/package.deb"
  stamp_cached_root "$cache" "$deb"
fi
[ "$prepare_only" = 0 ] || exit 0

version=$(echo '#include <torch/version.h>' | g++ -x c++ -std=c++20 -E -dM -isystem "$cache/usr/include" \
            -isystem "$cache/usr/include/torch/csrc/api/include" - |
          awk '$2 == "TORCH_VERSION_MAJOR" { major = $3 } $2 == "TORCH_VERSION_MINOR" { minor = $3 }
               END { print major "." minor }')
# The sources that test TORCH_VERSION_MAJOR/MINOR, or include a header that does.
mapfile -t sources < <(cd "$root" && {
  grep -rlE 'TORCH_VERSION_M(AJOR|INOR)' src tests --include='*.cpp'
  for header in $(grep -rlE 'TORCH_VERSION_M(AJOR|INOR)' src include --include='*.h'); do
    # included by its path ("trainer/step_update.h") or from beside it ("product_sm_carveout.h")
    grep -rlE "[\"/]$(basename "$header")\"" src tests --include='*.cpp' || true
    for middle in $(grep -rlE "[\"/]$(basename "$header")\"" src tests --include='*.h'); do
      grep -rlE "[\"/]$(basename "$middle")\"" src tests --include='*.cpp' || true
    done
  done
} | sort -u)
echo "newest-libtorch-check: libtorch $version headers: ${sources[*]}" >&2
flags=(-std=c++20 -fsyntax-only -I"$root/src" -I"$root/include" -I"$root/kernels" -I"$root/tests"
       -isystem "$cache/usr/include" -isystem "$cache/usr/include/torch/csrc/api/include")
compile_all() {  # compile_all FLAG...: every source, in parallel, one failure names its file
  printf '%s\n' "${sources[@]}" | (cd "$root" && xargs -P "$(nproc)" -I{} sh -c 'g++ "$@" {} || { echo "newest-libtorch-check: {} failed" >&2; exit 255; }' _ "$@")
}
compile_all "${flags[@]}"
echo "newest-libtorch-check: ${#sources[@]} sources compile against libtorch $version" >&2

# Again as a CUDA build of that libtorch compiles them (QWEN3_TORCH_HAS_CUDA, the CUDA toolkit's headers here): a
# branch both newer than 2.6 and behind QWEN3_TORCH_HAS_CUDA (ATen's SM carveout beside a CUDA stream) is
# otherwise first compiled on a GPU machine, where a failed build costs the round. The package is a CPU build: it
# lacks the one header CMake generates for a CUDA one (cuda_cmake_macros.h), written here as CMake writes it for
# shared libraries.
cuda=${CUDA_HOME:-/usr/local/cuda}
if [ ! -f "$cuda/include/cuda_runtime_api.h" ]; then
  echo "newest-libtorch-check: no CUDA headers under $cuda (set CUDA_HOME): the CUDA pass is skipped" >&2
  exit 0
fi
shim=$(mktemp -d)
trap 'rm -rf "$shim"' EXIT
mkdir -p "$shim/c10/cuda/impl"
printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' >"$shim/c10/cuda/impl/cuda_cmake_macros.h"
compile_all "${flags[@]}" -DQWEN3_TORCH_HAS_CUDA=1 -DQWEN3_WITH_CUDA_KERNELS=1 -isystem "$shim" -isystem "$cuda/include"
echo "newest-libtorch-check: ${#sources[@]} sources compile against libtorch $version as a CUDA build" >&2
