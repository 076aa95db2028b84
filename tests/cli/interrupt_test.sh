#!/usr/bin/env bash
# SIGINT / SIGTERM during `zerodp train`: every rank finishes its step, the checkpoint and
# the report are written (the report says it was interrupted), and the exit code is
# 128 + the signal; a second signal exits at once. Local and under mpirun, where the signal
# reaches one rank only. Prints the time from the signal to the exit.
set -uo pipefail
zerodp=$(realpath "$1")
mpirun=${2:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
failed() { echo "FAIL: $*"; fail=1; }
now() { date +%s.%N; }
# Waits until FILE holds at least N lines (a run's --metrics: steps done), up to 60 s.
wait_lines() {
  for _ in $(seq 600); do
    [[ -f $1 && $(wc -l <"$1") -ge $2 ]] && return 0
    sleep 0.1
  done
  return 1
}
json() { /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$3"; }
common=(--size tiny --data synthetic --schedule constant --warmup 0 --no-progress)

# 1. SIGTERM, local ranks: checkpoint, report, exit 143; the continuation is the run that
#    never stopped, bit for bit (a constant schedule does not depend on --steps).
d=$tmp/local
mkdir -p "$d"
"$zerodp" train "${common[@]}" --ranks 3 --stage 3 --steps 1000000 --checkpoint-dir "$d/ck" \
  --report "$d/r.json" --metrics "$d/m.jsonl" >"$d/out" 2>"$d/err" &
pid=$!
wait_lines "$d/m.jsonl" 5 || failed "local: no steps after 60 s"
t0=$(now)
kill -TERM $pid
wait $pid
rc=$?
took=$(echo "$(now) - $t0" | bc)
k=$(json "$d/r.json" "d['stopped']['after_step']" "$d/r.json" 2>/dev/null || echo none)
if [[ $rc -ne 143 ]] || ! grep -q "interrupted by SIGTERM after step $k of 1000000; checkpoint committed" "$d/err" ||
  [[ $(cat "$d/ck/latest" 2>/dev/null) != "$(printf 'step_%08d' "$k")" ]] ||
  [[ $(json "$d/r.json" "d['stopped']['reason']" "$d/r.json") != signal ]]; then
  failed "local SIGTERM: exit $rc, stopped after '$k', latest $(cat "$d/ck/latest" 2>/dev/null)"
  cat "$d/err"
else
  echo "ok: local SIGTERM (3 ranks, stage 3): exit 143 after ${took}s, checkpoint and report at step $k"
fi
if [[ $k =~ ^[0-9]+$ ]]; then
  n=$((k + 3))
  ref=$("$zerodp" train "${common[@]}" --ranks 3 --stage 3 --steps $n 2>/dev/null | grep -o 'weights sha256 [0-9a-f]*')
  cont=$("$zerodp" train "${common[@]}" --ranks 3 --stage 3 --steps $n --checkpoint-dir "$d/ck" \
    --resume latest --report "$d/cont.json" 2>/dev/null | grep -o 'weights sha256 [0-9a-f]*')
  if [[ -z $ref || $ref != "$cont" ]]; then
    failed "continuation after SIGTERM: '$cont', the uninterrupted run: '$ref'"
  else
    echo "ok: continued from step $k to $n: $cont, as the run that never stopped"
  fi
  # The continuation's report and page carry every step from 1, its own counted apart.
  "$zerodp" report "$d/cont.json" --out "$d/cont.html" 2>/dev/null
  if /usr/bin/python3 - "$d/cont.json" "$d/cont.html" "$k" "$n" <<'PY'
import json, re, sys
report = json.load(open(sys.argv[1]))
k, n = int(sys.argv[3]), int(sys.argv[4])
assert [s["step"] for s in report["history"]] == list(range(1, k + 1)), report["history"][:3]
assert [s["step"] for s in report["steps"]] == list(range(k + 1, n + 1))
page = open(sys.argv[2]).read()
data = json.loads(re.search(r'id="zerodp-data">(.*?)</script>', page, re.S).group(1))
run = data["runs"][0]  # each step is [step, loss, val_loss]
assert [s[0] for s in run["steps"]] == list(range(1, n + 1)), run["steps"][:3]
assert run["step_count"] == n - k
PY
  then
    echo "ok: the continuation's report and page hold steps 1..$n (history 1..$k)"
  else
    failed "the continuation's report or page lost the steps before $k"
  fi
fi

# 2. SIGINT without --checkpoint-dir: exit 130, the report still written and marked.
d=$tmp/int
mkdir -p "$d"
"$zerodp" train "${common[@]}" --ranks 2 --steps 1000000 --report "$d/r.json" \
  --metrics "$d/m.jsonl" >/dev/null 2>"$d/err" &
pid=$!
wait_lines "$d/m.jsonl" 3
kill -INT $pid
wait $pid
rc=$?
if [[ $rc -ne 130 ]] || ! grep -q "no checkpoint (pass --checkpoint-dir" "$d/err" ||
  [[ $(json "$d/r.json" "d['stopped']['signal']" "$d/r.json") != SIGINT ]]; then
  failed "local SIGINT: exit $rc"; cat "$d/err"
else
  echo "ok: local SIGINT: exit 130, report marked SIGINT"
fi

# 3. A second signal ends the process at once, even inside a long step (a rank hangs).
d=$tmp/twice
mkdir -p "$d"
"$zerodp" train "${common[@]}" --ranks 2 --steps 100 --collective-timeout 60 --inject hang@3 \
  --checkpoint-dir "$d/ck" --metrics "$d/m.jsonl" >/dev/null 2>"$d/err" &
pid=$!
wait_lines "$d/m.jsonl" 2
sleep 0.5
kill -TERM $pid
sleep 0.5
t0=$(now)
kill -TERM $pid
wait $pid
rc=$?
took=$(echo "$(now) - $t0" | bc)
if [[ $rc -ne 143 ]] || ! grep -q "second signal, exiting now" "$d/err" || [[ -d $d/ck/step_00000003 ]] ||
  (($(echo "$took > 5" | bc))); then
  failed "second SIGTERM: exit $rc after ${took}s"; cat "$d/err"
else
  echo "ok: second SIGTERM inside a hung step: exit 143 after ${took}s, nothing saved"
fi

# 4. --max-skips stops the run, and the report is still written.
d=$tmp/skips
mkdir -p "$d"
"$zerodp" train "${common[@]}" --ranks 2 --steps 20 --inject nan@3:1 --max-skips 1 \
  --report "$d/r.json" >/dev/null 2>"$d/err"
rc=$?
if [[ $rc -ne 1 ]] || [[ $(json "$d/r.json" "d['stopped']['reason']" "$d/r.json" 2>/dev/null) != max_skips ]] ||
  ! grep -q "1 consecutive steps skipped" "$d/err"; then
  failed "--max-skips: exit $rc, report: $(cat "$d/r.json" 2>/dev/null | head -c 200)"; cat "$d/err"
else
  echo "ok: --max-skips 1: exit 1, report written and marked max_skips"
fi

# 4b. --checkpoint-signal-wait holds when the signal lands while a due save waits for the
#     staging (the save of step 5 written 2 s slower): the wait ends, the due save is given
#     up, and the signal's save waits no longer than 0.1 s for the write in flight. Before,
#     the wait ran out the slow write first (1.3-1.95 s).
d=$tmp/signal-wait
mkdir -p "$d"
"$zerodp" train "${common[@]}" --ranks 2 --stage 1 --steps 400 --checkpoint-async \
  --checkpoint-every 5 --checkpoint-dir "$d/ck" --checkpoint-signal-wait 0.1s --inject slowio@5 \
  --metrics "$d/m.jsonl" >/dev/null 2>"$d/err" &
pid=$!
wait_lines "$d/m.jsonl" 9 || failed "signal wait: no steps after 60 s"
t0=$(now)
kill -TERM $pid
wait $pid
rc=$?
took=$(echo "$(now) - $t0" | bc)
if [[ $rc -ne 143 ]] || (($(echo "$took > 1.0" | bc))) ||
  ! grep -q "after --checkpoint-signal-wait 0.1s and was abandoned" "$d/err"; then
  failed "--checkpoint-signal-wait 0.1s during a wait for the staging: exit $rc after ${took}s"
  cat "$d/err"
else
  echo "ok: --checkpoint-signal-wait 0.1s with a due save waiting on a slow write: exit 143 after ${took}s"
fi

# 4c. A signal before the first step ends the run at once: start-up has nothing to save.
#     The lock file says the handlers are set; `medium` then takes a second to its first step
#     (the plan, the preflight, the GEMM calibration).
d=$tmp/before
mkdir -p "$d"
"$zerodp" train --size medium --data synthetic --no-progress --ranks 2 --steps 2 \
  --checkpoint-dir "$d/ck" >/dev/null 2>"$d/err" &
pid=$!
for _ in $(seq 600); do [[ -e $d/ck/.lock ]] && break; sleep 0.01; done
t0=$(now)
kill -TERM $pid
wait $pid
rc=$?
took=$(echo "$(now) - $t0" | bc)
if [[ $rc -ne 143 ]] || (($(echo "$took > 1.0" | bc))) ||
  ! grep -q "interrupted before the first step" "$d/err"; then
  failed "SIGTERM during start-up: exit $rc after ${took}s"; cat "$d/err"
else
  echo "ok: SIGTERM during start-up: exit 143 after ${took}s, $(tail -1 "$d/err")"
fi

# 4d. Outputs that are FIFOs: one that nobody reads is refused where it is opened (an open
#     that blocked held the process deaf to SIGTERM), one with a reader gets every line, and
#     a reader that leaves early (head -n 2) ends the run with a message, not a silent SIGPIPE.
d=$tmp/fifo
mkdir -p "$d"
mkfifo "$d/report" "$d/metrics" "$d/early"
timeout -s KILL 60 "$zerodp" train "${common[@]}" --steps 3 --report "$d/report" >"$d/out" 2>"$d/err"
rc=$?
if [[ $rc -eq 137 ]] || [[ $rc -eq 0 ]] || ! grep -q "report '$d/report' is a FIFO that nobody reads; start its reader first" "$d/err"; then
  failed "--report FIFO without a reader: exit $rc"; cat "$d/err"
else
  echo "ok: --report FIFO without a reader refused at once (exit $rc)"
fi
timeout -s KILL 60 "$zerodp" train "${common[@]}" --steps 3 --metrics "$d/metrics" >"$d/out" 2>"$d/err"
rc=$?
if [[ $rc -eq 137 ]] || [[ $rc -eq 0 ]] || ! grep -q "metrics '$d/metrics' is a FIFO that nobody reads" "$d/err"; then
  failed "--metrics FIFO without a reader: exit $rc"; cat "$d/err"
else
  echo "ok: --metrics FIFO without a reader refused (exit $rc)"
fi
cat "$d/metrics" >"$d/m.jsonl" &
reader=$!
timeout -s KILL 60 "$zerodp" train "${common[@]}" --steps 4 --metrics "$d/metrics" >"$d/out" 2>"$d/err"
rc=$?
wait $reader
if [[ $rc -ne 0 ]] || [[ $(wc -l <"$d/m.jsonl") -ne 4 ]]; then
  failed "--metrics FIFO with a reader: exit $rc, $(wc -l <"$d/m.jsonl") lines"; cat "$d/err"
else
  echo "ok: --metrics FIFO with a reader: 4 lines"
fi
head -n 2 "$d/early" >/dev/null &
timeout -s KILL 60 "$zerodp" train "${common[@]}" --steps 200 --metrics "$d/early" >"$d/out" 2>"$d/err"
rc=$?
if [[ $rc -eq 0 ]] || [[ $rc -ge 128 ]] || ! grep -q "metrics: cannot write '$d/early': Broken pipe" "$d/err"; then
  failed "--metrics FIFO whose reader leaves: exit $rc"; cat "$d/err"
else
  echo "ok: --metrics FIFO whose reader leaves: exit $rc, named"
fi

# 5. Under mpirun: SIGTERM to one rank's process only. The other rank learns of it in the
#    step's control exchange; both stop after the same step and commit one checkpoint.
if [[ -n $mpirun ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  d=$tmp/mpi
  mkdir -p "$d"
  "$mpirun" -np 2 --oversubscribe "$zerodp" train "${common[@]}" --backend mpi --stage 2 \
    --steps 1000000 --checkpoint-dir "$d/ck" --report "$d/r.json" --metrics "$d/m.jsonl" \
    >"$d/out" 2>"$d/err" &
  job=$!
  wait_lines "$d/m.jsonl" 5 || failed "mpi: no steps after 60 s"
  ranks=($(pgrep -P $job -x zerodp))
  t0=$(now)
  kill -TERM "${ranks[1]:-${ranks[0]}}"
  wait $job
  rc=$?
  took=$(echo "$(now) - $t0" | bc)
  k=$(json "$d/r.json" "d['stopped']['after_step']" "$d/r.json" 2>/dev/null || echo none)
  if [[ $rc -ne 143 ]] || [[ ${#ranks[@]} -ne 2 ]] ||
    [[ $(cat "$d/ck/latest" 2>/dev/null) != "$(printf 'step_%08d' "$k")" ]] ||
    ! grep -q "interrupted by SIGTERM after step $k" "$d/err"; then
    failed "mpi SIGTERM to one rank: exit $rc, ${#ranks[@]} rank pids, stopped after '$k'"
    cat "$d/err"
  else
    echo "ok: mpirun -np 2, SIGTERM to rank pid ${ranks[1]} only: exit 143 after ${took}s, both ranks stopped after step $k"
  fi

  # SIGTERM to mpirun itself: OpenMPI sends SIGCONT, waits odls_base_sigkill_timeout
  # seconds, sends SIGTERM, waits as long again, then SIGKILL. The ranks have that long to
  # finish the step, save and report.
  d=$tmp/mpirun
  mkdir -p "$d"
  "$mpirun" -np 2 --oversubscribe --mca odls_base_sigkill_timeout 3 "$zerodp" train \
    "${common[@]}" --backend mpi --steps 1000000 --checkpoint-dir "$d/ck" --report "$d/r.json" \
    --metrics "$d/m.jsonl" >"$d/out" 2>"$d/err" &
  job=$!
  wait_lines "$d/m.jsonl" 5 || failed "mpirun: no steps after 60 s"
  t0=$(now)
  kill -TERM $job
  wait $job
  rc=$?
  took=$(echo "$(now) - $t0" | bc)
  k=$(json "$d/r.json" "d['stopped']['after_step']" "$d/r.json" 2>/dev/null || echo none)
  if [[ $(cat "$d/ck/latest" 2>/dev/null) != "$(printf 'step_%08d' "$k")" ]]; then
    failed "SIGTERM to mpirun (sigkill timeout 3 s): exit $rc, stopped after '$k'"; cat "$d/err"
  else
    echo "ok: SIGTERM to mpirun, --mca odls_base_sigkill_timeout 3: checkpoint and report at step $k, mpirun exit $rc after ${took}s"
  fi
fi
exit $fail
