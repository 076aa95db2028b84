# zerodp train: flags, inputs and outputs, all refused before the first step.
tt=$(mktemp -d)
tiny=(--size tiny --data synthetic --steps 2 --no-progress)

# Numbers that were wrapped, clamped, rounded to inf or silently meant "the preset".
expect "--clip nan is invalid" train --clip nan --data synthetic
expect "--seed -1 is invalid" train --seed -1 --data synthetic
expect "--seed 18446744073709551616 is invalid" train --seed 18446744073709551616 --data synthetic
expect "--warmup -5 is invalid; use auto" train --warmup -5 --data synthetic
expect "--eval-batches -1 is invalid" train --eval-batches -1 --data synthetic
expect "--eval-every -1 is invalid" train --eval-every -1 --data synthetic
expect "--layers 0 is invalid" train --layers 0 --data synthetic
expect "--heads 0 is invalid" train --heads 0 --data synthetic
expect "--embd 0 is invalid" train --embd 0 --data synthetic
expect "--seq-len 0 is invalid" train --seq-len 0 --data synthetic
expect "--checkpoint-every 5 needs --checkpoint-dir" train --checkpoint-every 5 --data synthetic
expect "--keep 2 needs --checkpoint-dir" train --keep 2 --data synthetic
expect "--lr 1e308 is invalid" train --lr 1e308 --data synthetic
# Before the first collective: no "rank 1 of 2" in front of it.
expect "zerodp: --weight-decay -1 is invalid" train --weight-decay -1 --data synthetic --ranks 2

# --config: what it may hold, and what it may be.
echo '{"ranks": true}' >"$tt/bool.json"
expect "key 'ranks' is true, but --ranks takes a value" train --config "$tt/bool.json"
echo '{"stagee": 3}' >"$tt/unknown.json"
expect "--config '$tt/unknown.json': key 'stagee' is not an option of zerodp train" \
  train --config "$tt/unknown.json"
expect "--config '$tt' is a directory" train --config "$tt"
mkfifo "$tt/fifo"
expect "--config '$tt/fifo' is a FIFO" train --config "$tt/fifo"
expect "--data '$tt' is a directory without token shards" train --data "$tt"
# A corpus larger than the memory available is refused before it is read (sparse: no disk).
avail_kib=$(awk '/MemAvailable/ {print $2}' /proc/meminfo)
truncate -s "$((avail_kib * 2))K" "$tt/huge.txt"
expect_code 1 "--data '$tt/huge.txt' is" train --data "$tt/huge.txt" --steps 1
rm -f "$tt/huge.txt"

# Outputs that would destroy an input or each other.
head -c 20000 /dev/urandom | base64 >"$tt/corpus.txt"
cp "$tt/corpus.txt" "$tt/corpus.bak"
expect "--report '$tt/corpus.txt' would overwrite --data" \
  train --size tiny --data "$tt/corpus.txt" --report "$tt/corpus.txt"
cmp -s "$tt/corpus.txt" "$tt/corpus.bak" || { echo "FAIL: --data was changed"; fail=1; }
expect "--report '$tt/x.json' and --metrics '$tt/x.json' are the same file" \
  train "${tiny[@]}" --report "$tt/x.json" --metrics "$tt/x.json"
echo '{"stage": 1}' >"$tt/cfg.json"
expect "--trace '$tt/cfg.json' would overwrite --config" \
  train "${tiny[@]}" --config "$tt/cfg.json" --trace "$tt/cfg.json"
ln -s corpus.txt "$tt/link.txt"
expect "would overwrite --data" train --size tiny --data "$tt/corpus.txt" --metrics "$tt/link.txt"

# Output locations that cannot be written fail before the first step, naming the flag.
expect "--report '/nonexistent/r.json': its directory '/nonexistent' does not exist" \
  train "${tiny[@]}" --report /nonexistent/r.json
expect "--trace '/nonexistent/t.json'" train "${tiny[@]}" --trace /nonexistent/t.json
expect "--metrics '$tt' is a directory" train "${tiny[@]}" --metrics "$tt"
expect_code 1 "--checkpoint-dir: cannot create the directory '/proc/self/ck'" \
  train "${tiny[@]}" --checkpoint-dir /proc/self/ck

