#!/usr/bin/env bash
# The GPU round in one command (issue 8; docs/build.md, "The GPU round"):
#
#   scripts/gpu-check.sh RESULTS_DIR [--stage STAGE]... [--cpu-dry-run]
#
# STAGE: env, build, test, sanitize, bench, train (= smoke, train-2048, train-512), hf, summary, or all (default:
# every stage in that order). Stages can run in separate calls (the device tool allows 10 minutes per command):
# the build folder (BUILD_DIR, default build-gpu/, ignored) keeps the build and the status of every step run so
# far (BUILD_DIR/gpu-check/status.tsv), and every call ends by writing the table of all of them to stdout and
# RESULTS_DIR/summary.md. RESULTS_DIR gets four files at most (the device tool returns 8): summary.md,
# status.tsv, bench_kernels.json and gpu-check-details.tar.gz (every step's log, BUILD_DIR/gpu-check/
# results/<stage>/). A failing step is recorded and the next one runs; the exit status is 1 when any step of
# this call failed.
#
# Time: a step never starts without enough of GPU_CHECK_BUDGET_S (default 540 s, counted from this call's
# start) left and is cut at what is left, so a call returns its results before the tool's 10-minute limit.
#
# --cpu-dry-run: the same stages on a machine without a GPU, against Debian's libtorch (BUILD_DIR default
# build-vendor/): the build with the carried folder, the tests (GPU tests skip), smoke and a short training
# run of the tiny model on the CPU; everything that needs the GPU or its tools is recorded as skipped.
#
# Environment: PYTHON (default /opt/torch/.venv/bin/python3), VENDOR_DIR (.deps/gpu-vendor), BUILD_DIR,
# JOBS (nproc), CUDA_ARCHS (CMake's default: 90;120;121), GPU_CHECK_BUDGET_S, TRAIN_STEPS (20),
# TRAIN_TIMEOUT_S (per training run, 240), TRAIN_CONFIGS (some of: lean fused-optimizer grad-checkpoint base),
# SANITIZE_TIMEOUT_S (per tool, 240), GPU_TEST_FILTER.
set -u
set -o pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usage() { sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

results=""
dry_run=0
stages=()
while [ $# -gt 0 ]; do
  case "$1" in
    --stage) [ $# -ge 2 ] || usage; IFS=', ' read -r -a more <<<"$2"; stages+=("${more[@]}"); shift 2 ;;
    --stage=*) IFS=', ' read -r -a more <<<"${1#--stage=}"; stages+=("${more[@]}"); shift ;;
    --cpu-dry-run) dry_run=1; shift ;;
    -h|--help) usage ;;
    -*) echo "gpu-check: unknown option $1" >&2; usage ;;
    *) [ -z "$results" ] || usage; results=$1; shift ;;
  esac
done
[ -n "$results" ] || usage
[ ${#stages[@]} -gt 0 ] || stages=(all)
expanded=()
for s in "${stages[@]}"; do
  case "$s" in
    all) expanded+=(env build test sanitize bench smoke train-2048 train-512 hf) ;;
    train) expanded+=(smoke train-2048 train-512) ;;
    env|build|test|sanitize|bench|smoke|train-2048|train-512|hf|summary) expanded+=("$s") ;;
    "") ;;
    *) echo "gpu-check: unknown stage '$s'" >&2; usage ;;
  esac
done

mkdir -p "$results" || exit 2
results=$(cd "$results" && pwd)
if [ "$dry_run" = 1 ]; then
  build_dir=${BUILD_DIR:-$root/build-vendor}
  budget=${GPU_CHECK_BUDGET_S:-7200}
  train_steps=${TRAIN_STEPS:-2}
else
  build_dir=${BUILD_DIR:-$root/build-gpu}
  budget=${GPU_CHECK_BUDGET_S:-540}
  train_steps=${TRAIN_STEPS:-20}
fi
mkdir -p "$build_dir" || exit 2
build_dir=$(cd "$build_dir" && pwd)
vendor=${VENDOR_DIR:-$root/.deps/gpu-vendor}
state=$build_dir/gpu-check
mkdir -p "$state"
status_file=$state/status.tsv
touch "$status_file"
details=$state/results   # every step's log, kept across calls; packed into RESULTS_DIR at the end
mkdir -p "$details"
jobs=${JOBS:-$(nproc)}
python=${PYTHON:-/opt/torch/.venv/bin/python3}
gpu_filter=${GPU_TEST_FILTER:-*Nvfp4Kernel*:*QuantizeKernel*:*Dequant*:*Matmul*}
bin=$build_dir/qwen3-train
tests_bin=$build_dir/qwen3_tests
[ -x "$tests_bin" ] || tests_bin=$build_dir/tests/qwen3_tests
t_start=$SECONDS
failures=0

export CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=true CCACHE_COMPILERCHECK=content
# The CUDA tools where a CUDA image usually keeps them, after whatever PATH already has.
for d in /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer /usr/local/cuda/nsight-compute* /opt/nvidia/nsight-compute/*; do
  [ -d "$d" ] && PATH="$PATH:$d"
done
export PATH

# ------------------------------------------------------------------------------------------------ helpers
have() { command -v "$1" >/dev/null 2>&1; }
# JSON/number helper: any python3 (the torch one on the GPU machine).
py() { if [ -x "$python" ]; then "$python" "$@"; else python3 "$@"; fi; }

# record STAGE STEP STATUS SECONDS NOTES: one row per (stage, step), the newest wins.
record() {
  local key notes=${5//|//}
  notes=${notes//$'\t'/ }
  notes=${notes//$'\n'/; }
  key=$(printf '%s\t%s\t' "$1" "$2")
  grep -v -F -- "$key" "$status_file" >"$status_file.tmp" || true
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$notes" >>"$status_file.tmp"
  mv "$status_file.tmp" "$status_file"
  [ "$3" = failed ] && failures=$((failures + 1))
  printf '  %-16s %-8s %5ss  %s\n' "$2" "$3" "$4" "$notes"
}

remaining() { echo $((budget - (SECONDS - t_start))); }

# run_step LOG TIMEOUT CMD...: runs CMD with its output in LOG, cut at TIMEOUT or what is left of the budget.
# Sets step_rc and step_s; returns 0 when it ran (whatever its status), 1 when there was no time to start it.
step_rc=0
step_s=0
run_step() {
  local log=$1 limit=$2 left t0
  shift 2
  left=$(($(remaining) - 15))
  if [ "$left" -lt 30 ]; then step_rc=125; step_s=0; return 1; fi
  [ "$limit" -gt "$left" ] && limit=$left
  t0=$SECONDS
  {
    echo "\$ $*"
    echo "# $(date -u +%FT%TZ), limit ${limit}s"
  } >"$log"
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
  step_rc=$?
  step_s=$((SECONDS - t0))
  echo "# exit $step_rc after ${step_s}s" >>"$log"
  return 0
}
timed_out() { [ "$step_rc" = 124 ] || [ "$step_rc" = 137 ]; }
fail_note() {  # a short reason from a log's tail
  if timed_out; then echo "timed out after ${step_s}s"; return; fi
  local line
  line=$(grep -E -i 'error|fail|fatal|abort|what\(\)' "$1" | grep -v -E '^\$ |^# ' | tail -n 1 | cut -c1-160)
  echo "exit $step_rc${line:+: $line}"
}
show_tail() { echo "  --- last lines of $1"; tail -n "${2:-12}" "$1" | sed 's/^/  | /'; }
# record_outcome STAGE STEP LOG OK_NOTE, after run_step: ok with OK_NOTE, or failed with the log's reason and tail.
record_outcome() {
  if [ "$step_rc" = 0 ]; then
    record "$1" "$2" ok "$step_s" "$4"
  else
    record "$1" "$2" failed "$step_s" "$(fail_note "$3")"
    show_tail "$3" 10
  fi
}
no_time() { record "$1" "$2" skipped 0 "no time left in this call (GPU_CHECK_BUDGET_S=$budget): run --stage $1 again"; }

# Peak memory of a running command: host VmHWM of the process, GPU memory.used over the run (minus the
# used memory at its start, so other processes' memory is not counted).
monitor_pid=""
children() {  # the direct children of a process (timeout's child is the command)
  if have pgrep; then pgrep -P "$1" 2>/dev/null; else grep -l -E "^PPid:[[:space:]]+$1\$" /proc/[0-9]*/status 2>/dev/null | cut -d/ -f3; fi
}
start_monitor() {  # start_monitor PID OUTFILE
  local pid=$1 out=$2
  (
    base=0 gpu=0 rss=0
    if [ "$dry_run" = 0 ] && have nvidia-smi; then
      base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null | head -n 1 | tr -dc 0-9)
    fi
    base=${base:-0}
    while kill -0 "$pid" 2>/dev/null; do
      for c in $(children "$pid") "$pid"; do
        r=$(awk '/^VmHWM/{print $2}' "/proc/$c/status" 2>/dev/null)
        [ -n "$r" ] && [ "$r" -gt "$rss" ] && rss=$r
      done
      if [ "$dry_run" = 0 ] && have nvidia-smi; then
        g=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null | head -n 1 | tr -dc 0-9)
        [ -n "$g" ] && [ "$g" -gt "$gpu" ] && gpu=$g
      fi
      if [ "$dry_run" = 1 ]; then
        echo "host peak RSS $((rss / 1024)) MiB" >"$out"
      else
        echo "host peak RSS $((rss / 1024)) MiB, GPU peak $((gpu > base ? gpu - base : 0)) MiB over $base MiB in use before" >"$out"
      fi
      sleep 0.5
    done
  ) &
  monitor_pid=$!
}
stop_monitor() { [ -n "$monitor_pid" ] && wait "$monitor_pid" 2>/dev/null; monitor_pid=""; }

# run_monitored LOG TIMEOUT MEMFILE CMD...: run_step, with the memory monitor around it.
run_monitored() {
  local log=$1 limit=$2 mem=$3 left t0 pid
  shift 3
  left=$(($(remaining) - 15))
  if [ "$left" -lt 30 ]; then step_rc=125; step_s=0; return 1; fi
  [ "$limit" -gt "$left" ] && limit=$left
  t0=$SECONDS
  { echo "\$ $*"; echo "# $(date -u +%FT%TZ), limit ${limit}s"; } >"$log"
  : >"$mem"
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1 &
  pid=$!
  start_monitor "$pid" "$mem"
  wait "$pid"
  step_rc=$?
  stop_monitor
  step_s=$((SECONDS - t0))
  echo "# exit $step_rc after ${step_s}s; $(cat "$mem")" >>"$log"
  return 0
}

stage_begin() {
  stage_t0=$SECONDS
  stage_dir=$details/$1
  rm -rf "$stage_dir"
  mkdir -p "$stage_dir"
  echo "== $1 ($(date -u +%H:%M:%S), $(remaining)s of the budget left)"
}
stage_end() { record "$1" "(stage)" "done" $((SECONDS - stage_t0)) "wall time of the stage"; }

torch_prefix=""
torch_abi=""
torch_info() {  # fills torch_prefix and torch_abi from the PyTorch python (real run only)
  [ "$dry_run" = 1 ] && return 0
  [ -n "$torch_prefix" ] && return 0
  if [ -x "$python" ]; then
    torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
    torch_abi=$("$python" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null)
  fi
}

