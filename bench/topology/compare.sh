#!/usr/bin/env bash
# Cross-node traffic and speed of collective modes at a simulated slow link between nodes:
# the same training (P = 2 nodes x T = 2 ranks, stage 3, bf16, synthetic data, fixed seed)
# under each CONFIG, a label=flags string whose flags (split at whitespace) are added to the
# command line. Per config: the bytes rank 0 received from the other node per step (the comm
# ledger, training steps only) beside the planner's figure, its total bytes per step, the
# step time and tokens/s, each against the first config. The first config is also run with
# no simulated link at all, so the table shows whether the link is what bounds the step.
#   bench/topology/compare.sh [--zerodp BIN] [--size small] [--steps N] [--repeats R]
#     [--inter-node-bandwidth 10MB/s] [--inter-node-latency 50us] [--link-bandwidth 10GB/s]
#     [--] [CONFIG...]      (default: flat="--collectives flat" two-level="--collectives two-level")
# Configs alternate within each repeat (A B A B) so they share the host's drift; a config's
# step time is the best over repeats of the median of its steps after the first.
set -euo pipefail
zerodp=build/release/cli/zerodp
size=small
steps=10
repeats=2
inter_bw=10MB/s
inter_lat=50us
link_bw=10GB/s
configs=()
die() { echo "compare.sh: $*" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --zerodp) zerodp=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --inter-node-bandwidth) inter_bw=$2; shift 2 ;;
    --inter-node-latency) inter_lat=$2; shift 2 ;;
    --link-bandwidth) link_bw=$2; shift 2 ;;
    --) shift; configs+=("$@"); break ;;
    -*) die "unknown option $1; a mode's flags go in a config, label=flags, e.g. mine=\"$1\"" ;;
    *) configs+=("$1"); shift ;;
  esac
