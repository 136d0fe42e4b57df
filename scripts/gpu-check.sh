#!/usr/bin/env bash
# The GPU round, in three device calls (issues 12 and 26; docs/build.md, "The GPU round"):
#
#   scripts/gpu-check.sh RESULTS_DIR [--call 1|2|3] [--stage STAGE]... [--cpu-dry-run]
#
# The round is two device calls, chained back to back on one warm machine (docs/build.md, "The GPU round"; a
# lease is 15 minutes of device time, and the first round measured what each stage takes):
#   --call 1   env, build, test-gpu, smoke, train-2048:lean+fast+lean-unpacked+fast-unpacked (with their peers),
#              lean-int8 (int8 moments: the lean step of the step-time model's H100 goal), lean-recompute
#              (the memory goal: each block's operands made by its recompute), lean-fit (only the blocks
#              recomputed that the memory needs: none on an H200), lean-always (the nvfp4 update writing the
#              next forward's operands), lean and fast unpacked with --overlap-update, fast unpacked with
#              it leaving 16 and 32 SMs to the updates (--overlap-update-sms), and the fast step the step-time
#              model puts nearest its floor: with --keep-weight-operands always and 16 SMs left to the updates
#   --call 2   sanitize, hf, bench, train-512:lean+fast+fast-codes+fast-always (fast with its codes, and with its
#              operands kept across steps), test-all
#   --call 3   train-512:fast-unpacked+grad-checkpoint (what is left, if the lease has time)
# Every call works on a fresh machine: a stage that needs the build builds first when BUILD_DIR lacks it.
# STAGE: env, build, test (= test-gpu, test-all), sanitize, bench, smoke, train (= smoke, train-2048,
# train-512), hf, summary, or all (every stage). train-2048 and train-512 take the configurations to run after
# a colon, joined by '+': lean, fast, grad-checkpoint, base, each packed, or with -unpacked; lean and fast also
# with -overlap before it (--overlap-update: lean-overlap, fast-overlap-unpacked; -overlapN adds
# --overlap-update-sms N: fast-overlap16-unpacked), lean with -int8 (int8
# moments: lean-int8), or -codes / -recompute / -always
# (--keep-weight-operands off / recompute / always: fast-codes, lean-recompute, fast-always, lean-always), or -fit
# (--grad-checkpoint-blocks auto: lean-fit) (default: TRAIN_CONFIGS).
# The build folder (BUILD_DIR, default build-gpu/, ignored) keeps the build and the status of every step run so
# far (BUILD_DIR/gpu-check/status.tsv). RESULTS_DIR is rewritten after every step, so that a call cut short
# still returns what it measured: summary.md (the table), status.tsv, bench_kernels.json and
# gpu-check-details.tar.gz (every step's log, BUILD_DIR/gpu-check/results/<stage>/; kept under 15 MiB, the
# largest extras left out and named in the summary: the device tool returns 8 files of at most 16 MiB). A
# failing step is recorded and the next one runs; the exit status is 1 when any step of this call failed.
#
# Time: a step never starts without enough of GPU_CHECK_BUDGET_S (default 540 s, counted from this call's
# start) left and is cut at what is left, so a call returns its results before the tool's 10-minute limit.
#
# --cpu-dry-run: the same stages on a machine without a GPU, against Debian's libtorch (BUILD_DIR default
# build-vendor/): the build with the carried folder, the tests (GPU tests skip), smoke and a short training
# run of the tiny model on the CPU; everything that needs the GPU or its tools is recorded as skipped. On the GPU
# machine a GPU test or benchmark that finds no CUDA device is a failure, never a skip.
#
# Environment: PYTHON (default /opt/torch/.venv/bin/python3), VENDOR_DIR (.deps/gpu-vendor), BUILD_DIR,
# JOBS (nproc), CUDA_ARCHS (on the GPU machine 90;121: the H100/H200 and, for its SASS, the GB10; sm_120 adds
# build time and nothing the round looks at), GPU_CHECK_BUDGET_S, TRAIN_STEPS (12),
# TRAIN_TIMEOUT_S (per training run, 240), TRAIN_CONFIGS (default "lean fast grad-checkpoint base"),
# SANITIZE_TIMEOUT_S (per tool, 150), GPU_TEST_FILTER (default *Gpu*: every test that needs a device is named so,
# tests/gpu_test.h), TRAIN_HF (0: no peer runs).
set -u
set -o pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

results=""
dry_run=0
stages=()
while [ $# -gt 0 ]; do
  case "$1" in
    --stage) [ $# -ge 2 ] || usage; IFS=', ' read -r -a more <<<"$2"; stages+=("${more[@]}"); shift 2 ;;
    --stage=*) IFS=', ' read -r -a more <<<"${1#--stage=}"; stages+=("${more[@]}"); shift ;;
    --call) [ $# -ge 2 ] || usage
      case "$2" in
        1) stages+=(env build test-gpu smoke "train-2048:lean+fast+lean-unpacked+fast-unpacked+lean-int8+lean-recompute\
+lean-fit+lean-always+lean-overlap-unpacked+fast-overlap-unpacked+fast-overlap16-unpacked+fast-overlap32-unpacked\
+fast-always-overlap16-unpacked") ;;
        2) stages+=(sanitize hf bench train-512:lean+fast+fast-codes+fast-always test-all) ;;
        3) stages+=(train-512:fast-unpacked+grad-checkpoint) ;;
        *) echo "gpu-check: --call is 1, 2 or 3" >&2; usage ;;
      esac
      shift 2 ;;
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
    all) expanded+=(env build test-gpu test-all sanitize bench smoke train-2048 train-512 hf) ;;
    train) expanded+=(smoke train-2048 train-512) ;;
    test) expanded+=(test-gpu test-all) ;;
    env|build|test-gpu|test-all|sanitize|bench|smoke|train-2048|train-512|hf|summary) expanded+=("$s") ;;
    train-2048:*|train-512:*) expanded+=("$s") ;;
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
  train_steps=${TRAIN_STEPS:-12}  # timed over steps 4-12, as the first round (15-minute lease) ran them
  CUDA_ARCHS=${CUDA_ARCHS:-90;121}
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
gpu_filter=${GPU_TEST_FILTER:-*Gpu*}
gpu_kernel_filter='Gpu*.*:*/Gpu*.*'  # the kernels' parity suites (tests/gpu/), parameterised ones included
# The sanitizers leave out the tests that start the binary (the *Cli suites): a child process under
# compute-sanitizer is instrumented too, and its kernels are the ones the in-process tests check.
sanitize_filter=${GPU_TEST_FILTER:-*Gpu*-*Cli.*}
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
  write_table  # RESULTS_DIR as it goes: a call cut at its limit still returns every figure measured so far
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

stage_begin() {  # a stage's folder keeps what earlier calls wrote there (train-2048 runs in calls 1 and 2)
  stage_t0=$SECONDS
  stage_dir=$details/$1
  mkdir -p "$stage_dir"
  echo "== $1 ($(date -u +%H:%M:%S), $(remaining)s of the budget left)"
}
stage_end() { record "$1" "(stage)" "done" $((SECONDS - stage_t0)) "wall time of the stage"; pack_details; }

torch_prefix=""
torch_abi=""
torch_nccl=""
torch_info() {  # fills torch_prefix, torch_abi and torch_nccl (nccl.h's folder) from the PyTorch python (real run only)
  [ "$dry_run" = 1 ] && return 0
  [ -n "$torch_prefix" ] && return 0
  if [ -x "$python" ]; then
    torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
    torch_abi=$("$python" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null)
    torch_nccl=$("$python" - 2>/dev/null <<'PY'
import glob, os
import torch
site = os.path.dirname(os.path.dirname(torch.__file__))
found = glob.glob(os.path.join(site, "nvidia", "*", "include", "nccl.h"))
try:
    import nvidia.nccl
    found += [os.path.join(p, "include", "nccl.h") for p in nvidia.nccl.__path__]
except ImportError:
    pass
found += [os.path.join(os.path.dirname(torch.__file__), "include", "nccl.h")]
print(next((os.path.dirname(f) for f in found if os.path.isfile(f)), ""))
PY
)
  fi
}