# ------------------------------------------------------------------------------------------------ stages
stage_env() {
  stage_begin env
  local d=$stage_dir out
  {
    echo "date: $(date -u +%FT%TZ)"
    echo "host: $(uname -srm)"
    [ -r /etc/os-release ] && (. /etc/os-release && echo "os: $PRETTY_NAME")
    echo "glibc: $(ldd --version 2>&1 | head -n 1)"
    echo "gcc: $(g++ --version 2>&1 | head -n 1)"
    echo "cmake: $(cmake --version 2>&1 | head -n 1)"
    echo "ninja: $(ninja --version 2>&1)"
    echo "cpus: $(nproc), memory: $(awk '/MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
    for t in nvcc nvidia-smi compute-sanitizer ncu cuobjdump nvdisasm ccache; do
      echo "$t: $(command -v "$t" || echo absent)"
    done
    echo "vendor: $vendor ($(du -sh "$vendor" 2>/dev/null | cut -f1 || echo absent))"
    echo "git: $(git -C "$root" rev-parse --short HEAD 2>/dev/null) $(git -C "$root" status --porcelain 2>/dev/null | wc -l) changed files"
  } >"$d/host.txt" 2>&1
  cat "$d/host.txt"

  if [ "$dry_run" = 1 ] || ! have nvidia-smi; then
    record env nvidia-smi skipped 0 "$([ "$dry_run" = 1 ] && echo 'dry run: no GPU' || echo 'nvidia-smi absent')"
  elif run_step "$d/nvidia-smi.txt" 60 nvidia-smi; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit \
      --format=csv >>"$d/nvidia-smi.txt" 2>&1
    out=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)
    cat "$d/nvidia-smi.txt"
    [ "$step_rc" = 0 ] && record env nvidia-smi ok "$step_s" "$out" || record env nvidia-smi failed "$step_s" "$(fail_note "$d/nvidia-smi.txt")"
  fi

  if have nvcc; then
    nvcc --version >"$d/nvcc.txt" 2>&1
    record env nvcc ok 0 "$(grep -o 'release [0-9.]*, V[0-9.]*' "$d/nvcc.txt" | head -n 1)"
  else
    record env nvcc "$([ "$dry_run" = 1 ] && echo skipped || echo failed)" 0 "nvcc not found"
  fi

  if [ "$dry_run" = 1 ]; then
    record env torch skipped 0 "dry run: Debian libtorch $(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null), CXX11 ABI 1"
  elif [ -x "$python" ] && run_step "$d/torch.txt" 120 "$python" -c '
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "cxx11_abi", int(torch._C._GLIBCXX_USE_CXX11_ABI))
print("cmake_prefix_path", torch.utils.cmake_prefix_path)
print("cuda_available", torch.cuda.is_available(), "devices", torch.cuda.device_count())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, "sm", f"{p.major}{p.minor}", "memory_gib", round(p.total_memory / 2**30, 1), "sms", p.multi_processor_count)
'; then
    cat "$d/torch.txt"
    if [ "$step_rc" = 0 ]; then
      record env torch ok "$step_s" "$(grep -E '^(torch|device)' "$d/torch.txt" | tr '\n' ' ')"
    else
      record env torch failed "$step_s" "$(fail_note "$d/torch.txt")"
    fi
  else
    record env torch failed 0 "no $python"
  fi
  if [ -f "$vendor/MANIFEST.txt" ]; then
    cp "$vendor/MANIFEST.txt" "$d/vendor-MANIFEST.txt"
    record env vendor ok 0 "$(du -sh "$vendor" | cut -f1) carried: $(grep -c . "$vendor/MANIFEST.txt") manifest lines"
  else
    record env vendor failed 0 "no $vendor/MANIFEST.txt: run scripts/gather-deps.sh here and carry .deps/gpu-vendor"
  fi
  stage_end env
}

stage_build() {
  stage_begin build
  local d=$stage_dir args=() nvcc_path note
  torch_info
  args=(-S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DQWEN3_VENDOR_DIR=$vendor"
        -DCMAKE_POLICY_VERSION_MINIMUM=3.5)
  if [ "$dry_run" = 0 ]; then
    args+=(-DQWEN3_CUDA=ON "-DCMAKE_PREFIX_PATH=$torch_prefix")
    nvcc_path=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    args+=("-DCMAKE_CUDA_COMPILER=$nvcc_path")
    # Everything built here (gtest and benchmark too) must use the libtorch's std::string ABI.
    [ "$torch_abi" = 0 ] && args+=(-DCMAKE_CXX_FLAGS=-D_GLIBCXX_USE_CXX11_ABI=0)
  fi
  [ -n "${CUDA_ARCHS:-}" ] && args+=("-DQWEN3_CUDA_ARCHITECTURES=$CUDA_ARCHS")
  [ -f "$vendor/src/benchmark/CMakeLists.txt" ] || args+=(-DQWEN3_BUILD_BENCH=OFF)

  if ! run_step "$d/configure.log" 300 cmake "${args[@]}"; then no_time build configure; stage_end build; return; fi
  if [ "$step_rc" != 0 ]; then
    record build configure failed "$step_s" "$(fail_note "$d/configure.log")"
    show_tail "$d/configure.log" 20
    stage_end build
    return
  fi
  note=$(grep -E 'libtorch [0-9]|libtorch with CUDA|CUDA kernels:|nvcc not found' "$d/configure.log" | sed 's/^-- //' | tr '\n' ';')
  record build configure ok "$step_s" "$note"
  cp "$build_dir/CMakeCache.txt" "$d/CMakeCache.txt" 2>/dev/null

  local target
  for target in qwen3-train qwen3_tests all; do
    local name=$target
    [ "$target" = all ] && name=benchmarks
    if ! run_step "$d/ninja-$name.log" 600 ninja -C "$build_dir" -j "$jobs" "$target"; then no_time build "$name"; continue; fi
    if [ "$step_rc" = 0 ]; then
      record build "$name" ok "$step_s" "$(grep -c 'Building\|Linking' "$d/ninja-$name.log") build steps"
    else
      record build "$name" failed "$step_s" "$(grep -m1 -E 'error|FAILED' "$d/ninja-$name.log" | cut -c1-160)"
      grep -E -A3 'error:' "$d/ninja-$name.log" | head -n 30 | sed 's/^/  | /'
    fi
  done

  # The kernels' machine code: which architectures, and tensor-core instructions (HMMA: mma.sync; HGMMA: wgmma).
  local lib=$build_dir/libqwen3_kernels.a
  if ! have cuobjdump; then
    record build sass skipped 0 "cuobjdump not here$([ "$dry_run" = 1 ] && echo ' (dry run)')"
  elif [ ! -f "$lib" ]; then
    record build sass failed 0 "no $lib"
  elif run_step "$d/cuobjdump-list-elf.txt" 60 cuobjdump --list-elf "$lib"; then
    local arch counts="" ok=1 sass
    for arch in $(grep -o 'sm_[0-9]*[a-z]*' "$d/cuobjdump-list-elf.txt" | sort -u); do
      sass=$d/sass-$arch.txt
      cuobjdump -sass -arch "$arch" "$lib" >"$sass" 2>&1
      local hmma hgmma matmul_hmma
      hmma=$(grep -c -E '\bHMMA\b' "$sass")
      hgmma=$(grep -c -E '\bHGMMA\b' "$sass")
      # Only the product's kernels: the lines between its "Function :" header and the next one.
      matmul_hmma=$(awk '/Function :/{f = ($0 ~ /nvfp4_matmul/)} f && /[ \t]HMMA[. ]/{n++} END{print n+0}' "$sass")
      # The product kernels' opcode histogram (what they are made of on this architecture), kept with the SASS;
      # its tensor-core variants go into the note.
      sass_opcodes nvfp4_matmul <"$sass" >"$d/sass-ops-$arch.txt"
      local variants
      variants=$(awk '$2 ~ /^H(G)?MMA/ {printf "%s%s x%s", (n++ ? ", " : ""), $2, $1}' "$d/sass-ops-$arch.txt")
      counts+="$arch: HMMA $hmma (matmul $matmul_hmma${variants:+: $variants}), HGMMA $hgmma; "
      [ "$matmul_hmma" -gt 0 ] || [ "$hgmma" -gt 0 ] || ok=0
      gzip -f "$sass"
    done
    if [ -z "$counts" ]; then
      record build sass failed "$step_s" "no ELF in $lib"
    elif [ "$ok" = 1 ]; then
      record build sass ok "$step_s" "$counts"
    else
      record build sass failed "$step_s" "no tensor-core instruction in a product kernel: $counts"
    fi
  fi
  stage_end build
}

