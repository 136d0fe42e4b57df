# Sourced by scripts/cross-arm64.sh and scripts/torch2-check.sh: the Debian trees they unpack once per machine
# into a cache shared by every clone, stamped with the package list they were made from.

# needs_cached_root WHO DIR PACKAGES OVERRIDE_VARIABLE: true (0) when DIR must be (re)made for PACKAGES; refuses
# (exit 1) a non-empty DIR that no such script made, naming the variable that picks another folder. The caller
# then runs `make_cached_root_dir DIR`, fills DIR.partial, and `stamp_cached_root DIR PACKAGES`, which moves it
# into place: a root is whole or absent, never half made by a run that was stopped (CI's time limit, a signal),
# which would otherwise be refused on every later run as a folder no script made.
needs_cached_root() {
  local who=$1 dir=$2 packages=$3 variable=$4 stamp=$2/.qwen3-packages
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$packages" ] && return 1
  if [ -e "$dir" ] && [ ! -f "$stamp" ] && [ -n "$(ls -A "$dir")" ]; then
    echo "$who: $dir exists and is not a tree this script made; remove it or set $variable" >&2
    exit 1
  fi
  return 0
}
make_cached_root_dir() {
  rm -rf "$1" "$1.partial"  # only ever one a script made (stamped), an empty folder, or a stopped run's part
  mkdir -p "$(dirname "$1")"
}
stamp_cached_root() {
  echo "$2" > "$1.partial/.qwen3-packages"
  rm -rf "$1"
  mv "$1.partial" "$1"
}

# The host's own Debian mirror (deb822 or one-line sources), so a machine behind a local mirror uses it.
host_debian_mirror() {
  local mirror
  mirror=$(sed -n 's/^URIs: *\([^ ]*debian\)$/\1/p; s/^deb  *\(http[^ ]*debian\)  *bookworm .*/\1/p' \
             /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null | head -n 1 || true)
  echo "${mirror:-http://deb.debian.org/debian}"
}
