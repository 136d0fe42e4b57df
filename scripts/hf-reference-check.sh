#!/usr/bin/env bash
# The model against Hugging Face transformers, on a CPU (docs/model.md, "The independent reference"):
# bench/hf_peer.py builds transformers' Qwen3ForCausalLM from a synth model's config.json, loads the .dat's values
# through its own reader and NVFP4 decoder, and compares its float32 logits with `qwen3-train eval --logits-out`
# on the same ids (the dense tiny model and the tiny mixture of experts, with its router choices); it loads the
# MoE's `export --format hf` folder with AutoModelForCausalLM, as a user would, and compares that model's logits
# with qwen3-train's eval of the same folder converted back; then it runs the peer's training step (the GPU round's side-by-side benchmark) for a few tiny
# steps, gradient checkpointing on and off, so the script is known to run before a GPU session depends on it.
#
#   scripts/hf-reference-check.sh            # needs root (chroot); uses BUILD_DIR/qwen3-train (default build/)
#   scripts/hf-reference-check.sh --prepare  # only make the root (.ci/run does it while the native build compiles)
#
# transformers is not in Debian 12 and PyPI is not reachable from these machines: mmdebstrap makes a Debian
# unstable root with python3-transformers and python3-torch (CPU) once per machine, in the cache the other lanes
# use (QWEN3_HF_ROOT names another folder). qwen3-train runs on the host; Python runs in the root on the files.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/qwen3-train
chroot_dir=${QWEN3_HF_ROOT:-$cache/hf-root}
build_dir=${BUILD_DIR:-$root/build}
bin=$build_dir/qwen3-train

if [ "$(id -u)" -ne 0 ]; then
  echo "hf-reference-check: needs root (mmdebstrap, chroot and bind mounts); run it with sudo" >&2
  exit 2
fi
prepare_only=0
case "${1:-}" in
  "") ;;
  --prepare) prepare_only=1 ;;
  *) echo "usage: scripts/hf-reference-check.sh [--prepare]" >&2; exit 2 ;;
esac
[ "$prepare_only" = 1 ] || [ -x "$bin" ] || { echo "hf-reference-check: no $bin: build first (scripts/build.sh)" >&2; exit 2; }
"$root/scripts/setup.sh" mmdebstrap

packages=python3-transformers,python3-torch,python3-safetensors
# shellcheck source=scripts/cached-root.sh
. "$root/scripts/cached-root.sh"
if needs_cached_root hf-reference-check "$chroot_dir" "$packages" QWEN3_HF_ROOT; then
  echo "hf-reference-check: installing Debian unstable with transformers into $chroot_dir" >&2
  make_cached_root_dir "$chroot_dir"
  mirror=$(host_debian_mirror)
  # A mirror snapshot's unstable Release file may be past its Valid-Until date; its signature is still checked.
  mmdebstrap --quiet --variant=apt --format=directory --aptopt='Acquire::Check-Valid-Until "false"' \
    --include="$packages" sid "$chroot_dir.partial" "deb $mirror sid main"
  stamp_cached_root "$chroot_dir" "$packages"
fi
[ "$prepare_only" = 0 ] || exit 0

# The files both sides read: in the checkout's build folder (ignored), bind-mounted into the root at /src.
work=$build_dir/hf-reference
rm -rf "$work"
mkdir -p "$work"
"$bin" synth --preset tiny --seed 1 --out-dir "$work/m1" >/dev/null
"$bin" synth --preset tiny --seed 2 --out-dir "$work/m2" >/dev/null
"$bin" synth --preset qwen3-moe-tiny --seed 1 --out-dir "$work/moe" >/dev/null
# Three lines of ids, one longer than two windows (the overlap of windows is part of what is compared).
awk 'BEGIN { srand(7); split("7 33 133", n, " ");
             for (l = 1; l <= 3; ++l) { s = ""; for (i = 0; i < n[l]; ++i) s = s (i ? " " : "") int(rand() * 151936); print s } }' \
  >"$work/ids.txt"
"$bin" eval --weights "$work/m1/model.dat" --config "$work/m1/config.json" --token-ids-file "$work/ids.txt" \
  --seq-len 64 --dtype float32 --logits-out "$work/ours.safetensors" --json >"$work/eval.json"
"$bin" eval --weights "$work/moe/model.dat" --config "$work/moe/config.json" --token-ids-file "$work/ids.txt" \
  --seq-len 64 --dtype float32 --logits-out "$work/ours-moe.safetensors" --json >"$work/eval-moe.json"