# sass_opcodes PATTERN < cuobjdump -sass output: "count opcode" of the functions whose name matches PATTERN,
# most frequent first (a predicate such as @P0 or @!P1 is not part of the opcode).
sass_opcodes() {
  awk -v pat="$1" '
    /Function :/ { f = ($0 ~ pat); next }
    f && /^[ \t]*\/\*[0-9a-f]+\*\/[ \t]/ {
      line = $0
      sub(/^[ \t]*\/\*[0-9a-f]+\*\/[ \t]+/, "", line)
      if (line ~ /^@/) sub(/^@[^ \t]+[ \t]+/, "", line)
      split(line, part, /[ \t;]/)
      if (part[1] != "") n[part[1]]++
    }
    END { for (op in n) print n[op], op }' | sort -k1,1nr -k2
}

# gtest JSON -> "P passed, F failed, S skipped"
gtest_counts() {
  py - "$1" <<'EOF'
import json, sys
try:
    data = json.load(open(sys.argv[1]))
except Exception as e:
    print("no JSON report"); sys.exit(0)
p = f = s = 0
failed = []
for suite in data.get("testsuites", []):
    for t in suite.get("testsuite", []):
        if t.get("result") == "SKIPPED" or t.get("status") == "NOTRUN":
            s += 1
        elif t.get("failures"):
            f += 1; failed.append(suite["name"] + "." + t["name"])
        else:
            p += 1
print(f"{p} passed, {f} failed, {s} skipped" + (": " + " ".join(failed[:5]) if failed else ""))
EOF
}

stage_test() {
  stage_begin test
  local d=$stage_dir counts
  if [ ! -x "$tests_bin" ]; then
    record test gpu-tests failed 0 "no test binary: run --stage build"
    record test all-tests failed 0 "no test binary"
    stage_end test
    return
  fi
  if run_step "$d/gpu-tests.log" 300 "$tests_bin" "--gtest_filter=$gpu_filter" "--gtest_output=json:$d/gpu-tests.json"; then
    counts=$(gtest_counts "$d/gpu-tests.json")
    if [ "$step_rc" != 0 ]; then
      record test gpu-tests failed "$step_s" "$counts; $(fail_note "$d/gpu-tests.log")"
      grep -E '^\[  FAILED  \]|Failure' "$d/gpu-tests.log" | head -n 20 | sed 's/^/  | /'
    elif [ "$dry_run" = 1 ]; then
      record test gpu-tests skipped "$step_s" "dry run, no GPU: $counts (host-side codec tests ran)"
    elif [[ "$counts" != *" 0 skipped"* ]]; then
      record test gpu-tests failed "$step_s" "GPU tests skipped on the GPU machine (device not visible?): $counts"
    else
      record test gpu-tests ok "$step_s" "$counts"
    fi
  else
    no_time test gpu-tests
  fi

  if run_step "$d/ctest.log" 540 ctest --test-dir "$build_dir" -j "$jobs" --timeout 400 --output-on-failure \
      --output-junit "$d/ctest-junit.xml"; then
    local line skipped
    line=$(grep -E 'tests passed' "$d/ctest.log" | tail -n 1)
    skipped=$(grep -c -E '\((Skipped|Not Run)\)' "$d/ctest.log")
    if [ "$step_rc" = 0 ]; then
      record test all-tests ok "$step_s" "$line; $skipped skipped"
    else
      record test all-tests failed "$step_s" "${line:-$(fail_note "$d/ctest.log")}; $skipped skipped; failed: $(grep -E '^\s+[0-9]+ - .*\(Failed|Timeout|Exception' "$d/ctest.log" | awk '{print $3}' | head -n 5 | tr '\n' ' ')"
      grep -E -A30 'The following tests FAILED' "$d/ctest.log" | head -n 20 | sed 's/^/  | /'
    fi
  else
    no_time test all-tests
  fi
  stage_end test
}