# Does a program make a temporary folder (std::filesystem, as the tests' TempDir) and start a child process through
# glibc's popen and system (posix_spawn) and through fork, plain and with PyTorch's libraries loaded? The second
# round (H200, 2026-11-26) saw every test process die of SIGSEGV (pc 0) in the first test that made a TempDir and
# started a child, while the binary, which starts none, ran; the two programs say which step, and whether
# libtorch's presence is the cause.
spawn_probe() {
  local d=$1 lib=""
  [ "$dry_run" = 1 ] && { record env spawn-probe skipped 0 "dry run"; return; }
  have g++ || { record env spawn-probe failed 0 "no g++"; return; }
  cat >"$d/spawn_probe.cpp" <<'CPP'
// Each step prints its name before it runs, so a crash names the step: the test helpers' temporary folder
// (std::filesystem, mkdtemp), popen, system, fork and exec.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
int main() {
  std::printf("filesystem: "); std::fflush(stdout);
  std::string dir = (std::filesystem::temp_directory_path() / "spawn-probe-XXXXXX").string();
  if (!mkdtemp(dir.data())) return 4;
  { std::FILE* f = std::fopen((dir + "/file").c_str(), "w"); if (f) std::fclose(f); }  // not empty, as TempDir's
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);  // the overload TempDir called when the third round's tests died
  std::printf("ok; popen: "); std::fflush(stdout);
  char line[64] = {0};
  FILE* p = popen("echo spawned", "r");
  if (!p) return 3;
  if (!std::fgets(line, sizeof line, p)) line[0] = 0;
  const int closed = pclose(p);
  std::printf("read '%.7s', pclose %d; system: ", line, closed); std::fflush(stdout);
  const int sys = std::system("true");
  std::printf("%d; fork and exec: ", sys); std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) { execl("/bin/true", "true", static_cast<char*>(nullptr)); _exit(127); }
  int status = -1;
  waitpid(pid, &status, 0);
  std::printf("%d\n", status);
  return 0;
}
CPP
  torch_info
  [ -n "$torch_prefix" ] && lib=$(cd "$torch_prefix/../.." 2>/dev/null && pwd)/lib
  local kind note notes=() failed=0
  # plain; linked with libtorch as a program's link line has it (libstdc++ last, the compiler's own); with
  # -lstdc++ first (how the third round's programs were linked); and with the file the compiler resolves for
  # libstdc++.so.6 first, as cmake/Dependencies.cmake now links every program.
  local stdcxx_file
  stdcxx_file=$(g++ -print-file-name=libstdc++.so.6 2>/dev/null)
  for kind in plain torch torch-lstdcxx-first torch-libstdcxx-file; do
    local link=()
    if [ "$kind" != plain ]; then
      [ -d "$lib" ] || { notes+=("$kind: no libtorch folder"); continue; }
      # libtorch_cuda.so finds its CUDA libraries by its own run path; the link need not (allow-shlib-undefined).
      # libtorch.so too: the third round's tests died in its copy of remove_all, which the earlier probe never linked.
      link=(-Wl,--allow-shlib-undefined -Wl,--no-as-needed -L"$lib" -ltorch -ltorch_cuda -ltorch_cpu -lc10 -Wl,-rpath,"$lib")
      [ "$kind" = torch-lstdcxx-first ] && link=(-Wl,--no-as-needed -lstdc++ "${link[@]}")
      [ "$kind" = torch-libstdcxx-file ] && link=(-Wl,--no-as-needed "$stdcxx_file" "${link[@]}")
    fi
    if ! g++ -std=c++17 -O1 -o "$d/spawn-$kind" "$d/spawn_probe.cpp" "${link[@]}" >"$d/spawn-$kind.log" 2>&1; then
      notes+=("$kind: did not link"); failed=1; continue
    fi
    run_step "$d/spawn-$kind.run.log" 30 "$d/spawn-$kind" || continue
    note=$(grep -E '^filesystem' "$d/spawn-$kind.run.log" | head -n 1)
    [ "$step_rc" = 0 ] || { failed=1; note="exit $step_rc after '$note'"; }
    notes+=("$kind: $note")
  done
  # How many std::filesystem functions libtorch exports (pytorch/pytorch#133437): each would serve a program's
  # own calls where libtorch comes before libstdc++ in its link line.
  [ -f "$lib/libtorch_cpu.so" ] && have nm &&
    notes+=("libtorch_cpu.so exports $(nm -D --defined-only "$lib/libtorch_cpu.so" 2>/dev/null | grep -c '_ZN\?K\?St10filesystem') std::filesystem symbols")
  local joined
  joined=$(printf '%s; ' "${notes[@]}")
  record env spawn-probe "$([ "$failed" = 0 ] && echo ok || echo failed)" 0 "${joined%; }"
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
  # NCCL's header: a libtorch with NCCL needs it for ProcessGroupNCCL.hpp, and PyTorch's wheel keeps it in the
  # nvidia-nccl package beside torch, not in torch/include (cmake/Dependencies.cmake looks there too).
  if [ "$dry_run" = 1 ]; then
    record env nccl skipped 0 "dry run: Debian's libtorch is built without NCCL"
  else
    torch_info
    if [ -n "$torch_nccl" ]; then
      record env nccl ok 0 "nccl.h in $torch_nccl"
    elif [ -n "$torch_prefix" ] && "$python" -c 'import torch.distributed as d, sys; sys.exit(0 if d.is_nccl_available() else 1)' 2>/dev/null; then
      record env nccl failed 0 "this torch is built with NCCL but no nccl.h is beside it (site-packages/nvidia/*/include): the build would stop at <nccl.h>; pip install nvidia-nccl-cu13 headers or set QWEN3_NCCL_INCLUDE_DIR"
    else
      record env nccl ok 0 "this torch has no NCCL: Gloo only, no header needed"
    fi
  fi
  spawn_probe "$d"
  if [ -f "$vendor/MANIFEST.txt" ]; then
    cp "$vendor/MANIFEST.txt" "$d/vendor-MANIFEST.txt"
    record env vendor ok 0 "$(du -sh "$vendor" | cut -f1) carried: $(grep -c . "$vendor/MANIFEST.txt") manifest lines"
  else
    record env vendor failed 0 "no $vendor/MANIFEST.txt: run scripts/gather-deps.sh here and carry .deps/gpu-vendor"
  fi
  stage_end env
}

