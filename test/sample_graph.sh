#!/usr/bin/env bash
# fashion_cnn --graph against the eager run: the same quick training, the step
# captured once and replayed. On the CPU a replay runs the step again, so both
# print the same test accuracy to the last digit; on a GPU (a CUDA graph, and
# cuDNN kernels that may add in another order) within 3 points. Also checks
# that --graph refuses --compute f16 (exit 2, saying why). Without the data:
# 77 (a skip).
#   sample_graph.sh FASHION_CNN_EXE
set -u
exe="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$exe" --graph --compute f16 >/dev/null 2>"$tmp/err"
rc=$?
if [ $rc -ne 2 ]; then echo "fashion_cnn --graph --compute f16: exit $rc, wanted 2"; exit 1; fi
grep -q "loss scaler" "$tmp/err" || { echo "the refusal does not say why:"; cat "$tmp/err"; exit 1; }

"$exe" --quick >"$tmp/eager" 2>&1
rc=$?
if [ $rc -eq 77 ]; then cat "$tmp/eager"; exit 77; fi
if [ $rc -ne 0 ]; then echo "fashion_cnn --quick: exit $rc"; cat "$tmp/eager"; exit 1; fi
"$exe" --quick --graph >"$tmp/graph" 2>&1
rc=$?
if [ $rc -ne 0 ]; then echo "fashion_cnn --quick --graph: exit $rc"; cat "$tmp/graph"; exit 1; fi
cat "$tmp/graph"

a="$(sed -n 's/^test accuracy: \([0-9.]*\)%$/\1/p' "$tmp/eager")"
b="$(sed -n 's/^test accuracy: \([0-9.]*\)%$/\1/p' "$tmp/graph")"
if [ -z "$a" ] || [ -z "$b" ]; then echo "no test accuracy line"; exit 1; fi
grep -q "replayed [1-9][0-9]* times" "$tmp/graph" || { echo "the step was not replayed"; exit 1; }
if grep -q " on /cpu" "$tmp/graph"; then
  [ "$a" = "$b" ] || { echo "on the CPU: eager $a%, graph $b% (wanted the same)"; exit 1; }
else
  awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 3) }' ||
    { echo "eager $a%, graph $b%: more than 3 points apart"; exit 1; }
fi
echo "eager $a%, graph $b%"