done
[[ ${#configs[@]} -gt 0 ]] || configs=("flat=--collectives flat" "two-level=--collectives two-level")
# Step 1 is dropped from the step time, so at least one steady step must follow it.
[[ $steps =~ ^[0-9]+$ && $steps -ge 2 ]] || die "--steps $steps: need an integer >= 2"
[[ $repeats =~ ^[0-9]+$ && $repeats -ge 1 ]] || die "--repeats $repeats: need an integer >= 1"
bin=$(command -v -- "$zerodp") ||
  die "no zerodp binary at $zerodp (build it: cmake --preset release && cmake --build --preset release, or pass --zerodp PATH)"
labels=()
for c in "${configs[@]}"; do
  [[ $c == ?*=* ]] || die "config '$c' is not label=flags, e.g. flat=\"--collectives flat\""
  label=${c%%=*}
  for l in "${labels[@]}"; do [[ $l != "$label" ]] || die "config label '$label' given twice"; done
  labels+=("$label")
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(train --size "$size" --data synthetic --ranks 4 --node-ranks 2 --stage 3 --precision bf16
  --seed 1337 --steps "$steps" --eval-batches 0 --no-progress)
link=(--link-bandwidth "$link_bw" --inter-node-bandwidth "$inter_bw" --inter-node-latency "$inter_lat")
base_label="${labels[0]}, no link"

# Run index 0 is the no-link baseline of the first config, 1.. the configs; each gets a
# line "label<TAB>command" in commands.tsv, with R.json for the report path.
args_of() {  # run index -> the zerodp arguments in the array "args"
  local i=$1 flags
  if [[ $i -eq 0 ]]; then
    read -r -a flags <<<"${configs[0]#*=}"
    args=("${common[@]}" "${flags[@]}")
  else
    read -r -a flags <<<"${configs[i - 1]#*=}"
    args=("${common[@]}" "${link[@]}" "${flags[@]}")
  fi
}
for i in $(seq 0 ${#configs[@]}); do
  args_of "$i"
  label=$base_label; [[ $i -eq 0 ]] || label=${labels[i - 1]}
  printf '%s\t%s\n' "$label" "$(printf '%q ' "$bin" "${args[@]}" --report R.json)" >>"$tmp/commands.tsv"
done

runs=$(((${#configs[@]} + 1) * repeats)); n=0; start=$SECONDS
for r in $(seq "$repeats"); do
  for i in $(seq 0 ${#configs[@]}); do
    args_of "$i"
    label=$base_label; [[ $i -eq 0 ]] || label=${labels[i - 1]}
    n=$((n + 1))
    echo "compare.sh: [$n/$runs] $label, repeat $r/$repeats ($((SECONDS - start)) s so far)" >&2
    report=$tmp/run$i-$r.json
    if ! "$bin" "${args[@]}" --report "$report" >"$tmp/log" 2>&1 || [[ ! -s $report ]]; then
      echo "compare.sh: the run of '$label' failed; its command and last output:" >&2
      printf '%q ' "$bin" "${args[@]}" --report "$report" >&2; echo >&2
      tail -n 20 "$tmp/log" >&2
      exit 1
    fi
  done
done
echo "compare.sh: $runs runs in $((SECONDS - start)) s" >&2

cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1) || true
python3 - "$tmp" "$repeats" "$cpu" "$size" "$steps" "$inter_bw" "$inter_lat" "$link_bw" <<'PY'
import json, os, statistics, sys
d, repeats, cpu, size, steps, inter_bw, inter_lat, link_bw = sys.argv[1:]
repeats = int(repeats)
commands = [line.rstrip("\n").split("\t", 1) for line in open(os.path.join(d, "commands.tsv"))]
# The planner predicts the data collectives; control scalars (a few hundred bytes a step)
# are outside it, so they are left out of both sides and shown apart.
DATA = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")

def measure(i):
    out = []
    for r in range(1, repeats + 1):
        rep = json.load(open(os.path.join(d, f"run{i}-{r}.json")))
        recs = rep["steps"]
        steady = recs[1:]
        comm = rep["ranks"][0]["comm"]
        plan = rep["plan"]["comm_bytes_per_step"][0]
        out.append({
            "steps": len(recs),
            "step_s": statistics.median(s["seconds"] for s in steady),
            "tokens": statistics.median(s["tokens"] for s in steady),
            "cross": sum(comm[k]["cross_node_bytes"] for k in DATA if k in comm),
            "total": sum(comm[k]["bytes"] for k in DATA if k in comm),
            "control_cross": comm.get("control", {}).get("cross_node_bytes", 0),
            "plan_cross": plan["cross_node_bytes"],
            "plan_total": plan["total"],
        })
    first = out[0]
    # The runs are deterministic in their traffic: a repeat that differs is a finding.
    drift = [k for k in ("steps", "cross", "total", "plan_cross") if any(o[k] != first[k] for o in out)]
    best = min(out, key=lambda o: o["step_s"])
    n = first["steps"]
    return {
        "cross": first["cross"] / n, "total": first["total"] / n,
        "control_cross": first["control_cross"] / n,
        "plan_cross": first["plan_cross"],
        "equal": first["cross"] == first["plan_cross"] * n and not drift,
        "drift": drift,
        "step_s": best["step_s"], "tok_s": best["tokens"] / best["step_s"],
    }

def num(b):
    return f"{b:.0f}" if b == int(b) else f"{b:.1f}"

version = json.load(open(os.path.join(d, "run0-1.json"))).get("zerodp_version", "unknown")
rows = [(label, measure(i)) for i, (label, _) in enumerate(commands)]
baseline, configs = rows[0], rows[1:]
ref = configs[0][1]
print(f"P = 2 nodes x T = 2 ranks, stage 3, bf16, --size {size}, {steps} steps (step 1 not timed), "
      f"best of {repeats}; link: {inter_bw} + {inter_lat} between nodes, {link_bw} inside one")
head = ("| config | cross-node B/step, rank 0 | plan | equal | control cross-node B/step | "
        "total MiB/step | step s | tokens/s | cross-node / first | tokens/s / first |")
print(head)
print("|" + "---|" * (head.count("|") - 1))
for label, m in configs + [baseline]:
    eq = "yes" if m["equal"] else "NO"
    if m["drift"]:
        eq += " (repeats differ in " + ", ".join(m["drift"]) + ")"
    xr = f"{m['cross'] / ref['cross']:.2f}" if ref["cross"] else "n/a"
    print(f"| {label} | {num(m['cross'])} | {m['plan_cross']} | {eq} | {num(m['control_cross'])} | "
          f"{m['total'] / 2**20:.3f} | {m['step_s']:.3f} | {m['tok_s']:.0f} | {xr} | "
          f"{m['tok_s'] / ref['tok_s']:.2f} |")
slow = ref["step_s"] / baseline[1]["step_s"]
print(f"Link bound: {configs[0][0]} at the link takes {slow:.2f}x its no-link step "
      f"({ref['step_s']:.3f} s against {baseline[1]['step_s']:.3f} s); a link that bounds the step gives >= 2x.")
print(f"CPU: {cpu or 'unknown (no lscpu)'}; zerodp {version}")
print("Commands (R.json: the report):")
for label, cmd in commands[1:] + commands[:1]:
    print(f"  {label}: {cmd.rstrip()}")
PY