stage_build() {
  build_tried=1
  stage_begin build
  local d=$stage_dir args=() nvcc_path note
  torch_info
  # One object a source (no unity build): the CUDA-libtorch lane checks these files one by one, and a name two
  # files share only under QWEN3_TORCH_HAS_CUDA must not first collide here, on device time.
  args=(-S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DQWEN3_VENDOR_DIR=$vendor"
        -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DQWEN3_UNITY_BUILD=OFF)
  if [ "$dry_run" = 0 ]; then
    args+=(-DQWEN3_CUDA=ON "-DCMAKE_PREFIX_PATH=$torch_prefix")
    nvcc_path=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    args+=("-DCMAKE_CUDA_COMPILER=$nvcc_path")
    [ -n "$torch_nccl" ] && args+=("-DQWEN3_NCCL_INCLUDE_DIR=$torch_nccl")
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

  # The binary and the tests; the benchmarks are built by the stage that runs them (call 2), so call 1 keeps
  # its minutes for the tests and the first training run.
  local target
  for target in qwen3-train qwen3_tests; do
    local name=$target
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
      # The dump itself stays on the machine (megabytes per architecture): what comes back is the opcode
      # histogram above and each function's name with its instruction count.
      awk '/Function :/ {if (name != "") print n, name; name = $3; n = 0; next}
           /^[ \t]*\/\*[0-9a-f]+\*\/[ \t]/ {n++} END {if (name != "") print n, name}' "$sass" >"$d/sass-functions-$arch.txt"
      rm -f "$sass"
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

# A stage that needs the build makes it first where this machine has none (a fresh machine: the device tool hands
# a machine back 30 s after a call, and the next call may land on a new one).
build_tried=0
ensure_built() {
  [ -x "$bin" ] && [ -x "$tests_bin" ] && return 0
  if [ "$build_tried" = 0 ]; then
    echo "gpu-check: no build in $build_dir (a fresh machine?): building first"
    stage_build
  fi
  [ -x "$bin" ] && [ -x "$tests_bin" ]
}

# crash_note LOG: the test process's crash report (tests/crash_report.cpp) in one line, the test binary's
# unexported functions named through nm (the report gives their module offsets); the whole report, named, goes to
# LOG.crash.txt.
crash_note() {
  py - "$1" "$tests_bin" <<'EOF'
import bisect, re, subprocess, sys
log, binary = sys.argv[1], sys.argv[2]
text = open(log, errors="replace").read()
start = text.rfind("qwen3_tests: fatal")
if start < 0:
    print("no crash report"); sys.exit(0)
report = text[start:].splitlines()
try:
    nm = subprocess.run(["nm", "-C", "-n", "--defined-only", binary], capture_output=True, text=True).stdout.splitlines()
except OSError:
    nm = []
addrs, names = [], []
for line in nm:
    parts = line.split(" ", 2)
    if len(parts) == 3 and parts[1] in "tTwW":
        addrs.append(int(parts[0], 16)); names.append(parts[2])
def name(line):
    m = re.search(r"^\s+(pc|\[sp\]|frame) 0x[0-9a-f]+: (\S+?)\+0x([0-9a-f]+)(?: \((.*)\))?$", line)
    if not m:
        return line.strip()
    label, module, offset, symbol = m.group(1), m.group(2), int(m.group(3), 16), m.group(4)
    if not symbol and module.endswith("qwen3_tests") and addrs:
        i = bisect.bisect_right(addrs, offset) - 1
        if i >= 0:
            symbol = f"{names[i][:160]}+0x{offset - addrs[i]:x}"
    return f"{label} {symbol or module.rsplit('/', 1)[-1] + '+0x%x' % offset}"
lines = [l for l in report[1:] if l.strip() and not l.strip().startswith("backtrace")]
named = [report[0]] + [name(l) for l in lines if l.startswith("  ")]
open(log + ".crash.txt", "w").write("\n".join(named) + "\n")
# The one line: pc, [sp] and the first frames below the handler and the signal trampoline.
regs = [n for n in named[1:] if not n.startswith("frame")]
frames = [n for n in named[1:] if n.startswith("frame")]
handler = next((i for i, n in enumerate(frames) if "on_fatal_signal" in n), None)
if handler is not None:
    frames = frames[handler + 2:]
print(re.sub(r"^qwen3_tests: fatal ", "", named[0]) + "; " + "; ".join(regs + frames[:4]))
EOF
}

# run_gtests STAGE STEP LOGBASE TIMEOUT FILTER [ENV=VALUE...]: the test binary on FILTER, its report in
# LOGBASE.json. When the process dies of a signal, its crash report names the test: that test is recorded and left
# out, and the rest run again (at most 4 times), so that one crashing test does not hide every test after it.
run_gtests() {
  local stage=$1 step=$2 base=$3 limit=$4 filter=$5 attempt=0 log crashed=() notes=() counts test
  shift 5
  while :; do
    log=$base.log
    [ "$attempt" -gt 0 ] && log=$base.rerun$attempt.log
    rm -f "$base.json"
    if ! run_step "$log" "$limit" env "$@" "$tests_bin" "--gtest_filter=$filter" "--gtest_output=json:$base.json"; then
      no_time "$stage" "$step"
      return
    fi
    test=$(grep -a -o 'qwen3_tests: fatal .* in test [^ ,]*' "$log" | tail -n 1 | sed 's/.* in test //')
    if [ "$step_rc" -lt 128 ] || timed_out || [ -z "$test" ] || [[ "$test" == \(* ]] || [ "$attempt" -ge 4 ]; then
      break
    fi
    crashed+=("$test")
    notes+=("$test: $(crash_note "$log")")
    echo "  $step: $test crashed the test process; the rest again without it"
    if [[ "$filter" == *-* ]]; then filter="$filter:$test"; else filter="$filter-$test"; fi
    attempt=$((attempt + 1))
  done
  counts=$(gtest_counts "$base.json")
  if [ "$step_rc" -ge 128 ] && ! timed_out; then notes+=("the last run died too: $(crash_note "$log")"); fi
  local detail=""
  [ ${#crashed[@]} -gt 0 ] && detail="; crashed the test process: ${crashed[*]}"
  [ ${#notes[@]} -gt 0 ] && detail="$detail ($(printf '%s; ' "${notes[@]}"))"
  if [ "$step_rc" != 0 ] || [ ${#crashed[@]} -gt 0 ]; then
    record "$stage" "$step" failed "$step_s" "$counts$detail; $(fail_note "$log")"
    grep -E '^\[  FAILED  \]|Failure' "$log" | head -n 20 | sed 's/^/  | /'
  elif [ "$dry_run" = 1 ]; then
    record "$stage" "$step" skipped "$step_s" "dry run, no GPU: $counts"
  elif [[ "$counts" != *" 0 skipped"* ]]; then
    record "$stage" "$step" failed "$step_s" "GPU tests skipped on the GPU machine (device not visible?): $counts"
  else
    record "$stage" "$step" ok "$step_s" "$counts"
  fi
}

# Every GPU test (the tests that need a device are named *Gpu*: tests/gpu_test.h): failed if one skips here. The
# kernels' parity suites (named Gpu*, tests/gpu/) first, in a process of their own: a crash elsewhere cannot hide
# them (the second round's test process died before reaching them).
# How the test binary's std::filesystem calls bind (the first two rounds' test processes died in libtorch.so's
# remove_all): its first needed libraries, what the compiler's -lstdc++ would take, the LinkOrder and
# RemoveTree tests, and the dynamic linker's own word on where remove_all was bound (LD_DEBUG=bindings).
link_check() {
  local d=$1 cxx so needed bound tests
  cxx=$(grep -m1 '^CMAKE_CXX_COMPILER:' "$build_dir/CMakeCache.txt" 2>/dev/null | cut -d= -f2)
  so=$("${cxx:-g++}" -print-file-name=libstdc++.so 2>/dev/null)
  needed=$(readelf -d "$tests_bin" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | head -n 3 | tr '\n' ' ')
  if ! run_step "$d/link-tests.log" 60 env LD_DEBUG=bindings LD_DEBUG_OUTPUT="$d/ld-bindings" \
      "$tests_bin" --gtest_filter='LinkOrder.*:RemoveTree.*'; then no_time test-gpu link; return; fi
  # The program's std::filesystem bindings (its dlsym lookups included): which file served each, remove_all's first.
  bound=$(cat "$d"/ld-bindings.* 2>/dev/null | grep "binding file [^ ]*qwen3_tests " | grep 'St10filesystem' |
    sed -n 's/.* to \([^ ]*\) .*symbol `\([^'"'"']*\)'"'"'.*/\2 -> \1/p' | sort -u |
    awk '/remove_all/ {print; next} {rest[++n] = $0} END {for (i = 1; i <= n && i <= 3; ++i) print rest[i]}' |
    tr '\n' ';')
  rm -f "$d"/ld-bindings.*
  tests=$(grep -E '^\[  (PASSED|FAILED) ' "$d/link-tests.log" | tr '\n' ' ')
  record test-gpu link "$([ "$step_rc" = 0 ] && echo ok || echo failed)" "$step_s" \
    "needed: $needed; linked first: $(grep -m1 -o 'no-as-needed [^ ]*stdc++[^ ]*' "$build_dir/build.ninja" 2>/dev/null | cut -d' ' -f2); ${cxx:-g++} -print-file-name=libstdc++.so: $so -> $(readlink -f "$so" 2>/dev/null || echo '?')$([ -e "$so" ] || echo ' (missing)'); $tests; bindings: ${bound:-none logged}"
}

stage_test_gpu() {
  stage_begin test-gpu
  local d=$stage_dir
  if ! ensure_built; then record test-gpu gpu-tests failed 0 "no test binary: the build failed"; stage_end test-gpu; return; fi
  link_check "$d"
  if [ -n "${GPU_TEST_FILTER:-}" ]; then
    run_gtests test-gpu gpu-tests "$d/gpu-tests" 300 "$gpu_filter"
  else
    run_gtests test-gpu gpu-kernel-tests "$d/gpu-kernel-tests" 200 "$gpu_kernel_filter"
    run_gtests test-gpu gpu-tests "$d/gpu-tests" 200 "$gpu_filter-$gpu_kernel_filter"
  fi
  stage_end test-gpu
}

# The whole suite through ctest (the CPU tests too: the PyTorch 2.11 libtorch's behaviour on everything).
stage_test_all() {
  stage_begin test-all
  local d=$stage_dir
  if ! ensure_built; then record test-all all-tests failed 0 "no test binary: the build failed"; stage_end test-all; return; fi
  if run_step "$d/ctest.log" 540 ctest --test-dir "$build_dir" -j "$jobs" --timeout 400 --output-on-failure \
      --output-junit "$d/ctest-junit.xml"; then
    local line skipped
    line=$(grep -E 'tests passed' "$d/ctest.log" | tail -n 1)
    skipped=$(grep -c -E '\((Skipped|Not Run)\)' "$d/ctest.log")
    if [ "$step_rc" = 0 ]; then
      record test-all all-tests ok "$step_s" "$line; $skipped skipped"
    else
      local crashes
      crashes=$(grep -a -o 'qwen3_tests: fatal [A-Z]* .* in test [^ ,]*' "$d/ctest.log" | sed 's/^qwen3_tests: fatal \([A-Z]*\) .* in test /\1 in /' | sort -u | head -n 8 | tr '\n' ' ')
      record test-all all-tests failed "$step_s" "${line:-$(fail_note "$d/ctest.log")}; $skipped skipped; failed: $(grep -E '^\s+[0-9]+ - .*\(Failed|Timeout|Exception|SEGFAULT' "$d/ctest.log" | awk '{print $3}' | head -n 5 | tr '\n' ' ')${crashes:+; process crashes (tests/crash_report.cpp): $crashes}"
      grep -E -A30 'The following tests FAILED' "$d/ctest.log" | head -n 20 | sed 's/^/  | /'
    fi
  else
    no_time test-all all-tests
  fi
  stage_end test-all
}

stage_sanitize() {
  stage_begin sanitize
  local d=$stage_dir tool summary
  for tool in memcheck racecheck synccheck; do
    if [ "$dry_run" = 1 ] || ! have compute-sanitizer; then
      record sanitize "$tool" skipped 0 "$([ "$dry_run" = 1 ] && echo 'dry run: no GPU' || echo 'compute-sanitizer absent')"
      continue
    fi
    if ! ensure_built; then record sanitize "$tool" failed 0 "no test binary: the build failed"; continue; fi
    # Every GPU test, at its small shapes (QWEN3_GPU_TEST_SMALL, tests/gpu_test.h), so the three tools fit one call.
    # memcheck watches every kernel; racecheck and synccheck only ours (their names hold "qwen3"): the first round
    # found synccheck reporting "divergent threads at a barrier" in cuDNN's flash-attention backward (a warp-
    # specialised wgmma kernel, not ours to fix), and instrumenting cuBLAS and cuDNN cost racecheck its time.
    local only_ours=() filter=$sanitize_filter
    [ "$tool" = memcheck ] || only_ours=(--kernel-name kns=qwen3)
    # racecheck failed "to handle a hardware exception" in the loss-statistics kernel in the second and third
    # rounds (its tests pass alone and under memcheck; the kernel's shared memory is two 8-float arrays between
    # barriers), after which every CUDA call of the process failed: the loss kernels' tests are left out of
    # racecheck so that the others run.
    if [ "$tool" = racecheck ] && [ -z "${GPU_TEST_FILTER:-}" ]; then
      filter+=":LinearCrossEntropy.Gpu*:GpuLossKernels.*"
      [[ "$sanitize_filter" == *-* ]] || filter="$sanitize_filter-LinearCrossEntropy.Gpu*:GpuLossKernels.*"
    fi
    if ! run_step "$d/$tool.log" "${SANITIZE_TIMEOUT_S:-150}" env QWEN3_GPU_TEST_SMALL=1 compute-sanitizer --tool "$tool" \
        "${only_ours[@]}" --error-exitcode 99 --print-limit 50 "$tests_bin" "--gtest_filter=$filter"; then
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
  if ! ensure_built; then record bench kernels failed 0 "no build"; stage_end bench; return; fi
  if [ ! -x "$b" ] && grep -q '^build bench/bench_kernels:' "$build_dir/build.ninja" 2>/dev/null; then
    if run_step "$d/ninja-bench_kernels.log" 300 ninja -C "$build_dir" -j "$jobs" bench_kernels; then
      record_outcome bench build-bench "$d/ninja-bench_kernels.log" "bench_kernels built"
    else
      no_time bench build-bench
    fi
  fi
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
  if grep -q 'no CUDA device' "$d/bench_kernels.log"; then  # on the GPU machine that is a failure, not a skip
    record bench kernels "$([ "$dry_run" = 1 ] && echo skipped || echo failed)" "$step_s" "no CUDA device: nothing measured"
    record bench ncu skipped 0 "no CUDA device"
    stage_end bench
    return
  fi
  local figures
  figures=$(py - "$json" <<'EOF'
import json, sys
try:
    data = json.load(open(sys.argv[1]))
except Exception:
    print("no JSON output"); sys.exit(0)
q, qo, dq, m, adamw, fused, clip, loss = [], [], [], {}, [], [], [], {}
for b in data.get("benchmarks", []):
    n = b.get("name", "")
    if n.startswith("loss_slice/") and "us" in b:  # loss_slice/<product>/rows<N>_cols<V>/...
        product, rows = n.split("/")[1:3]
        loss.setdefault(product, {})[rows] = b["us"]
    if n.startswith("quantize/") and "/rne/" in n and "of_copy" in b:
        q.append((n.split("/")[1], b["of_copy"]))
    if n.startswith("quantize_operand/") and "of_copy" in b:
        qo.append(("/".join(n.split("/")[1:3]), b["of_copy"]))
    if n.startswith("dequantize/") and "of_copy" in b:
        dq.append(b["of_copy"])
    if n.startswith("matmul") and "speedup" in b:
        # "matmul_bf16/M16/N9728/K2560/iterations:3/manual_time": the name goes on past the arguments
        M, N, K = n.split("/")[1:4]
        m.setdefault(N + K, []).append((int(M[1:]), b.get("speedup_vs_path", b["speedup"])))
    if n.startswith("adamw/") and "of_copy" in b:
        adamw.append("%s %.0f%%" % ("/".join(n.split("/")[1:3]).replace("_moments", "").replace("_master", ""),
                                    100 * b["of_copy"]))
    if n.startswith("grad_clip/") and "of_copy" in b:
        clip.append("%s %.0f%%" % (n.split("/")[2], 100 * b["of_copy"]))
    if n.startswith("fused/") and "of_copy" in b:
        fused.append("%s %.0f%%" % (b.get("label", n), 100 * b["of_copy"]))
parts = []
for t in ("f32", "bf16"):
    v = [x for k, x in q if k == t]
    if v:
        parts.append(f"quantize {t} rne {min(v):.0%}-{max(v):.0%} of D2D copy")
for kind in sorted(set(k for k, _ in qo)):
    v = [x for k, x in qo if k == kind]
    parts.append(f"quantize {kind} {min(v):.0%}-{max(v):.0%} of copy")
if dq:
    parts.append(f"dequantize bf16 {min(dq):.0%}-{max(dq):.0%} of copy")
# Where the kernel stops beating the path it replaces (dequantize, then cuBLAS), per shape: the data
# kNvfp4KernelMaxRows is set from.
for shape, rows in sorted(m.items()):
    rows.sort()
    beats = [M for M, speedup in rows if speedup >= 1.0]
    parts.append("%s: %s (%s)" % (shape, "beats dequantize+cuBLAS to M=%d" % max(beats) if beats else "never beats dequantize+cuBLAS",
                                   ", ".join("M%d %.2fx" % (M, sp) for M, sp in rows)))
if adamw:
    parts.append("AdamW of copy: " + ", ".join(adamw))
if fused:
    parts.append("fused of copy: " + ", ".join(fused))
if clip:
    parts.append("grad clip (a 4B block's gradients) of copy: " + ", ".join(clip))
if loss:
    parts.append("loss slice products us (rows x columns 2047x8192 / 2047x8196 / 2048x8192): " + ", ".join(
        "%s %.0f / %.0f / %.0f" % (k, v.get("rows2047_cols8192", float("nan")), v.get("rows2047_cols8196", float("nan")),
                                   v.get("rows2048_cols8192", float("nan"))) for k, v in sorted(loss.items())))
print("; ".join(parts))
EOF
)
  if [ "$step_rc" = 0 ]; then
    record bench kernels ok "$step_s" "$figures"
  else
    record bench kernels failed "$step_s" "$(fail_note "$d/bench_kernels.log"); $figures"
  fi
  grep -E '^(quantize|dequantize|matmul|adamw|fused|grad_clip|loss_slice)' "$d/bench_kernels.log" | head -n 100

  # ncu on the kernels a training step runs, each at a training shape: quantize (every trained weight, every
  # forward), dequantize (into the product's scratch from 17 rows on), the product at the rows where small
  # batches and generation take it, the AdamW update of the fast and of the lean configuration, the fused ops.
  local spec name kernel filter nf
  for spec in "quantize|nvfp4_quantize_rne_kernel|quantize/bf16/rne/9728x2560" \
              "quantize-operand-f32|nvfp4_quantize_rne_kernel|quantize_operand/f32/codes_and_operand/9728x2560" \
              "dequantize|nvfp4_dequantize_vector_kernel|dequantize/bf16/9728x2560" \
              "gemv-M1|nvfp4_gemv_kernel|matmul_bf16/M1/N9728/K2560" \
              "matmul-M16|nvfp4_matmul_kernel|matmul_bf16/M16/N9728/K2560" \
              "matmul-M256|nvfp4_matmul_kernel|matmul_bf16/M256/N9728/K2560" \
              "adamw-fp32|plain_kernel|adamw/f32_moments/fp32_master" \
              "adamw-fp32-operand|plain_operand_kernel|adamw/f32_moments/fp32_master_operand" \
              "adamw-int8-bf16|int8_kernel|adamw/int8_moments/bf16_master" \
              "adamw-int8-bf16-operand|int8_kernel|adamw/int8_moments/bf16_master_operand" \
              "adamw-nvfp4-bf16|nvfp4_kernel|adamw/nvfp4_moments/bf16_master" \
              "rmsnorm|rmsnorm_forward_kernel|fused/0" \
              "rmsnorm-backward|rmsnorm_dx_kernel|fused/1" \
              "q-norm|rmsnorm_forward_kernel|fused/7" \
              "q-norm-dw-sum|sum_chunks_kernel|fused/8" \
              "rope|rope_kernel|fused/2" \
              "q-norm-rope|head_norm_rope_forward_kernel|fused/9" \
              "q-norm-rope-backward|head_norm_rope_backward_kernel|fused/10" \
              "swiglu-backward|swiglu_backward_kernel|fused/4"; do
    IFS='|' read -r name kernel filter <<<"$spec"
    if ! have ncu; then record bench "ncu-$name" skipped 0 "ncu absent"; continue; fi
    # Google Benchmark's names go on past the arguments ("fused/0/iterations:3/manual_time"): the first round's
    # filters ended in '$', matched nothing, and ncu profiled nothing. A filter that names no benchmark is a failure.
    if ! "$b" --benchmark_list_tests "--benchmark_filter=^${filter}/" 2>/dev/null | grep . >/dev/null; then  # not -q: has_flag
      record bench "ncu-$name" failed 0 "$filter: no benchmark of bench_kernels is named so"; continue
    fi
    if ! run_step "$d/ncu-$name.log" 90 ncu --target-processes all --kernel-name-base function -k "regex:^${kernel}\$" \
        --launch-count 1 --section SpeedOfLight --section LaunchStats --section Occupancy \
        --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum \
        -o "$d/ncu-$name" -f "$b" "--benchmark_filter=^${filter}/"; then
      no_time bench "ncu-$name"; continue
    fi
    ncu --import "$d/ncu-$name.ncu-rep" --print-summary none >>"$d/ncu-$name.log" 2>&1
    # Issue slots busy and instructions executed say whether a memory-bound kernel is held back by its arithmetic.
    nf=$(grep -E '^\s+(Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per Thread|sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active|smsp__issue_active.avg.pct_of_peak_sustained_active|smsp__inst_executed.sum)\s' "$d/ncu-$name.log" |
         sed -E 's/^ +//; s/ {2,}/ /g' | head -n 10 | tr '\n' ';')
    if [ "$step_rc" = 0 ] && [ -n "$nf" ] && ! grep -q 'ERR_NVGPUCTRPERM\|==ERROR==' "$d/ncu-$name.log"; then
      record bench "ncu-$name" ok "$step_s" "$filter: $nf"
    else
      record bench "ncu-$name" failed "$step_s" "$filter: $(grep -m1 -E 'ERR_|==ERROR==|No kernels were profiled' "$d/ncu-$name.log" | cut -c1-140)"
    fi
  done
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
# Unpacked training data: lines several rows long (about 4 x SEQ_LEN words), so that every row is one sample and
# full, as the peer's random rows are; split at row boundaries by the loader.
make_long_train_data() {
  local f=$state/train-long-$1.txt
  [ -s "$f" ] && { echo "$f"; return; }
  awk -v words=$((4 * $1)) 'BEGIN {
    srand(11); split("the of model train weight block scale token layer step memory kernel tensor core batch sequence loss gradient optimizer moment checkpoint export vocabulary attention head norm product quantize round error bound", w, " ")
    for (l = 0; l < 200; l++) { s = ""; for (i = 0; i < words; i++) s = s (i ? " " : "") w[1 + int(rand() * 35)]; print s "." }
  }' >"$f"
  echo "$f"
}
tokenizer_file() {
  local real=$root/.deps/tokenizer-qwen3/models/tokenizer.json
  if [ -s "$real" ]; then echo "$real"; else echo "$root/tests/data/tiny_tokenizer.json"; fi
}
device() { [ "$dry_run" = 1 ] && echo cpu || echo cuda; }
# grep reads the whole help, not -q: under pipefail, grep -q leaving at its first match makes the program's next
# write fail (SIGPIPE, status 141) and the pipeline false, whenever grep wins that race. The CPU dry run of
# 2026-11-27 lost its profiled step so (has_flag train --profile-step: 141).
has_command() { "$bin" --help 2>/dev/null | grep -E "^ +$1( |$)" >/dev/null; }
has_flag() { "$bin" "$1" --help 2>/dev/null | grep -E -- "(^| |,)$2([ =,:\[]|$)" >/dev/null; }

# The slower paths a run's summary lists (docs/trainer.md, "Slow paths"), its lines starting with PREFIX: the first
# three, or "none" (what the run's figures assume).
slower_paths() {  # slower_paths LOG PREFIX
  local found
  found=$(awk -v p="$2" 'index($0, p) == 1 { print substr($0, length(p) + 1) }' "$1" | head -n 3 | tr '\n' ';')
  echo "${found:-none}"
}

stage_smoke() {
  stage_begin smoke
  local d=$stage_dir dev
  if ! ensure_built; then record smoke smoke failed 0 "no $bin: the build failed"; stage_end smoke; return; fi
  if ! has_command smoke; then
    record smoke smoke skipped 0 "qwen3-train has no smoke command"
    stage_end smoke
    return
  fi
  for dev in $([ "$dry_run" = 1 ] || echo cuda) cpu; do  # CUDA first: the call-1 figure; the CPU run compares
    rm -rf "$state/smoke-$dev"
    if ! run_monitored "$d/smoke-$dev.log" 300 "$d/smoke-$dev.mem" "$bin" smoke --device "$dev" --out-dir "$state/smoke-$dev"; then
      no_time smoke "smoke-$dev"; continue
    fi
    local losses
    losses=$(grep -o -E 'loss [0-9.]+ -> [0-9.]+|loss [0-9.]+' "$d/smoke-$dev.log" | tail -n 1)
    if [ "$step_rc" = 0 ]; then
      record smoke "smoke-$dev" ok "$step_s" "${losses:+$losses; }$(grep -o -E '(passed|FAILED) in [0-9.]+ s' "$d/smoke-$dev.log" | tail -n 1); $(cat "$d/smoke-$dev.mem"); slower paths: $(slower_paths "$d/smoke-$dev.log" 'smoke: slower     ')"
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
  if ! ensure_built; then record hf hf failed 0 "no $bin: the build failed"; stage_end hf; return; fi
  if [ "$dry_run" = 1 ] || [ ! -x "$python" ] || ! "$python" -c 'import transformers' >/dev/null 2>&1; then
    record hf transformers skipped 0 "needs $python with transformers (the GPU machine's)"
    stage_end hf
    return
  fi
  rm -rf "$m" && mkdir -p "$m"
  if ! run_step "$d/synth.log" 120 "$bin" synth --preset tiny --out-dir "$m/model"; then no_time hf synth; stage_end hf; return; fi
  if ! run_step "$d/export.log" 120 "$bin" export --format hf --weights "$m/model/model.dat" --config "$m/model/config.json" --no-tokenizer --out "$m/hf"; then
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

# The configurations a training stage runs, by name (most wanted first where a stage takes its default list):
#   lean             bf16 masters with stochastic rounding, nvfp4 moments, --grad-checkpoint --fused-optimizer:
#                    the memory goal (<= 16 GB for Qwen3-4B at 1 x 2048) as lean-recompute; plain lean lets
#                    --keep-weight-operands auto hold the first forward's operands through the recompute (7 GB
#                    more where the device has them, as an H200 has)
#   fast             fp32 masters and moments, bf16 compute, --fused-optimizer (the 4B model's fp32 gradients
#                    never all live at once): the speed goal; its last step runs under the profiler
#   grad-checkpoint  fp32 masters and moments, --grad-checkpoint
#   base             fp32 masters and moments, nothing else
# Each is packed (whole samples in full rows, --pack); NAME-unpacked trains one sample a row from lines longer
# than the row (every row full, split at row boundaries), the shape of the peer's random rows.
# A configuration: its name, -unpacked (full rows), -overlap (--overlap-update: the in-backward updates on a
# CUDA stream of their own) or -overlapN (and backward's products leaving N SMs to them), -int8 (lean only: int8
# moments where lean has nvfp4 ones, the configuration of issue 28's lean goal), -codes (--keep-weight-operands
# off: backward dequantizes each trained projection's codes, where auto keeps its bf16 operand from forward when the step fits), -recompute (--keep-weight-operands
# recompute, under --grad-checkpoint: each block's recompute makes its operands again, where auto keeps the first
# forward's through the recompute when the step fits) or -always (--keep-weight-operands always: the operands kept
# across steps, written by the update), -fit (--grad-checkpoint-blocks auto: the fewest blocks recomputed whose step
# fits the device, none for Qwen3-4B's lean step on an H100 or H200), or several (NAME-overlap-unpacked).
config_flags() {
  local name=${1%-unpacked} extra="" moments=nvfp4
  if [[ "$name" =~ -overlap([0-9]*)$ ]]; then
    local sms=${BASH_REMATCH[1]}
    name=${name%-overlap"$sms"}
    [ "$dry_run" = 1 ] || extra=" --overlap-update"  # a CUDA stream: the dry run's CPU takes the plain mode
    # -overlapN: backward's products leave N SMs to the updates (--overlap-update-sms; CUDA only, as above)
    [ -z "$sms" ] || [ "$dry_run" = 1 ] || extra+=" --overlap-update-sms $sms"
  fi
  # lean with int8 moments: the configuration issue 28's lean goal and the "Where it stands" table predict.
  if [[ "$name" == *-int8 ]]; then
    name=${name%-int8}
    moments=int8
  fi
  if [[ "$name" == *-codes ]]; then
    name=${name%-codes}
    extra+=" --keep-weight-operands off"
  elif [[ "$name" == *-recompute ]]; then
    name=${name%-recompute}
    [ "$dry_run" = 1 ] || extra+=" --keep-weight-operands recompute"  # CUDA only, as always below
  elif [[ "$name" == *-always ]]; then
    name=${name%-always}
    [ "$dry_run" = 1 ] || extra+=" --keep-weight-operands always"  # CUDA only: the dry run's CPU keeps the codes
  elif [[ "$name" == *-fit ]]; then
    name=${name%-fit}
    extra+=" --grad-checkpoint-blocks auto"
  fi
  [ "$moments" = nvfp4 ] || [ "$name" = lean ] || return 1  # -int8: lean's moments only
  case "$name" in
    lean) echo "--master-dtype bfloat16 --optimizer-state-mode $moments --grad-checkpoint --fused-optimizer$extra" ;;
    fast) echo "--fused-optimizer$extra" ;;
    grad-checkpoint) echo "--grad-checkpoint" ;;
    base) echo "" ;;
    *) return 1 ;;
  esac
}
# The configuration a name modifies: NAME without its -unpacked, -overlap, -int8 and -codes, -recompute, -always
# or -fit.
base_config() {
  local name=${1%-unpacked}
  [[ "$name" =~ -overlap[0-9]*$ ]] && name=${name%"${BASH_REMATCH[0]}"}
  name=${name%-int8}
  name=${name%-codes}
  name=${name%-recompute}
  name=${name%-always}
  name=${name%-fit}
  [[ "$name" =~ -overlap[0-9]*$ ]] && name=${name%"${BASH_REMATCH[0]}"}
  echo "$name"
}
# The peer with the same parameter and optimizer dtypes (bench/hf_peer.py train): a bf16 master with 4-bit
# moments (torchao's; bf16 moments where torchao is absent) for lean, an fp32 master computing in bf16 for the
# others; checkpointing as the configuration has it.
peer_flags() {
  case "$(base_config "$1")" in
    lean) echo "--param-dtype bfloat16 --moments 4bit --grad-checkpoint on" ;;
    grad-checkpoint) echo "--param-dtype float32 --grad-checkpoint on" ;;
    fast|base) echo "--param-dtype float32 --grad-checkpoint off" ;;
  esac
}

peer_name() {
  case "$(base_config "$1")" in
    lean) echo bf16-4bit-gc ;;
    grad-checkpoint) echo fp32-gc ;;
    *) echo fp32 ;;
  esac
}

