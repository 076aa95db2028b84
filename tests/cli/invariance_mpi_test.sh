#!/usr/bin/env bash
# World-size invariance under mpirun: 12 micro-batches per step on np = 1, 2, 3 and 4
# processes (4 x 3, ..., 1 x 12 micro-batches per rank), every stage and precision, give
# the local backend's 12-rank bits: the same weights, losses, gradient norms and validation
# loss (docs/determinism.md).
set -euo pipefail
zerodp=$1
mpirun=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Environment, not flags, so MPICH's mpiexec (which ignores them) runs this too.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
common=(train --size tiny --data synthetic --steps 2 --micro-batch 2 --clip 0.05
        --eval-batches 5 --invariant on --no-progress --collective-timeout 60)
fail=0
for precision in bf16 fp16 fp32; do
  "$zerodp" "${common[@]}" --ranks 12 --precision "$precision" --report "$tmp/local.json" \
    >/dev/null
  for stage in 0 1 2 3; do
    for np in 1 2 3 4; do
      "$mpirun" -np "$np" "$zerodp" "${common[@]}" --backend mpi --stage "$stage" \
        --precision "$precision" --grad-accum $((12 / np)) --report "$tmp/mpi.json" >/dev/null
      if /usr/bin/env python3 - "$tmp/local.json" "$tmp/mpi.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert b["backend"] == "mpi" and b["config"]["invariant"] == "on", b["config"]
for key in ("weights_sha256", "val_loss"):
    assert a["final"][key] == b["final"][key], (key, a["final"][key], b["final"][key])
for key in ("loss", "grad_norm", "grad_norm_clipped"):
    assert [s[key] for s in a["steps"]] == [s[key] for s in b["steps"]], key
# Clipping acts on every step, so the norm's bits reach the weights.
assert all(s["grad_norm_clipped"] < s["grad_norm"] for s in b["steps"])
PY
      then
        echo "ok: $precision stage $stage np $np: the local 12-rank run's bits"
      else
        echo "FAIL: $precision stage $stage np $np differs from the local 12-rank run"
        fail=1
      fi
    done
  done
done
exit $fail
