#!/usr/bin/env python3
"""Hugging Face transformers' Qwen3ForCausalLM beside qwen3-train (docs/performance.md, "The peer").

  hf_peer.py logits --weights M.dat --config C.json [--ids-file IDS] [--qwen3 BIN | --ours LOGITS.safetensors]
  hf_peer.py logits --hf-dir EXPORT --config C.json --ours LOGITS.safetensors [--ids-file IDS] [--tolerance T]
  hf_peer.py train  --config C.json --seq-len T --batch-size B [--steps 20] [--grad-checkpoint on|off]
                    [--param-dtype bfloat16|float32] [--moments param|int8|4bit]

logits: the independent reference for the model. Decodes the .dat here (its own reader and NVFP4 decoder, written
from the format's definition, sharing nothing with qwen3-train), loads the values into Qwen3ForCausalLM built from
the same config.json in float32, and compares its logits on every window with `qwen3-train eval --logits-out`
(run here with --qwen3, or read from --ours where the binary cannot run beside this Python). Exit 1 when the largest
|difference| of a logit exceeds --tolerance times the largest |logit|. With --hf-dir the model is instead what
transformers loads from an `export --format hf` folder, against --ours: `qwen3-train eval --logits-out` of that
folder converted back (`convert --dtype bfloat16`: the export's very values), at the same tolerance.

train: the peer's training step on the same shape and with the same dtypes as a `qwen3-train train`
configuration: random weights from config.json in --param-dtype (bfloat16: a bf16 master; float32: an fp32 master
whose products run in bf16 under autocast, as qwen3-train computes in bf16 on a GPU), AdamW with moments in the
parameters' dtype (torch.optim.AdamW(fused=True)) or, with --moments int8|4bit, torchao's 8-bit / 4-bit AdamW
(block-quantized moments, the nearest a PyTorch user has to qwen3-train's int8 / nvfp4 moments; refused when
torchao is not installed), gradient checkpointing on or off, random ids; tokens/s over the steps after --warmup,
the model TFLOP/s and the peak memory (CUDA: allocated and reserved by PyTorch's allocator; CPU: the process's
peak RSS). Model FLOPs per token are qwen3-train's (docs/performance.md, "MFU"): 6 per parameter but the input
embedding (a tied head counted once) + 12·L·(heads·head_dim)·T, never recompute.
The config's tie_word_embeddings holds for both: qwen3-train's training ties the head to the embedding as HF does,
even where the .dat also stores an lm_head (docs/data.md), so the two train the same parameters.

Each prints one JSON line on stdout.
"""
import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import torch


# ------------------------------------------------------------------------------------------- the .dat, read here
def _leb128(f):
    value, shift = 0, 0
    while True:
        b = f.read(1)
        if not b:
            raise ValueError("truncated LEB128")
        value |= (b[0] & 0x7F) << shift
        shift += 7
        if not b[0] & 0x80:
            return value


# element type id -> (torch dtype of the payload, bytes per element)
_DAT_TYPES = {0: (torch.uint8, 1), 1: (torch.int8, 1), 2: (torch.int16, 2), 3: (torch.int32, 4), 4: (torch.int64, 8),
              5: (torch.float16, 2), 6: (torch.float32, 4), 7: (torch.float64, 8), 15: (torch.bfloat16, 2),
              100: (torch.uint8, 1), 101: (torch.uint8, 1)}
# E2M1 magnitudes of codes 0..7; bit 3 is the sign.
_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def read_dat(path):
    """Every entry of a .dat as {key: (type id, tensor)}; payloads little-endian, row-major."""
    out = {}
    with open(path, "rb") as f:
        for _ in range(_leb128(f)):
            key = f.read(_leb128(f)).decode()
            etype = _leb128(f)
            shape = [_leb128(f) for _ in range(_leb128(f))]
            if etype not in _DAT_TYPES:
                raise ValueError(f"{path}: entry '{key}' has element type {etype}, unknown here")
            dtype, size = _DAT_TYPES[etype]
            numel = 1
            for d in shape:
                numel *= d
            raw = bytearray(f.read(numel * size))
            if len(raw) != numel * size:
                raise ValueError(f"{path}: entry '{key}' is truncated")
            t = torch.frombuffer(raw, dtype=dtype) if numel else torch.empty(0, dtype=dtype)
            out[key] = (etype, t.reshape(shape))
    return out


