#!/usr/bin/env bash
# `zerodp estimate --offload optimizer`: the optimizer's states leave memory for a file per
# rank whose size is 4 bytes per owned element per array (master, adam_m, adam_v; no master
# at fp32) in whole 4 KiB blocks; --disk-bandwidth prices reading and writing all of it once
# per step, shared among the ranks on one disk; the budget advice names offload where only
# offload fits; and the flags that make no sense are refused.
set -uo pipefail
zerodp=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
py=/usr/bin/python3
[[ -x $py ]] || py=python3
fail=0
ok() { echo "ok: $*"; }
bad() {
  echo "FAIL: $*"
  fail=1
}

# A parameter count that is no multiple of a 4 KiB block's 1024 fp32 elements, nor of the
# rank counts, so both the padding and the ragged partition show.
P=1000003
for precision in bf16 fp32; do
  for n in 1 2; do
    "$zerodp" estimate --params $P --ranks $n --precision $precision --json >"$tmp/plain.json" &&
      "$zerodp" estimate --params $P --ranks $n --precision $precision --offload optimizer \
        --json >"$tmp/off.json"
    if $py - "$tmp/plain.json" "$tmp/off.json" $P $n $precision <<'PY'; then
import json, sys
plain = json.load(open(sys.argv[1])); off = json.load(open(sys.argv[2]))
P, n, precision = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
assert len(plain) == len(off) == 4, (len(plain), len(off))
arrays = 2 if precision == "fp32" else 3
for p, o in zip(plain, off):
    assert "nvme" not in p["model_state_bytes"], p  # unchanged without --offload
    stage = o["stage"]
    own = P if stage == 0 else -(-P // n)  # rank 0 holds the larger range
    want = arrays * (-(-4 * own // 4096) * 4096)
    ps, os_ = p["model_state_bytes"], o["model_state_bytes"]
    assert os_["nvme"] == want, (stage, os_["nvme"], want)
    for k in ("master", "adam_m", "adam_v"):
        assert os_[k] == 0, (stage, k, os_[k])
    for k in ("params", "grads"):
        assert os_[k] == ps[k], (stage, k, os_[k], ps[k])
    moved = ps["master"] + ps["adam_m"] + ps["adam_v"]
    assert moved == 4 * arrays * own, (stage, moved, own)
    assert os_["total"] == ps["total"] - moved, (stage, os_["total"], ps["total"], moved)
    assert o["offload"] == "optimizer"
PY
      ok "--params $P --ranks $n --precision $precision: nvme = $([[ $precision == fp32 ]] && echo 2 || echo 3) padded regions of the owned range, master/m/v 0, total less by them"
    else
      bad "--params $P --ranks $n --precision $precision --offload optimizer"
    fi
  done
done

# --offload optimizer,params: stage 3's row moves the parameter shard to disk too (2 bytes an
# element in its own padded region at bf16; at fp32 the shard is the master, one 4-byte
# region); stages 0-2 offload the optimizer only. The shard is read before every gather (2 per
# micro-batch) and written once, unread, by the update (read too at fp32, as the master).
for precision in bf16 fp32; do
  for n in 1 2; do
    "$zerodp" estimate --params $P --ranks $n --precision $precision --grad-accum 3 \
      --offload optimizer --disk-bandwidth 2GB/s/1GB/s --json >"$tmp/opt.json" &&
      "$zerodp" estimate --params $P --ranks $n --precision $precision --grad-accum 3 \
        --offload optimizer,params --disk-bandwidth 2GB/s/1GB/s --json >"$tmp/par.json"
    if $py - "$tmp/opt.json" "$tmp/par.json" $P $n $precision <<'PY'; then
import json, sys
opt = json.load(open(sys.argv[1])); par = json.load(open(sys.argv[2]))
P, n, precision = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
pad = lambda b: -(-b // 4096) * 4096
for o, p in zip(opt, par):
    if p["stage"] != 3:
        assert p == o, (p, o)
        continue
    own = -(-P // n)
    w = 4 if precision == "fp32" else 2
    region = pad(w * own)
    os_, ps = o["model_state_bytes"], p["model_state_bytes"]
    assert p["offload"] == "optimizer,params", p["offload"]
    assert ps["params"] == 0 and os_["params"] == w * own, (ps, os_)
    assert ps["nvme"] == os_["nvme"] + region, (ps["nvme"], os_["nvme"], region)
    assert ps["total"] == os_["total"] - w * own, (ps["total"], os_["total"])
    read = os_["nvme"] + (region if precision == "fp32" else 0) + 2 * 3 * region
    want = (read / 2e9 + ps["nvme"] / 1e9) * n
    assert abs(p["io_seconds"] - want) <= 1e-12 * want, (p["io_seconds"], want)
PY
      ok "--offload optimizer,params --ranks $n $precision: stage 3's shard on disk, read per gather"
    else
      bad "--offload optimizer,params --ranks $n --precision $precision"
    fi
  done
done

# io s: every byte of the file read once and written once per step, times the ranks that
# share the disk: given, by default every rank of a node (--node-ranks), else of the row.
check_io() {  # label, rank counts, the ranks per disk expected for each, estimate args...
  local label=$1 ranks=$2 sharers=$3
  shift 3
  if ! "$zerodp" estimate --params $P --ranks "$ranks" --offload optimizer "$@" --json \
    >"$tmp/io.json"; then
    bad "$label: estimate failed"
    return
  fi
  if $py - "$tmp/io.json" "$ranks" "$sharers" <<'PY'; then
import json, sys
rows = json.load(open(sys.argv[1]))
sharers = dict(zip((int(n) for n in sys.argv[2].split(",")), (int(k) for k in sys.argv[3].split(","))))
read, write = 2.1e9, 1.0e9
assert sorted({r["ranks"] for r in rows}) == sorted(sharers), rows
for r in rows:
    k = sharers[r["ranks"]]
    nvme = r["model_state_bytes"]["nvme"]
    want = (nvme / read + nvme / write) * k
    assert abs(r["io_seconds"] - want) <= 1e-12 * want, (r["ranks"], r["stage"], r["io_seconds"], want)
    assert r["ranks_per_disk"] == k, (r["ranks"], r["ranks_per_disk"], k)
    assert r["step_seconds"] is None  # no --flops
PY
    ok "$label: io s = (nvme/R + nvme/W) x ranks per disk"
  else
    bad "$label"
  fi
}
check_io "one machine" 1,2,4,8 1,2,4,8 --disk-bandwidth 2.1GB/s/1.0GB/s
check_io "--ranks-per-disk 2" 1,2,4,8 1,2,2,2 --disk-bandwidth 2100e6/1e9 --ranks-per-disk 2
check_io "--node-ranks 4" 4,8,16 4,4,4 --disk-bandwidth 2.1GB/s/1GB/s --node-ranks 4
check_io "--node-ranks 4 --ranks-per-disk 1" 4,8 1,1 --disk-bandwidth 2.1GB/s/1GB/s --node-ranks 4 \
  --ranks-per-disk 1
# One figure is both directions: io s = 2 nvme / bandwidth x ranks per disk.
"$zerodp" estimate --params $P --ranks 3 --stage 1 --offload optimizer --disk-bandwidth 500MB/s \
  --json >"$tmp/one.json"
if $py - "$tmp/one.json" <<'PY'; then
import json, sys
r = json.load(open(sys.argv[1]))[0]
want = 2 * r["model_state_bytes"]["nvme"] / 500e6 * 3
assert abs(r["io_seconds"] - want) <= 1e-12 * want, (r["io_seconds"], want)
PY
  ok "--disk-bandwidth 500MB/s: io s = 2 nvme / 500 MB/s x 3 ranks"
else
  bad "--disk-bandwidth 500MB/s"
fi

# With --flops the I/O adds to the step (the update waits for the gradient norm and the
# backward for the update; at stages 0 and 3 --offload-overlap on lets the forward overlap
# it), and `bound` names the largest part.
gpt=(--layers 2 --heads 2 --embd 64 --seq-len 32 --ranks 2 --flops 1e9 --link-bandwidth 1GB/s)
# A disk of 1 MB/s bounds every row; one of 1 TB/s bounds none (compute does: 1 GFLOP/s).
# Both are the ends of the range --disk-bandwidth takes.
for case in "1e6 io" "1e12 compute"; do
  read -r disk want_bound <<<"$case"
  "$zerodp" estimate "${gpt[@]}" --offload optimizer --disk-bandwidth "$disk" --json >"$tmp/g.json" &&
    "$zerodp" estimate "${gpt[@]}" --json >"$tmp/gp.json"
  if $py - "$tmp/g.json" "$tmp/gp.json" "$disk" "$want_bound" <<'PY'; then
import json, sys
rows = json.load(open(sys.argv[1])); plain = json.load(open(sys.argv[2])); bw = float(sys.argv[3])
for r, p in zip(rows, plain):
    t, pt = r["step_seconds"], p["step_seconds"]
    assert "io" not in pt and "offload_staging" not in p["transient_bytes"], p
    want = 2 * r["model_state_bytes"]["nvme"] / bw * 2
    assert abs(t["io"] - want) <= 1e-12 * want, (t["io"], want)
    # Offload changes nothing of compute and comm; the step gains exactly the I/O.
    assert t["overlapped"] == pt["overlapped"], (t, pt)
    # At stages 0 and 3 the next forward (a third of the compute) runs beside the I/O.
    hidden = 0  # --offload-overlap is off unless asked for
    assert abs(t["predicted"] - (pt["overlapped"] + want - hidden)) <= 1e-12 * t["predicted"], (t, pt)
    parts = {"compute": t["compute"], "comm": t["comm"], "io": t["io"]}
    assert t["bound"] == max(parts, key=parts.get), (t["bound"], parts)
    # Memory: the states moved to disk leave, the staging of their pieces comes.
    staging = r["transient_bytes"]["offload_staging"]
    assert staging > 0, r["transient_bytes"]
    m = p["model_state_bytes"]
    assert r["peak_bytes"] == p["peak_bytes"] - m["master"] - m["adam_m"] - m["adam_v"] + staging, (r["peak_bytes"], p["peak_bytes"])
assert {r["step_seconds"]["bound"] for r in rows} == {sys.argv[4]}, [r["step_seconds"] for r in rows]
PY
    ok "GPT --flops, disk $disk B/s: step = step without offload + io s; bound $want_bound"
  else
    bad "GPT --flops --disk-bandwidth $disk"
  fi
done
# --offload-overlap on: at stages 0 and 3 the forward (a third of the compute) hides behind
# the I/O; stages 1-2 are unchanged.
"$zerodp" estimate "${gpt[@]}" --offload optimizer --disk-bandwidth 1e9 --json >"$tmp/off.json" &&
  "$zerodp" estimate "${gpt[@]}" --offload optimizer --disk-bandwidth 1e9 --offload-overlap on \
    --json >"$tmp/on.json"
if $py - "$tmp/off.json" "$tmp/on.json" <<'PY'; then
import json, sys
off = json.load(open(sys.argv[1])); on = json.load(open(sys.argv[2]))
for a, b in zip(off, on):
    ta, tb = a["step_seconds"], b["step_seconds"]
    hidden = min(ta["io"], ta["compute"] / 3) if a["stage"] in (0, 3) else 0
    assert hidden == 0 or hidden > 0 and a["stage"] in (0, 3)
    assert abs(tb["predicted"] - (ta["predicted"] - hidden)) <= 1e-12 * ta["predicted"], (a["stage"], ta, tb)
assert any(b["step_seconds"]["predicted"] < a["step_seconds"]["predicted"] for a, b in zip(off, on))
PY
  ok "--offload-overlap on: stages 0 and 3 hide the forward behind the I/O"
else
  bad "--offload-overlap on"
fi
out=$("$zerodp" estimate "${gpt[@]}" --offload optimizer --disk-bandwidth 1e6 2>&1)
if [[ $out == *" io s "*"bound"* && $out == *"nvme"* && $out == *" io"$'\n'* ]]; then
  ok "text table: nvme, io s and bound columns (a slow disk bounds the step)"
else
  bad "text table with --offload optimizer --disk-bandwidth 1e6: $out"
fi
out=$("$zerodp" estimate --params $P --ranks 2 --stage 1 --offload optimizer --disk-bandwidth 1GB/s)
if [[ $out == *"io s"* ]]; then ok "io s without --flops"; else bad "no io s without --flops: $out"; fi

# Refusals: exit 2, the message naming what was wrong.
expect() {  # text the message must contain, estimate args...
  local want=$1
  shift
  local msg rc
  msg=$("$zerodp" estimate "$@" 2>&1 >/dev/null)
  rc=$?
  if [[ $rc -eq 2 && $msg == *"$want"* ]]; then
    ok "estimate $* -> $want"
  else
    bad "estimate $*: exit $rc, want 2 and '$want' in: $msg"
  fi
}
expect "--disk-bandwidth 1GB/s prices the offload file" --params $P --disk-bandwidth 1GB/s
expect "give --offload optimizer" --params $P --disk-bandwidth 1GB/s --offload none
expect "use --offload optimizer,params" --params $P --offload params
expect "--offload 'disk' is not a tier" --params $P --offload disk
expect "--offload-overlap on with --offload optimizer,params" --params $P \
  --offload optimizer,params --offload-overlap on
for text in fast 1GB/s/ /1GB/s 1GB/s/fast 0 -1GB/s 1e999 1GB/s/2GB/s/3GB/s; do
  expect "--disk-bandwidth '$text' is not a disk's bandwidth" --params $P --offload optimizer \
    --disk-bandwidth "$text"
done
expect "--ranks-per-disk '0' is not a rank count" --params $P --offload optimizer --disk-bandwidth 1GB/s \
  --ranks-per-disk 0
expect "--ranks-per-disk 4 divides" --params $P --offload optimizer --ranks-per-disk 4
expect "--qwz quantizes parameters from the fp32 master" --params $P --offload optimizer --qwz

# Budget advice: at 1e9 parameters in bf16 a rank's states are 16 GB at stage 0 and 8 GB at
# stage 3 on 2 ranks, of which 12 GB (stage 0) and 6 GB (stage 3) are the optimizer's. A 5 GB
# budget fits no stage in memory but stage 0 with offload (4 GB).
out=$("$zerodp" estimate --params 1e9 --ranks 2 --memory-per-rank 5GB)
if [[ $out == *"no stage fits"*"with --offload optimizer stage 0 fits: 4.00 GB per rank"* ]] &&
  [[ $(grep -o -- "--offload optimizer" <<<"$out" | wc -l) -eq 1 ]]; then
  ok "no stage fits 5 GB: the advice names --offload optimizer, once, at stage 0's 4 GB"
else
  bad "budget advice at 5 GB does not name --offload optimizer with stage 0's 4 GB: $out"
fi
out=$("$zerodp" estimate --params 1e9 --ranks 2 --memory-per-rank 5GB --offload optimizer)
if [[ $out == *"stage 0 is the least communication"* && $out != *"no stage fits"* ]]; then
  ok "--offload optimizer given: stage 0 fits 5 GB and nothing is suggested"
else
  bad "with --offload optimizer at 5 GB: $out"
fi
# 1.5 GB: offload's stage 3 keeps 2 GB; even offload does not fit at 2 ranks, 3 do (1.33 GB).
out=$("$zerodp" estimate --params 1e9 --ranks 2 --memory-per-rank 1.5GB --offload optimizer)
if [[ $out == *"no stage fits"*"stage 3 needs at least 3 ranks"* && $out != *"with --offload optimizer stage"* ]]; then
  ok "--offload optimizer given and 1.5 GB: stage 3 needs 3 ranks, no offload suggested again"
else
  bad "with --offload optimizer at 1.5 GB: $out"
fi
# Without offload at 1.5 GB: the optimizer's offload leaves 2 GB at stage 3; with the
# parameter shards on disk too, stage 3 keeps its 1 GB of gradients.
out=$("$zerodp" estimate --params 1e9 --ranks 2 --memory-per-rank 1.5GB)
if [[ $out == *"with --offload optimizer,params stage 3 fits: 1.00 GB per rank in memory"* ]]; then
  ok "1.5 GB without offload: optimizer,params at stage 3 named, 1 GB"
else
  bad "1.5 GB without offload: $out"
fi
out=$("$zerodp" estimate --params 1e9 --ranks 2 --memory-per-rank 0.9GB)
if [[ $out == *"--offload does not fit either: the least is stage 3's 1.00 GB per rank in memory (model states) with --offload optimizer,params"* ]]; then
  ok "0.9 GB without offload: even optimizer,params does not fit, its 1 GB named"
else
  bad "0.9 GB without offload: $out"
fi
# A GPT shape: the advice counts activations, buffers and the staging too: its need is the
# stage's peak under --offload optimizer.
shape=(--layers 4 --heads 4 --embd 256 --seq-len 64 --micro-batch 1 --ranks 1 --stage 0)
"$zerodp" estimate "${shape[@]}" --offload optimizer --json >"$tmp/s.json"
"$zerodp" estimate "${shape[@]}" --json >"$tmp/sp.json"
read -r peak plain < <($py -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["peak_bytes"], json.load(open(sys.argv[2]))[0]["peak_bytes"])' "$tmp/s.json" "$tmp/sp.json")
budget=$(((peak + plain) / 2))
out=$("$zerodp" estimate "${shape[@]}" --memory-per-rank "$budget")
want=$($py -c 'import sys; b=int(sys.argv[1]); print(f"{b/1e9:.2f} GB" if b >= 1e9 else f"{b/1e6:.2f} MB")' "$peak")
if [[ $out == *"with --offload optimizer stage 0 fits: $want per rank in memory (states, activations and buffers)"* ]]; then
  ok "GPT: the advice names offload's peak ($want) for a budget between it and the plain peak"
else
  bad "GPT budget $budget: want offload's $want in: $out"
fi

exit $fail
