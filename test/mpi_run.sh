#!/usr/bin/env bash
# Runs test_mpi's scenarios under mpirun and checks that rank 0 reported the
# promise kept ("test_mpi: <scenario> OK"): mpirun's own status says less when
# a rank is killed on purpose. Skips (77), saying why, where mpirun is missing,
# the build has no MPI, or the build runs under ThreadSanitizer (which cannot
# see into OpenMPI's threads). Every mpirun runs under timeout, so a hang fails.
#
#   test/mpi_run.sh TEST_MPI SCENARIO      SCENARIO: train, capture, mismatch, silent, kill, capture-kill,
#                                          replay-kill, slow, resume (test_mpi),
#                                          async-train, async-kill-worker, async-slow, async-kill-server (test_mpi_async)
set -uo pipefail
exe="${1:?usage: mpi_run.sh TEST_MPI SCENARIO}"
scenario="${2:?usage: mpi_run.sh TEST_MPI SCENARIO}"
if [ -n "${NB_MPI_TEST_SKIP:-}" ]; then
  echo "test_mpi $scenario: skipped: $NB_MPI_TEST_SKIP"
  exit 77
fi
if ! command -v mpirun >/dev/null; then
  echo "test_mpi $scenario: mpirun not found (apt-get install openmpi-bin): skipped"
  exit 77
fi
"$exe" --probe >/dev/null 2>&1
[ $? -eq 77 ] && { echo "test_mpi $scenario: built without MPI: skipped"; exit 77; }
args=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && args+=(--allow-run-as-root)
# OpenMPI keeps its start-up allocations to the end: not nabla's leaks.
export ASAN_OPTIONS="${ASAN_OPTIONS:-}${ASAN_OPTIONS:+:}detect_leaks=0"
export NB_NUM_THREADS=1 OMPI_MCA_rmaps_base_oversubscribe=1
run() { # NP EXTRA_ARGS... -- ARGS...: mpirun, output to $log
  local np="$1"; shift
  local extra=()
  while [ "$1" != -- ]; do extra+=("$1"); shift; done
  shift
  local pass=()
  for v in ASAN_OPTIONS UBSAN_OPTIONS NB_NUM_THREADS NB_DEBUG_POISON; do
    [ -n "${!v+x}" ] && pass+=(-x "$v")
  done
  timeout 120 mpirun "${args[@]}" "${extra[@]}" "${pass[@]}" -np "$np" "$exe" "$@" >"$log" 2>&1
  local rc=$?
  cat "$log"
  [ $rc -eq 124 ] && echo "mpi_run.sh: mpirun did not finish within 120 s"
  return $rc
}
log="$(mktemp)"
tmp="$(mktemp -d)"
trap 'rm -rf "$log" "$tmp"' EXIT
expect() { grep -q "test_mpi: $1 OK" "$log" || { echo "mpi_run.sh: no 'test_mpi: $1 OK' from rank 0"; exit 1; }; }
# train, mismatch and resume: every rank must also end well (status 0)
ok() { [ "$1" -eq 0 ] || { echo "mpi_run.sh: mpirun ended with status $1"; exit 1; }; }
case "$scenario" in
  train) run 2 -- train; ok $?; expect train ;;
  capture) run 2 -- capture; ok $?; expect capture ;;
  mismatch)
    run 2 -- mismatch; ok $?
    [ "$(grep -c 'test_mpi: mismatch OK' "$log")" -eq 2 ] || { echo "mpi_run.sh: not every rank failed naming both"; exit 1; } ;;
  silent) run 2 -- silent; expect silent ;;
  # without --enable-recovery mpirun itself would end every rank when one is killed
  kill) run 2 --enable-recovery -- kill; expect kill ;;
  # rank 1 of 3 dies at each point of the call in turn (0: in the step
  # function's recording, or between replays; k: before its k-th message)
  # until it says k is past the call's end; both survivors must fail well
  capture-kill|replay-kill)
    k=0
    while :; do
      run 3 --enable-recovery -- "$scenario" "$k"
      grep -q "test_mpi: $scenario $k past the end" "$log" && break
      [ "$(grep -c "test_mpi: $scenario OK" "$log")" -eq 2 ] || { echo "mpi_run.sh: rank 1 died at $k: not every survivor failed well"; exit 1; }
      k=$((k + 1))
      [ $k -le 64 ] || { echo "mpi_run.sh: the call sends more than 64 messages"; exit 1; }
    done
    [ $k -ge 2 ] || { echo "mpi_run.sh: the call sent fewer messages than a handshake"; exit 1; }
    echo "mpi_run.sh: rank 1 died at each of $k points: every survivor failed well" ;;
  # rank 1 stalls past the deadline inside the all-reduce, then sends on
  # (--enable-recovery: neither rank finalises MPI, so either may end first);
  # both ranks must fail well, rank 0's memory untouched by the late message
  slow)
    for how in eager replay; do
      run 2 --enable-recovery -- slow "$how"
      [ "$(grep -c "test_mpi: slow $how OK" "$log")" -eq 2 ] || { echo "mpi_run.sh: slow $how: not every rank failed well"; exit 1; }
    done ;;
  async-train) run 4 -- async-train; ok $?; expect async-train ;;
  async-kill-worker) run 3 --enable-recovery -- async-kill-worker; expect async-kill-worker ;;
  async-slow)
    run 3 -- async-slow; ok $?
    [ "$(grep -c 'test_mpi: async-slow OK' "$log")" -eq 3 ] || { echo "mpi_run.sh: not every rank waited for the slow worker"; exit 1; } ;;
  async-kill-server)
    run 3 --enable-recovery -- async-kill-server
    [ "$(grep -c 'test_mpi: async-kill-server OK' "$log")" -eq 2 ] || { echo "mpi_run.sh: not every worker failed naming the server"; exit 1; } ;;
  resume)
    run 2 -- resume-write "$tmp"; ok $?; expect resume-write
    for np in 1 3; do run "$np" -- resume-read "$tmp"; ok $?; expect resume; done ;;
  *) echo "mpi_run.sh: unknown scenario $scenario"; exit 2 ;;
esac
exit 0