stage_sanitize() {
  stage_begin sanitize
  local d=$stage_dir tool summary
  for tool in memcheck racecheck synccheck; do
    if [ "$dry_run" = 1 ] || ! have compute-sanitizer; then
      record sanitize "$tool" skipped 0 "$([ "$dry_run" = 1 ] && echo 'dry run: no GPU' || echo 'compute-sanitizer absent')"
      continue
    fi
    if [ ! -x "$tests_bin" ]; then record sanitize "$tool" failed 0 "no test binary"; continue; fi
    if ! run_step "$d/$tool.log" "${SANITIZE_TIMEOUT_S:-240}" compute-sanitizer --tool "$tool" --error-exitcode 99 \
        --print-limit 50 "$tests_bin" "--gtest_filter=$gpu_filter"; then
      no_time sanitize "$tool"
      continue
    fi
    summary=$(grep -E '(ERROR|RACECHECK) SUMMARY' "$d/$tool.log" | tail -n 1 | sed 's/^=* *//')
    if [ "$step_rc" = 0 ]; then
      record sanitize "$tool" ok "$step_s" "${summary:-no summary line}"
    else
      record sanitize "$tool" failed "$step_s" "${summary:-$(fail_note "$d/$tool.log")}"
      grep -E -m 10 '^=+ +(Invalid|Error|Race|Barrier|Warning|Program hit)' "$d/$tool.log" | sed 's/^/  | /'
    fi
  done
  stage_end sanitize
}

stage_bench() {
  stage_begin bench
  local d=$stage_dir b=$build_dir/bench/bench_kernels json=$stage_dir/bench_kernels.json
  if [ ! -x "$b" ]; then
    record bench kernels "$([ "$dry_run" = 1 ] && echo skipped || echo failed)" 0 "no $b (built only with nvcc and the benchmark source)"
    record bench ncu skipped 0 "no benchmark"
    stage_end bench
    return
  fi
  if ! run_step "$d/bench_kernels.log" 300 "$b" "--benchmark_out=$json" --benchmark_out_format=json \
      --benchmark_counters_tabular=true; then
    no_time bench kernels; no_time bench ncu; stage_end bench; return
  fi
  if grep -q 'no CUDA device' "$d/bench_kernels.log"; then
    record bench kernels skipped "$step_s" "no CUDA device: nothing measured$([ "$dry_run" = 1 ] && echo ' (dry run)')"
    record bench ncu skipped 0 "no CUDA device"
    stage_end bench
    return
  fi
  local figures slowest
  figures=$(py - "$json" <<'EOF'
import json, sys
try:
    data = json.load(open(sys.argv[1]))
except Exception:
    print("no JSON output|"); sys.exit(0)
q, m = [], {}
for b in data.get("benchmarks", []):
    n = b.get("name", "")
    if n.startswith("quantize/") and "/rne/" in n and "of_copy" in b:
        q.append((n.split("/")[1], b["of_copy"]))
    if n.startswith("matmul") and "speedup" in b:
        M = n.split("/")[1]
        m.setdefault(M, []).append((b["speedup"], b.get("TFLOP/s", 0), b.get("us", b.get("real_time", 0)), n))
parts = []
for t in ("f32", "bf16"):
    v = [x for k, x in q if k == t]
    if v:
        parts.append(f"quantize {t} rne {min(v):.0%}-{max(v):.0%} of D2D copy")
for M in sorted(m, key=lambda s: int(s[1:])):
    v = m[M]
    parts.append(f"{M}: {min(x[0] for x in v):.2f}-{max(x[0] for x in v):.2f}x cuBLAS, up to {max(x[1] for x in v):.0f} TFLOP/s")
allm = [x for v in m.values() for x in v]
slowest = max(allm, key=lambda x: x[2])[3] if allm else ""
print("; ".join(parts) + "|" + slowest)
EOF
)
  slowest=${figures##*|}
  figures=${figures%|*}
  if [ "$step_rc" = 0 ]; then
    record bench kernels ok "$step_s" "$figures"
  else
    record bench kernels failed "$step_s" "$(fail_note "$d/bench_kernels.log"); $figures"
  fi
  grep -E '^(quantize|matmul|adamw|fused)' "$d/bench_kernels.log" | head -n 60

  if ! have ncu; then
    record bench ncu skipped 0 "ncu absent"
  elif [ -z "$slowest" ]; then
    record bench ncu skipped 0 "no product benchmark in the output"
  elif run_step "$d/ncu-slowest.log" 240 ncu --target-processes all -k regex:nvfp4_matmul --launch-count 1 \
      --section SpeedOfLight --section LaunchStats --section Occupancy \
      --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_hmma.sum,dram__bytes_read.sum,gpu__time_duration.sum \
      -o "$d/ncu-slowest" -f "$b" "--benchmark_filter=^${slowest}\$"; then
    ncu --import "$d/ncu-slowest.ncu-rep" --print-summary none >>"$d/ncu-slowest.log" 2>&1
    local nf
    nf=$(grep -E '^\s+(Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per Thread|sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active)\s' "$d/ncu-slowest.log" |
         sed -E 's/^ +//; s/ {2,}/ /g' | head -n 8 | tr '\n' ';')
    if [ "$step_rc" = 0 ] && ! grep -q 'ERR_NVGPUCTRPERM\|==ERROR==' "$d/ncu-slowest.log"; then
      record bench ncu ok "$step_s" "$slowest: ${nf:-see ncu-slowest.log}"
    else
      record bench ncu failed "$step_s" "$slowest: $(grep -m1 -E 'ERR_|==ERROR==' "$d/ncu-slowest.log" | cut -c1-140)"
    fi
  else
    no_time bench ncu
  fi
  stage_end bench
}

# Training data: text lines of pseudo-words from a fixed generator, plenty for 20 packed steps of 4 x 512 or
# 1 x 2048 tokens with any tokenizer.
make_train_data() {
  local f=$state/train-text.txt
  [ -s "$f" ] && { echo "$f"; return; }
  awk 'BEGIN {
    srand(7); split("the of model train weight block scale token layer step memory kernel tensor core batch sequence loss gradient optimizer moment checkpoint export vocabulary attention head norm product quantize round error bound", w, " ")
    for (l = 0; l < 4000; l++) { s = ""; n = 40 + int(rand() * 40); for (i = 0; i < n; i++) s = s (i ? " " : "") w[1 + int(rand() * 35)]; print s "." }
  }' >"$f"
  echo "$f"
}
tokenizer_file() {
  local real=$root/.deps/tokenizer-qwen3/models/tokenizer.json
  if [ -s "$real" ]; then echo "$real"; else echo "$root/tests/data/tiny_tokenizer.json"; fi
}
device() { [ "$dry_run" = 1 ] && echo cpu || echo cuda; }
has_command() { "$bin" --help 2>/dev/null | grep -q -E "^ +$1( |$)"; }
has_flag() { "$bin" "$1" --help 2>/dev/null | grep -q -E -- "(^| |,)$2([ =,:\[]|$)"; }

