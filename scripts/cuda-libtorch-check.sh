#!/usr/bin/env bash
# Configures the project against a CUDA build of PyTorch 2.x's libtorch and compiles what differs there, on a machine with
# nvcc but no GPU and no CUDA libtorch (docs/build.md, "Against a CUDA libtorch, without a GPU"). Every path
# behind QWEN3_TORCH_HAS_CUDA (the kernels' libtorch glue, the CUDA memory probe, the NCCL data-parallel
# backend) is compiled nowhere else before a GPU machine is lent, and PyTorch's CUDA cmake (which sets
# CMAKE_CUDA_ARCHITECTURES OFF and adds -gencode flags of its own) runs here as it will there.
#
#   scripts/cuda-libtorch-check.sh            # build folder build-cuda-libtorch/ (BUILD_DIR)
#   scripts/cuda-libtorch-check.sh --prepare  # only unpack the packages (.ci/run: while the native build runs)
#
# What: Debian 13's libtorch-cuda-dev 2.6 (headers and cmake package) and libnccl-dev are unpacked (dpkg -x,
# nothing installed) once per machine into a cache shared by every clone. Their runtime libraries are not
# fetched (480 MB that nothing here would link or run): CMake's package only checks that the five files it
# names exist, so empty placeholders stand in for them. Then: configure with QWEN3_CUDA=ON and the CUDA
# toolkit here (/usr/local/cuda, or CUDA_HOME; without one the check is skipped with a message), check that
# the kernels are built for exactly QWEN3_CUDA_ARCHITECTURES and nothing of PyTorch's list, that nccl.h was found
# where PyTorch's wheel keeps it (outside torch's headers, which hold none), and compile the kernels and every
# source whose code differs against a CUDA libtorch (nothing is linked into an executable or run). QWEN3_REQUIRE_NCCL makes the
# data-parallel module fail to compile if its NCCL path were left out.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/qwen3-train/cuda-libtorch
cuda=${CUDA_HOME:-/usr/local/cuda}
build_dir=${BUILD_DIR:-$root/build-cuda-libtorch}
prepare_only=0
case "${1:-}" in
  "") ;;
  --prepare) prepare_only=1 ;;
  *) echo "usage: scripts/cuda-libtorch-check.sh [--prepare]" >&2; exit 2 ;;
esac
if [ ! -x "$cuda/bin/nvcc" ]; then
  echo "cuda-libtorch-check: no nvcc under $cuda (set CUDA_HOME): skipped" >&2
  exit 0
fi
# shellcheck source=scripts/cached-root.sh
. "$root/scripts/cached-root.sh"
debs="pool/contrib/p/pytorch-cuda/libtorch-cuda-dev_2.6.0+dfsg-7+b1_amd64.deb pool/contrib/n/nvidia-nccl/libnccl-dev_2.22.3-1-1_amd64.deb"
if needs_cached_root cuda-libtorch-check "$cache" "$debs" XDG_CACHE_HOME; then
  echo "cuda-libtorch-check: unpacking libtorch-cuda-dev and libnccl-dev (Debian 13) into $cache" >&2
  make_cached_root_dir "$cache"
  mkdir -p "$cache.partial"
  mirror=$(host_debian_mirror)
  for deb in $debs; do
    curl -fsSL --retry 3 -o "$cache.partial/package.deb" "$mirror/$deb"
    dpkg -x "$cache.partial/package.deb" "$cache.partial"
    rm "$cache.partial/package.deb"
  done
  lib=$cache.partial/usr/lib/x86_64-linux-gnu
  for name in c10 c10_cuda torch torch_cpu torch_cuda; do : >"$lib/lib$name.so.2.6.0"; done  # placeholders (above)
  stamp_cached_root "$cache" "$debs"
fi
# PyTorch's pip wheel has no nccl.h beside torch's headers: it is in site-packages/nvidia/nccl/include, a sibling
# of the torch folder. The same here: Debian's nccl*.h move out of usr/include into nvidia/nccl/include beside usr/
# (done on every run, so a cache unpacked before this layout is moved too), and the configure must find them there.
if compgen -G "$cache/usr/include/nccl*.h" >/dev/null; then
  mkdir -p "$cache/nvidia/nccl/include"
  mv "$cache"/usr/include/nccl*.h "$cache/nvidia/nccl/include/"
fi
[ "$prepare_only" = 0 ] || exit 0

