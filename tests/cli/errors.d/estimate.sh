# estimate and bench-comm: numbers that mean nothing are refused before any work, and sizes
# are checked against the machine before they are allocated. Sourced by errors_test.sh.

# A parameter count is a whole number; a flag train bounds is bounded here too.
expect "--params '1.5'" estimate --params 1.5
expect "--params '12abc'" estimate --params 12abc
expect "--prefetch 100 is invalid; use 0..8" estimate --params 7.5e9 --prefetch 100
expect "--prefetch -1" estimate --params 7.5e9 --prefetch -1
expect "--stage '3.5'" estimate --params 7.5e9 --stage 3.5
expect "--flops 'inf'" estimate --layers 2 --heads 2 --embd 8 --seq-len 8 --flops inf
expect "--flops '1e9x'" estimate --layers 2 --heads 2 --embd 8 --seq-len 8 --flops 1e9x
expect "--memory-per-rank 0" estimate --params 7.5e9 --memory-per-rank 0
expect "not both" estimate --params 7.5e9 --heads 4
expect "give either --params or a model's shape (--model and the rest), not both" \
  estimate --params 7.5e9 --model llama
expect "--model mlp: estimate prices a gpt or a llama" estimate --model mlp
expect "past 2^64" estimate --params 1e15 --ranks 1000000
# A bad rank count later in the list is refused before the first row is printed.
out=$(timeout 20 "$zerodp" estimate --params 100 --ranks 4,0 2>/dev/null)
if [[ $? -ne 2 || -n "$out" ]]; then
  echo "FAIL: zerodp estimate --ranks 4,0 printed rows before refusing: $out"
  fail=1
else
  echo "ok: zerodp estimate --params 100 --ranks 4,0 -> exit 2, nothing on stdout"
fi

# A million ranks: the per-rank work is closed form, not a loop over every rank per rank.
out=$(timeout 20 "$zerodp" estimate --params 7.5e9 --ranks 1000000 2>&1)
if [[ $? -ne 0 || "$out" != *"1000000     3"* ]]; then
  echo "FAIL: zerodp estimate --params 7.5e9 --ranks 1000000 (20 s limit): $out"
  fail=1
else
  echo "ok: zerodp estimate --params 7.5e9 --ranks 1000000 within 20 s"
fi

bench=(bench-comm --ops broadcast --dtypes f32 --min-bytes 4 --max-bytes 16)
expect "--seconds-per-row nan is invalid" "${bench[@]}" --seconds-per-row nan
expect "--seconds-per-row inf is invalid" "${bench[@]}" --seconds-per-row inf
expect "--seconds-per-row 0 is invalid" "${bench[@]}" --seconds-per-row 0
expect "--seconds-per-row -1 is invalid" "${bench[@]}" --seconds-per-row -1
expect "--collective-timeout inf is invalid" "${bench[@]}" --collective-timeout inf
expect "--collective-timeout nan is invalid" "${bench[@]}" --collective-timeout nan
expect "--min-bytes 2 is invalid" bench-comm --min-bytes 2
expect "--min-bytes 100GiB is more than --max-bytes 256MiB" bench-comm --min-bytes 100GiB
# Sizes past the machine's memory: exit 1 (OutOfMemory, as train's preflight), named, no
# bad_alloc. 100 TiB exceeds any machine this runs on.
expect_code 1 "--max-bytes 100TiB: the largest row needs" bench-comm --min-bytes 100TiB --max-bytes 100TiB
expect_code 1 "4000 rank(s) x 2 buffers" bench-comm --ranks 4000 --min-bytes 1GiB --max-bytes 1GiB
expect "it needs --node-ranks T" estimate --params 1e6 --ranks 4 --stage 3 --shard-within-node
expect "--stage 0 shards none" estimate --params 1e6 --ranks 4 --node-ranks 2 --stage 0 --shard-within-node
expect "--ranks-per-process 2 is for --backend mpi" bench-comm --ranks-per-process 2 --max-bytes 4KiB
expect "bench-io: /nonexistent-zerodp does not exist" bench-io /nonexistent-zerodp
expect "is not a directory" bench-io /etc/hostname
expect "--block 1000 is invalid" bench-io /tmp --block 1000
expect "--size 3MiB is invalid; use a whole number of --block" bench-io /tmp --size 3MiB --block 2MiB
expect "--direct 'maybe' is invalid" bench-io /tmp --direct maybe --size 4MiB --block 4MiB
# The update pass moves three regions of whole blocks: fewer than three blocks measured
# nothing and printed "update 0.0 MB/s", the figure estimate --disk-bandwidth takes.
expect "--size 4MiB is 1 block of --block 4MiB, but the update pass moves whole blocks of three regions and needs 3 blocks or more; use --size 12MiB or more, or --block 1MiB" \
  bench-io /tmp --size 4MiB --block 4MiB
