#!/usr/bin/env bash
# Runs every benchmark: bench/run.sh [BUILD_DIR] [extra args for each benchmark]
# Builds BUILD_DIR (default: build, set up with -Dbuildtype=release if missing).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
build="${1:-$root/build}"
shift || true
if [ ! -d "$build" ]; then
  meson setup "$build" "$root" -Dbuildtype=release
fi
ninja -C "$build" bench/bench_overhead bench/bench_mlp_step >/dev/null
export NB_BENCH_DIR="$here"
echo "nabla benchmarks ($(uname -m), $(nproc) cores, build: $build)"
"$build/bench/bench_overhead" "$@"
"$build/bench/bench_mlp_step" "$@"