# A link stays a link; the report goes to its target.
echo old >"$tt/target.json"
ln -s target.json "$tt/report-link.json"
if "$zerodp" train "${tiny[@]}" --report "$tt/report-link.json" >/dev/null 2>&1 &&
  [[ -L "$tt/report-link.json" ]] && grep -q zerodp_version "$tt/target.json"; then
  echo "ok: --report through a symlink wrote its target and kept the link"
else
  echo "FAIL: --report through a symlink"; ls -l "$tt"; fail=1
fi

# mpirun without --backend mpi: every process would train alone into the same outputs.
OMPI_COMM_WORLD_SIZE=2 expect "one of 2 started by an MPI launcher (OMPI_COMM_WORLD_SIZE=2)" \
  train "${tiny[@]}"

# When every stage's states fit, the advice names the activations, not a rank count.
expect_code 1 "every stage's states fit, so it is the activations and buffers that do not" \
  train --size tiny --data synthetic --ranks 4 --memory-per-rank 1MiB

# Too many local ranks: refused at once, before any thread starts.
expect_code 1 "past its --memory-per-rank budget" train --size tiny --data synthetic --ranks 2000 \
  --memory-per-rank 1MiB
expect_code 2 "--ranks 10000000 needs 10000000 threads" train --size tiny --data synthetic \
  --ranks 10000000 --micro-batch 1 --seq-len 8

# Two runs on one --checkpoint-dir: the second is refused naming the first.
"$zerodp" train --size tiny --data synthetic --steps 1000000 --checkpoint-dir "$tt/ck" \
  --no-progress >/dev/null 2>&1 &
holder=$!
for _ in $(seq 100); do [[ -s "$tt/ck/.lock" ]] && break; sleep 0.1; done
expect "is in use by another zerodp run (pid $holder on" \
  train "${tiny[@]}" --checkpoint-dir "$tt/ck" --resume latest
kill -TERM "$holder"
wait "$holder"
rm -rf "$tt"

# A resume continues the checkpoint's model: a flag that shapes another is refused naming it,
# and without model flags the model is the checkpoint's.
tm=$(mktemp -d)
"$zerodp" train --model mlp --data synthetic --steps 1 --checkpoint-dir "$tm/ck" --no-progress \
  >/dev/null 2>&1
expect "the checkpoint's model is mlp ($tm/ck/step_00000001/meta.json), but --size shapes a model of kind gpt" \
  train --size tiny --data synthetic --steps 2 --resume "$tm/ck"
expect "--model gpt differs from the checkpoint's model, mlp" \
  train --model gpt --data synthetic --steps 2 --resume "$tm/ck"
"$zerodp" train --size tiny --data synthetic --steps 2 --checkpoint-dir "$tm/gpt" --no-progress \
  >/dev/null 2>&1
expect "--layers 3 differs from the checkpoint's model.layers, 2" \
  train --layers 3 --data synthetic --steps 3 --checkpoint-dir "$tm/gpt" --resume latest
expect "--size small differs from the checkpoint's size, tiny" \
  train --size small --data synthetic --steps 3 --checkpoint-dir "$tm/gpt" --resume latest
out=$("$zerodp" train --data synthetic --steps 3 --checkpoint-dir "$tm/gpt" --resume latest \
  --no-progress 2>&1)
if [[ "$out" == *"trained 42880 parameters for 1 steps"*"continued from"* ]]; then
  echo "ok: a resume without model flags continues the checkpoint's gpt tiny"
else
  echo "FAIL: a resume without model flags: $out"; fail=1
fi
# The meta.json export refuses, a resume refuses the same way (exit 3, naming the field).
/usr/bin/python3 - "$tm/gpt/step_00000003/meta.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["model"]["layers"] = 1000000
m["model"]["embd"] = 1000000
json.dump(m, open(sys.argv[1], "w"))
PY
expect_code 3 'field "model.layers" is 1000000' \
  train --data synthetic --steps 5 --checkpoint-dir "$tm/gpt" --resume latest
