#!/usr/bin/env bash
# Data-parallel step time on one machine (docs/distributed.md, "Measured"): the synth model of hidden 256, 4
# blocks, vocabulary 4,096, packed rows of 256 tokens, global batch 8, 12 steps; prints the mean step time and
# the time waiting on collectives over steps 3-12 of --metrics-jsonl, for 2 ranks x 1 thread with the state
# whole and shared out (--shard-optimizer-state), plain and --fused-optimizer.
#
#   bench/dp-step.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${1:-$root/build}/qwen3-train
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "qwen"]
with open(w + "/text.txt", "w") as f:
    for line in range(400):
        f.write("".join(words[(line * 7 + k * 3) % 10] + " " for k in range(50)) + "\n")
json.dump({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 4096, "hidden_size": 256,
           "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
           "head_dim": 32, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
           "tie_word_embeddings": True}, open(w + "/config.json", "w"))
PY
"$bin" synth --config "$work/config.json" --out-dir "$work/m" >/dev/null 2>&1
common=(train --weights "$work/m/model.dat" --config "$work/m/config.json" --tokenizer "$root/tests/data/tiny_tokenizer.json"
        --train-data "$work/text.txt" --data-format text --pack --seq-len 256 --steps 12 --log-every 0 --lr 1e-3)
summary() {  # metrics file, label
  python3 - "$1" "$2" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "loss" in r][2:]
ms = sum(r["step_ms"] for r in rows) / len(rows)
wait = sum(r.get("comm_wait_ms", 0) for r in rows) / len(rows)
print(f"| {sys.argv[2]} | {ms:.0f} | {wait:.1f} | {rows[-1]['loss']:.5f} |")
PY
}
echo "| run | step ms | waiting ms | loss after 12 steps |"
echo "|---|---:|---:|---:|"
for flags in "" "--shard-optimizer-state" "--fused-optimizer" "--fused-optimizer --shard-optimizer-state"; do
  name=$(echo "x$flags" | tr -dc 'a-z')
  for r in 0 1; do
    OMP_NUM_THREADS=1 RANK=$r WORLD_SIZE=2 "$bin" "${common[@]}" --batch-size 4 $flags \
      --dist-init "file://$work/$name.store" --metrics-jsonl "$work/$name-$r.jsonl" >"$work/$name-$r.out" 2>"$work/$name-$r.err" &
  done
  wait
  summary "$work/$name-0.jsonl" "2 ranks x 1 thread, batch 4 each ${flags:-(state whole)}"
done
