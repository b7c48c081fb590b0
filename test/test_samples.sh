#!/usr/bin/env bash
# Checks the samples' command-line edges: usage errors, --help, and fashion_mnist's message
# when the data set is missing (exit 1; 77, a skip, in --quick mode).
# With a third executable, model_parallel's: its skip without data and its refusal of a
# schedule it does not know.
#   test_samples.sh FASHION_MNIST_EXE LINEAR_REGRESSION_EXE [MODEL_PARALLEL_EXE]
set -u
fm="$1" lr="$2" mp="${3:-}"
fail=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$fm" --data "$tmp/nowhere" >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -ne 1 ]; then echo "fashion_mnist without data: exit $rc, wanted 1"; fail=1; fi
grep -q "$tmp/nowhere/train-images-idx3-ubyte.gz" "$tmp/err" || { echo "message lacks the file name:"; cat "$tmp/err"; fail=1; }
grep -q "apt-get install dataset-fashion-mnist" "$tmp/err" || { echo "message lacks the apt-get hint:"; cat "$tmp/err"; fail=1; }

"$fm" --quick --data "$tmp/nowhere" >/dev/null 2>&1
rc=$?
if [ $rc -ne 77 ]; then echo "fashion_mnist --quick without data: exit $rc, wanted 77"; fail=1; fi

"$lr" --no-such-flag >/dev/null 2>"$tmp/err"
rc=$?
if [ $rc -ne 2 ]; then echo "linear_regression --no-such-flag: exit $rc, wanted 2"; fail=1; fi
grep -q "usage" "$tmp/err" || { echo "no usage line"; fail=1; }

"$lr" --help >"$tmp/out" 2>/dev/null
rc=$?
if [ $rc -ne 0 ]; then echo "linear_regression --help: exit $rc, wanted 0"; fail=1; fi
grep -q "usage" "$tmp/out" || { echo "--help printed no usage line"; fail=1; }

if [ -n "$mp" ]; then
  "$mp" --quick --data "$tmp/nowhere" >/dev/null 2>&1
  rc=$?
  if [ $rc -ne 77 ]; then echo "model_parallel --quick without data: exit $rc, wanted 77"; fail=1; fi
  "$mp" --schedule zigzag >/dev/null 2>"$tmp/err"
  rc=$?
  if [ $rc -ne 2 ]; then echo "model_parallel --schedule zigzag: exit $rc, wanted 2"; fail=1; fi
  grep -q "gpipe or 1f1b" "$tmp/err" || { echo "model_parallel names no schedules:"; cat "$tmp/err"; fail=1; }
fi

[ $fail -eq 0 ] && echo "samples' command lines: ok"
exit $fail
