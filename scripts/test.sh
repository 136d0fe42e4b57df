#!/usr/bin/env bash
# The README's test command: installs what is missing, builds everything (the CUDA kernels too when nvcc is
# there), and runs every test through ctest. Tests that need a GPU or downloaded data skip with a message.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/fetch-tokenizer.sh" || echo "test: could not fetch the Qwen3 tokenizer.json; the tests that need it skip" >&2
"$root/scripts/build.sh"
cd "${BUILD_DIR:-$root/build}"
ctest --output-on-failure -j "$(nproc)" "$@"
