#!/usr/bin/env bash
# Builds qwen3-train against PyTorch 2.x's libtorch (Debian 13's libtorch-dev 2.6, CPU) and runs the tests whose
# results can differ with libtorch's version (the unit tests and the `versioned` binary-level ones: training,
# evaluation, generation, export, torchrun, the memory model, the smoke), on a Debian 12 machine: docs/build.md. The GPU machine's libtorch is
# PyTorch 2.x; Debian 12's is 1.13. Without this lane the first build against 2.x happened on a lent GPU, where
# its failures cost device time.
#
#   scripts/torch2-check.sh              # root (once), build into build-torch2/, ctest -L 'unit|versioned'
#   scripts/torch2-check.sh -R Dist      # arguments given go to ctest instead of the labels (`-L .`: every test)
#   scripts/torch2-check.sh --prepare    # only make the root (.ci/run does it while the native build compiles)
#
# How: mmdebstrap makes a Debian 13 root with the same libraries as scripts/setup.sh plus python3-torch (for
# torchrun), once per machine, in a cache shared by every clone (as ccache is); QWEN3_TORCH2_ROOT names another
# folder. The checkout is bind-mounted into it at /src and built there with Debian 13's gcc 14 and cmake, in a
# private mount namespace (nothing stays mounted when the script ends). Needs root (chroot and mounts).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/qwen3-train
chroot_dir=${QWEN3_TORCH2_ROOT:-$cache/torch2-root}
build_dir=build-torch2  # inside the checkout (ignored by git)

if [ "$(id -u)" -ne 0 ]; then
  echo "torch2-check: needs root (mmdebstrap, chroot and bind mounts); run it with sudo" >&2
  exit 2
fi
"$root/scripts/setup.sh" mmdebstrap

packages=build-essential,cmake,ninja-build,ccache,pkg-config,libtorch-dev,python3-torch,nlohmann-json3-dev
packages+=,libcli11-dev,libtomlplusplus-dev,libspdlog-dev,libfmt-dev,libgtest-dev,libbenchmark-dev,libpcre2-dev,libutf8proc-dev
packages+=,libgloo-dev,libopenblas0-pthread,python3,nodejs
# shellcheck source=scripts/cached-root.sh
. "$root/scripts/cached-root.sh"
if needs_cached_root torch2-check "$chroot_dir" "$packages" QWEN3_TORCH2_ROOT; then
  echo "torch2-check: installing Debian 13 with libtorch 2.x into $chroot_dir" >&2
  make_cached_root_dir "$chroot_dir"
  mirror=$(host_debian_mirror)
  mmdebstrap --quiet --variant=apt --format=directory --include="$packages" trixie "$chroot_dir.partial" "deb $mirror trixie main"
  stamp_cached_root "$chroot_dir" "$packages"
fi
[ "${1:-}" != --prepare ] || exit 0
mkdir -p "$cache/torch2-ccache"

# Inside: configure once, build (the benchmarks too: they must compile against 2.x), run ctest. The tests that
# need the fetched tokenizer find it in the checkout (scripts/fetch-tokenizer.sh ran on the host) or skip.
inner=$(cat <<'INNER'
set -euo pipefail
export CCACHE_DIR=/ccache CCACHE_BASEDIR=/src CCACHE_NOHASHDIR=true CCACHE_COMPILERCHECK=content CCACHE_MAXSIZE=3G
cd /src
python3 -c 'import torch; print("torch2-check: libtorch", torch.__version__)'
# Without the unity build: every source compiles on its own here (a missing #include that a batch hides fails).
if [ ! -f "$BUILD/build.ninja" ] || ! grep -q '^QWEN3_UNITY_BUILD:BOOL=OFF$' "$BUILD/CMakeCache.txt"; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DQWEN3_UNITY_BUILD=OFF >/dev/null
fi
ninja -C "$BUILD" -j "$(nproc)"
cd "$BUILD"
if [ $# -eq 0 ]; then set -- -L 'unit|versioned'; fi
ctest --output-on-failure -j "$(nproc)" "$@"
INNER
)
# The private mount namespace keeps the bind mounts to this process; they go when it ends, whatever happens.
unshare --mount --propagation private bash -euo pipefail -c '
  dir=$1 src=$2 ccache=$3 inner=$4 build=$5
  shift 5
  mount -t proc proc "$dir/proc"
  mount --rbind /dev "$dir/dev"
  mount --rbind /sys "$dir/sys"  # the CPU topology qwen3-train sizes its threads by
  mkdir -p "$dir/src" "$dir/ccache"
  mount --bind "$src" "$dir/src"
  mount --bind "$ccache" "$dir/ccache"
  exec chroot "$dir" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 BUILD="$build" \
    bash -c "$inner" inner "$@"
' torch2 "$chroot_dir" "$root" "$cache/torch2-ccache" "$inner" "$build_dir" "$@"
