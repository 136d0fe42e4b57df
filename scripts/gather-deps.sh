#!/usr/bin/env bash
# Gathers into the ignored folder .deps/gpu-vendor/ (or $1) everything the GPU machine's build needs that the
# GPU machine lacks (no network, no Debian -dev packages there; see docs/build.md, "The GPU round"):
#
#   include/       nlohmann-json, CLI11, toml++, spdlog, fmt (header-only: SPDLOG_HEADER_ONLY + FMT_HEADER_ONLY),
#                  pcre2.h, utf8proc.h                      <- this machine's Debian -dev packages
#   lib/           libpcre2-8.a, libutf8proc.a              <- Debian's static archives (same packages)
#   src/googletest GoogleTest sources (gtest only)          <- Debian's googletest package (/usr/src/googletest)
#   src/benchmark  Google Benchmark sources, Debian patches applied  <- `apt-get source benchmark`
#   MANIFEST.txt   versions, checksums, the glibc symbols the archives need, the checks below
#
# Why static archives and sources: the GPU machine's glibc and GCC are unknown (a PyTorch cu130 image, maybe
# older than Debian 12). The two C archives reference only old glibc symbols (checked below, recorded in the
# manifest) and are position-independent; C++ libraries (gtest, benchmark) are built there from source with
# that machine's compiler and the libtorch's _GLIBCXX_USE_CXX11_ABI, so no libstdc++ version or ABI mismatch.
#
# Then it checks, with the carried folder alone (no /usr/include copy of any of these is used, and no
# libfmt/libspdlog/libpcre2/libutf8proc shared library is linked): a program using all of them compiles,
# links and runs. Idempotent; the benchmark source is cached in .deps/src-cache/ so a re-run needs no network.
# Needs the packages of scripts/setup.sh (run it first) and, once, deb.debian.org for the benchmark source.
set -euo pipefail
export LC_ALL=C
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest=${1:-$root/.deps/gpu-vendor}
cache=$root/.deps/src-cache
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
libdir=/usr/lib/$multiarch
benchmark_version=1.7.1-1   # Debian 12's libbenchmark-dev

say() { echo "gather-deps: $*" >&2; }
die() { say "$*"; exit 1; }

# --- what must be on this machine ---------------------------------------------------------------------------
need=(/usr/include/nlohmann/json.hpp /usr/include/CLI/CLI.hpp /usr/include/toml++/toml.h /usr/include/spdlog/spdlog.h
      /usr/include/fmt/format-inl.h /usr/include/pcre2.h /usr/include/utf8proc.h
      "$libdir/libpcre2-8.a" "$libdir/libutf8proc.a" /usr/src/googletest/CMakeLists.txt
      /usr/src/googletest/googletest/src/gtest-all.cc)
for f in "${need[@]}"; do
  [ -e "$f" ] || die "missing $f: run scripts/setup.sh (nlohmann-json3-dev libcli11-dev libtomlplusplus-dev libspdlog-dev libfmt-dev libpcre2-dev libutf8proc-dev libgtest-dev)"
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stage=$work/gpu-vendor
mkdir -p "$stage/include" "$stage/lib" "$stage/src" "$stage/licenses"

# --- header-only libraries ----------------------------------------------------------------------------------
for d in nlohmann CLI toml++ spdlog fmt; do
  cp -a "/usr/include/$d" "$stage/include/"
done
cp -a /usr/include/pcre2.h /usr/include/utf8proc.h "$stage/include/"

# --- the tokenizer's C libraries: Debian's static archives --------------------------------------------------
# (Debian's own build of the installed, security-patched version; `apt-get source pcre2` cannot fetch the
# +deb12u2 source from the security archive here, and the archives below are what that source builds.)
cp -a "$libdir/libpcre2-8.a" "$libdir/libutf8proc.a" "$stage/lib/"

