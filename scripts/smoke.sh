#!/usr/bin/env bash
# The README's main command: installs what is missing, builds qwen3-train, and runs the main job on its
# embedded default. Today that is: write a small synthetic NVFP4 model, inspect and validate it, and round-trip
# it through a dense file and `quantize`. (Later issues turn this into `qwen3-train smoke`: synthetic
# train -> export -> reload -> generate.) Extra arguments go to `synth` (e.g. --preset qwen3-4b).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh" qwen3-train
bin=${BUILD_DIR:-$root/build}/qwen3-train
out=${SMOKE_DIR:-$root/build/smoke}
rm -rf "$out"
mkdir -p "$out"

"$bin" --version
"$bin" synth --preset tiny --out-dir "$out/nvfp4" "$@"
"$bin" inspect "$out/nvfp4/model.dat" | tail -n 4
"$bin" synth --preset tiny --dense --out-dir "$out/dense" "$@"
"$bin" quantize --in "$out/dense/model.dat" --out "$out/quantized.dat" --scale-mode search
"$bin" inspect --json "$out/quantized.dat" > "$out/quantized.json"
echo "smoke: ok (files in $out)"