stage_train() {  # stage_train NAME SEQ_LEN BATCH CONFIGS ('+'- or space-separated; empty: the default list)
  local name=$1 seq=$2 batch=$3 wanted=${4:-}
  stage_begin "$name"
  local d=$stage_dir dev m packed_data long_data tok configs=() c
  dev=$(device)
  if ! ensure_built; then record "$name" train failed 0 "no $bin: the build failed"; stage_end "$name"; return; fi
  train_model "$name" || { stage_end "$name"; return; }
  m=$(cat "$state/model-path")
  packed_data=$(make_train_data)
  long_data=$(make_long_train_data "$seq")
  tok=$(tokenizer_file)
  [ -n "$wanted" ] || wanted="lean fast grad-checkpoint base"
  for c in ${wanted//+/ }; do
    if config_flags "$c" >/dev/null; then configs+=("$c"); else record "$name" "train-$c" failed 0 "unknown configuration '$c'"; fi
  done

  for c in "${configs[@]}"; do
    local extra=() profiled=0 data=$packed_data pack=(--pack)
    read -r -a extra <<<"$(config_flags "$c")"
    if [[ "$c" == *-unpacked ]]; then data=$long_data; pack=(); fi
    # The fast configuration's last step under the profiler (the step breakdown), packed and on full rows (what
    # the packed rows cost: 18.5 ms of 176.8 in the second round): the trace beside the log, the phase and op
    # tables in it; the steady figures leave that step out. And lean's on full rows: no round has said where its
    # time goes (its update is bound by instructions; issue 28's H100 goal turns on it). And every -overlap run:
    # whether their updates ran beside the products at all (the "adamw beside products" figure), which their
    # ms/step alone cannot tell from an update that waited for SMs a persistent product held.
    if { [ "$c" = fast ] || [ "$c" = fast-unpacked ] || [ "$c" = lean-unpacked ] ||
         [[ "$c" =~ -overlap[0-9]*-unpacked$ ]]; } &&
       has_flag train --profile-step; then
      rm -f "$d/profile-$c.json"
      extra+=(--profile-step "$train_steps" --profile-out "$d/profile-$c.json")
      profiled=$train_steps
    fi
    local step=train-$c log=$d/train-$c.log
    rm -f "$d/train-$c.jsonl" "$d/vram-$c.json"
    # Every run's first step is also its memory report (measured and predicted per phase, vram-$c.json beside
    # the log): the GPU rows docs/memory.md is waiting for, at no extra model load.
    if ! run_monitored "$log" "${TRAIN_TIMEOUT_S:-240}" "$d/train-$c.mem" "$bin" train --weights "$m/model.dat" \
        --config "$m/config.json" --tokenizer "$tok" --train-data "$data" --data-format text "${pack[@]}" \
        --seq-len "$seq" --batch-size "$batch" --steps "$train_steps" --lr 1e-5 --device "$dev" --log-every 5 \
        --metrics-jsonl "$d/train-$c.jsonl" --vram-report "$d/vram-$c.json" "${extra[@]}"; then
      no_time "$name" "$step"
      continue
    fi
    local fig
    fig=$(grep -o -E 'trained [0-9]+ steps.*' "$log" | tail -n 1 | sed -E 's/^trained ([0-9]+) steps \(now at step [0-9]+, ([0-9]+) skipped\)/\1 steps, \2 skipped/' | cut -c1-150)
    fig+="; $(steady_figures "$d/train-$c.jsonl" "$profiled" "$d/vram-$c.json")"
    fig+="; $(cat "$d/train-$c.mem")"
    fig+="; $(vram_figures "$d/vram-$c.json")"
    # The slower paths the run's steps took (docs/trainer.md, "Slow paths"): none is what its figures assume.
    fig+="; slower paths: $(slower_paths "$log" 'slower path: ')"
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
      # Launch overhead (issue 28, point 8): the kernels the step launched and how much of the step they fill
      # (the sum of their durations, against the phases' wall time); a step far from busy is launch-bound.
      local launches
      launches=$(python3 - "$d/profile-$c.json" <<'PY' 2>/dev/null || echo "kernel count unavailable"
import collections, json, re, sys
events = json.load(open(sys.argv[1])).get("traceEvents", [])
kernels = [e for e in events if e.get("cat") == "kernel"]
busy = sum(e.get("dur", 0) for e in kernels) / 1e3
step = sum(e.get("dur", 0) for e in events if e.get("cat") == "phase") / 1e3
# The kernels by what they do (the groups of docs/performance.md's step tables), and the device's idle time:
# the gaps between kernels, the short ones (launch-bound stretches) apart.
def group(name):
    n = name.lower()
    if any(k in n for k in ("flash", "fmha", "sdpa", "cudnn")): return "attention"
    if "adam" in n: return "adamw"
    if "dequantize" in n: return "dequantize"
    if "quantize" in n: return "quantize"
    if any(k in n for k in ("nvjet", "gemm", "cutlass", "xmma", "splitk")): return "products"
    if any(k in n for k in ("rmsnorm", "rope", "swiglu", "sum_chunks", "gradient_kernel", "stats_kernel")): return "fused"
    if "reduce" in n or "grad_clip" in n: return "reductions"
    return "other"
# What "other" is (the second round's ~2,340 adds, casts, memsets and copies, 7.1 ms, were never named): its
# five largest kernels by time, with their launch counts, named without ATen's namespaces so that an elementwise
# kernel's functor (add, copy, fill, ...) and a copy's element type are inside the first 80 characters.
def short(name):
    for noise in ("void ", "at::native::", "(anonymous namespace)::", "c10::", "at::detail::", "(at::TensorIteratorBase&)",
                  "::operator()() const"):
        name = name.replace(noise, "")
    return re.sub(r"\{lambda\(\)#\d+\}::", "", name)[:80]
ms, launched, other = collections.Counter(), collections.Counter(), collections.Counter()
for e in kernels:
    g = group(e.get("name", ""))
    ms[g] += e.get("dur", 0) / 1e3
    launched[g] += 1
    if g == "other": other[short(e.get("name", "?"))] += e.get("dur", 0) / 1e3
other_count = collections.Counter(short(e.get("name", "?")) for e in kernels if group(e.get("name", "")) == "other")
# Products cuBLAS ran on kernels made for Ampere (cutlass_80_*) or for operands aligned to fewer than 8 elements
# (*_align1/2/4): the third round's packed 2048 x 1 step ran the head's loss slices on cutlass_80_..._align2
# kernels (24.6 ms) where 512 x 4 batches took Hopper ones (its 8,196-column slices; loss_slice_width since).
slow = collections.Counter()
for e in kernels:
    n = e.get("name", "")
    if group(n) == "products" and (re.search(r"_align[124]\b", n) or "cutlass_80" in n):
        kernel = re.search(r"(cutlass_\w+|nvjet_\w+|\w*gemm\w*)", n)
        slow[(kernel.group(1) if kernel else n)[:70]] += e.get("dur", 0) / 1e3
# The gaps between kernels (the device idle), each with the phase it falls in and the kernels either side: the
# second round's fast step idled 16.1 ms and nothing said where. `last` is the kernel that ends latest so far.
phases = [e for e in events if e.get("cat") == "phase"]
def phase_of(t):
    for p in phases:
        if p["ts"] <= t < p["ts"] + p.get("dur", 0): return p.get("name", "?")
    return "between phases"
gaps, by_phase, largest, last = [], collections.Counter(), [], None
for e in sorted(kernels, key=lambda e: e["ts"]):
    if last is not None:
        end = last["ts"] + last.get("dur", 0)
        if e["ts"] > end:
            gaps.append(e["ts"] - end)
            by_phase[phase_of(end)] += (e["ts"] - end) / 1e3
            largest.append((e["ts"] - end, short(last.get("name", "?"))[:40], short(e.get("name", "?"))[:40]))
    if last is None or e["ts"] + e.get("dur", 0) > last["ts"] + last.get("dur", 0): last = e
short = [g for g in gaps if g < 5]
largest = sorted(largest, reverse=True)[:3]
# --overlap-update (issue 28): how much of the AdamW kernels' time a product kernel ran beside them (on another
# stream), from the union of the products' intervals; 0% where every update waited for the products.
spans = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in kernels if group(e.get("name", "")) == "products")
merged = []
for a, b in spans:
    if merged and a <= merged[-1][1]: merged[-1][1] = max(merged[-1][1], b)
    else: merged.append([a, b])
def beside_products(a, b):
    return sum(max(0, min(b, y) - max(a, x)) for x, y in merged if x < b and y > a)
adam = [(e["ts"], e["ts"] + e.get("dur", 0)) for e in kernels if group(e.get("name", "")) == "adamw"]
adam_ms, adam_beside = sum(b - a for a, b in adam) / 1e3, sum(beside_products(a, b) for a, b in adam) / 1e3
streams = {e.get("args", {}).get("stream", e.get("tid")) for e in kernels}
# The products' grids (thread blocks a launch, from the trace's "grid" argument), the three that took the most
# time: a persistent Hopper kernel launches one block an SM, so --overlap-update-sms N shows as grids of SMs - N.
grids = collections.Counter()
for e in kernels:
    grid = e.get("args", {}).get("grid")
    if group(e.get("name", "")) == "products" and isinstance(grid, list) and grid:
        blocks = 1
        for g in grid: blocks *= int(g)
        grids[blocks] += e.get("dur", 0) / 1e3
print(f"{len(kernels)} kernels, their durations {busy:.1f} ms of the step's {step:.1f} ms"
      + (f" ({100 * busy / step:.0f}%)" if step > 0 else "") + ": "
      + ", ".join(f"{k} {v:.1f} ({launched[k]})" for k, v in ms.most_common())
      + "; other's largest: " + ", ".join(f"{k} {v:.2f} ms ({other_count[k]})" for k, v in other.most_common(5))
      + f"; products on Ampere-era or unaligned kernels: {sum(slow.values()):.1f} ms"
      + ("" if not slow else " (" + ", ".join(f"{k} {v:.1f} ms" for k, v in slow.most_common(3)) + ")")
      + f"; adamw beside products {adam_beside:.1f} of {adam_ms:.1f} ms"
      + (f" ({100 * adam_beside / adam_ms:.0f}%)" if adam_ms > 0 else "") + f", kernels on {len(streams)} streams"
      + "; products' grids by time: " + (", ".join(f"{b} blocks {v:.1f} ms" for b, v in grids.most_common(3)) or "none")
      + f"; device idle {sum(gaps) / 1e3:.1f} ms ({len(short)} gaps under 5 us: {sum(short) / 1e3:.1f} ms)"
      + "; idle by phase: " + ", ".join(f"{k} {v:.1f}" for k, v in by_phase.most_common())
      + "; largest gaps: " + ", ".join(f"{g / 1e3:.2f} ms {a} -> {b}" for g, a, b in largest))
PY
)
      record "$name" "profile-$c" "$([ -s "$d/profile-$c.json" ] && echo ok || echo failed)" 0 \
        "step $profiled: ${table:-no phase table in the log}; $launches"
    fi
    # The peer right after, once per shape and peer configuration (packed and unpacked share it).
    hf_peer_train "$name" "$m" "$seq" "$batch" "$c"
  done
  compare_variants "$name" "$d" "${configs[@]}"
  stage_end "$name"
}

