#!/usr/bin/env bash
# The README's main command: installs what is missing, fetches the real Qwen3 tokenizer (the built-in tiny one
# is used if that fails), builds qwen3-train, and runs `qwen3-train smoke`: a synthetic NVFP4 model trained on
# a few built-in pairs, exported, reloaded and asked to reproduce a trained reply. Extra arguments go to smoke
# (e.g. --device cuda).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/fetch-tokenizer.sh" || echo "smoke: could not fetch the Qwen3 tokenizer; using the built-in tiny one" >&2
"$root/scripts/build.sh" qwen3-train
bin=${BUILD_DIR:-$root/build}/qwen3-train
out=${SMOKE_DIR:-$root/build/smoke}
rm -rf "$out"
cd "$root"
"$bin" --version
"$bin" smoke --out-dir "$out" "$@"
"$bin" inspect "$out/trained.dat" | tail -n 1
