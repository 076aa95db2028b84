# shellcheck shell=bash disable=SC2034,SC2154  # sourced: $zerodp and $fail are the caller's
# zerodp report: inputs that would block, and an --out that would destroy an input or what
# a link or device stands for. Sourced by errors_test.sh (expect, expect_code, $zerodp, $fail).
rp_dir=$(mktemp -d)
if ! "$zerodp" train --size tiny --data synthetic --steps 2 --report "$rp_dir/s0.json" \
  --metrics "$rp_dir/m.jsonl" --no-progress >"$rp_dir/train.log" 2>&1; then
  echo "FAIL: report cases: the training that makes their report failed:"
  cat "$rp_dir/train.log"
  fail=1
fi
cp "$rp_dir/s0.json" "$rp_dir/s0.orig"

# A FIFO never ends a read: refused before it is opened (it hung until the timeout).
mkfifo "$rp_dir/fifo"
expect "report '$rp_dir/fifo' is a FIFO" report "$rp_dir/fifo" --out "$rp_dir/x.html"
expect "metrics '$rp_dir/fifo' is a FIFO" report "$rp_dir/s0.json" --metrics "$rp_dir/fifo" \
  --out "$rp_dir/x.html"

# An --out that is an input, by name, through a link or as the --metrics log: refused, and
# the input is left as it was.
ln -s s0.json "$rp_dir/link.json"
expect "--out '$rp_dir/s0.json' would overwrite report" report "$rp_dir/s0.json" \
  --out "$rp_dir/s0.json"
expect "would overwrite report '$rp_dir/s0.json'" report "$rp_dir/s0.json" \
  --out "$rp_dir/link.json"
expect "would overwrite --metrics '$rp_dir/m.jsonl'" report "$rp_dir/s0.json" \
  --metrics "$rp_dir/m.jsonl" --out "$rp_dir/m.jsonl"
if ! cmp -s "$rp_dir/s0.json" "$rp_dir/s0.orig" || [[ ! -L "$rp_dir/link.json" ]]; then
  echo "FAIL: a refused report --out changed the input report or its link"
  fail=1
fi
[[ -e "$rp_dir/x.html" ]] && { echo "FAIL: a refused report wrote x.html"; fail=1; }

# A symlinked --out stays a link, and the page lands in its target.
ln -s page.html "$rp_dir/out-link.html"
if ! "$zerodp" report "$rp_dir/s0.json" --out "$rp_dir/out-link.html" --quiet ||
  [[ ! -L "$rp_dir/out-link.html" ]] || ! grep -q '<!DOCTYPE html>' "$rp_dir/page.html"; then
  echo "FAIL: zerodp report --out LINK: the link was replaced or its target not written"
  fail=1
else
  echo "ok: zerodp report --out LINK keeps the link and writes the page to its target"
fi

# A device is written through, never replaced by a regular file. As root a private node of
# /dev/null's kind is used, so a failure cannot replace the real one.
rp_null=/dev/null
if [[ $EUID -eq 0 ]] && mknod "$rp_dir/null" c 1 3 2>/dev/null; then rp_null=$rp_dir/null; fi
if ! "$zerodp" report "$rp_dir/s0.json" --out "$rp_null" --quiet || [[ ! -c $rp_null ]]; then
  echo "FAIL: zerodp report --out $rp_null: failed, or the device is no longer a device"
  fail=1
else
  echo "ok: zerodp report --out $rp_null writes through the device"
fi
rm -rf "$rp_dir"
unset rp_dir rp_null
