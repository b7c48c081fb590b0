#!/usr/bin/env bash
# mirrored_mnist --quick under mpirun: two processes of two replicas each must
# train as one process of four (the same loss and accuracy to the digits
# printed), and rank 0 alone prints. Skips (77), saying why, without mpirun,
# without the data set, under ThreadSanitizer, or when the sample was built
# without MPI.
#   test/sample_mpi.sh MIRRORED_MNIST
set -uo pipefail
exe="${1:?usage: sample_mpi.sh MIRRORED_MNIST}"
[ -n "${NB_MPI_TEST_SKIP:-}" ] && { echo "skipped: $NB_MPI_TEST_SKIP"; exit 77; }
command -v mpirun >/dev/null || { echo "mpirun not found (apt-get install openmpi-bin): skipped"; exit 77; }
args=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && args+=(--allow-run-as-root)
export ASAN_OPTIONS="${ASAN_OPTIONS:-}${ASAN_OPTIONS:+:}detect_leaks=0" NB_NUM_THREADS=1
pass=()
for v in ASAN_OPTIONS UBSAN_OPTIONS NB_NUM_THREADS NB_DEBUG_POISON; do [ -n "${!v+x}" ] && pass+=(-x "$v"); done
one="$(mktemp)" two="$(mktemp)"
trap 'rm -f "$one" "$two"' EXIT
"$exe" --quick --replicas 4 >"$one" 2>&1
rc=$?
[ $rc -eq 77 ] && { cat "$one"; exit 77; }
[ $rc -eq 0 ] || { cat "$one"; echo "sample_mpi.sh: one process failed ($rc)"; exit 1; }
timeout 300 mpirun "${args[@]}" "${pass[@]}" -np 2 "$exe" --quick --replicas 2 >"$two" 2>&1
rc=$?
cat "$two"
[ $rc -eq 0 ] || { echo "sample_mpi.sh: mpirun -np 2 failed ($rc)"; exit 1; }
# Built without MPI, each process trains alone (and says nothing of processes).
grep -q 'in each of 2 processes' "$two" || { echo "sample_mpi.sh: the sample was built without MPI: skipped"; exit 77; }
a="$(grep -o 'loss [0-9.]*, test accuracy [0-9.]*%' "$one")"
b="$(grep -o 'loss [0-9.]*, test accuracy [0-9.]*%' "$two")"
[ -n "$a" ] && [ "$a" = "$b" ] || { echo "sample_mpi.sh: one process: '$a'; two processes: '$b'"; exit 1; }
[ "$(grep -c '^Fashion-MNIST:' "$two")" -eq 1 ] || { echo "sample_mpi.sh: more than rank 0 printed"; exit 1; }
echo "sample_mpi.sh: 2 processes x 2 replicas train as 1 x 4: $b"