# The MoE's Hugging Face export (bf16 safetensors, per-expert keys) as transformers loads it, against qwen3-train's
# eval of the same folder converted back (dense bf16: the very values); another MoE's export must fail.
"$bin" synth --preset qwen3-moe-tiny --seed 2 --out-dir "$work/moe2" >/dev/null
for m in moe moe2; do
  "$bin" export --weights "$work/$m/model.dat" --config "$work/$m/config.json" --format hf --no-tokenizer \
    --out "$work/$m-hf" >/dev/null
done
"$bin" convert --hf-dir "$work/moe-hf" --out "$work/moe-back/model.dat" --dtype bfloat16 >/dev/null
"$bin" eval --weights "$work/moe-back/model.dat" --config "$work/moe-back/config.json" --token-ids-file "$work/ids.txt" \
  --seq-len 64 --dtype float32 --logits-out "$work/ours-moe-hf.safetensors" --json >/dev/null
rel=${work#"$root"/}

inner=$(cat <<'INNER'
set -euo pipefail
cd /src
w=$REL
peer() { python3 bench/hf_peer.py "$@" 2> >(grep -v -e 'UCX  ERROR' -e '^Error in cpuinfo' >&2); }
peer logits --weights $w/m1/model.dat --config $w/m1/config.json --ids-file $w/ids.txt --seq-len 64 \
  --ours $w/ours.safetensors
# The comparison can fail: another model's weights against these logits.
if peer logits --weights $w/m2/model.dat --config $w/m2/config.json --ids-file $w/ids.txt --seq-len 64 \
     --ours $w/ours.safetensors >$w/wrong.json; then
  echo "hf-reference-check: the logits of seed 1 passed against the weights of seed 2" >&2
  exit 1
fi
echo "hf-reference-check: another model's weights are refused: $(cat $w/wrong.json)"
# The mixture of experts: Qwen3MoeForCausalLM on the tiny MoE (two sparse blocks, one dense): the logits, and
# each sparse block's chosen experts at every position (eval --logits-out's experts.K), ties apart.
if ! peer logits --weights $w/moe/model.dat --config $w/moe/config.json --ids-file $w/ids.txt --seq-len 64 \
     --ours $w/ours-moe.safetensors >$w/moe.json; then
  cat $w/moe.json >&2
  echo "hf-reference-check: the MoE's logits or router choices differ from transformers'" >&2
  exit 1
fi
cat $w/moe.json
if ! grep -q '"router_mismatches": 0' $w/moe.json; then
  echo "hf-reference-check: the MoE's router choices were not compared (no experts.K in eval --logits-out?)" >&2
  exit 1
fi
# transformers loads the MoE's hf export (AutoModelForCausalLM): the logits and router choices of what it loaded.
peer logits --hf-dir $w/moe-hf --config $w/moe/config.json --ids-file $w/ids.txt --seq-len 64 \
  --ours $w/ours-moe-hf.safetensors
if peer logits --hf-dir $w/moe2-hf --config $w/moe2/config.json --ids-file $w/ids.txt --seq-len 64 \
     --ours $w/ours-moe-hf.safetensors >$w/wrong-moe.json; then
  echo "hf-reference-check: another MoE's export passed against this one's logits" >&2
  exit 1
fi
for gc in on off; do
  peer train --config $w/m1/config.json --seq-len 64 --batch-size 2 --steps 3 --warmup 1 --grad-checkpoint $gc
done
# The fast configuration's peer: an fp32 master (autocast to bf16 on a GPU).
peer train --config $w/m1/config.json --seq-len 64 --batch-size 2 --steps 3 --warmup 1 --param-dtype float32
INNER
)
unshare --mount --propagation private bash -euo pipefail -c '
  dir=$1 src=$2 inner=$3 rel=$4
  mount -t proc proc "$dir/proc"
  mount --rbind /sys "$dir/sys"
  mount --rbind /dev "$dir/dev"
  mkdir -p "$dir/src"
  mount --bind "$src" "$dir/src"
  exec chroot "$dir" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 OMP_NUM_THREADS=2 REL="$rel" \
    bash -c "$inner"
' hf-reference "$chroot_dir" "$root" "$inner" "$rel"
echo "hf-reference-check: transformers' Qwen3ForCausalLM and Qwen3MoeForCausalLM agree with qwen3-train eval (float32 logits); transformers loads the MoE's hf export"