def e4m3fn_to_float(codes):
    """E4M3FN bytes to float64, from the definition: (1 + m/8)·2^(e-7), subnormal m/8·2^-6, 0x7F/0xFF NaN."""
    c = codes.to(torch.int64)
    sign = torch.where(c & 0x80 != 0, -1.0, 1.0).to(torch.float64)
    e = (c >> 3) & 0xF
    m = (c & 0x7).to(torch.float64)
    normal = (1 + m / 8) * torch.pow(2.0, (e - 7).to(torch.float64))
    subnormal = m / 8 * 2.0 ** -6
    v = sign * torch.where(e == 0, subnormal, normal)
    return torch.where((c & 0x7F) == 0x7F, torch.full_like(v, float("nan")), v)


def dequantize_pair(codes, scales, scale_type):
    """A [out, in/2] code tensor (element 2j in the low nibble) and its [out, in/16] scales -> [out, in] float64."""
    lo, hi = codes & 0x0F, codes >> 4
    nibbles = torch.stack([lo, hi], dim=-1).reshape(codes.shape[0], -1).to(torch.int64)
    values = _E2M1[nibbles & 7] * torch.where(nibbles & 8 != 0, -1.0, 1.0).to(torch.float64)
    s = e4m3fn_to_float(scales) if scale_type == 101 else scales.to(torch.float64)
    return values * s.repeat_interleave(16, dim=1)


def dat_state_dict(path):
    """The model's tensors under their Hugging Face names, float32 (NVFP4 pairs dequantized)."""
    entries = read_dat(path)
    state = {}
    for key, (etype, t) in entries.items():
        if key.endswith(".scale"):
            continue
        if key.endswith(".qdata"):
            name = key[: -len(".qdata")]
            stype, scales = entries[name + ".scale"]
            state[name] = dequantize_pair(t, scales, stype).to(torch.float32)
        else:
            state[key] = t.to(torch.float32)
    return state


# ------------------------------------------------------------------------------------------- the peer model
def _is_moe(config_path):
    with open(config_path) as f:
        return json.load(f).get("model_type") == "qwen3_moe"


def _transformers(moe=False):
    """transformers' version, and the config and model classes: Qwen3's, or Qwen3 MoE's."""
    import transformers
    if moe:
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
        return transformers.__version__, Qwen3MoeConfig, Qwen3MoeForCausalLM
    from transformers import Qwen3Config, Qwen3ForCausalLM
    return transformers.__version__, Qwen3Config, Qwen3ForCausalLM


def hf_config(config_path, **overrides):
    _, config_class, _ = _transformers(_is_moe(config_path))
    with open(config_path) as f:
        d = json.load(f)
    d.pop("torch_dtype", None)
    d.pop("dtype", None)
    d.update(overrides)
    return config_class(**d)


def expert_layout(state, model_keys):
    """The checkpoint layout keeps one module per expert (mlp.experts.E.gate_proj.weight, ...); transformers 5 holds a
    block's experts as two stacked parameters (mlp.experts.gate_up_proj [E, 2I, H]: gate then up;
    mlp.experts.down_proj [E, H, I]). The per-expert tensors are stacked where the model has those."""
    out = dict(state)
    for key in model_keys:
        for fused, members in ((".mlp.experts.gate_up_proj", ("gate_proj", "up_proj")),
                               (".mlp.experts.down_proj", ("down_proj",))):
            if not key.endswith(fused):
                continue
            prefix = key[: -len(fused)] + ".mlp.experts."
            experts = []
            while f"{prefix}{len(experts)}.{members[0]}.weight" in out:
                e = len(experts)
                experts.append(torch.cat([out.pop(f"{prefix}{e}.{m}.weight") for m in members], 0))
            if experts:
                out[key] = torch.stack(experts)
    return out


