#!/usr/bin/env bash
# Installs what building and testing qwen3-train needs on Debian 12, non-interactively; a no-op when all of it
# is already there. Used by smoke.sh, test.sh and cross-arm64.sh (whose extra packages come as arguments); safe
# to run by hand.
set -euo pipefail

packages=(build-essential cmake ninja-build ccache pkg-config
          libtorch-dev nlohmann-json3-dev libcli11-dev libtomlplusplus-dev libspdlog-dev libfmt-dev
          libgtest-dev libbenchmark-dev libpcre2-dev libutf8proc-dev
          libgloo-dev  # libtorch's c10d headers include <gloo/...> (data parallel: docs/distributed.md)
          libopenblas0-pthread  # libtorch's matmul goes through libblas.so.3: the reference BLAS is ~10x slower
          python3 nodejs        # the independent readers of the tests (SVG plots; HF exports, chat fixtures)
          "$@")

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" >/dev/null || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
