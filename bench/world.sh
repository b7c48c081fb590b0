#!/usr/bin/env bash
# The mirrored strategy across processes beside PyTorch DDP (gloo) on the same
# MLP step and global batch, and nabla's all-reduce across processes beside
# MPI_Allreduce on the same buffers, at 1, 2 and 4 processes of one CPU
# replica (and one thread) each:
#
#   bench/world.sh [BUILD_DIR] [--reps R] [--batch B]
#
# Needs mpirun and a build with MPI (bench_world_step); the PyTorch column is
# left out where python3 cannot import torch. More processes than cores are
# oversubscribed (and slower for both).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../build}"
shift || true
reps=100 batch=256
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    *) echo "usage: bench/world.sh [BUILD_DIR] [--reps R] [--batch B]" >&2; exit 2 ;;
  esac
done
exe="$build/bench/bench_world_step"
[ -x "$exe" ] || { echo "bench/world.sh: $exe is missing (a build with MPI makes it)"; exit 1; }
command -v mpirun >/dev/null || { echo "bench/world.sh: mpirun not found: skipped"; exit 0; }
args=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && args+=(--allow-run-as-root)
cores="$(nproc --all)"
export NB_NUM_THREADS=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
declare -A ddp
have_ddp=0
if peer="$(python3 "$here/mirrored_step_ddp.py" "$reps" "$batch" 1,2,4 2>/dev/null)" && ! grep -q "not installed" <<<"$peer"; then
  while read -r k v; do ddp[$k]="$v"; done <<<"$peer"
  have_ddp=1
fi
echo
echo "Data-parallel MLP step (784-256-10, global batch $batch) and all-reduce (25 MiB f32) across processes, $cores cores"
printf '%-10s %12s %12s %7s %14s %14s %14s %7s\n' processes "nabla img/s" "DDP img/s" ratio "AR in step ms" \
  "sum across ms" "MPI_Allreduce" "share"
for np in 1 2 4; do
  line="$(timeout 300 mpirun "${args[@]}" -x NB_NUM_THREADS -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS -np $np \
            "$exe" --reps "$reps" --batch "$batch" 2>/dev/null | grep '^world ')"
  [ -z "$line" ] && { echo "$np: failed"; continue; }
  read -r _ p _ ips _ _ _ ar _ mpi _ across_us <<<"$line"
  d=""
  [ $have_ddp -eq 1 ] && d="${ddp[ddp$np]:-}"
  ratio="-"; [ -n "$d" ] && ratio="$(awk -v a="$ips" -v b="$d" 'BEGIN{printf "%.2fx", a/b}')"
  across="-" share="-"
  if [ "$p" -gt 1 ] && [ -n "${across_us:-}" ] && [ "$across_us" != 0 ]; then
    across="$(awk -v a="$across_us" 'BEGIN{printf "%.2f", a/1000}')"
    share="$(awk -v a="$across_us" -v m="$mpi" 'BEGIN{printf "%.0f%%", 100*m/a}')"
  fi
  printf '%-10s %12.0f %12s %7s %14.2f %14s %14.2f %7s\n' "$p" "$ips" "${d:+$(printf '%.0f' "$d")}" "$ratio" \
    "$(awk -v x="$ar" 'BEGIN{print x/1000}')" "$across" "$(awk -v x="$mpi" 'BEGIN{print x/1000}')" "$share"
done
[ $have_ddp -eq 0 ] && echo "(PyTorch not installed: no DDP column)"
echo "AR in step: the strategy's step of one 25 MiB variable less the plain step (packing the gradient, the"
echo "sums, the copies); sum across: the sum across processes alone, handshake included, by the strategy's"
echo "clock (nb_mirrored_stats.world_seconds); share: MPI_Allreduce's time on a 25 MiB buffer over it (100% ="
echo "as fast as MPI's own blocking call)"