def cmd_logits(a):
    version, _, model_class = _transformers(_is_moe(a.config))
    from safetensors.torch import load_file

    if bool(a.hf_dir) == bool(a.weights):
        sys.exit("hf_peer: logits takes --weights (the .dat) or --hf-dir (an export), one of them")
    if a.hf_dir and a.ours is None:
        sys.exit("hf_peer: logits --hf-dir needs --ours (eval of the folder converted back)")
    if a.hf_dir:
        # The export's folder as a user loads it: transformers reads its config.json and safetensors itself.
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(a.hf_dir, dtype=torch.float32, attn_implementation="eager")
        config = model.config
    else:
        state = dat_state_dict(a.weights)
        # A file with its own lm_head is used as such even when the config ties it (as qwen3-train loads it).
        config = hf_config(a.config, tie_word_embeddings="lm_head.weight" not in state)
        config._attn_implementation = "eager"  # the textbook formula, in float32
        model = model_class(config).to(torch.float32)
        state = expert_layout(state, model.state_dict().keys())
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
        if missing or unexpected:
            sys.exit(f"hf_peer: {a.weights}: missing {missing}, unexpected {unexpected}")
    model = model.to(a.device).eval()

    tmp = tempfile.TemporaryDirectory()
    ids_file = a.ids_file
    if ids_file is None:  # a few lines of random ids, one longer than --seq-len so that windows overlap
        g = torch.Generator().manual_seed(0)
        ids_file = os.path.join(tmp.name, "ids.txt")
        with open(ids_file, "w") as f:
            for n in (7, 33, 2 * a.seq_len + 5):
                f.write(" ".join(str(int(i)) for i in torch.randint(0, config.vocab_size, (n,), generator=g)) + "\n")
    ours_path = a.ours
    if ours_path is None:
        ours_path = os.path.join(tmp.name, "ours.safetensors")
        subprocess.run([a.qwen3, "eval", "--weights", a.weights, "--config", a.config, "--token-ids-file", ids_file,
                        "--seq-len", str(a.seq_len), "--dtype", "float32", "--device", a.device,
                        "--logits-out", ours_path, "--json"], check=True, stdout=subprocess.DEVNULL)
    ours = load_file(ours_path)
    windows = sum(1 for k in ours if k.startswith("logits."))
    if windows == 0:
        sys.exit(f"hf_peer: {ours_path} holds no logits")

    worst, worst_rel, largest, loss_diff, tokens = 0.0, 0.0, 0.0, 0.0, 0
    # A mixture of experts: each sparse block's chosen experts at each position against ours (experts.K). Where the
    # k-th and (k+1)-th probabilities are within 1e-5 of each other a different choice is a tie, not a difference.
    routed, mismatched, ties = 0, 0, 0
    with torch.no_grad():
        for k in range(windows):
            ids = ours[f"ids.{k}"].to(a.device)
            mine = ours[f"logits.{k}"].to(a.device)
            moe = f"experts.{k}" in ours
            out = model(input_ids=ids[:-1].unsqueeze(0), **({"output_router_logits": True} if moe else {}))
            theirs = out.logits[0].float()
            if moe:
                mine_experts = ours[f"experts.{k}"].to(a.device)
                if len(out.router_logits) != mine_experts.shape[0]:
                    sys.exit(f"hf_peer: window {k}: {len(out.router_logits)} sparse blocks (transformers), "
                             f"{mine_experts.shape[0]} (ours)")
                for block, router in enumerate(out.router_logits):
                    probs = torch.softmax(router.float(), dim=-1)
                    top = torch.topk(probs, mine_experts.shape[2] + 1, dim=-1)
                    their_set = top.indices[:, :-1].sort(dim=-1).values
                    our_set = mine_experts[block].sort(dim=-1).values
                    differs = (their_set != our_set).any(dim=-1)
                    tie = (top.values[:, -2] - top.values[:, -1]) < 1e-5
                    routed += differs.numel()
                    ties += int((differs & tie).sum())
                    mismatched += int((differs & ~tie).sum())
            if theirs.shape != mine.shape:
                sys.exit(f"hf_peer: window {k}: shapes {tuple(theirs.shape)} (transformers) and {tuple(mine.shape)}")
            diff = (theirs - mine).abs().max().item()
            worst = max(worst, diff)
            worst_rel = max(worst_rel, diff / max(theirs.abs().max().item(), 1e-30))
            largest = max(largest, theirs.abs().max().item())
            ce = torch.nn.functional.cross_entropy
            loss_diff = max(loss_diff, abs(ce(theirs, ids[1:]).item() - ce(mine, ids[1:]).item()))
            tokens += ids.numel() - 1
    ok = worst_rel <= a.tolerance and mismatched == 0
    result = {"check": "logits", "transformers": version, "torch": torch.__version__, "device": a.device,
              "windows": windows, "tokens": tokens, "max_abs_diff": worst, "max_rel_diff": worst_rel,
              "max_abs_logit": largest, "max_loss_diff": loss_diff, "tolerance": a.tolerance, "ok": ok}
    if routed:
        result.update({"routed_positions": routed, "router_mismatches": mismatched, "router_ties": ties})
    print(json.dumps(result))
    return 0 if ok else 1