stage_smoke() {
  stage_begin smoke
  local d=$stage_dir dev
  if [ ! -x "$bin" ]; then record smoke smoke failed 0 "no $bin: run --stage build"; stage_end smoke; return; fi
  if ! has_command smoke; then
    record smoke smoke skipped 0 "qwen3-train has no smoke command"
    stage_end smoke
    return
  fi
  for dev in cpu $([ "$dry_run" = 1 ] || echo cuda); do
    rm -rf "$state/smoke-$dev"
    if ! run_monitored "$d/smoke-$dev.log" 300 "$d/smoke-$dev.mem" "$bin" smoke --device "$dev" --out-dir "$state/smoke-$dev"; then
      no_time smoke "smoke-$dev"; continue
    fi
    local losses
    losses=$(grep -o -E 'loss [0-9.]+ -> [0-9.]+|loss [0-9.]+' "$d/smoke-$dev.log" | tail -n 1)
    if [ "$step_rc" = 0 ]; then
      record smoke "smoke-$dev" ok "$step_s" "${losses:+$losses; }$(grep -o -E '(passed|FAILED) in [0-9.]+ s' "$d/smoke-$dev.log" | tail -n 1); $(cat "$d/smoke-$dev.mem")"
    else
      record smoke "smoke-$dev" failed "$step_s" "$(fail_note "$d/smoke-$dev.log")"
      show_tail "$d/smoke-$dev.log" 10
    fi
  done
  stage_end smoke
}

# The model the training stages use: the Qwen3-4B preset on the GPU (written once, kept in the build folder),
# the tiny preset in a dry run.
train_model() {
  local preset=qwen3-4b
  [ "$dry_run" = 1 ] && preset=tiny
  local m=$state/model-$preset
  if [ ! -s "$m/model.dat" ] || [ ! -f "$m/.complete" ]; then
    rm -rf "$m"
    if ! run_step "$details/$1/synth.log" 420 "$bin" synth --preset "$preset" --out-dir "$m"; then
      no_time "$1" synth; return 1
    fi
    if [ "$step_rc" != 0 ]; then
      record "$1" synth failed "$step_s" "$(fail_note "$details/$1/synth.log")"
      return 1
    fi
    touch "$m/.complete"
    record "$1" synth ok "$step_s" "synth --preset $preset: $(du -sh "$m/model.dat" | cut -f1)"
  else
    record "$1" synth ok 0 "reused $m ($(du -sh "$m/model.dat" | cut -f1))"
  fi
  echo "$m" >"$state/model-path"
}

# The Hugging Face export against transformers (issue 16): the tiny synthetic model out with `export --format hf`,
# loaded by AutoModelForCausalLM, its per-line losses compared with `qwen3-train eval` on the same ids.
stage_hf() {
  stage_begin hf
  local d=$stage_dir m=$state/hf-check
  if [ ! -x "$bin" ]; then record hf hf failed 0 "no $bin: run --stage build"; stage_end hf; return; fi
  if [ "$dry_run" = 1 ] || [ ! -x "$python" ] || ! "$python" -c 'import transformers' >/dev/null 2>&1; then
    record hf transformers skipped 0 "needs $python with transformers (the GPU machine's)"
    stage_end hf
    return
  fi
  rm -rf "$m" && mkdir -p "$m"
  if ! run_step "$d/synth.log" 120 "$bin" synth --preset tiny --out-dir "$m/model"; then no_time hf synth; stage_end hf; return; fi
  if ! run_step "$d/export.log" 120 "$bin" export --format hf --weights "$m/model/model.dat" --config "$m/model/config.json" --out "$m/hf"; then
    no_time hf export; stage_end hf; return
  fi
  printf '9707 4337 11 1879 525 498 30\n151644 872 198 9707 151645 198 151644 77091 198\n785 3974 13876 38835 34208 916 279 15678 5562 13\n' >"$m/ids.txt"
  if run_step "$d/compare.log" 300 "$python" "$root/bench/hf_export_vs_transformers.py" --hf "$m/hf" \
       --weights "$m/model/model.dat" --config "$m/model/config.json" --ids-file "$m/ids.txt" --qwen3 "$bin" --device cuda; then
    record_outcome hf transformers "$d/compare.log" "$(tail -n 1 "$d/compare.log")"
  else
    no_time hf transformers
  fi
  # The independent reference for the model: transformers' Qwen3ForCausalLM with the .dat's values decoded by the
  # script itself, float32 logits against `eval --logits-out` (scripts/hf-reference-check.sh runs it on a CPU).
  if run_step "$d/logits.log" 300 "$python" "$root/bench/hf_peer.py" logits --weights "$m/model/model.dat" \
       --config "$m/model/config.json" --qwen3 "$bin" --device cuda; then
    record_outcome hf logits "$d/logits.log" "$(grep '^{' "$d/logits.log" | tail -n 1)"
  else
    no_time hf logits
  fi
  stage_end hf
}