mkdir -p "$build_dir"
export CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=true CCACHE_COMPILERCHECK=content
# One object a source (no unity build): the check compiles only the sources named below, each by its object.
if [ ! -f "$build_dir/build.ninja" ] || ! grep -q '^QWEN3_UNITY_BUILD:BOOL=OFF$' "$build_dir/CMakeCache.txt"; then
  cmake -S "$root" -B "$build_dir" -G Ninja -Wno-dev -DCMAKE_BUILD_TYPE=Release -DQWEN3_CUDA=ON -DQWEN3_UNITY_BUILD=OFF \
    -DCMAKE_CUDA_COMPILER="$cuda/bin/nvcc" -DCUDAToolkit_ROOT="$cuda" \
    -DCMAKE_PREFIX_PATH="$cache/usr/lib/x86_64-linux-gnu/cmake" \
    -DCMAKE_CXX_FLAGS=-DQWEN3_REQUIRE_NCCL=1 ${CMAKE_ARGS:-} >"$build_dir/configure.log" 2>&1 ||
    { tail -n 40 "$build_dir/configure.log" >&2; exit 1; }
fi
grep -q 'libtorch with CUDA: ON' "$build_dir/configure.log" ||
  { echo "cuda-libtorch-check: the configure did not see a CUDA libtorch ($build_dir/configure.log)" >&2; exit 1; }

nccl_dir=$(sed -n 's/^QWEN3_NCCL_INCLUDE_DIR:PATH=//p' "$build_dir/CMakeCache.txt")
if [ "$nccl_dir" != "$cache/nvidia/nccl/include" ]; then
  echo "cuda-libtorch-check: nccl.h found at '$nccl_dir', expected the wheel's layout $cache/nvidia/nccl/include" >&2
  exit 1
fi

# The kernels' architectures: ours, whatever PyTorch's cmake added.
archs=$(sed -n 's/^QWEN3_CUDA_ARCHITECTURES:STRING=//p' "$build_dir/CMakeCache.txt")
expected=$(tr ';' '\n' <<<"$archs" | sort -u | tr '\n' ' ')
got=$(grep -o -E -- '--generate-code=arch=compute_[0-9a-z]+|-gencode[= ]arch=compute_[0-9a-z]+' "$build_dir/build.ninja" |
      sed -E 's/.*compute_//' | sort -u | tr '\n' ' ')
if [ "$got" != "$expected" ]; then
  echo "cuda-libtorch-check: kernels built for [$got], expected [$expected] (QWEN3_CUDA_ARCHITECTURES)" >&2
  exit 1
fi

# What differs against a CUDA libtorch: the sources that test QWEN3_TORCH_HAS_CUDA or USE_C10D_NCCL, or include a
# header that does (the kernels' libtorch glue, the CUDA memory probe, the NCCL backend), and the kernels under
# PyTorch's CUDA flags. Every other object is the same code as the native build's, which the README's test
# command compiles and tests (compiling all of it again here took 5-9 minutes on a cold machine).
macros='QWEN3_TORCH_HAS_CUDA|USE_C10D_NCCL'
mapfile -t differing < <(cd "$root" && {
  grep -rlE "$macros" src --include='*.cpp'
  for header in $(grep -rlE "$macros" src include --include='*.h'); do
    base=$(basename "$header")
    grep -rlE "[\"/]${base//./\\.}\"" src --include='*.cpp'
  done
} | sort -u)
objects=()
for source in "${differing[@]}"; do
  object=$(grep -m1 -oE "CMakeFiles/[A-Za-z0-9_]+\.dir/${source//./\\.}\.o" "$build_dir/build.ninja")  # -m1, not | head: under pipefail head can make grep fail
  [ -n "$object" ] || { echo "cuda-libtorch-check: no object for $source in $build_dir/build.ninja" >&2; exit 1; }
  objects+=("$object")
done
echo "cuda-libtorch-check: compiling the kernels and ${differing[*]}"
ninja -C "$build_dir" qwen3_kernels "${objects[@]}"
# ... and compiled against it, not against an nccl.h of the CUDA toolkit's (CUDA 13 ships one in its include/).
used=$(ninja -C "$build_dir" -t deps CMakeFiles/qwen3_core.dir/src/dist/data_parallel.cpp.o | grep -E '/nccl\.h$' | tr -d ' ')
if [ "$used" != "$cache/nvidia/nccl/include/nccl.h" ]; then
  echo "cuda-libtorch-check: src/dist/data_parallel.cpp compiled against '$used', not $cache/nvidia/nccl/include/nccl.h" >&2
  exit 1
fi
echo "cuda-libtorch-check: the CUDA-dependent objects compile against libtorch-cuda 2.6 with nvcc $("$cuda/bin/nvcc" --version |
  sed -n 's/.*release \([0-9.]*\).*/\1/p'), kernels for sm_${archs//;/, sm_}, NCCL path included"
