#!/usr/bin/env python3
"""Writes a dense .dat (float16/bfloat16/float32 entries) as a Hugging Face safetensors checkpoint directory:
N shards plus model.safetensors.index.json, payload bytes copied as they are (no numpy, no torch). Used to make
a full-size HF-layout input for measuring `qwen3-train convert` (docs/export.md).

usage: dat-to-safetensors.py MODEL.dat CONFIG.json OUT_DIR [SHARDS]
"""
import json, os, shutil, struct, sys

DTYPES = {5: ("F16", 2), 6: ("F32", 4), 15: ("BF16", 2)}


def leb(f):
    value, shift = 0, 0
    while True:
        b = f.read(1)[0]
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value


def entries(path):
    with open(path, "rb") as f:
        for _ in range(leb(f)):
            key = f.read(leb(f)).decode()
            etype = leb(f)
            shape = [leb(f) for _ in range(leb(f))]
            if etype not in DTYPES:
                sys.exit(f"{path}: entry '{key}' has element type {etype}; only dense float files are supported")
            n = DTYPES[etype][1]
            for d in shape:
                n *= d
            yield key, DTYPES[etype][0], shape, f.tell(), n
            f.seek(n, os.SEEK_CUR)


def main():
    dat, config, out = sys.argv[1:4]
    shards = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    items = list(entries(dat))
    total = sum(e[4] for e in items)
    os.makedirs(out, exist_ok=True)
    shutil.copy(config, os.path.join(out, "config.json"))
    groups, current, size = [], [], 0
    for e in items:  # split by bytes, in order
        current.append(e)
        size += e[4]
        if size >= total * (len(groups) + 1) / shards and len(groups) < shards - 1:
            groups.append(current)
            current = []
    groups.append(current)
    weight_map = {}
    with open(dat, "rb") as src:
        for i, group in enumerate(groups):
            name = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
            header, offset = {"__metadata__": {"format": "pt"}}, 0
            for key, dtype, shape, _, n in group:
                header[key] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
                offset += n
                weight_map[key] = name
            text = json.dumps(header).encode()
            text += b" " * (-len(text) % 8)  # the reference writer pads the header to 8 bytes
            with open(os.path.join(out, name), "wb") as f:
                f.write(struct.pack("<Q", len(text)) + text)
                for _, _, _, pos, n in group:
                    src.seek(pos)
                    while n:
                        chunk = src.read(min(n, 64 << 20))
                        f.write(chunk)
                        n -= len(chunk)
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


main()
