#!/usr/bin/env bash
# Static PTX instruction counts of every kernel in kernels/*.cu, for one architecture: the figure the kernel
# docs quote when a change cuts the work an element and no GPU is at hand to time it (kernels/nvfp4_kernels.md,
# kernels/fused_ops.md, docs/performance.md). Needs nvcc, python3 and c++filt only (--sass: readelf too).
#
#   scripts/ptx-counts.sh [--arch sm_90] [--rev GIT_REV] [--sass] [NAME_FILTER]
#
# --rev counts the kernels of that commit instead of the working tree (before/after a change). Prints
# "file<TAB>kernel<TAB>instructions", a line a kernel instantiation. Instructions are the PTX statements of its
# body, those inside the intrinsics' inline-asm braces included; not directives, declarations, labels or
# comments. Static counts: unrolled loops count unrolled and both sides of a branch count once, so compare a
# kernel with itself before and after a change, never with time.
#
# --sass counts machine instructions instead: each kernel's .text section of the cubin ptxas makes, at 16 bytes an
# instruction (sm_70 on), its alignment padding included. PTX hides what an operation costs: an IEEE division or
# square root is one PTX statement and a dozen machine instructions with a slow-path branch, so a change that
# trades divisions for products counts up in PTX and down here (kernels/adamw_step.md). No disassembler is
# needed; what the instructions are, this does not say.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
arch=sm_90 rev="" filter="" sass=0
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch=$2; shift 2 ;;
    --rev) rev=$2; shift 2 ;;
    --sass) sass=1; shift ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "ptx-counts: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) filter=$1; shift ;;
  esac
done
for tool in nvcc python3 c++filt; do
  command -v "$tool" >/dev/null || { echo "ptx-counts: $tool not found" >&2; exit 2; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src=$root
if [ -n "$rev" ]; then
  src=$work/src
  mkdir -p "$src"
  git -C "$root" archive "$rev" kernels include | tar -x -C "$src" || { echo "ptx-counts: no kernels at $rev" >&2; exit 2; }
fi
kind=ptx
if [ "$sass" = 1 ]; then
  command -v readelf >/dev/null || { echo "ptx-counts: readelf not found (binutils)" >&2; exit 2; }
  kind=cubin
fi
mkdir -p "$work/out"
for cu in "$src"/kernels/*.cu; do
  out=$work/out/$(basename "$cu" .cu)
  nvcc -arch="$arch" -"$kind" -std=c++17 -I"$src/kernels" -I"$src/include" "$cu" -o "$out.$kind"
  # A cubin's section table as text, for the same reader below.
  if [ "$kind" = cubin ]; then readelf -S -W "$out.cubin" >"$out.sections" 2>/dev/null; fi
done
python3 - "$work/out" "$kind" "$filter" <<'PY'
import os, re, subprocess, sys
folder, kind, wanted = sys.argv[1], sys.argv[2], sys.argv[3]

def ptx_rows(path):
    rows, entry = [], None
    for line in open(path):
        code = line.split('//')[0]
        if re.match(r'\s*(\.visible\s+)?\.entry\s', code):
            entry = [code.split('(')[0].split()[-1], 0]
            rows.append(entry)
            continue
        if entry is None:
            continue
        for statement in code.split(';')[:-1]:  # only what ends in ';' is a statement
            s = statement.strip().lstrip('{}').strip()
            s = re.sub(r'^\$?[\w$]+:\s*', '', s)  # a label in front
            if s and not s.startswith('.'):
                entry[1] += 1
    return rows

def cubin_rows(path):  # each kernel's .text section, 16 bytes an instruction
    rows = []
    for line in open(path):
        m = re.search(r'\s\.text\.(\S+)\s+PROGBITS\s+\S+\s+\S+\s+([0-9a-fA-F]+)', line)
        if m:
            rows.append([m.group(1), int(m.group(2), 16) // 16])
    return rows

suffix = '.ptx' if kind == 'ptx' else '.sections'
for listing in sorted(f for f in os.listdir(folder) if f.endswith(suffix)):
    file = listing[:-len(suffix)]
    rows = (ptx_rows if kind == 'ptx' else cubin_rows)(os.path.join(folder, listing))
    demangled = subprocess.run(['c++filt'], input='\n'.join(r[0] for r in rows), capture_output=True,
                               text=True).stdout.split('\n')
    for (mangled, count), name in zip(rows, demangled):
        name = re.sub(r'\(anonymous namespace\)::|qwen3::kernels::|^void ', '', name or mangled)
        name = re.sub(r'\((?:[^()]|\([^()]*\))*\)$', '', name)  # the parameter list
        if wanted in file + '\t' + name:
            print(f"{file}\t{name}\t{count}")
PY