expect_code 3 'field "model.layers" is 1000000' export "$tm/gpt" --out "$tm/o.safetensors"
# A time slice ending before the checkpoint it continues from would train nothing.
"$zerodp" train --size tiny --data synthetic --steps 3 --checkpoint-dir "$tm/ck3" --no-progress \
  >/dev/null 2>&1
expect "--stop-after 2: the checkpoint" train --size tiny --data synthetic --steps 10 \
  --checkpoint-dir "$tm/ck3" --resume latest --stop-after 2

# A run's report is a --config: the run it describes again, bit for bit.
"$zerodp" train --size tiny --data synthetic --steps 3 --ranks 2 --stage 2 --seed 7 \
  --no-progress --report "$tm/r1.json" >/dev/null 2>&1
if "$zerodp" train --config "$tm/r1.json" --no-progress --report "$tm/r2.json" >/dev/null 2>"$tm/err" &&
  [[ -n $(grep -o '"weights_sha256": "[0-9a-f]*"' "$tm/r1.json") ]] &&
  [[ $(grep -o '"weights_sha256": "[0-9a-f]*"' "$tm/r1.json") == \
    $(grep -o '"weights_sha256": "[0-9a-f]*"' "$tm/r2.json") ]]; then
  echo "ok: train --config REPORT reran the run to the same weights"
else
  echo "FAIL: train --config REPORT: $(cat "$tm/err")"; fail=1
fi
rm -rf "$tm"

# --max-restarts: what a restart needs, and where it cannot be done in-process.
expect "--max-restarts -1 is invalid" train --max-restarts -1 --data synthetic
expect "--max-restarts 1 needs checkpoints along the way to restart from; pass --checkpoint-dir DIR and --checkpoint-every K" \
  train --max-restarts 1 --data synthetic
expect "pass --checkpoint-every K" train --max-restarts 1 --checkpoint-dir /nonexistent/ck \
  --data synthetic
expect "--max-restarts 2 works on the local backend only: under MPI a failed rank ends the job; relaunch it with mpirun -np N'" \
  train --max-restarts 2 --backend mpi --checkpoint-dir /nonexistent/ck --checkpoint-every 2 \
  --data synthetic
# Ranks as threads of MPI processes, and HSDP: refused where they cannot work, naming why.
expect "--ranks-per-process 2 is for --backend mpi" train "${tiny[@]}" --ranks-per-process 2
expect "--ranks-per-process 0 is invalid" train "${tiny[@]}" --ranks-per-process 0
expect "it needs --node-ranks T" train "${tiny[@]}" --ranks 4 --stage 2 --shard-within-node
expect "--stage 0 shards none" train "${tiny[@]}" --ranks 4 --node-ranks 2 --shard-within-node
expect "--qwz has nothing to act on" train "${tiny[@]}" --ranks 4 --node-ranks 2 --stage 3 \
  --shard-within-node --qwz
# The offload tier: what it cannot do, and directories it cannot use, named before a rank
# starts.
expect "only stage 3 shards parameters (at stage 1" train "${tiny[@]}" --stage 1 \
  --offload optimizer,params
expect "--offload-piece 1024 is not a multiple of 2048" train "${tiny[@]}" --stage 3 \
  --offload optimizer,params --offload-piece 1024
expect "--offload 'disk' is not a tier; use none, optimizer or optimizer,params" train \
  "${tiny[@]}" --offload disk
expect "--offload-piece 1000 is not a multiple of 1024" train "${tiny[@]}" --offload optimizer \
  --offload-piece 1000
expect "--offload-dir /nonexistent/offload does not exist" train "${tiny[@]}" \
  --offload optimizer --offload-dir /nonexistent/offload
expect "is not a directory" train "${tiny[@]}" --offload optimizer --offload-dir /etc/hostname
expect "--qwz quantizes parameters from the fp32 master" train "${tiny[@]}" --stage 3 --qwz \
  --offload optimizer
# A disk that cannot take the offload file fails at the start, naming the file: here a file
# size limit (SIGXFSZ ignored, so the reservation returns EFBIG rather than killing).
scratch=$(mktemp -d)
err=$(bash -c 'trap "" XFSZ; ulimit -f 100; exec "$@"' _ timeout 20 "$zerodp" train "${tiny[@]}" \
  --offload optimizer --offload-dir "$scratch" 2>&1 >/dev/null)
