#!/usr/bin/env bash
# Compiles (syntax only) the sources whose code depends on libtorch's version against the newest libtorch Debian
# has (unstable's libtorch-dev, headers only), on any machine. The other lanes build against 1.13 (Debian 12),
# 2.6 (Debian 13, CPU and CUDA headers); the branches for newer releases — at::_grouped_mm (2.8+) for the
# mixture-of-experts block's grouped products, aten::mm.dtype (2.9+) for fp32 weight gradients — are what a GPU
# machine's PyTorch wheel compiles, and would otherwise first compile there (docs/build.md, "CI").
#
#   scripts/newest-libtorch-check.sh            # the check
#   scripts/newest-libtorch-check.sh --prepare  # only fetch and unpack the package (.ci/run: during the native build)
#
# What: the libtorch-dev package unstable lists now is unpacked (dpkg -x, nothing installed) once per machine
# into a cache shared by every clone; a later run keeps that one. PyTorch 2.14 needs C++20: the check compiles
# with -std=c++20, as cmake/Dependencies.cmake configures such a build.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/qwen3-train/newest-libtorch
prepare_only=0
case "${1:-}" in
  "") ;;
  --prepare) prepare_only=1 ;;
  *) echo "usage: scripts/newest-libtorch-check.sh [--prepare]" >&2; exit 2 ;;
esac
. "$root/scripts/cached-root.sh"
if [ ! -f "$cache/.qwen3-packages" ]; then
  mirror=$(host_debian_mirror)
  index=$(curl -fsSL --retry 3 "$mirror/dists/sid/main/binary-amd64/Packages.xz" | xz -dc)
  deb=$(awk '/^Package: libtorch-dev$/ { found = 1 } found && /^Filename: / { print $2; exit }' <<<"$index")
  [ -n "$deb" ] || { echo "newest-libtorch-check: no libtorch-dev in $mirror unstable" >&2; exit 1; }
  echo "newest-libtorch-check: unpacking $deb into $cache" >&2
  make_cached_root_dir "$cache"
  mkdir -p "$cache.partial"
  curl -fsSL --retry 3 -o "$cache.partial/package.deb" "$mirror/$deb"
  dpkg -x "$cache.partial/package.deb" "$cache.partial"
  rm "$cache.partial/package.deb"
  stamp_cached_root "$cache" "$deb"
fi
[ "$prepare_only" = 0 ] || exit 0

version=$(echo '#include <torch/version.h>' | g++ -std=c++20 -E -dM -isystem "$cache/usr/include" \
            -isystem "$cache/usr/include/torch/csrc/api/include" - |
          awk '$2 == "TORCH_VERSION_MAJOR" { major = $3 } $2 == "TORCH_VERSION_MINOR" { minor = $3 }
               END { print major "." minor }')
# The sources that test TORCH_VERSION_MAJOR/MINOR, or include a header that does.
mapfile -t sources < <(cd "$root" && {
  grep -rlE 'TORCH_VERSION_M(AJOR|INOR)' src tests --include='*.cpp'
  for header in $(grep -rlE 'TORCH_VERSION_M(AJOR|INOR)' src include --include='*.h'); do
    grep -rlF "/$(basename "$header")\"" src tests --include='*.cpp'
  done
} | sort -u)
echo "newest-libtorch-check: libtorch $version headers: ${sources[*]}" >&2
flags=(-std=c++20 -fsyntax-only -I"$root/src" -I"$root/include" -I"$root/kernels" -I"$root/tests"
       -isystem "$cache/usr/include" -isystem "$cache/usr/include/torch/csrc/api/include")
printf '%s\n' "${sources[@]}" | (cd "$root" && xargs -P "$(nproc)" -I{} sh -c 'g++ "$@" {} || { echo "newest-libtorch-check: {} failed" >&2; exit 255; }' _ "${flags[@]}")
echo "newest-libtorch-check: ${#sources[@]} sources compile against libtorch $version" >&2
