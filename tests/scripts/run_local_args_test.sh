#!/bin/bash
# scripts/run-local.sh refuses bad arguments before it installs, builds or starts anything:
# exit 2 and a message naming the argument.
set -uo pipefail
src=$1
script="$src/scripts/run-local.sh"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
check() {  # check <expected text> <args...>
  local expect=$1 code=0
  shift
  timeout 20 bash "$script" "$@" >"$dir/out.txt" 2>"$dir/err.txt" || code=$?
  if [ "$code" -ne 2 ] || ! grep -q -- "$expect" "$dir/err.txt"; then
    echo "run-local.sh $*: exit $code, expected 2 and '$expect'" >&2
    cat "$dir/err.txt" >&2
    exit 1
  fi
  [ ! -s "$dir/out.txt" ] || { echo "run-local.sh $*: started anyway" >&2; cat "$dir/out.txt" >&2; exit 1; }
}
check "unknown argument '--bogus'" --bogus
check "--phase-s needs a value" --phase-s
check "--seed needs a value" --quick --seed
check "--phase-s '0' is not a whole number" --phase-s 0
check "--phase-s 'abc' is not a whole number" --phase-s abc
check "--seed '-1' is not a number" --seed -1
check "--warmup-s '1.5' is not a whole number" --warmup-s 1.5
check "--warmup-s needs a value" --warmup-s
echo "run-local.sh argument checks: ok"