# --- GoogleTest sources (gtest only; gmock, docs, samples and gtest's own tests left out) --------------------
gt=$stage/src/googletest
mkdir -p "$gt/googletest"
cp -a /usr/src/googletest/CMakeLists.txt "$gt/"
for d in CMakeLists.txt cmake include src; do
  cp -a "/usr/src/googletest/googletest/$d" "$gt/googletest/"
done
[ -f /usr/src/googletest/LICENSE ] && cp /usr/src/googletest/LICENSE "$stage/licenses/googletest.LICENSE" || true

# --- Google Benchmark sources (apt-get source with a private deb-src list; cached) ---------------------------
bench_src=$cache/benchmark-${benchmark_version%-*}
if [ ! -f "$bench_src/src/benchmark.cc" ]; then
  say "fetching the Debian source of benchmark $benchmark_version"
  apt_dir=$work/apt
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/src"
  printf 'deb-src http://deb.debian.org/debian bookworm main\n' >"$apt_dir/sources.list"
  apt_opts=(-q -o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/nonexistent
            -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache")
  if apt-get "${apt_opts[@]}" update >"$work/apt.log" 2>&1 &&
     (cd "$apt_dir/src" && apt-get "${apt_opts[@]}" source --download-only "benchmark=$benchmark_version") >>"$work/apt.log" 2>&1 &&
     (cd "$apt_dir/src" && dpkg-source -x "benchmark_${benchmark_version}.dsc" bm) >>"$work/apt.log" 2>&1; then
    mkdir -p "$cache"
    rm -rf "$bench_src"
    mv "$apt_dir/src/bm" "$bench_src"
  else
    tail -n 5 "$work/apt.log" >&2
    say "WARNING: no benchmark source: the GPU build will have no benchmarks (QWEN3_BUILD_BENCH=OFF there)"
  fi
fi
if [ -f "$bench_src/src/benchmark.cc" ]; then
  mkdir -p "$stage/src/benchmark"
  for d in CMakeLists.txt cmake include src LICENSE; do
    cp -a "$bench_src/$d" "$stage/src/benchmark/"
  done
fi

# --- licenses of the carried code ---------------------------------------------------------------------------
for p in nlohmann-json3-dev libcli11-dev libtomlplusplus-dev libspdlog-dev libfmt-dev libpcre2-dev libutf8proc-dev googletest; do
  [ -f "/usr/share/doc/$p/copyright" ] && cp "/usr/share/doc/$p/copyright" "$stage/licenses/$p.copyright" || true
done

# --- checks -------------------------------------------------------------------------------------------------
# 1. The glibc symbols the static archives need (their undefined symbols, looked up in this machine's libc
#    with the version each was introduced at): the GPU machine's glibc must be at least the newest one.
libc=$(gcc -print-file-name=libc.so.6)
[ -e "$libc" ] || libc=/lib/$multiarch/libc.so.6
objdump -T "$libc" | awk 'NF >= 2 && $(NF-1) ~ /^GLIBC_/ {print $NF, $(NF-1)}' |
  sort -u >"$work/libc-symbols"
glibc_report=""
for a in "$stage"/lib/*.a; do
  nm "$a" 2>/dev/null | awk '$1=="U"{print $2}' | sort -u >"$work/undef"
  nm --defined-only "$a" 2>/dev/null | awk 'NF==3{print $3}' | sort -u >"$work/def"
  newest=$(comm -23 "$work/undef" "$work/def" | join - "$work/libc-symbols" | awk '{print $2}' | sort -V | tail -n 1)
  # A non-PIC object would carry absolute 32-bit relocations and could not go into a PIE executable.
  abs32=$(readelf -rW "$a" 2>/dev/null | grep -cE 'R_X86_64_32S? ' || true)
  glibc_report+="$(basename "$a"): newest glibc symbol version ${newest:-none}; absolute 32-bit relocations: ${abs32}"$'\n'
done

# 2. Compile, link and run a program using every carried library, from the carried folder only.
cat >"$work/check.cpp" <<'EOF'
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#define TOML_HEADER_ONLY 1
#include <toml++/toml.h>
#include <cstring>
int main(int argc, char** argv) {
  CLI::App app{"gather-deps check"};
  std::string word = "caf\xc3\xa9";
  app.add_option("--word", word);
  CLI11_PARSE(app, argc, argv);
  int err = 0; PCRE2_SIZE off = 0;
  pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>("\\p{L}+"), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  if (!re) return 2;
  const bool jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(re, nullptr);
  const int rc = pcre2_match(re, reinterpret_cast<PCRE2_SPTR>(word.c_str()), word.size(), 0, 0, md, nullptr);
  utf8proc_uint8_t* nfc = utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>("cafe\xcc\x81"));
  const bool nfc_ok = nfc && std::strcmp(reinterpret_cast<char*>(nfc), "caf\xc3\xa9") == 0;
  std::free(nfc);
  pcre2_match_data_free(md);
  pcre2_code_free(re);
  const bool toml_ok = toml::parse("a = \"#1\"")["a"].value_or(std::string()) == "#1";
  nlohmann::json j = {{"match", rc > 0}, {"jit", jit}, {"nfc", nfc_ok}, {"toml", toml_ok}, {"utf8proc", utf8proc_version()}};
  spdlog::info("{}", fmt::format("check {}", j.dump()));
  return rc > 0 && nfc_ok && toml_ok ? 0 : 3;
}
EOF
inc=$stage/include
cxx=${CXX:-g++}
"$cxx" -std=c++17 -O1 -isystem "$inc" -DSPDLOG_HEADER_ONLY -DSPDLOG_FMT_EXTERNAL -DFMT_HEADER_ONLY \
  -MD -MF "$work/check.d" -c "$work/check.cpp" -o "$work/check.o"
# Every header of these libraries must have come from the carried folder, none from /usr/include.
if grep -oE '/usr/(local/)?include/(nlohmann|CLI|toml\+\+|spdlog|fmt)/[^ ]*|/usr/(local/)?include/(pcre2|utf8proc)\.h' "$work/check.d" >"$work/leaks"; then
  sort -u "$work/leaks" | head -n 5 >&2
  die "the check program used system headers instead of the carried ones"
fi
# Only the carried archives: no -lfmt/-lspdlog (header-only must really be header-only), nothing from /usr/lib.
"$cxx" "$work/check.o" -o "$work/check" "$stage/lib/libpcre2-8.a" "$stage/lib/libutf8proc.a" -pthread -Wl,--as-needed
if ldd "$work/check" | grep -E 'libfmt|libspdlog|libpcre2|libutf8proc' >&2; then
  die "the check program links a shared library that the GPU machine lacks"
fi
check_out=$("$work/check" --word "caf$(printf '\xc3\xa9')" 2>&1) || die "the check program failed: $check_out"
say "check program: ${check_out##*] }"

# --- manifest, then move into place -------------------------------------------------------------------------
{
  echo "# .deps/gpu-vendor, gathered by scripts/gather-deps.sh on $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "# host: $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -n 1), $("$cxx" --version | head -n 1)"
  echo
  echo "## Debian packages the files come from"
  dpkg-query -W -f='${Package} ${Version}\n' nlohmann-json3-dev libcli11-dev libtomlplusplus-dev libspdlog-dev libfmt-dev \
    libpcre2-dev libutf8proc-dev googletest 2>/dev/null
  [ -d "$stage/src/benchmark" ] && echo "benchmark (source) $benchmark_version" || echo "benchmark: ABSENT"
  echo
  echo "## static archives"
  (cd "$stage/lib" && sha256sum ./*.a)
  printf '%s' "$glibc_report"
  echo
  echo "## check program (carried headers and archives only)"
  echo "${check_out##*] }"
  echo
  echo "## sizes"
  (cd "$stage" && du -sh include lib src licenses)
} >"$stage/MANIFEST.txt"

rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$stage" "$dest"
say "$dest: $(du -sh "$dest" | cut -f1) ($(find "$dest" -type f | wc -l) files)"
printf '%s' "$glibc_report" >&2