code=$?
if [[ $code -ne 1 || "$err" != *"cannot reserve"*"$scratch/zerodp-offload-"*"File too large"* ||
      -n $(ls -A "$scratch") ]]; then
  echo "FAIL: offload past a file size limit: exit $code, stderr: $err, left: $(ls -A "$scratch")"
  fail=1
else
  echo "ok: offload past a file size limit -> exit 1, $err"
fi
rm -rf "$scratch"
expect "--offload-piece -1 is invalid" train "${tiny[@]}" --offload optimizer --offload-piece -1

# Nothing lost, round three.
# Outputs may not take a name the checkpoints own (latest, .lock, step_*, .tmp.*), also
# through a link and before the directory or the step exists.
ck3=$(mktemp -d)
expect "--report '$ck3/c/latest' would overwrite latest in --checkpoint-dir '$ck3/c'" \
  train "${tiny[@]}" --checkpoint-dir "$ck3/c" --report "$ck3/c/latest"
expect "--metrics '$ck3/c/.lock' would overwrite .lock" \
  train "${tiny[@]}" --checkpoint-dir "$ck3/c" --metrics "$ck3/c/.lock"
expect "--trace '$ck3/c/step_00000002' would overwrite step_00000002" \
  train "${tiny[@]}" --checkpoint-dir "$ck3/c" --trace "$ck3/c/step_00000002"
ln -s c/latest "$ck3/link"
expect "--report '$ck3/link' would overwrite latest" \
  train "${tiny[@]}" --checkpoint-dir "$ck3/c" --report "$ck3/link"
# Another name inside the directory is the user's to take, created with it.
rm -rf "$ck3/c"
if "$zerodp" train "${tiny[@]}" --checkpoint-dir "$ck3/c" --report "$ck3/c/report.json" \
     >/dev/null 2>&1 && [[ -f $ck3/c/report.json && -f $ck3/c/latest ]]; then
  echo "ok: a report of its own name inside --checkpoint-dir"
else
  echo "FAIL: --report inside --checkpoint-dir under a name of its own"; fail=1
fi
expect "--out '$ck3/c/latest' would overwrite latest in checkpoint '$ck3/c'" \
  export "$ck3/c" --out "$ck3/c/latest"
expect "--out '$ck3/c/.lock' would overwrite .lock" export "$ck3/c" --out "$ck3/c/.lock"
expect "--out '$ck3/link' would overwrite latest" export "$ck3/c" --out "$ck3/link"
[[ $(cat "$ck3/c/latest") == step_00000002 ]] || { echo "FAIL: latest was changed"; fail=1; }
expect "is --offload-dir, where the offload scratch lives" \
  train "${tiny[@]}" --offload optimizer --offload-dir "$ck3" --trace "$ck3"

# Nothing lost, round four: an output that is a hard link to a checkpoint's file is that
# file, whatever its name: refused, and the checkpoint still resumes.
ln "$ck3/c/latest" "$ck3/hard-latest"
ln "$ck3/c/step_00000002/rank_00000.safetensors" "$ck3/hard-shard"
expect "--metrics '$ck3/hard-latest' is a hard link to latest" \
  train "${tiny[@]}" --steps 4 --checkpoint-dir "$ck3/c" --resume latest --metrics "$ck3/hard-latest"
expect "--metrics '$ck3/hard-shard' is a hard link to rank_00000.safetensors" \
  train "${tiny[@]}" --steps 4 --checkpoint-dir "$ck3/c" --metrics "$ck3/hard-shard"
expect "--report '$ck3/hard-shard' is a hard link to rank_00000.safetensors" \
  train "${tiny[@]}" --steps 4 --resume "$ck3/c" --report "$ck3/hard-shard"
# An islands checkpoint names the rank counts that split its batch: multiples of the islands.
"$zerodp" train "${tiny[@]}" --steps 2 --ranks 4 --islands 2 --outer-every 2 \
  --checkpoint-dir "$ck3/isl" >/dev/null 2>&1
expect "(4 ranks as 2 islands x --micro-batch 8 x --grad-accum 1), which 8 ranks of --micro-batch 8 cannot split evenly; use --ranks 2, 4," \
  train "${tiny[@]}" --steps 4 --ranks 8 --islands 2 --outer-every 2 --resume "$ck3/isl"
