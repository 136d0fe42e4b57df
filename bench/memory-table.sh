#!/usr/bin/env bash
# Regenerates docs/memory.md's "prediction against measurement on CPU" table: one `vram-report` step per
# configuration on the "mid" model (hidden 256, 4 layers, 8 heads / 2 KV, intermediate 1024, vocabulary 384;
# batch 4 x seq 256 of packed text, the same text as tests/test_memory.cpp) and the tiny preset (vocabulary
# 151936, seq 32), printing tensor MiB measured / predicted per phase and the worst relative error.
#
#   bench/memory-table.sh [BUILD_DIR]      (default build/; about a minute on a 2-core machine)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${1:-$root/build}/qwen3-train
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tok=$root/tests/data/tiny_tokenizer.json

python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "qwen"]
with open(w + "/text.txt", "w") as f:
    for line in range(120):
        f.write("".join(words[(line * 7 + k * 3) % 10] + " " for k in range(50)) + "\n")
mid = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 384, "hidden_size": 256,
       "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
       "head_dim": 32, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
       "tie_word_embeddings": True}
json.dump(mid, open(w + "/mid.json", "w"))
PY
"$bin" synth --config "$work/mid.json" --out-dir "$work/mid" >/dev/null
"$bin" synth --preset tiny --out-dir "$work/tiny" >/dev/null

row() {  # name, model folder, seq, extra flags...
  local name=$1 model=$2 seq=$3
  shift 3
  rm -f "$work/r.json"  # each row's report is new (vram-report replaces one only with --overwrite)
  "$bin" vram-report --weights "$work/$model/model.dat" --config "$work/$model/config.json" --tokenizer "$tok" \
    --train-data "$work/text.txt" --data-format text --pack --seq-len "$seq" --batch-size 4 --lr 1e-3 \
    --out "$work/r.json" "$@" >/dev/null 2>&1 || { echo "| $name | failed: vram-report $* |"; return; }
  python3 - "$work/r.json" "$name" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
cells, worst = [], 0.0
for s in r["Samples"]:
    if s["Phase"] in ("model_loaded", "forward_done", "backward_done", "optimizer_step_done"):
        m, p = s["PeakMiB"], s["PredictedMiB"]
        cells.append(f"{m:.1f} / {p:.1f}")
        worst = max(worst, abs(p - m) / m)
print(f"| {sys.argv[2]} | " + " | ".join(cells) + f" | {100 * worst:.0f}% |")
PY
}

echo "| configuration | model_loaded | forward_done | backward_done | optimizer_step_done | worst |"
echo "|---|---|---|---|---|---:|"
row "tiny preset (vocab 151936), seq 32: fp32 master, fp32 moments" tiny 32
row "tiny preset, seq 32: bf16 master, int8 moments, checkpointing, fused" tiny 32 --master-dtype bfloat16 \
  --optimizer-state-mode int8 --grad-checkpoint --fused-optimizer
row "mid: fp32, fp32 moments" mid 256
row "mid: bf16 master, bf16 moments" mid 256 --master-dtype bfloat16 --optimizer-state-mode bfloat16
row "mid: bf16, int8 moments" mid 256 --master-dtype bfloat16 --optimizer-state-mode int8
row "mid: fp32, checkpointing" mid 256 --grad-checkpoint
row "mid: bf16, checkpointing" mid 256 --master-dtype bfloat16 --grad-checkpoint
row "mid: fp32, nvfp4 moments, checkpointing" mid 256 --optimizer-state-mode nvfp4 --grad-checkpoint
row "mid: fp32, fused" mid 256 --fused-optimizer
row "mid: fp32, checkpointing, fused" mid 256 --grad-checkpoint --fused-optimizer
row "mid: bf16, nvfp4 moments, checkpointing, fused" mid 256 --master-dtype bfloat16 --optimizer-state-mode nvfp4 \
  --grad-checkpoint --fused-optimizer
row "mid: fp32, last layer only (frozen blocks as codes)" mid 256 --train-last-layers 1
row "mid: fp32 master, bf16 compute" mid 256 --compute-dtype bfloat16
row "mid: fp32 master, bf16 compute, int8 moments, checkpointing, fused" mid 256 --compute-dtype bfloat16 \
  --optimizer-state-mode int8 --grad-checkpoint --fused-optimizer
