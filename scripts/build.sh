#!/usr/bin/env bash
# Configures (once) and builds qwen3-train into build/. Extra arguments are ninja targets (default: all).
# BUILD_DIR and CMAKE_ARGS override the folder and add configure flags.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${BUILD_DIR:-$root/build}

# ccache hits across clones of the repository (CI builds a fresh clone each time).
export CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=true CCACHE_COMPILERCHECK=content
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G}

if [ ! -f "$build_dir/build.ninja" ]; then
  # shellcheck disable=SC2086
  cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-}
fi
jobs=${BUILD_JOBS:-$(nproc)}
ninja -C "$build_dir" -j "$jobs" "$@"
