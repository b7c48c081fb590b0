#!/usr/bin/env bash
# Runs every benchmark: bench/run.sh [BUILD_DIR] [extra args for each benchmark]
# Builds BUILD_DIR (default: build, set up with -Dbuildtype=release if missing).
# The gpu_* benchmarks say why and skip where there is no GPU (they fail with
# NB_REQUIRE_GPU=1), and
# gpu_matmul and gpu_reduce exist only in a CUDA build. Every benchmark takes --reps R and
# --no-peer; a failing one is reported and the rest still run.
#
# On a GPU machine, bench/gpu-check.sh runs this as its last step (after the
# build and the test suites), with NB_REQUIRE_GPU=1.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
build="${1:-$root/build}"
shift || true
if [ ! -d "$build" ]; then
  meson setup "$build" "$root" -Dbuildtype=release
fi
ninja -C "$build" build.ninja >/dev/null # regenerate first if a meson.build changed
targets=()
missing=()
for name in overhead mlp_step conv_step conv_layer gpu_bandwidth gpu_matmul gpu_reduce allreduce mirrored_step async_step pipeline_step data_io norm loss fusion cpu_math cpu_reduce; do
  if ninja -C "$build" -t query "bench/bench_$name" >/dev/null 2>&1; then
    targets+=("bench/bench_$name")
  else
    missing+=("bench_$name")
  fi
done
if ! log="$(ninja -C "$build" "${targets[@]}" 2>&1)"; then
  echo "$log"
  exit 1
fi
export NB_BENCH_DIR="$here"
echo "nabla benchmarks ($(uname -m), $(nproc) cores, build: $build)"
status=0
for t in "${targets[@]}"; do
  own=() # the overhead benchmark also shows where an add's time goes
  [ "$t" = bench/bench_overhead ] && own=(--phases)
  "$build/$t" ${own[@]+"${own[@]}"} "$@" || { echo "($t failed: status $?)"; status=1; }
done
for m in ${missing[@]+"${missing[@]}"}; do
  echo
  echo "($m: not in this build; gpu_matmul and gpu_reduce need a CUDA build, -Dcuda=enabled)"
done
exit $status