def optimizer_moments(a):
    return a.param_dtype if a.moments == "param" else a.moments


def make_optimizer(a, parameters):
    """AdamW without weight decay, as qwen3-train's default; moments in the parameters' dtype or torchao's."""
    if a.moments == "param":
        return torch.optim.AdamW(parameters, lr=a.lr, weight_decay=0.0, fused=True)
    try:
        from torchao.optim import AdamW4bit, AdamW8bit
    except ImportError:
        sys.exit(f"hf_peer: --moments {a.moments} needs torchao (its AdamW8bit / AdamW4bit), not installed here")
    kind = AdamW8bit if a.moments == "int8" else AdamW4bit
    return kind(parameters, lr=a.lr, weight_decay=0.0)


def cmd_train(a):
    version, _, Qwen3ForCausalLM = _transformers()
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    torch.manual_seed(a.seed)
    config = hf_config(a.config, use_cache=False)
    config._attn_implementation = a.attn
    t0 = time.time()
    param_dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[a.param_dtype]
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(param_dtype)
    with device:  # weights made where they train, in their dtype: no extra copy of a 4B model on the host
        model = Qwen3ForCausalLM(config)
    torch.set_default_dtype(default_dtype)
    model.train()
    if a.grad_checkpoint == "on":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    params = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight.numel()
    # qwen3-train's model FLOPs (step_time_model.h, model_flops_per_token): a tied head is the embedding, counted
    # once as the head; an untied model's input embedding does no product.
    flop_params = params if config.tie_word_embeddings else params - embedding
    optimizer = make_optimizer(a, model.parameters())
    # An fp32 master computes in bf16 on the GPU (qwen3-train's compute dtype there); a bf16 master is bf16 already.
    autocast = (torch.autocast(device_type=device.type, dtype=torch.bfloat16)
                if param_dtype == torch.float32 and cuda else contextlib.nullcontext())
    build_s = time.time() - t0
    if cuda:
        torch.cuda.synchronize(device)
        weights_gib = torch.cuda.memory_allocated(device) / 2**30
        torch.cuda.reset_peak_memory_stats(device)
    g = torch.Generator(device="cpu").manual_seed(a.seed)
    ids = torch.randint(0, config.vocab_size, (a.batch_size, a.seq_len), generator=g).to(device)

    losses, step_s = [], []
    start = None
    for step in range(a.steps):
        if step == a.warmup:
            if cuda:
                torch.cuda.synchronize(device)
            start = time.time()
        t = time.time()
        with autocast:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())  # synchronizes, as qwen3-train's per-step loss does
        step_s.append(time.time() - t)
    if cuda:
        torch.cuda.synchronize(device)
    timed = a.steps - a.warmup
    elapsed = time.time() - start
    tokens_per_s = a.batch_size * a.seq_len * timed / elapsed
    heads_dim = config.num_attention_heads * getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)
    flops_per_token = 6 * flop_params + 12 * config.num_hidden_layers * heads_dim * a.seq_len  # PaLM's count
    out = {"check": "train", "transformers": version, "torch": torch.__version__, "device": str(device),
           "attn": a.attn, "params": params, "flop_params": flop_params, "tied": bool(config.tie_word_embeddings),
           "seq_len": a.seq_len, "batch_size": a.batch_size, "param_dtype": a.param_dtype,
           "compute_dtype": "bfloat16" if param_dtype == torch.bfloat16 or cuda else "float32",
           "moments": optimizer_moments(a), "flops_per_token": flops_per_token,
           "grad_checkpoint": a.grad_checkpoint, "steps": a.steps, "timed_steps": timed, "build_s": round(build_s, 2),
           "tokens_per_s": round(tokens_per_s, 1), "ms_per_step": round(1000 * elapsed / timed, 2),
           "ms_per_step_median": round(1000 * sorted(step_s[a.warmup:])[timed // 2], 2),
           "tflops_per_s": round(tokens_per_s * flops_per_token / 1e12, 2),
           "loss_first": round(losses[0], 6), "loss_last": round(losses[-1], 6)}
    if cuda:
        out["weights_gib"] = round(weights_gib, 3)
        out["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 3)
        out["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved(device) / 2**30, 3)
    out["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)
    print(json.dumps(out))
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    default_device = "cuda" if torch.cuda.is_available() else "cpu"

    lg = sub.add_parser("logits", help="logits of the .dat's model: transformers against qwen3-train eval")
    lg.add_argument("--weights", help="the .dat (decoded here), unless --hf-dir")
    lg.add_argument("--hf-dir", help="an `export --format hf` folder, loaded with AutoModelForCausalLM instead (with --ours)")
    lg.add_argument("--config", required=True)
    lg.add_argument("--ids-file", help="lines of space-separated ids (default: three random lines)")
    lg.add_argument("--seq-len", type=int, default=64, help="window length, as eval's --seq-len")
    who = lg.add_mutually_exclusive_group()
    who.add_argument("--qwen3", default="build/qwen3-train", help="the binary, run here")
    who.add_argument("--ours", help="eval --logits-out's file, made elsewhere with the same --ids-file and --seq-len")
    lg.add_argument("--device", default=default_device)
    lg.add_argument("--tolerance", type=float, default=1e-4,
                    help="largest |logit difference| allowed, as a fraction of the largest |logit|")
    lg.set_defaults(run=cmd_logits)

    tr = sub.add_parser("train", help="the peer's training step: tokens/s and peak memory")
    tr.add_argument("--config", required=True)
    tr.add_argument("--seq-len", type=int, required=True)
    tr.add_argument("--batch-size", type=int, required=True)
    tr.add_argument("--steps", type=int, default=20)
    tr.add_argument("--warmup", type=int, default=3, help="first steps left out of the timing")
    tr.add_argument("--grad-checkpoint", choices=["on", "off"], default="off")
    tr.add_argument("--param-dtype", choices=["bfloat16", "float32"], default="bfloat16",
                    help="the master weights' dtype (float32 computes in bf16 under autocast on a GPU)")
    tr.add_argument("--moments", choices=["param", "int8", "4bit"], default="param",
                    help="AdamW's moments: in the parameters' dtype, or torchao's 8-bit / 4-bit AdamW")
    tr.add_argument("--attn", default="sdpa", help="transformers' attention implementation")
    tr.add_argument("--lr", type=float, default=1e-5)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--device", default=default_device)
    tr.set_defaults(run=cmd_train)

    a = p.parse_args()
    if a.cmd == "train" and not 0 <= a.warmup < a.steps:
        p.error("--warmup must be below --steps")
    return a.run(a)


if __name__ == "__main__":
    sys.exit(main())
