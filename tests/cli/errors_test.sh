#!/usr/bin/env bash
# Bad input is refused with exit code 2 and one line that names the value.
set -uo pipefail
zerodp=$1
fail=0
expect() {  # expect NEEDLE ARGS...: exit 2, one line on stderr containing NEEDLE
  local needle=$1
  shift
  local err code
  err=$(timeout 20 "$zerodp" "$@" 2>&1 >/dev/null)
  code=$?
  if [[ $code -ne 2 || "$err" != *"$needle"* || $(printf '%s\n' "$err" | wc -l) -ne 1 ]]; then
    echo "FAIL: zerodp $*: exit $code, stderr: $err (wanted exit 2 and '$needle')"
    fail=1
  else
    echo "ok: zerodp $* -> $err"
  fi
}
expect "--stage 7" train --stage 7 --data synthetic
expect "--ranks 0" train --ranks 0 --data synthetic
expect "--precision 'fp8'" train --precision fp8
expect "--size 'huge'" train --size huge
expect "--backend 'tcp'" train --backend tcp
expect "--accumulate 'sometimes'" train --accumulate sometimes
expect "--memory-per-rank" train --memory-per-rank 12XB
expect "--collective-timeout" train --collective-timeout soon
expect "--schedule 'linear'" train --schedule linear --data synthetic
expect "--micro-batch: Value 0" train --micro-batch 0 --data synthetic
expect "--model 'cnn'" train --model cnn
expect "no-such-file" train --data ./no-such-file
expect "--steps = abc" train --steps abc
expect "--config" train --config /nonexistent.json
expect "--max-bytes" bench-comm --max-bytes lots
expect "--backend 'tcp'" bench-comm --backend tcp
exit $fail
