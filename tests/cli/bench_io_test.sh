#!/usr/bin/env bash
# zerodp bench-io measures a directory's disk and leaves nothing in it: both directions
# timed, every block read back as written, the scratch file gone, whatever the O_DIRECT
# support of the file system under the build tree.
set -euo pipefail
zerodp=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
for direct in auto off; do
  "$zerodp" bench-io "$tmp" --size 8MiB --block 1MiB --repeats 2 --direct "$direct" --json >"$tmp/../bench-io.$$.json"
  if /usr/bin/env python3 - "$tmp/../bench-io.$$.json" "$direct" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["bytes"] == 8 << 20 and j["block_bytes"] == 1 << 20, j
assert j["write_bytes_per_second"] > 0 and j["read_bytes_per_second"] > 0, j
assert j["update_bytes_per_second"] > 0 and j["unsynced_write_bytes_per_second"] > 0, j
assert j["wrong_blocks"] == 0, j
if sys.argv[2] == "off":
    assert j["direct"] is False, j
PY
  then echo "ok: bench-io --direct $direct: $(cat "$tmp/../bench-io.$$.json")"
  else echo "FAIL: bench-io --direct $direct"; fail=1
  fi
  rm -f "$tmp/../bench-io.$$.json"
  if [[ -n $(ls -A "$tmp") ]]; then echo "FAIL: bench-io left $(ls -A "$tmp") behind"; fail=1; fi
done
# Three blocks, the fewest the update pass (three regions of whole blocks) can move, measure
# it; fewer are refused (errors.d/estimate.sh).
if "$zerodp" bench-io "$tmp" --size 12KiB --block 4KiB --repeats 1 --json >"$tmp/../bench-io.$$.json" &&
  /usr/bin/env python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); assert j["update_bytes_per_second"] > 0, j' \
    "$tmp/../bench-io.$$.json"; then
  echo "ok: bench-io --size 12KiB --block 4KiB measures the update pass"
else
  echo "FAIL: bench-io --size 12KiB --block 4KiB: $(cat "$tmp/../bench-io.$$.json")"; fail=1
fi
rm -f "$tmp/../bench-io.$$.json"
# A size past the free space is refused before anything is written (exit 1, named).
err=$("$zerodp" bench-io "$tmp" --size 1000TiB 2>&1 >/dev/null) && rc=0 || rc=$?
if [[ $rc != 1 || $err != *"does not fit in $tmp"* ]]; then
  echo "FAIL: bench-io past the free space: exit $rc: $err"; fail=1
else
  echo "ok: $err"
fi
exit $fail
