#!/usr/bin/env bash
# fashion_cnn --graph against the eager run: the same quick training, the step
# captured once and replayed, in f32 and, for a few steps, in f16 with its
# loss scaler (whose check, skip and scale stay on the device in a replay).
# On the CPU a replay runs the recorded kernels of an eager step, so both
# print the same test accuracy (and, in f16, the same final loss scale and
# skipped steps) to the last digit; on a GPU (a CUDA graph, and cuDNN kernels
# that may add in another order) the accuracy within 3 points. Without the
# data: 77 (a skip).
#   sample_graph.sh FASHION_CNN_EXE
set -u
exe="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# run NAME ARGS...: fashion_cnn ARGS into $tmp/NAME; a skip or a failure ends the test
run() {
  local name="$1"
  shift
  "$exe" "$@" >"$tmp/$name" 2>&1
  local rc=$?
  if [ $rc -eq 77 ]; then cat "$tmp/$name"; exit 77; fi
  if [ $rc -ne 0 ]; then echo "fashion_cnn $*: exit $rc"; cat "$tmp/$name"; exit 1; fi
}

# same EAGER GRAPH: the graph's run was replayed and agrees with the eager one
same() {
  local a b
  a="$(sed -n 's/^test accuracy: \([0-9.]*\)%$/\1/p' "$tmp/$1")"
  b="$(sed -n 's/^test accuracy: \([0-9.]*\)%$/\1/p' "$tmp/$2")"
  if [ -z "$a" ] || [ -z "$b" ]; then echo "$2: no test accuracy line"; exit 1; fi
  grep -q "replayed [1-9][0-9]* times" "$tmp/$2" || { echo "$2: the step was not replayed"; exit 1; }
  if grep -q " on /cpu" "$tmp/$2"; then
    [ "$a" = "$b" ] || { echo "$2 on the CPU: eager $a%, graph $b% (wanted the same)"; exit 1; }
    local sa sb
    sa="$(grep '^loss scale' "$tmp/$1")"
    sb="$(grep '^loss scale' "$tmp/$2")"
    [ "$sa" = "$sb" ] || { echo "$2 on the CPU: eager '$sa', graph '$sb'"; exit 1; }
  else
    awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 3) }' ||
      { echo "$2: eager $a%, graph $b%: more than 3 points apart"; exit 1; }
  fi
  echo "$2: eager $a%, graph $b%"
}

run eager --quick
run graph --quick --graph
cat "$tmp/graph"
same eager graph

if [ -n "${NB_SAMPLE_GRAPH_SKIP_F16:-}" ]; then
  echo "f16 with its loss scaler: not run ($NB_SAMPLE_GRAPH_SKIP_F16)"
  exit 0
fi
run eager16 --quick --steps 12 --compute f16
run graph16 --quick --steps 12 --compute f16 --graph
cat "$tmp/graph16"
grep -q "^loss scale" "$tmp/graph16" || { echo "graph16: no loss scale line"; exit 1; }
same eager16 graph16
