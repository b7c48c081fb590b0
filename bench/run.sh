#!/usr/bin/env bash
# Runs every benchmark: bench/run.sh [BUILD_DIR] [extra args for each benchmark]
# Builds BUILD_DIR (default: build, set up with -Dbuildtype=release if missing).
# The gpu_* benchmarks print "no GPU: skipped" where there is no GPU, and
# gpu_matmul exists only in a CUDA build. Every benchmark takes --reps R and
# --no-peer; a failing one is reported and the rest still run.
#
# On a GPU machine with nvcc, meson and ninja but no OpenBLAS and no package
# manager, from the repository root: build with CUDA, run the GPU test suite and
# every benchmark, and keep all the output in gpu-results.txt:
#
#   export PATH="$PATH:/usr/local/cuda/bin"; { (test -d build-gpu || meson setup build-gpu -Dcuda=enabled -Dblas=disabled -Dbuildtype=release) && ninja -C build-gpu && meson test -C build-gpu --suite gpu --print-errorlogs; bench/run.sh build-gpu; } 2>&1 | tee gpu-results.txt
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
for name in overhead mlp_step gpu_bandwidth gpu_matmul allreduce mirrored_step; do
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
  "$build/$t" "$@" || { echo "($t failed: status $?)"; status=1; }
done
for m in ${missing[@]+"${missing[@]}"}; do
  echo
  echo "($m: not in this build; gpu_matmul needs a CUDA build, -Dcuda=enabled)"
done
exit $status