# Each run of a stage that differs from another of the stage by one modifier (-codes, -recompute, -always, -fit, -overlap)
# against it, and an -overlapN run against the same -overlap run (what leaving N SMs to the updates gains) and the
# run without either:
# the ratio of their steady ms/step (steps after the first 3, the last left out: the fast runs profile it), one
# row for the stage (what --keep-weight-operands and --overlap-update gain, measured in the same call).
compare_variants() {
  local name=$1 d=$2
  shift 2
  local figures
  figures=$(py - "$d" "$@" <<'PY'
import json, os, re, sys
d, configs = sys.argv[1], sys.argv[2:]
def ms(c):
    try:
        rows = [json.loads(l) for l in open(os.path.join(d, "train-%s.jsonl" % c)) if l.startswith("{") and '"step"' in l]
    except OSError:
        return None
    rows = [r for r in rows if r.get("step_ms")][3:-1]
    return sum(r["step_ms"] for r in rows) / len(rows) if rows else None
out = []
def against(c, base):
    if base in configs and ms(c) and ms(base):
        out.append("%s %.1f / %s %.1f ms = %.3f" % (c, ms(c), base, ms(base), ms(c) / ms(base)))
for c in configs:
    carveout = re.search(r"-overlap\d+", c)
    if carveout:  # -overlapN: against the same overlap with every SM to the products, and against no overlap
        against(c, c.replace(carveout.group(0), "-overlap", 1))
        against(c, c.replace(carveout.group(0), "", 1))
    for mod in ("-codes", "-recompute", "-always", "-fit", "-overlap", "-int8"):
        if mod in c and not (mod == "-overlap" and carveout):
            against(c, c.replace(mod, "", 1))
print("; ".join(out))
PY
)
  [ -n "$figures" ] && record "$name" compare-variants ok 0 "$figures"
  return 0
}

