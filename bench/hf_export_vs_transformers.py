#!/usr/bin/env python3
"""The hf export of a model against qwen3-train itself, on a machine with PyTorch and transformers (the GPU round).

Loads DIR (written by `qwen3-train export --format hf`) with transformers.AutoModelForCausalLM, scores every line
of an ids file (space-separated token ids) and compares each line's mean next-token cross-entropy with what
`qwen3-train eval --token-ids-file` reports for the .dat it came from: the same weights (the export's bf16 values
are the model's dequantized NVFP4 ones) must give the same losses to bf16 rounding. Prints one JSON line.

  python3 bench/hf_export_vs_transformers.py --hf DIR --weights M.dat --config C.json --ids-file IDS \
      [--qwen3 build/qwen3-train] [--device cuda] [--tolerance 0.02]
"""
import argparse
import json
import subprocess
import sys
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hf", required=True)
    p.add_argument("--weights", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--ids-file", required=True)
    p.add_argument("--qwen3", default="build/qwen3-train")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tolerance", type=float, default=0.02, help="largest |loss difference| / loss allowed")
    a = p.parse_args()

    t0 = time.time()
    ours = json.loads(subprocess.run([a.qwen3, "eval", "--weights", a.weights, "--config", a.config,
                                      "--token-ids-file", a.ids_file, "--json", "--device", a.device],
                                     check=True, capture_output=True, text=True).stdout)
    t_ours = time.time() - t0

    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(a.hf, torch_dtype=torch.bfloat16).to(a.device).eval()
    t_load = time.time() - t0
    rows = []
    with open(a.ids_file) as f:
        lines = [l.split() for l in f if l.strip() and not l.lstrip().startswith("#")]
    t0 = time.time()
    with torch.no_grad():
        for ids in lines:
            x = torch.tensor([[int(i) for i in ids]], device=a.device)
            logits = model(x).logits.float()
            loss = torch.nn.functional.cross_entropy(logits[0, :-1], x[0, 1:]).item()
            rows.append(loss)
    t_hf = time.time() - t0
    theirs = [s["loss"] for s in ours["sequences"]]
    if len(theirs) != len(rows):
        sys.exit(f"qwen3-train scored {len(theirs)} sequences, transformers {len(rows)} (lines longer than eval's "
                 "--seq-len are windowed by qwen3-train: keep lines shorter)")
    worst = max(abs(h - q) / max(q, 1e-9) for h, q in zip(rows, theirs))
    print(json.dumps({"sequences": len(rows), "worst_relative_loss_difference": worst,
                      "qwen3_mean": ours["mean_loss"], "transformers_first": rows[0], "qwen3_first": theirs[0],
                      "seconds": {"qwen3_eval": t_ours, "transformers_load": t_load, "transformers_score": t_hf},
                      "device": a.device, "ok": worst <= a.tolerance}))
    sys.exit(0 if worst <= a.tolerance else 1)


if __name__ == "__main__":
    main()