expect "--size 8MiB is 2 blocks of --block 4MiB" bench-io /tmp --size 8MiB --block 4MiB
expect "needs 3 blocks or more; use --size 12KiB or more" bench-io /tmp --size 8KiB --block 4KiB
# Links and disks in the ranges train takes (train/config.h): past them an estimate prices
# what no run can be (a disk of 1e20 B/s printed as 0.00 KB/s).
off=(estimate --params 1e6 --ranks 4 --offload optimizer)
expect "--disk-bandwidth 1e20 is out of range; use 1 MB/s to 1 TB/s" "${off[@]}" --disk-bandwidth 1e20
expect "--disk-bandwidth 1e308 is out of range" "${off[@]}" --disk-bandwidth 1e308
expect "--disk-bandwidth 10KB/s is out of range" "${off[@]}" --disk-bandwidth 10KB/s
expect "--disk-bandwidth READ 1e20 is out of range" "${off[@]}" --disk-bandwidth 1e20/1e9
expect "--disk-bandwidth WRITE 1e3 is out of range" "${off[@]}" --disk-bandwidth 2GB/s/1e3
expect "--link-latency 2s is out of range; use 0 s to 1 s" estimate --params 1e6 --link-latency 2s
expect "--link-bandwidth 1e20 is out of range; use 1 KB/s to 10 TB/s" estimate --params 1e6 \
  --link-bandwidth 1e20
expect "--link-bandwidth 10 is out of range" estimate --params 1e6 --link-bandwidth 10
expect "--inter-node-latency 1e6 is out of range; use 0 s to 1 s" estimate --params 1e6 --ranks 4 \
  --node-ranks 2 --inter-node-latency 1e6
expect "--inter-node-bandwidth 1e14 is out of range; use 1 KB/s to 10 TB/s" estimate --params 1e6 \
  --ranks 4 --node-ranks 2 --inter-node-bandwidth 1e14
# Block sizes as text, as train checks them: -1 would wrap to 2^64 - 1.
expect "--qgz-block -1 is invalid; use the elements per scale, 1 to 16777216" \
  estimate --params 1e9 --ranks 8 --qgz int8 --qgz-block -1
expect "--qwz-block 4294967297 is invalid; use the elements per scale, 1 to 16777216" \
  estimate --params 1e9 --ranks 8 --stage 3 --qwz --qwz-block 4294967297
expect "--flops and --compute-seconds both give the compute of a step" \
  estimate --params 1e9 --ranks 2 --flops 1e12 --compute-seconds 0.2
expect "--compute-seconds: '-1' is not a duration" \
  estimate --params 1e9 --ranks 2 --compute-seconds -1
expect "--compute-seconds 2day is out of range; use 1 us to 1 day" \
  estimate --params 1e9 --ranks 2 --compute-seconds 2day
# DiLoCo's options without --islands, as train refuses them.
expect "--fragments 4 does nothing here: it streams DiLoCo's outer steps; add --islands K" \
  estimate --params 1e9 --ranks 2 --fragments 4
expect "--outer-every 8 does nothing here: it spaces DiLoCo's outer steps; add --islands K" \
  estimate --params 1e9 --ranks 2 --outer-every 8
expect "--fragments 100000000 is invalid; use a number of fragments from 1 to 1000000" \
  estimate --params 1e9 --ranks 4 --islands 2 --outer-every 100000000 --fragments 100000000
expect "--fragments 1000000 would split the model's" \
  estimate --layers 2 --heads 2 --embd 32 --seq-len 32 --vocab 256 --ranks 2 --islands 2 \
  --outer-every 1000000 --fragments 1000000
# A measured compute is the step's compute as given.
cs=$("$zerodp" estimate --layers 2 --heads 2 --embd 32 --seq-len 32 --vocab 256 --ranks 4 \
  --node-ranks 2 --stage 3 --inter-node-bandwidth 1MB/s --compute-seconds 0.25 --json 2>&1 |
  /usr/bin/python3 -c 'import json,sys; r=[x for x in json.load(sys.stdin) if x["stage"]==3][0]; print(r["step_seconds"]["compute"])')
if [[ $cs == 0.25 ]]; then
  echo "ok: estimate --compute-seconds 0.25 prices a step's compute at 0.25 s"
else
  echo "FAIL: estimate --compute-seconds 0.25 gave compute $cs"; fail=1
fi