# The steps after the first 3 of a metrics JSONL (as hf_peer.py times them), but a profiled one (second argument,
# 0: none): tokens/s, ms/step, the model TFLOP/s and MFU (against --mfu-device's bf16 peak: H100's 989 TFLOP/s
# unless told) and the model FLOPs of a token (tflops / tok_per_s: the count the peer must share).
# The steady steps (after the first 3, the profiled one left out). With the run's first-step report (VRAM_JSON),
# the steady step against the step-time model's prediction for this run (packed rows' attention as the first
# batch has it) and against the compute floor (the step's products alone at the matmul rate: the goal is a step
# within 1.5x of it): "step/predicted/floor ms".
steady_figures() {  # steady_figures METRICS_JSONL PROFILED_STEP [VRAM_JSON]
  py - "$1" "${2:-0}" "${3:-}" <<'PY'
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
tokens = sum(r["tokens"] for r in rows)
mfu = [r["mfu"] for r in rows if r.get("mfu") is not None]
tflops = [r["tflops"] for r in rows if r.get("tflops")]
per_token = rows[0]["tflops"] * 1e12 / rows[0]["tok_per_s"] if rows[0].get("tflops") else None
line = "steps %d-%d: %.0f tokens/s, %.1f ms/step%s%s%s" % (rows[0]["step"], rows[-1]["step"], 1000 * tokens / ms,
       ms / len(rows), ", MFU %.1f%%" % (100 * sum(mfu) / len(mfu)) if mfu else "",
       ", %.3g TFLOP/s" % (sum(t * r["step_ms"] for t, r in zip(tflops, rows)) / ms) if tflops else "",
       ", model FLOPs/token %.6g" % per_token if per_token else "")
try:
    report = json.load(open(sys.argv[3])) if sys.argv[3] else {}
except (OSError, ValueError):
    report = {}
floor = report.get("PredictedFloorMs")
if floor:
    step = ms / len(rows)
    predicted = sum(s.get("PredictedMs") or 0 for s in report.get("Samples", []))
    line += "; step/predicted/floor ms %.1f/%.1f/%.1f on %s: %.2fx the floor (predicted %.2fx)" % (
        step, predicted, floor, report.get("PredictedTimeDevice", "?"), step / floor, predicted / floor)
print(line)
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
# The step-time model's step for this run (the steady ms/step is the figure to hold it against), and what its
# attention was counted over: packed rows' samples alone, as a share of whole rows.
step_ms = [s.get("PredictedMs") for s in r.get("Samples", []) if s.get("PredictedMs") is not None]
if step_ms:
    line += "; predicted step %.1f ms on %s" % (sum(step_ms), r.get("PredictedTimeDevice", "?"))
    whole, counted = r.get("PredictedWholeRowsSquare"), r.get("PredictedAttentionSquare")
    if whole and counted is not None:
        line += " (attention over %.0f%% of whole rows)" % (100.0 * counted / whole)
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
print("transformers %s, %s params, %s master, %s moments, checkpointing %s: steps %d-%d: %s tokens/s, %s ms/step, "
      "%s TFLOP/s, MFU %.1f%% (of 989 TFLOP/s), model FLOPs/token %.6g, peak allocated %s GiB, reserved %s GiB" % (
    j["transformers"], j["params"], j["param_dtype"], j["moments"], j["grad_checkpoint"],
    j["steps"] - j["timed_steps"] + 1, j["steps"], j["tokens_per_s"], j["ms_per_step"], j["tflops_per_s"],
    100 * j["tflops_per_s"] / 989, j["flops_per_token"], j.get("peak_allocated_gib"), j.get("peak_reserved_gib")))
PY
}

