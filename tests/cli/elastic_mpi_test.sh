#!/usr/bin/env bash
# Elastic restarts under MPI are a relaunch: a job of 4 processes x --grad-accum 3 loses a
# rank at step 7 and ends; relaunched on 3 processes with --resume latest and no --grad-accum
# (the batch kept, A' = 12 / 3 = 4), it finishes with the uninterrupted job's weights and,
# from step 7 on, its losses.
set -euo pipefail
zerodp=$1
mpirun=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Environment, not flags, so MPICH's mpiexec (which ignores them) runs this too.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
common=(train --backend mpi --size tiny --data synthetic --steps 10 --micro-batch 4 --invariant on
        --no-progress --collective-timeout 60)
fail=0

"$mpirun" -np 4 "$zerodp" "${common[@]}" --grad-accum 3 --report "$tmp/whole.json" >/dev/null

if "$mpirun" -np 4 "$zerodp" "${common[@]}" --grad-accum 3 --checkpoint-dir "$tmp/ck" \
  --checkpoint-every 2 --inject throw@7:2 >/dev/null 2>"$tmp/err"; then
  echo "FAIL: the job with --inject throw@7:2 succeeded"
  fail=1
elif ! grep -q "step 7: injected failure" "$tmp/err"; then
  echo "FAIL: the failed job did not name the injected failure at step 7:"
  cat "$tmp/err"
  fail=1
else
  echo "ok: mpirun -np 4 failed at step 7: $(grep -m1 "injected failure" "$tmp/err")"
fi

"$mpirun" -np 3 "$zerodp" "${common[@]}" --checkpoint-dir "$tmp/ck" --resume latest \
  --report "$tmp/relaunched.json" >/dev/null
if /usr/bin/env python3 - "$tmp/whole.json" "$tmp/relaunched.json" <<'PY'
import json, sys
whole, again = (json.load(open(p)) for p in sys.argv[1:3])
assert again["world_size"] == 3 and again["config"]["grad_accum"] == 4, (
    again["world_size"], again["config"]["grad_accum"])
assert again["resumed_from"].endswith("step_00000006"), again["resumed_from"]
assert [s["step"] for s in again["steps"]] == [7, 8, 9, 10], again["steps"]
assert [s["loss"] for s in again["history"]] == [s["loss"] for s in whole["steps"][:6]], "history"
assert [s["loss"] for s in again["steps"]] == [s["loss"] for s in whole["steps"][6:]], "losses"
assert again["final"]["weights_sha256"] == whole["final"]["weights_sha256"], "weights differ"
assert again["restarts"] == [], again["restarts"]
PY
then
  echo "ok: mpirun -np 3 --resume latest: 3 ranks x 4, the uninterrupted job's weights and losses"
else
  echo "FAIL: the relaunch on 3 ranks is not the uninterrupted job"
  fail=1
fi
exit $fail
