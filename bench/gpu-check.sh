#!/usr/bin/env bash
# The GPU check, in steps that each end well inside ten minutes on a 16-core GPU
# machine and write their log to OUTDIR:
#
#   bench/gpu-check.sh OUTDIR [info] [build] [test] [sanitize] [bench]    (no step: all five)
#
#   info   nvidia-smi, nvcc and the CUDA library folders        -> OUTDIR/info.log
#   build  meson setup + ninja in $BUILD (default build-gpu): CUDA on, the
#          built-in matmul (GPU machines may lack OpenBLAS), release  -> OUTDIR/build.log
#   test   every test suite with NB_REQUIRE_GPU=1, so a GPU test fails naming
#          the CUDA error instead of skipping when no GPU is usable
#                                                  -> OUTDIR/test.log, OUTDIR/testlog.json
#   sanitize  compute-sanitizer's memcheck over the GPU suite's programs and
#          initcheck over the pooling, normalisation and index tests
#          (bench/gpu-sanitize.sh): any report fails it   -> OUTDIR/sanitize.log, OUTDIR/sanitize.txt
#   bench  every benchmark (bench/run.sh), NB_REQUIRE_GPU=1 too -> OUTDIR/bench.log
#
# Run from anywhere; nvcc is looked for in /usr/local/cuda/bin when it is not on
# PATH. The binaries find the CUDA libraries through their rpath, so no
# LD_LIBRARY_PATH is needed (that is part of what the check checks). Each step
# is cut at $STEP_SECONDS (default 540) so its log still comes back. Exits
# non-zero when a step fails.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
out="${1:?usage: bench/gpu-check.sh OUTDIR [info] [build] [test] [sanitize] [bench]}"
shift
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(info build test sanitize bench)
mkdir -p "$out"
out="$(cd "$out" && pwd)"
build="${BUILD:-$root/build-gpu}"
limit="${STEP_SECONDS:-540}"
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
export NB_REQUIRE_GPU=1

info() {
  nvidia-smi || echo "nvidia-smi failed (status $?)"
  echo
  command -v nvcc && nvcc --version
  echo
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  ls -d /usr/local/cuda*/lib* 2>/dev/null
  echo "cores: $(nproc)"
}

build() {
  if [ ! -d "$build/meson-private" ]; then
    meson setup "$build" "$root" -Dcuda=enabled -Dblas=disabled -Dbuildtype=release || return 1
  fi
  ninja -C "$build"
}

test_() {
  local st=0
  meson test -C "$build" --print-errorlogs --num-processes "$(nproc)" || st=$?
  cp "$build/meson-logs/testlog.json" "$out/testlog.json" 2>/dev/null
  return $st
}

sanitize() {
  "$here/gpu-sanitize.sh" "$build" "$out"
}

bench() {
  local st=0
  "$here/run.sh" "$build" || st=$?
  return $st
}

status=0
for step in "${steps[@]}"; do
  case "$step" in
    info|build|sanitize|bench) fn="$step" ;;
    test) fn=test_ ;;
    *) echo "unknown step '$step' (info, build, test, sanitize, bench)" >&2; exit 2 ;;
  esac
  echo "=== $step ($(date -u +%H:%M:%S)), log in $out/$step.log"
  export -f "$fn" info build test_ sanitize bench 2>/dev/null
  export build out here root
  timeout "$limit" bash -c "$fn" >"$out/$step.log" 2>&1
  st=$?
  tail -n 15 "$out/$step.log"
  if [ $st -ne 0 ]; then
    echo "=== $step FAILED (status $st$([ $st -eq 124 ] && echo ", cut at ${limit}s"))"
    status=1
    [ "$step" = build ] && break # nothing to test without a build
  else
    echo "=== $step ok"
  fi
done
exit $status
