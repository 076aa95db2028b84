#!/usr/bin/env bash
# docs/performance.md's collective table: zerodp's local backend, zerodp's MPI backend and
# OpenMPI's own collectives, f32, 2 ranks, in one invocation, plus memcpy bandwidth.
#   bench/comm/compare.sh [build-dir]    (default build/release)
set -euo pipefail
build=${1:-build/release}
zerodp=$build/cli/zerodp
native=$build/bench/comm/bench_mpi_native
# Environment, not flags, so MPICH's mpiexec (which ignores them) runs this too.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
min=$((1 << 20)); max=$((256 << 20))
"$zerodp" bench-comm --ranks 2 --dtypes f32 --min-bytes $min --max-bytes $max --json >"$tmp/local.jsonl"
mpirun -np 2 "$zerodp" bench-comm --backend mpi --dtypes f32 --min-bytes $min \
  --max-bytes $max --json >"$tmp/mpi.jsonl"
mpirun -np 2 "$native" $min $max 4 >"$tmp/native.jsonl"
"$zerodp" bench-comm --ranks 2 --dtypes f32 --ops broadcast --min-bytes 64MiB --max-bytes 64MiB \
  | grep memcpy >"$tmp/memcpy.txt"
/usr/bin/env python3 - "$tmp" <<'PY'
import json, re, sys, os
d = sys.argv[1]
def rows(name):
    return {(r["op"], r["bytes"]): r for r in map(json.loads, open(os.path.join(d, name)))}
local, mpi, native = rows("local.jsonl"), rows("mpi.jsonl"), rows("native.jsonl")
memcpy = open(os.path.join(d, "memcpy.txt")).read().strip()
m2 = float(re.search(r"([\d.]+) GB/s on 2 threads", memcpy).group(1))
print(memcpy)
# Bytes a rank must read and write per collective, per byte of S, at N = 2 (local backend):
# reduce-scatter reads its half of both inputs and writes its half: 1.5 S per rank, 3 S in all
# all-gather copies the peer's half: reads 0.5 S, writes 0.5 S per rank, 2 S in all
# all-reduce is both: 5 S in all; broadcast: the non-root reads S and writes S: 2 S in all.
traffic = {"all_reduce": 5.0, "reduce_scatter": 3.0, "all_gather": 2.0, "broadcast": 2.0}
print("| op | bytes | local busbw GB/s | zerodp mpi busbw | OpenMPI busbw | local / OpenMPI | memory bound / local time |")
print("|---|---|---|---|---|---|---|")
for key in sorted(local, key=lambda k: (list(traffic).index(k[0]), k[1])):
    l, m, n = local[key], mpi.get(key), native.get(key)
    # memcpy of B bytes reads B and writes B: its traffic rate is twice its copy rate.
    bound_s = traffic[key[0]] * key[1] / (2 * m2 * 1e9)
    frac = bound_s / (l["time_us"] * 1e-6)
    print(f"| {key[0]} | {key[1] >> 20} MiB | {l['busbw']:.2f} | {m['busbw'] if m else float('nan'):.2f} | "
          f"{n['busbw'] if n else float('nan'):.2f} | {l['busbw'] / n['busbw'] if n else float('nan'):.2f}x | {frac:.0%} |")
PY