stage_train() {  # stage_train NAME SEQ_LEN BATCH
  local name=$1 seq=$2 batch=$3
  stage_begin "$name"
  local d=$stage_dir dev m data tok configs=() extra
  dev=$(device)
  if [ ! -x "$bin" ]; then record "$name" train failed 0 "no $bin: run --stage build"; stage_end "$name"; return; fi
  train_model "$name" || { stage_end "$name"; return; }
  m=$(cat "$state/model-path")
  data=$(make_train_data)
  tok=$(tokenizer_file)

  # Most wanted first, so a call that runs out of time drops the least wanted: lean (bf16 masters with stochastic
  # rounding, int8 moments, both flags: the memory goal), fused-optimizer (fp32 masters and moments, bf16 compute
  # on CUDA: the speed goal; the fused update keeps the 4B model's fp32 gradients from all living at once),
  # grad-checkpoint, base. TRAIN_CONFIGS picks some of them.
  local missing=() have_gc=0 have_fo=0 wanted
  has_flag train --grad-checkpoint && have_gc=1 || missing+=(--grad-checkpoint)
  has_flag train --fused-optimizer && have_fo=1 || missing+=(--fused-optimizer)
  wanted=" ${TRAIN_CONFIGS:-lean fused-optimizer grad-checkpoint base} "
  [ "$have_gc$have_fo" = 11 ] && [[ "$wanted" == *" lean "* ]] && configs+=(lean)
  [ "$have_fo" = 1 ] && [[ "$wanted" == *" fused-optimizer "* ]] && configs+=(fused-optimizer)
  [ "$have_gc" = 1 ] && [[ "$wanted" == *" grad-checkpoint "* ]] && configs+=(grad-checkpoint)
  [[ "$wanted" == *" base "* ]] && configs+=(base)
  [ ${#missing[@]} -gt 0 ] && record "$name" flags skipped 0 "train has no ${missing[*]}: only the configurations without them run"

  local c hf_done=0
  for c in "${configs[@]}"; do
    # The peer right after the two configurations the goals compare (lean, fast), before the optional ones.
    if [ "$hf_done" = 0 ] && { [ "$c" = grad-checkpoint ] || [ "$c" = base ]; }; then
      hf_peer_train "$name" "$m" "$seq" "$batch"
      hf_done=1
    fi
    extra=()
    local profiled=0
    case "$c" in
      grad-checkpoint) extra=(--grad-checkpoint) ;;
      fused-optimizer)
        extra=(--fused-optimizer)
        # The fast configuration's last step under the profiler (issue 12's step breakdown): the trace beside the
        # log, the phase and op tables in it; the steady figures leave that step out.
        if has_flag train --profile-step; then
          rm -f "$d/profile-$c.json"
          extra+=(--profile-step "$train_steps" --profile-out "$d/profile-$c.json")
          profiled=$train_steps
        fi ;;
      lean) extra=(--master-dtype bfloat16 --optimizer-state-mode int8 --grad-checkpoint --fused-optimizer) ;;
    esac
    local step=train-$c log=$d/train-$c.log
    rm -f "$d/train-$c.jsonl" "$d/vram-$c.json"
    # Every run's first step is also its memory report (measured and predicted per phase, vram-$c.json beside
    # the log): the GPU rows docs/memory.md is waiting for, at no extra model load.
    if ! run_monitored "$log" "${TRAIN_TIMEOUT_S:-240}" "$d/train-$c.mem" "$bin" train --weights "$m/model.dat" \
        --config "$m/config.json" --tokenizer "$tok" --train-data "$data" --data-format text --pack \
        --seq-len "$seq" --batch-size "$batch" --steps "$train_steps" --lr 1e-5 --device "$dev" --log-every 5 \
        --metrics-jsonl "$d/train-$c.jsonl" --vram-report "$d/vram-$c.json" "${extra[@]}"; then
      no_time "$name" "$step"
      continue
    fi
    local fig
    fig=$(grep -o -E 'trained [0-9]+ steps.*' "$log" | tail -n 1 | sed -E 's/^trained ([0-9]+) steps \(now at step [0-9]+, ([0-9]+) skipped\)/\1 steps, \2 skipped/' | cut -c1-150)
    fig+="; $(steady_figures "$d/train-$c.jsonl" "$profiled")"
    fig+="; $(cat "$d/train-$c.mem")"
    fig+="; $(vram_figures "$d/vram-$c.json")"
    local peak_line
    peak_line=$(grep -i -o -E 'peak[^,;]*[0-9.]+ ?[GM]i?B' "$log" | tail -n 1)
    [ -n "$peak_line" ] && fig+="; reported: $peak_line"
    if [ "$step_rc" = 0 ]; then
      record "$name" "$step" ok "$step_s" "$fig"
    else
      record "$name" "$step" failed "$step_s" "$(fail_note "$log"); $fig"
      show_tail "$log" 8
    fi
    if [ "$profiled" != 0 ]; then
      local table
      table=$(grep -A5 'profile of step' "$log" | grep -E ' (batch|forward|backward|optimizer) ' |
              sed -E 's/^.*info //; s/ +/ /g' | cut -c1-110 | tr '\n' ';')
      record "$name" "profile-$c" "$([ -s "$d/profile-$c.json" ] && echo ok || echo failed)" 0 \
        "step $profiled: ${table:-no phase table in the log}"
    fi
  done
  [ "$hf_done" = 1 ] || hf_peer_train "$name" "$m" "$seq" "$batch"
  stage_end "$name"
}

