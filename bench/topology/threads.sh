#!/usr/bin/env bash
# Ranks as threads of an MPI process against the local backend: the same N ranks, once as N
# threads of `zerodp bench-comm` (local) and once as one mpirun process running N rank
# threads (--backend mpi --ranks-per-process N, started with --bind-to none so its threads
# may use every core, as the local run's do). Both read their peers' buffers in place, so
# the MPI run should match the local one. Prints each collective's time per size on both
# and the ratio local / mpi (>= 1: the MPI process is at least as fast). The two alternate
# (A B A B) so they share the host's drift; each row keeps the best of the repeats.
#   bench/topology/threads.sh [--zerodp BIN] [--ranks N] [--repeats R] [--dtype bf16]
#     [--min-bytes 64KiB] [--max-bytes 16MiB]
set -euo pipefail
zerodp=build/release/cli/zerodp
ranks=2
repeats=2
dtype=bf16
min_bytes=64KiB
max_bytes=16MiB
die() { echo "threads.sh: $*" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --zerodp) zerodp=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --dtype) dtype=$2; shift 2 ;;
    --min-bytes) min_bytes=$2; shift 2 ;;
    --max-bytes) max_bytes=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) die "unknown option '$1'; see --help" ;;
  esac
done
[[ -x $zerodp ]] || die "no zerodp binary at '$zerodp'; build it (make build) or pass --zerodp"
command -v mpirun >/dev/null || die "mpirun not found; install openmpi-bin"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(bench-comm --ops reduce_scatter,all_gather,all_reduce,broadcast --dtypes "$dtype"
      --min-bytes "$min_bytes" --max-bytes "$max_bytes" --factor 4 --seconds-per-row 0.3 --json)
for ((r = 0; r < repeats; ++r)); do
  "$zerodp" "${args[@]}" --ranks "$ranks" >"$tmp/local.$r.json"
  mpirun -np 1 --bind-to none "$zerodp" "${args[@]}" --backend mpi \
    --ranks-per-process "$ranks" >"$tmp/mpi.$r.json"
done
/usr/bin/env python3 - "$tmp" "$repeats" "$ranks" <<'PY'
import glob, json, os, sys
tmp, repeats, ranks = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def best(kind):
    rows = {}
    for path in glob.glob(os.path.join(tmp, kind + ".*.json")):
        for line in open(path):
            j = json.loads(line)
            assert j.get("wrong", 0) == 0, j
            key = (j["op"], j["bytes"])
            rows[key] = min(rows.get(key, float("inf")), j["time_us"])
    return rows
local, mpi = best("local"), best("mpi")
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"# {ranks} ranks: local backend vs one MPI process of {ranks} rank threads; {cpu}, "
      f"{os.cpu_count()} cores; best of {repeats}")
print(f"{'op':>15} {'bytes':>10} {'local us':>10} {'mpi us':>10} {'local/mpi':>10}")
ratios = []
for key in sorted(local, key=lambda k: (k[0], k[1])):
    a, b = local[key], mpi[key]
    ratios.append(a / b)
    print(f"{key[0]:>15} {key[1]:>10} {a:>10.1f} {b:>10.1f} {a / b:>10.2f}")
ratios.sort()
print(f"# local/mpi: median {ratios[len(ratios) // 2]:.2f}, worst {ratios[0]:.2f}")
PY
