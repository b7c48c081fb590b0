#!/usr/bin/env bash
# compute-sanitizer over the GPU tests of a CUDA build, on a machine with a GPU:
#
#   bench/gpu-sanitize.sh BUILD OUTDIR        (BUILD: build-gpu, or build-gpu-pack from a .gpu-pack)
#
# memcheck (out-of-bounds and misaligned accesses, on the device and in the
# library calls' kernels) over the GPU suite's programs, then initcheck (reads
# of device memory nothing wrote) over the pooling, normalisation, convolution
# and index tests. The tests run as meson runs them (NB_DEBUG_POISON=1,
# NB_NUM_THREADS=2, NB_REQUIRE_GPU=1), one at a time. API errors are not
# reported: test_gpu's out-of-memory case fails cudaMalloc on purpose, and any
# other failing CUDA call fails its test anyway. Writes OUTDIR/sanitize.txt
# (a line a run: its result and how many errors the tool counted) and
# OUTDIR/sanitize/*.log; exits non-zero when any run reported an error or
# failed, or could not run in the time given: each run is cut at RUN_SECONDS
# (default 150), and none starts past SANITIZE_SECONDS (default 500) in all.
set -uo pipefail
build="$(cd "${1:?usage: bench/gpu-sanitize.sh BUILD OUTDIR}" && pwd)"
out="${2:?usage: bench/gpu-sanitize.sh BUILD OUTDIR}"
mkdir -p "$out/sanitize"
out="$(cd "$out" && pwd)"
limit="${RUN_SECONDS:-150}"
budget="${SANITIZE_SECONDS:-500}"
began=$(date +%s)
cs="$(command -v compute-sanitizer || true)"
[ -z "$cs" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && cs=/usr/local/cuda/bin/compute-sanitizer
if [ -z "$cs" ]; then
  echo "gpu-sanitize: compute-sanitizer not found" | tee "$out/sanitize.txt"
  exit 1
fi
# The CUDA libraries: the toolkit's, else those Python wheels bring.
libdirs=$(find /usr/local/cuda/lib64 /usr/local/cuda*/targets /usr/lib/x86_64-linux-gnu /opt /usr/local/lib -maxdepth 9 \
            \( -name 'libcudart.so.*' -o -name 'libcublas.so.*' -o -name 'libcudnn.so.*' -o -name 'libnccl.so.*' \) \
            2>/dev/null | xargs -r -n1 dirname | sort -u | paste -sd:)
export LD_LIBRARY_PATH="${libdirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NB_REQUIRE_GPU=1 NB_DEBUG_POISON=1 NB_NUM_THREADS=2 NB_SEARCH_CONFIGS=400
t="$build/test"
# tool | name | environment | command. initcheck runs without the poison fill,
# which would make every output look written.
runs=(
  "memcheck|test_gpu||$t/test_gpu"
  "memcheck|test_gpu_async||$t/test_gpu_async"
  "memcheck|test_backend_ops_gpu||$t/test_backend_ops --gpu"
  "memcheck|test_nn_gpu||$t/test_nn --gpu"
  "memcheck|test_nn_gpu_own_pooling|NB_POOL_PLAIN=1|$t/test_nn --gpu"
  "memcheck|test_conv||$t/test_conv"
  "memcheck|test_conv_search_gpu||$t/test_conv_search --gpu"
  "memcheck|test_distribute_gpu||$t/test_distribute_gpu"
  "initcheck|test_nn_gpu|NB_DEBUG_POISON=0|$t/test_nn --gpu"
  "initcheck|test_conv_search_gpu|NB_DEBUG_POISON=0|$t/test_conv_search --gpu"
  "initcheck|test_gpu_async|NB_DEBUG_POISON=0|$t/test_gpu_async"
)
status=0
: > "$out/sanitize.txt"
for r in "${runs[@]}"; do
  IFS='|' read -r tool name envs cmd <<<"$r"
  log="$out/sanitize/${tool}_$name.log"
  start=$(date +%s)
  left=$(( budget - (start - began) ))
  if [ $left -lt 20 ]; then
    printf '%-9s %-9s %-26s (no time left)\n' NOTRUN "$tool" "$name" | tee -a "$out/sanitize.txt"
    status=1
    continue
  fi
  [ $left -lt "$limit" ] && run_limit=$left || run_limit=$limit
  # shellcheck disable=SC2086
  (cd "$build" && for e in $envs; do export "${e?}"; done &&
   timeout "$run_limit" "$cs" --tool "$tool" --report-api-errors no --print-limit 50 --error-exitcode 99 $cmd) \
    >"$log" 2>&1
  rc=$?
  errors=$(sed -n 's/^========= ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$log" | tail -n 1)
  case $rc in
    0) res=ok ;;
    77) res=SKIP ;;
    99) res=REPORTED status=1 ;;
    124) res=TIMEOUT status=1 ;;
    *) res=FAIL status=1 ;;
  esac
  printf '%-9s %-9s %-26s rc=%-3s errors=%-4s %4ds\n' "$res" "$tool" "$name" "$rc" "${errors:-?}" \
    $(( $(date +%s) - start )) | tee -a "$out/sanitize.txt"
  if [ "$res" = REPORTED ]; then
    grep -m 20 -E '^========= (Invalid|Uninitialized|Program hit|    at|Address)' "$log" | sed 's/^/    /' |
      tee -a "$out/sanitize.txt"
  fi
done
exit $status
