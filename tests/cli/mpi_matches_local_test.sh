#!/usr/bin/env bash
# The same run under mpirun and on the local backend gives the same report: the same
# weights hash, losses and per-rank sample hashes, for several stages and rank counts.
set -euo pipefail
zerodp=$1
mpirun=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Environment, not flags, so MPICH's mpiexec (which ignores them) runs this too.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
common=(train --size tiny --data synthetic --steps 3 --micro-batch 4 --no-progress
        --collective-timeout 60)
fail=0
# Cases: ranks, stage, precision, ranks per MPI process, extra flags. The later cases put
# ranks on nodes: the cross-node bytes match too, and the two-level collectives and hpZ give
# the same bits on both backends. With more than one rank per process the MPI run starts
# ranks / that many processes, each running its ranks as threads: the same training still.
# Offloaded parameter shards are read by each process's file workers. DiLoCo's islands split
# the world into groups on both backends (islands of two nodes each, two-level and hpZ
# inside; two islands in a node, hpZ's copy over each; three islands in turn on every rank).
# The llama family at three stages and precisions, on nodes too.
# Flags are split at
# commas; a + stands for a comma inside a flag's value.
for case in "2 0 bf16 1 -" "2 3 bf16 1 -" "3 1 fp16 1 -" "3 2 fp32 1 -" \
  "3 3 bf16 1 --node-ranks=1" "4 0 fp16 1 --node-ranks=2,--collectives=two-level" \
  "4 3 bf16 1 --node-ranks=2,--collectives=two-level,--hpz" "3 3 bf16 1 --qwz,--qwz-block=64" \
  "4 2 fp16 1 --node-ranks=2,--qgz=int4,--qgz-block=64" "4 2 bf16 2 -" "4 0 fp32 4 -" \
  "6 3 bf16 3 --node-ranks=3,--collectives=two-level,--hpz,--qwz,--qgz=int4" \
  "4 1 bf16 1 --node-ranks=2,--shard-within-node,--accumulate=local,--grad-accum=2" \
  "6 3 fp16 3 --node-ranks=3,--shard-within-node" "4 0 bf16 2 --node-ranks=2,--qgz=int4" \
  "2 3 bf16 1 --offload=optimizer+params,--offload-dir=$tmp,--offload-piece=2048" \
  "4 3 fp16 2 --offload=optimizer+params,--offload-dir=$tmp,--prefetch=2,--grad-accum=2" \
  "4 2 bf16 2 --islands=2,--outer-every=2" "4 1 fp32 1 --islands=4,--outer-every=1" \
  "4 3 bf16 1 --islands=2,--outer-every=4,--fragments=2,--outer-delay=1,--outer-quant=int4" \
  "8 3 fp16 2 --islands=2,--outer-every=2,--node-ranks=2,--collectives=two-level,--hpz,--qwz" \
  "4 3 bf16 2 --islands=2,--outer-every=2,--node-ranks=4,--hpz" \
  "2 2 bf16 1 --islands=3,--outer-every=2,--islands-in-turn,--outer-quant=int8" \
  "4 3 fp16 2 --islands=2,--outer-every=2,--islands-in-turn,--node-ranks=2,--collectives=two-level" \
  "3 3 bf16 1 --model=llama" "4 2 fp16 2 --model=llama,--node-ranks=2,--collectives=two-level" \
  "2 0 fp32 1 --model=llama"; do
  read -r n stage precision per extras <<<"$case"
  extra=()
  [[ $extras != - ]] && IFS=, read -r -a extra <<<"$extras"
  extra=("${extra[@]//+/,}")
  "$zerodp" "${common[@]}" --ranks "$n" --stage "$stage" --precision "$precision" \
    "${extra[@]}" --report "$tmp/local.json" >/dev/null
  "$mpirun" -np $((n / per)) "$zerodp" "${common[@]}" --backend mpi --ranks-per-process "$per" \
    --stage "$stage" --precision "$precision" "${extra[@]}" --report "$tmp/mpi.json" >/dev/null
  if ! /usr/bin/env python3 - "$tmp/local.json" "$tmp/mpi.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert b["backend"] == "mpi" and a["backend"] == "local", (a["backend"], b["backend"])
assert a["final"]["weights_sha256"] == b["final"]["weights_sha256"], "weights differ"
assert [s["loss"] for s in a["steps"]] == [s["loss"] for s in b["steps"]], "losses differ"
assert [r["samples_sha256"] for r in a["ranks"]] == [r["samples_sha256"] for r in b["ranks"]]
assert [r["comm"] for r in a["ranks"]] == [r["comm"] for r in b["ranks"]], "comm ledgers differ"
assert [r["model_state_bytes"] for r in a["ranks"]] == [r["model_state_bytes"] for r in b["ranks"]]
# The MFU peak counts the cores the ranks share, on either backend: never more than the host's.
import os
for r in (a, b):
    assert r["throughput"]["peak_cores"] <= os.cpu_count(), r["throughput"]
PY
  then
    echo "FAIL: N=$n stage $stage $precision x$per per process $extras: mpi and local reports differ"
    fail=1
  else
    echo "ok: N=$n stage $stage $precision x$per per process $extras: same weights, losses, samples, comm, memory"
  fi
done
# Ranks on different hosts (each process told it is alone on its host, as OpenMPI tells a
# rank per node): the same training as the local run, and a peak counting each host's cores.
if "$mpirun" --version 2>/dev/null | grep -q "Open MPI"; then
  "$zerodp" "${common[@]}" --ranks 2 --stage 1 --report "$tmp/local.json" >/dev/null
  if "$mpirun" -np 2 env OMPI_COMM_WORLD_LOCAL_SIZE=1 "$zerodp" "${common[@]}" --backend mpi \
    --stage 1 --report "$tmp/hosts.json" >/dev/null &&
    /usr/bin/env python3 - "$tmp/local.json" "$tmp/hosts.json" <<'PY'
import json, os, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["final"]["weights_sha256"] == b["final"]["weights_sha256"], "weights differ"
assert [r["samples_sha256"] for r in a["ranks"]] == [r["samples_sha256"] for r in b["ranks"]]
assert b["throughput"]["peak_cores"] == 2 * os.cpu_count(), b["throughput"]
PY
  then
    echo "ok: one rank per host: the local run's weights and samples, each host's cores"
  else
    echo "FAIL: one rank per host: not the local run's training, or the wrong peak"
    fail=1
  fi
fi
# The MFU line names the precision whose GEMM peak it divides by.
"$zerodp" "${common[@]}" --precision bf16 | grep -q "GFLOP/s bf16 GEMM peak" ||
  { echo "FAIL: a bf16 run's MFU line does not name the bf16 peak"; fail=1; }
"$zerodp" "${common[@]}" --precision fp16 | grep -q "GFLOP/s fp32 GEMM peak" ||
  { echo "FAIL: an fp16 run's MFU line does not name the fp32 peak"; fail=1; }
exit $fail