if "$zerodp" train "${tiny[@]}" --steps 4 --checkpoint-dir "$ck3/c" --resume latest \
     >/dev/null 2>&1; then
  echo "ok: the checkpoint behind the hard links still resumes"
else
  echo "FAIL: the checkpoint behind the hard links no longer resumes"; fail=1
fi

# Simulated links within human bounds (a latency of 1e6 s hung for 22 minutes).
expect "--inter-node-latency 1e6 is out of range; use 0 s to 1 s" \
  train "${tiny[@]}" --ranks 4 --node-ranks 2 --inter-node-latency 1e6
expect "--link-latency 1e10 is out of range; use 0 s to 1 s" train "${tiny[@]}" --link-latency 1e10
expect "--link-latency 1e308s is out of range" train "${tiny[@]}" --link-latency 1e308s
expect "--link-bandwidth 1 is out of range; use 1 KB/s to 10 TB/s" \
  train "${tiny[@]}" --link-bandwidth 1
expect "--collective-timeout 1e308 is out of range; use 1 ms to 1 day" \
  train "${tiny[@]}" --collective-timeout 1e308
# The range a message gives is the range accepted, in units the parser reads back.
expect "--collective-timeout 0 is out of range; use 1 ms to 1 day" \
  train "${tiny[@]}" --collective-timeout 0
expect "--collective-timeout 2day is out of range; use 1 ms to 1 day" \
  train "${tiny[@]}" --collective-timeout 2day
# Options islands of one rank give nothing to act on (the same bits as without them).
for opt in "--qgz int8" "--hpz on" "--collectives two-level"; do
  # shellcheck disable=SC2086
  expect "${opt} does nothing here: the --islands have one rank each" \
    train "${tiny[@]}" --ranks 2 --islands 2 --stage 3 ${opt% on}
done
# --vocab: at least the data's largest token + 1 (KJV's is 'z', 122), a gpt's only.
expect "--vocab 100 does not hold the data's token 122 (byte 30675 of kjv/train); use --vocab 123 or more" \
  train --size tiny --data kjv --steps 2 --no-progress --vocab 100
expect "--vocab 1 is invalid; use 2 to 16777216" train "${tiny[@]}" --vocab 1
expect "--vocab 300 does nothing here: it shapes a gpt or a llama; use --model gpt or llama" \
  train --model mlp --data synthetic --steps 1 --vocab 300
# A larger vocabulary adds its rows (2 x 44 x 32 to tiny's 42880) and a resume keeps it.
vc=$(mktemp -d)
"$zerodp" train "${tiny[@]}" --steps 4 --stop-after 2 --checkpoint-dir "$vc/ck" --vocab 300 \
  >/dev/null 2>&1
whole=$("$zerodp" train "${tiny[@]}" --steps 4 --vocab 300 2>&1)
cont=$("$zerodp" train "${tiny[@]}" --steps 4 --checkpoint-dir "$vc/ck" --resume latest 2>&1)
if [[ $whole == *"trained 45696 parameters"* &&
      $(grep -o 'weights sha256 [0-9a-f]*' <<<"$cont") == $(grep -o 'weights sha256 [0-9a-f]*' <<<"$whole") ]]; then
  echo "ok: --vocab 300 trains 45696 parameters, and its checkpoint resumes with it"
else
  echo "FAIL: --vocab 300: $whole / $cont"; fail=1
fi
rm -rf "$vc"
# The llama's shape flags: named when wrong, idle on another model, a tied head refused
# naming why, and a resume that keeps every field, the RMSNorm eps's bits included.
llama=(--model llama --size tiny --data synthetic --steps 2 --no-progress)
expect "llama: kv_heads 3 does not divide heads 2" train "${llama[@]}" --kv-heads 3
expect "--kv-heads 2 does nothing here: it shapes a llama; use --model llama" \
  train "${tiny[@]}" --kv-heads 2
