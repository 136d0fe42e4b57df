#!/usr/bin/env bash
# Builds the .dat reader with clang's libFuzzer + AddressSanitizer + UBSan and fuzzes it for N seconds
# (default 300), starting from a few valid files. Results: docs/dat.md.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=${1:-300}
out=${FUZZ_DIR:-$root/build/fuzz}
mkdir -p "$out/corpus"
clang++ -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I"$root/include" \
  "$root/tests/fuzz/fuzz_dat_reader.cpp" "$root"/src/dat/{leb128,dat_reader,dat_writer,durable_file,elem_type}.cpp \
  -o "$out/fuzz_dat_reader"

# Seeds: small valid files, one with an NVFP4 pair.
python3 - "$out/corpus" <<'PY'
import sys, os
def leb(v):
    out = bytearray()
    while True:
        b = v & 0x7F; v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v: return bytes(out)
def entry(key, t, shape, size):
    n = 1
    for d in shape: n *= d
    h = leb(len(key)) + key.encode() + leb(t) + leb(len(shape)) + b"".join(leb(d) for d in shape)
    return h + bytes(range(256)) * (n * size // 256) + bytes(range(n * size % 256))
seeds = {
  "dense": [("model.norm.weight", 5, [16], 2), ("scalar", 6, [], 4)],
  "pair": [("a.weight.qdata", 0, [4, 8], 1), ("a.weight.scale", 101, [4, 1], 1), ("e", 15, [2, 3], 2)],
}
for name, ents in seeds.items():
    with open(os.path.join(sys.argv[1], name), "wb") as f:
        f.write(leb(len(ents)) + b"".join(entry(*e) for e in ents))
PY
"$out/fuzz_dat_reader" -max_total_time="$seconds" -max_len=4096 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$out/"   "$out/corpus" 2>&1 | tail -n 25