# The peer (bench/hf_peer.py train) at the same shape and with the configuration's dtypes (peer_flags): transformers'
# Qwen3ForCausalLM training the same parameters (the head tied to the embedding as the config says, as qwen3-train's
# training does), random full rows. Once per stage and peer configuration; TRAIN_HF=0 leaves it out.
hf_peer_train() {
  local name=$1 m=$2 seq=$3 batch=$4 config=$5 d=$stage_dir flags=() peer log
  if [ "${TRAIN_HF:-1}" = 0 ]; then return; fi
  read -r -a flags <<<"$(peer_flags "$config")"
  peer=hf-peer-$(peer_name "$config")
  grep -q -F "$(printf '%s\t%s\tok\t' "$name" "$peer")" "$status_file" && return  # measured already
  if [ "$dry_run" = 1 ] || [ ! -x "$python" ] || ! "$python" -c 'import transformers' >/dev/null 2>&1; then
    record "$name" "$peer" skipped 0 "needs $python with transformers (the GPU machine's)"
    return
  fi
  log=$d/$peer.log
  local run=(run_monitored "$log" "${TRAIN_TIMEOUT_S:-240}" "$d/$peer.mem" "$python" "$root/bench/hf_peer.py" train
             --config "$m/config.json" --seq-len "$seq" --batch-size "$batch" --steps "$train_steps" --device cuda
             "${flags[@]}")
  "${run[@]}" || { no_time "$name" "$peer"; return; }
  local note=""
  if [ "$step_rc" != 0 ] && grep -q 'needs torchao' "$log"; then  # no torchao here: the moments in bf16 instead
    note="torchao absent, bf16 moments; "
    "${run[@]}" --moments param || { no_time "$name" "$peer"; return; }
  fi
  if [ "$step_rc" = 0 ]; then
    record "$name" "$peer" ok "$step_s" "$note$(hf_peer_figures "$log"); $(cat "$d/$peer.mem")"
  else
    record "$name" "$peer" failed "$step_s" "$note$(fail_note "$log"); $(cat "$d/$peer.mem")"
    show_tail "$log" 8
  fi
}