# The options estimate shares with train are declared once (train/options.h): the same help.
for flag in --node-ranks --qgz --offload --micro-batch --link-bandwidth --hpz; do
  t=$("$zerodp" train --help | grep -F -- "    $flag " | head -1 | sed 's/^ *//')
  e=$("$zerodp" estimate --help | grep -F -- "  $flag " | head -1 | sed 's/^ *//')
  if [[ -n "$t" && "$t" == "$e" ]]; then
    echo "ok: $flag: one declaration for train and estimate"
  else
    echo "FAIL: $flag differs: train '$t' estimate '$e'"; fail=1
  fi
done

# bench-comm's host rate: an all-gather over 2 hosts of 2 brings each host S bytes (its 2
# ranks each receive the other host's 2 shards of S/4), so host_MB/s is the algbw.
expect "--node-ranks 3 does not divide --ranks 4: a world is whole nodes; use a divisor of 4" bench-comm --ranks 4 --node-ranks 3
expect "--node-ranks -1 is invalid; use the ranks per node (1 or more), or leave it out for one node" \
  bench-comm --ranks 4 --node-ranks -1
row=$("$zerodp" bench-comm --ranks 4 --node-ranks 2 --ops all_gather --dtypes f32 --min-bytes 1MiB \
  --max-bytes 1MiB --json --seconds-per-row 0.05)
if /usr/bin/python3 -c 'import json,sys; r=json.loads(sys.argv[1]); assert abs(r["host_bytes_per_s"] / (r["algbw"] * 1e9) - 1) < 1e-6, r' "$row"; then
  echo "ok: bench-comm --node-ranks 2: host rate = algbw for an all-gather over 2 hosts of 2"
else
  echo "FAIL: bench-comm host rate: $row"; fail=1
fi
# An empty value is named as one; a stage listed twice is one row.
expect "--ranks '' is invalid; use 1 or more" estimate --params 1e9 --ranks ""
rows=$("$zerodp" estimate --params 1e9 --ranks 2 --stage 3,1,3 | grep -c '^ *2 ')
if [[ $rows == 2 ]]; then echo "ok: --stage 3,1,3 prints stages 1 and 3 once"; else echo "FAIL: --stage 3,1,3 printed $rows rows"; fail=1; fi
# estimate takes train's check of the run (train/run_check.h): an option with nothing to act on
# at every stage it sweeps is refused as train refuses it, and each row's rank count meets the
# world's rules before the first row is printed.
expect "--qwz-block 64 does nothing here: it sizes --qwz's blocks, and --qwz is off; add --qwz, or leave --qwz-block out" \
  estimate --params 1e9 --ranks 8 --qwz-block 64
expect "--prefetch 2 does nothing here: it sets how many units stage 3 gathers ahead" \
  estimate --params 1e9 --ranks 8 --stage 1,2 --prefetch 2
expect "--offload-overlap on does nothing here: it overlaps --offload's update, and --offload is none" \
  estimate --params 1e9 --ranks 8 --offload-overlap on
expect "--kv-heads 2 does nothing here: it shapes a llama; use --model llama" \
  estimate --layers 2 --heads 2 --embd 32 --seq-len 32 --kv-heads 2
expect "--node-ranks 0 is invalid; use the ranks per node (1 or more), or leave it out for one node" \
  estimate --params 1e9 --ranks 4 --node-ranks 0
expect "--hpz keeps a node's copy of stage 3's gathered parameters; --stage 1 gathers none" \
  estimate --params 1e9 --ranks 4 --node-ranks 2 --stage 0,1 --hpz
expect "--offload optimizer,params puts each rank's parameter shard on disk, and only stage 3 shards parameters (at stage 2" \
  estimate --params 1e9 --ranks 4 --stage 1,2 --offload optimizer,params
if "$zerodp" estimate --params 1e9 --ranks 4 --stage 0,2 --offload optimizer --offload-overlap on \
  >/dev/null 2>&1; then
  echo "ok: estimate --stage 0,2 --offload-overlap on: stage 0 overlaps, so the sweep takes it"
else
  echo "FAIL: estimate --stage 0,2 --offload-overlap on was refused"; fail=1
fi
out=$(timeout 20 "$zerodp" estimate --params 1e9 --ranks 4,12 --islands 2 --node-ranks 4 2>&1 >/dev/null)
rows=$(timeout 20 "$zerodp" estimate --params 1e9 --ranks 4,12 --islands 2 --node-ranks 4 2>/dev/null)
if [[ "$out" == *"--islands 2 of 6 ranks each and --node-ranks 4: an island must be whole nodes"* && -z "$rows" ]]; then
  echo "ok: estimate --ranks 4,12 --islands 2 --node-ranks 4 -> refused before the first row"
else
  echo "FAIL: estimate --ranks 4,12 --islands 2 --node-ranks 4: stdout '$rows', stderr '$out'"; fail=1
fi