expect "--norm-eps 1e-06 does nothing here: it shapes a llama" train "${tiny[@]}" --norm-eps 1e-6
expect "--rope-theta 1.5 is invalid; use a whole number" train "${llama[@]}" --rope-theta 1.5
expect "--norm-eps 0 is invalid; use a number above 0" train "${llama[@]}" --norm-eps 0
expect "--head tied is not built yet: a unit owns one flat buffer" train "${llama[@]}" --head tied
expect "--size '3b' is unknown for the llama; use tiny, small, medium, large, 1.1b" \
  train --model llama --size 3b --data synthetic
lc=$(mktemp -d)
lflags=(--kv-heads 1 --ffn-hidden 96 --rope-theta 500000 --norm-eps 1e-6 --vocab 260)
"$zerodp" train "${llama[@]}" --steps 4 --stop-after 2 --checkpoint-dir "$lc/ck" "${lflags[@]}" \
  >/dev/null 2>&1
whole=$("$zerodp" train "${llama[@]}" --steps 4 "${lflags[@]}" 2>&1)
cont=$("$zerodp" train "${llama[@]}" --steps 4 --checkpoint-dir "$lc/ck" --resume latest 2>&1)
other=$("$zerodp" train "${llama[@]}" --steps 4 2>&1)
wh() { grep -o 'weights sha256 [0-9a-f]*' <<<"$1"; }
if [[ -n $(wh "$whole") && $(wh "$cont") == $(wh "$whole") && $(wh "$other") != $(wh "$whole") ]]; then
  echo "ok: a llama's shape flags reach the model, and its checkpoint resumes with them"
else
  echo "FAIL: llama resume: $whole / $cont"; fail=1
fi
expect "--norm-eps 1e-05 differs from the checkpoint's model.norm_eps_fp32_bits, 1e-06" \
  train "${llama[@]}" --steps 4 --checkpoint-dir "$lc/ck" --resume latest --norm-eps 1e-5
rm -rf "$lc"
# Streaming DiLoCo's fragments hold at least one parameter each, refused before any work.
expect "--fragments 1000000 would split the model's" \
  train "${tiny[@]}" --ranks 2 --islands 2 --outer-every 1000000 --fragments 1000000
# Block sizes as text: -1 would wrap to 2^64-1, 2^32+1 to 1.
for v in -1 -18446744073709551615 4294967297 0; do
  expect "--qgz-block $v is invalid; use the elements per scale, 1 to 16777216" \
    train "${tiny[@]}" --qgz int8 --qgz-block "$v"
  expect "--qwz-block $v is invalid; use the elements per scale, 1 to 16777216" \
    train "${tiny[@]}" --stage 3 --qwz --qwz-block "$v"
done
# One parser for seeds.
expect "--seed -1 is invalid; use a whole number from 0 to 18446744073709551615" \
  sample /nonexistent --seed -1