# ------------------------------------------------------------------------------------------------ summary
write_table() {
  local md=$results/summary.md
  {
    echo "# GPU round: scripts/gpu-check.sh"
    echo
    echo "$(date -u +%FT%TZ); $([ "$dry_run" = 1 ] && echo 'CPU DRY RUN (no GPU): GPU steps are skipped' || echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)"); build folder \`${build_dir#"$root"/}\`; git $(git -C "$root" rev-parse --short HEAD 2>/dev/null)"
    echo
    echo "| stage | step | status | time (s) | key figures / notes |"
    echo "|---|---|---|---:|---|"
    local s
    for s in env build test-gpu test-all sanitize bench smoke train-2048 train-512 hf; do
      awk -F'\t' -v s="$s" '$1 == s && $2 != "(stage)"' "$status_file"
      awk -F'\t' -v s="$s" '$1 == s && $2 == "(stage)"' "$status_file"
    done | awk -F'\t' '{printf "| %s | %s | %s | %s | %s |\n", $1, $2, ($3 == "failed" ? "**failed**" : $3), $4, $5}'
    echo
    echo "Counts: $(awk -F'\t' '$2 != "(stage)"{n[$3]++} END{for (k in n) printf "%s %d  ", k, n[k]}' "$status_file")"
    if [ -s "$state/left-out.txt" ]; then
      echo
      echo "Left out of the details archive (size): $(tr '\n' ' ' <"$state/left-out.txt")"
    fi
  } >"$md.tmp"
  mv "$md.tmp" "$md"
  cp "$status_file" "$results/status.tsv"
  [ -f "$details/bench/bench_kernels.json" ] && cp "$details/bench/bench_kernels.json" "$results/"
  return 0
}

# The details as one archive (the device tool brings back at most 8 files of at most 16 MiB each from $OUT):
# every log, kept under 15 MiB; past that the largest extras (ncu reports, profiler traces, then anything over
# 1 MiB) are left out, largest first, and named in the summary.
archive_limit=$((15 * 1024 * 1024))
pack_details() {
  local out=$results/gpu-check-details.tar.gz excluded=() f size
  : >"$state/left-out.txt"
  while :; do
    tar -czf "$out.tmp" -C "$state" "${excluded[@]/#/--exclude=}" results 2>/dev/null
    size=$(stat -c %s "$out.tmp" 2>/dev/null || echo 0)
    [ "$size" -le "$archive_limit" ] && break
    f=$(cd "$state" && {
          find results -type f \( -name '*.ncu-rep' -o -name 'profile-*.json' \) -printf '%s %p\n' | sort -k1,1nr
          find results -type f -size +1M ! -name '*.ncu-rep' ! -name 'profile-*.json' -printf '%s %p\n' | sort -k1,1nr
        } | awk '{print $2}' | grep -v -x -F -f <(printf '%s\n' "${excluded[@]:-}") | head -n 1)
    [ -n "$f" ] || break
    excluded+=("$f")
    echo "$f ($(du -h "$state/$f" | cut -f1))" >>"$state/left-out.txt"
  done
  mv "$out.tmp" "$out"
  write_table
}

write_summary() {
  pack_details
  echo
  cat "$results/summary.md"
}

# ------------------------------------------------------------------------------------------------ main
echo "gpu-check: results in $results, build in $build_dir$([ "$dry_run" = 1 ] && echo ', CPU dry run'), stages: ${expanded[*]}, budget ${budget}s"
for s in "${expanded[@]}"; do
  case "$s" in
    env) stage_env ;;
    build) stage_build ;;
    test-gpu) stage_test_gpu ;;
    test-all) stage_test_all ;;
    sanitize) stage_sanitize ;;
    bench) stage_bench ;;
    smoke) stage_smoke ;;
    train-2048) stage_train train-2048 2048 1 "${TRAIN_CONFIGS:-}" ;;
    train-512) stage_train train-512 512 4 "${TRAIN_CONFIGS:-}" ;;
    train-2048:*) stage_train train-2048 2048 1 "${s#*:}" ;;
    train-512:*) stage_train train-512 512 4 "${s#*:}" ;;
    hf) stage_hf ;;
    summary) ;;
  esac
done
write_summary
[ "$failures" = 0 ]
