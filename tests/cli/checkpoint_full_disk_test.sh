#!/usr/bin/env bash
# A save onto a full disk, synchronous or in the background, is not committed and stops the run
# with a message naming the shard and the system's reason, whichever rank met it and whichever
# rank's message the run reports; the previous checkpoint stays `latest` and the temporary is
# removed. The disk is a small tmpfs mounted here (root only; skipped with 77 elsewhere).
# Then saves onto a ramfs, which refuses O_DIRECT, fall back to buffered writes.
set -uo pipefail
zerodp=$1
tmp=$(mktemp -d)
disk=$tmp/disk
mkdir -p "$disk"
trap 'umount "$disk" 2>/dev/null; rm -rf "$tmp"' EXIT
fail=0
# Saves at steps 2 and 4 (in the background with --checkpoint-async; the last step's is
# synchronous either way). The tiny model's checkpoint on four ranks is 624 KiB (shards of 148 KiB): after the first,
# 1040 KiB leaves room for two or three of the second's shards, so one or two ranks find the
# disk full and the others, whose message the run may report, must name what they met.
for mode in sync async; do
  for round in 1 2; do
    umount "$disk" 2>/dev/null
    if ! mount -t tmpfs -o size=1040k tmpfs "$disk" 2>/dev/null; then
      echo "skip: cannot mount a tmpfs (needs root)"; exit 77
    fi
    flags=()
    [[ $mode == async ]] && flags=(--checkpoint-async)
    "$zerodp" train --size tiny --data synthetic --no-progress --micro-batch 4 --stage 3 \
      --ranks 4 --steps 5 --checkpoint-every 2 "${flags[@]}" --checkpoint-dir "$disk/ck" \
      >"$tmp/out" 2>&1
    rc=$?
    label="$mode, round $round"
    if [[ $rc == 0 ]]; then echo "FAIL: $label: exit 0 on a full disk"; cat "$tmp/out"; fail=1; continue; fi
    line=$(grep -m1 "not committed" "$tmp/out")
    # The first failing rank's cause: a shard, or rank 0's history, which it writes after
    # its shard into the same temporary.
    named='could not write their files: .*\.tmp\.step_00000004/(rank_0000[0-3]\.safetensors|history\.jsonl)[^ ]*: .*No space left on device'
    if ! [[ $line =~ $named ]]; then
      echo "FAIL: $label: the message does not name the file and the cause:"
      grep "zerodp:" "$tmp/out"
      fail=1; continue
    fi
    if [[ $(cat "$disk/ck/latest" 2>/dev/null) != step_00000002 ]]; then
      echo "FAIL: $label: latest is not the checkpoint before"; ls -la "$disk/ck"; fail=1
    fi
    if compgen -G "$disk/ck/.tmp.*" >/dev/null; then
      echo "FAIL: $label: the temporary is left"; ls -la "$disk/ck"; fail=1
    fi
    echo "ok: $label: exit $rc: $(echo "$line" | cut -c1-170)"
  done
done
# A file system that refuses O_DIRECT at the open (ramfs: EINVAL; tmpfs accepts it on this
# kernel): the shards are written buffered instead, synchronously and in the background, and
# the continuation from them has the bits of the run that never stopped.
common=(--size tiny --data synthetic --no-progress --ranks 2 --stage 1 --steps 6)
want=$("$zerodp" train "${common[@]}" 2>/dev/null | grep -o 'weights sha256 [0-9a-f]*')
for mode in sync async; do
  umount "$disk" 2>/dev/null
  if ! mount -t ramfs ramfs "$disk" 2>/dev/null; then
    echo "skip: cannot mount a ramfs (needs root)"; exit 77
  fi
  if dd if=/dev/zero of="$disk/probe" bs=4096 count=1 oflag=direct 2>/dev/null; then
    echo "FAIL: ramfs took O_DIRECT here; this case tests nothing"; fail=1
  fi
  flags=()
  [[ $mode == async ]] && flags=(--checkpoint-async)
  "$zerodp" train "${common[@]}" --checkpoint-every 2 --stop-after 4 "${flags[@]}" \
    --checkpoint-dir "$disk/ck" >"$tmp/out" 2>&1 &&
    got=$("$zerodp" train "${common[@]}" --checkpoint-dir "$disk/ck" --resume latest 2>>"$tmp/out" |
      grep -o 'weights sha256 [0-9a-f]*')
  if [[ $(cat "$disk/ck/latest" 2>/dev/null) == step_00000006 && -n $want && ${got:-} == "$want" ]]; then
    echo "ok: $mode saves on a file system without O_DIRECT: resumed to $got"
  else
    echo "FAIL: $mode saves without O_DIRECT: '${got:-}' against '$want'"; cat "$tmp/out"; fail=1
  fi
  got=
done
exit $fail