# The steps after the first 3 of a metrics JSONL (as hf_peer.py times them), but a profiled one (second argument,
# 0: none): tokens/s, ms/step and the trainer's MFU (against --mfu-device's bf16 peak: H100's 989 TFLOP/s unless
# told).
steady_figures() {
  py - "$1" "${2:-0}" <<'PY'
import json, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{") and '"step"' in l]
except OSError:
    rows = []
rows = [r for r in rows if r.get("step_ms") and r["step"] != int(sys.argv[2])][3:]
if not rows:
    print("no steady steps in the metrics")
    sys.exit(0)
ms = sum(r["step_ms"] for r in rows)
mfu = [r["mfu"] for r in rows if r.get("mfu") is not None]
print("steps %d-%d: %.0f tokens/s, %.1f ms/step%s" % (rows[0]["step"], rows[-1]["step"],
      1000 * sum(r["tokens"] for r in rows) / ms, ms / len(rows),
      ", MFU %.1f%%" % (100 * sum(mfu) / len(mfu)) if mfu else ""))
PY
}

# A first-step memory report (train --vram-report) as one short note: per phase the measured tensor peak, the
# allocator's reserve and the memory model's prediction (MiB), then the step's peak against the prediction.
vram_figures() {
  py - "$1" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    print("no memory report")
    sys.exit(0)
fmt = lambda v: "-" if v is None else "%.0f" % v
rows = [s for s in r.get("Samples", []) if s.get("Phase") in ("forward_done", "backward_done", "optimizer_step_done")]
peak = max((s.get("PeakMiB") or 0 for s in r.get("Samples", [])), default=0)
reserved = max((s.get("ReservedMiB") or 0 for s in r.get("Samples", [])), default=0)
predicted = (r.get("Predicted") or {}).get("PeakMiB")
line = "memory MiB peak/reserved/predicted: " + ", ".join(
    "%s %s/%s/%s" % (s["Phase"].replace("_done", ""), fmt(s.get("PeakMiB")), fmt(s.get("ReservedMiB")),
                     fmt(s.get("PredictedMiB"))) for s in rows)
line += "; step peak %.0f, reserved %s, predicted %s" % (peak, fmt(reserved or None), fmt(predicted))
if predicted:
    line += " (%+.1f%%)" % (100.0 * (peak - predicted) / predicted)
print(line)
PY
}

hf_peer_figures() {  # the JSON line of hf_peer.py train as one short note
  py - "$1" <<'PY'
import json, sys
lines = [l for l in open(sys.argv[1]) if l.startswith("{")]
if not lines:
    print("no JSON line in the log")
    sys.exit(0)
j = json.loads(lines[-1])
print("transformers %s, %s params: steps %d-%d: %s tokens/s, %s ms/step, MFU %.1f%% (of 989 TFLOP/s), "
      "peak allocated %s GiB, reserved %s GiB" % (
    j["transformers"], j["params"], j["steps"] - j["timed_steps"] + 1, j["steps"], j["tokens_per_s"], j["ms_per_step"],
    100 * j["tflops_per_s"] / 989, j.get("peak_allocated_gib"), j.get("peak_reserved_gib")))
PY
}

# The peer at the same shape (bench/hf_peer.py train): transformers' Qwen3ForCausalLM with bf16 weights and
# fused AdamW, gradient checkpointing on and off, training the same parameters (the head tied to the embedding as
# the config says, as qwen3-train's training does). TRAIN_HF=0 leaves it out.
hf_peer_train() {
  local name=$1 m=$2 seq=$3 batch=$4 d=$stage_dir gc
  if [ "${TRAIN_HF:-1}" = 0 ]; then return; fi
  if [ "$dry_run" = 1 ] || [ ! -x "$python" ] || ! "$python" -c 'import transformers' >/dev/null 2>&1; then
    record "$name" hf-peer skipped 0 "needs $python with transformers (the GPU machine's)"
    return
  fi
  for gc in on off; do
    local log=$d/hf-peer-gc-$gc.log
    if ! run_monitored "$log" "${TRAIN_TIMEOUT_S:-240}" "$d/hf-peer-gc-$gc.mem" "$python" "$root/bench/hf_peer.py" train         --config "$m/config.json" --seq-len "$seq" --batch-size "$batch" --steps "$train_steps" --device cuda         --grad-checkpoint "$gc"; then
      no_time "$name" "hf-peer-gc-$gc"
      continue
    fi
    if [ "$step_rc" = 0 ]; then
      record "$name" "hf-peer-gc-$gc" ok "$step_s" "$(hf_peer_figures "$log"); $(cat "$d/hf-peer-gc-$gc.mem")"
    else
      record "$name" "hf-peer-gc-$gc" failed "$step_s" "$(fail_note "$log"); $(cat "$d/hf-peer-gc-$gc.mem")"
      show_tail "$log" 8
    fi
  done
}

# ------------------------------------------------------------------------------------------------ summary
write_summary() {
  local md=$results/summary.md
  {
    echo "# GPU round: scripts/gpu-check.sh"
    echo
    echo "$(date -u +%FT%TZ); $([ "$dry_run" = 1 ] && echo 'CPU DRY RUN (no GPU): GPU steps are skipped' || echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)"); build folder \`${build_dir#"$root"/}\`; git $(git -C "$root" rev-parse --short HEAD 2>/dev/null)"
    echo
    echo "| stage | step | status | time (s) | key figures / notes |"
    echo "|---|---|---|---:|---|"
    local s
    for s in env build test sanitize bench smoke train-2048 train-512 hf; do
      awk -F'\t' -v s="$s" '$1 == s && $2 != "(stage)"' "$status_file"
      awk -F'\t' -v s="$s" '$1 == s && $2 == "(stage)"' "$status_file"
    done | awk -F'\t' '{printf "| %s | %s | %s | %s | %s |\n", $1, $2, ($3 == "failed" ? "**failed**" : $3), $4, $5}'
    echo
    echo "Counts: $(awk -F'\t' '$2 != "(stage)"{n[$3]++} END{for (k in n) printf "%s %d  ", k, n[k]}' "$status_file")"
  } >"$md"
  cp "$status_file" "$results/status.tsv"
  # The device tool brings back at most 8 files from $OUT: the details travel as one archive.
  tar -czf "$results/gpu-check-details.tar.gz" -C "$state" results
  [ -f "$details/bench/bench_kernels.json" ] && cp "$details/bench/bench_kernels.json" "$results/"
  echo
  cat "$md"
}

# ------------------------------------------------------------------------------------------------ main
echo "gpu-check: results in $results, build in $build_dir$([ "$dry_run" = 1 ] && echo ', CPU dry run'), stages: ${expanded[*]}, budget ${budget}s"
for s in "${expanded[@]}"; do
  case "$s" in
    env) stage_env ;;
    build) stage_build ;;
    test) stage_test ;;
    sanitize) stage_sanitize ;;
    bench) stage_bench ;;
    smoke) stage_smoke ;;
    train-2048) stage_train train-2048 2048 1 ;;
    train-512) stage_train train-512 512 4 ;;
    hf) stage_hf ;;
    summary) ;;
  esac
done
write_summary
[ "$failures" = 0 ]
