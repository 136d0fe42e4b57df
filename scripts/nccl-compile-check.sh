#!/usr/bin/env bash
# Compiles the NCCL path of the data-parallel module (src/dist/data_parallel.cpp with USE_C10D_NCCL) against a
# CUDA build of PyTorch 2.x's libtorch headers, on a machine without a GPU or a CUDA libtorch: Debian 13's
# libtorch-cuda-dev 2.6 (contrib) and libnccl-dev (contrib) are unpacked (dpkg -x, nothing installed) once per
# machine into a cache shared by every clone, and the file is checked with -fsyntax-only (every template the
# file uses is instantiated; nothing is linked or run). CUDA's own headers come from the CUDA toolkit here
# (/usr/local/cuda, or CUDA_HOME); without one the check is skipped with a message. docs/distributed.md.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/qwen3-train/nccl-headers
cuda=${CUDA_HOME:-/usr/local/cuda}
if [ ! -f "$cuda/include/cuda_runtime_api.h" ]; then
  echo "nccl-compile-check: no CUDA toolkit headers under $cuda (set CUDA_HOME): skipped" >&2
  exit 0
fi
# shellcheck source=scripts/cached-root.sh
. "$root/scripts/cached-root.sh"
debs="pool/contrib/p/pytorch-cuda/libtorch-cuda-dev_2.6.0+dfsg-7+b1_amd64.deb pool/contrib/n/nvidia-nccl/libnccl-dev_2.22.3-1-1_amd64.deb"
if needs_cached_root nccl-compile-check "$cache" "$debs" XDG_CACHE_HOME; then
  echo "nccl-compile-check: unpacking libtorch-cuda-dev and libnccl-dev (Debian 13) into $cache" >&2
  make_cached_root_dir "$cache"
  mkdir -p "$cache"
  mirror=$(host_debian_mirror)
  for deb in $debs; do
    curl -fsSL --retry 3 -o "$cache/package.deb" "$mirror/$deb"
    dpkg -x "$cache/package.deb" "$cache"
    rm "$cache/package.deb"
  done
  stamp_cached_root "$cache" "$debs"
fi
cxx=${CXX:-g++}
# The definitions a CUDA libtorch's CMake package gives its users (torch_cpu's and torch_cuda's).
"$cxx" -std=c++17 -fsyntax-only -Wall -Wextra -Wno-unused-parameter \
  -DUSE_DISTRIBUTED -DUSE_C10D_GLOO -DUSE_RPC -DUSE_TENSORPIPE -DUSE_C10D_NCCL -D_GLIBCXX_USE_CXX11_ABI=1 \
  -DQWEN3_REQUIRE_NCCL=1 -I"$root/include" -I"$root/src" \
  -isystem "$cache/usr/include" -isystem "$cache/usr/include/torch/csrc/api/include" \
  -isystem "$cuda/include" "$root/src/dist/data_parallel.cpp"
echo "nccl-compile-check: src/dist/data_parallel.cpp compiles with NCCL against libtorch-cuda-dev 2.6"