expect "--seed 1.5 is invalid" sample /nonexistent --seed 1.5
# A range in words, not the largest double in 300 digits.
for flag in --keep --checkpoint-every; do
  err=$("$zerodp" train "${tiny[@]}" --checkpoint-dir "$ck3/k" "$flag" -1 2>&1 >/dev/null)
  if [[ ${#err} -gt 200 || "$err" != *"$flag -1 is invalid; use 0"* ]]; then
    echo "FAIL: $flag -1: $err"; fail=1
  else
    echo "ok: $flag -1 -> $err"
  fi
done
# Options with nothing to do in their combination: refused when given, null in the report.
expect "--qwz-block 64 does nothing here: it sizes --qwz's blocks, and --qwz is off" \
  train "${tiny[@]}" --qwz-block 64
expect "--qgz-block 64 does nothing here" train "${tiny[@]}" --qgz-block 64
expect "--offload-piece 2048 does nothing here" train "${tiny[@]}" --offload-piece 2048
expect "--offload-overlap off does nothing here" train "${tiny[@]}" --offload-overlap off
expect "--offload-dir $ck3 does nothing here" train "${tiny[@]}" --offload-dir "$ck3"
expect "--offload-overlap on does nothing here: stages 1 and 2" \
  train "${tiny[@]}" --stage 1 --offload optimizer --offload-dir "$ck3" --offload-overlap on
expect "--prefetch 2 does nothing here" train "${tiny[@]}" --stage 2 --prefetch 2
expect "--initial-loss-scale 1024 does nothing here" \
  train "${tiny[@]}" --initial-loss-scale 1024
expect "--layers 3 does nothing here" train --model mlp --layers 3 --data synthetic --steps 1
expect "--mlp-hidden 64 does nothing here" train "${tiny[@]}" --mlp-hidden 64
expect "--node-ranks 0 is invalid; use the ranks per node (1 or more), or leave it out" \
  train "${tiny[@]}" --node-ranks 0
echo '{"qwz_block": 64}' >"$ck3/idle.json"
expect "--qwz-block 64 does nothing here" train "${tiny[@]}" --config "$ck3/idle.json"
# A report's config fed back runs: what was idle is null there, so never given.
for extra in "" "--stage 3 --offload optimizer --offload-dir $ck3" "--stage 1 --qgz int4"; do
  rm -f "$ck3/r.json" "$ck3/again.json"
  # shellcheck disable=SC2086
  if "$zerodp" train "${tiny[@]}" --ranks 2 $extra --report "$ck3/r.json" >/dev/null 2>&1 &&
     "$zerodp" train --config "$ck3/r.json" --no-progress --report "$ck3/again.json" \
       >/dev/null 2>"$ck3/err" &&
     [[ $(/usr/bin/python3 -c 'import json,sys; a,b=(json.load(open(p))["final"]["weights_sha256"] for p in sys.argv[1:]); print(a==b)' "$ck3/r.json" "$ck3/again.json") == True ]]; then
    echo "ok: a report's config runs again to the same weights (${extra:-defaults})"
  else
    echo "FAIL: a report's config fed back (${extra:-defaults}): $(cat "$ck3/err")"; fail=1
  fi
done
# A file size limit (no trap: zerodp ignores SIGXFSZ itself) fails a checkpoint like a full
# disk: the run stops there, says so, leaves no temporary, and writes its report.
rm -rf "$ck3/x" "$ck3/x.json"
err=$(bash -c 'ulimit -f 100; exec "$@"' _ "$zerodp" train "${tiny[@]}" --steps 3 \
  --checkpoint-dir "$ck3/x" --report "$ck3/x.json" 2>&1 >/dev/null)
code=$?
if [[ $code -ne 1 || "$err" != *"not committed"*"File too large"* || ! -f $ck3/x.json ||
      -n $(ls -A "$ck3/x" | grep -v '^.lock$') ]] ||
   ! grep -q '"checkpoint_failed"' "$ck3/x.json"; then
  echo "FAIL: a checkpoint past ulimit -f: exit $code, $err, left: $(ls -A "$ck3/x")"; fail=1
else
  echo "ok: a checkpoint past ulimit -f -> exit 1, report written: $err"
fi
scratch=$(mktemp -d)
err=$(bash -c 'ulimit -f 100; exec "$@"' _ "$zerodp" train "${tiny[@]}" \
  --offload optimizer --offload-dir "$scratch" 2>&1 >/dev/null)
code=$?
if [[ $code -ne 1 || "$err" != *"File too large"*"ulimit -f"* ]]; then
  echo "FAIL: offload past ulimit -f without a trap: exit $code, $err"; fail=1
else
  echo "ok: offload past ulimit -f without a trap -> exit 1: $err"
fi
rm -rf "$scratch" "$ck3"

# --checkpoint-storage: a place for --checkpoint-dir, so nothing without one.
expect "--checkpoint-storage node-local does nothing here: it says where --checkpoint-dir lives" \
  train --size tiny --data synthetic --checkpoint-storage node-local
expect "--checkpoint-storage 'nfs' is unknown; use shared" \
  train --size tiny --data synthetic --checkpoint-storage nfs
# --optimizer-states: fp32 or int8; offloaded, int8 needs pieces of whole 4 KiB blocks of codes.
expect "--optimizer-states int4 is invalid; use fp32 or int8" \
  train --size tiny --data synthetic --optimizer-states int4
expect "--offload-piece 2048 is not a multiple of 4096 elements, which --optimizer-states int8 needs" \
  train --size tiny --data synthetic --optimizer-states int8 --offload optimizer --offload-dir /tmp \
  --offload-piece 2048
