#!/usr/bin/env bash
# zerodp tokenizer: a BPE tokenizer trained on a KJV excerpt; encode then decode gives a file
# back byte for byte (the excerpt, and hostile text: tabs, CRLF, runs of spaces, emoji, U+2581,
# no final newline), through files and through pipes; --input kjv; and the refusals (a missing
# input, --vocab 0, the output onto an input, a damaged model, text that is not UTF-8, ids that
# are not ids), each with its exit code and one line naming the culprit. Skipped (77) without
# the bible program (Debian's bible-kjv).
set -uo pipefail
zerodp=$1
command -v bible >/dev/null || { echo "skip: bible (bible-kjv) is not installed"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }

tok() {  # tok ARGS...: zerodp tokenizer ARGS, must succeed
  if ! timeout 120 "$zerodp" tokenizer "$@" 2>"$tmp/err"; then
    bad "zerodp tokenizer $*: exit $?, stderr: $(cat "$tmp/err")"
    return 1
  fi
}

# --input kjv: the cached KJV text, here a sample of it; the excerpt for the rest is its head.
tok train --input kjv --cache-dir "$tmp/cache" --sample-lines 3000 --vocab 600 \
  --out "$tmp/sampled.model" && grep -q "a sample of 3000 lines" "$tmp/err" &&
  ok "--input kjv --sample-lines 3000: $(tail -n 1 "$tmp/err")"
kjv=$(ls "$tmp"/cache/kjv-*.txt)
head -n 2500 "$kjv" >"$tmp/excerpt.txt"

tok train --input "$tmp/excerpt.txt" --vocab 1000 --out "$tmp/kjv.model" || exit 1
cat "$tmp/err"
grep -q "training bpe to 1000 pieces on every line" "$tmp/err" && ok "trained on every line"
tok info --tokenizer "$tmp/kjv.model" >"$tmp/info" &&
  grep -q "1000 pieces, bpe (normalizer identity), unk 0, bos 1, eos 2, pad -1, lossless" \
    "$tmp/info" && ok "info: $(head -n 1 "$tmp/info")"
sha=$(sha256sum "$tmp/kjv.model" | cut -d' ' -f1)
grep -q "sha256 $sha" "$tmp/info" && ok "info's sha256 is the file's"

roundtrip() {  # roundtrip FILE: encode to a file, decode to a file, compare
  local f=$1
  tok encode --tokenizer "$tmp/kjv.model" "$f" --out "$tmp/ids" || return 1
  tok decode --tokenizer "$tmp/kjv.model" "$tmp/ids" --out "$tmp/back" || return 1
  if cmp "$tmp/back" "$f"; then
    ok "$(basename "$f"): $(wc -c <"$f") bytes -> $(wc -w <"$tmp/ids") tokens -> the same bytes"
  else
    bad "$(basename "$f") did not come back byte for byte"
  fi
}
roundtrip "$tmp/excerpt.txt"
if [[ $(wc -l <"$tmp/ids") -eq $(wc -l <"$tmp/excerpt.txt") ]]; then
  ok "one line of ids per line of text"
else
  bad "$(wc -l <"$tmp/ids") lines of ids for $(wc -l <"$tmp/excerpt.txt") lines of text"
fi
printf '  Ge1:1\tIn the\r\nbeginning   God ▁ created 😀 日本 the heaven.\n\n\n\t end' >"$tmp/hostile.txt"
roundtrip "$tmp/hostile.txt"
: >"$tmp/empty.txt"
roundtrip "$tmp/empty.txt"

# Through pipes, with bos and eos (which decode to nothing).
if "$zerodp" tokenizer encode --tokenizer "$tmp/kjv.model" --bos --eos --quiet <"$tmp/hostile.txt" |
  "$zerodp" tokenizer decode --tokenizer "$tmp/kjv.model" --quiet | cmp - "$tmp/hostile.txt"; then
  ok "stdin -> encode --bos --eos -> decode -> stdout"
else
  bad "the pipe did not give the text back"
fi
first=$("$zerodp" tokenizer encode --tokenizer "$tmp/kjv.model" --bos --quiet <"$tmp/hostile.txt" |
  head -n 1 | cut -d' ' -f1)
[[ $first == 1 ]] && ok "--bos starts with id 1" || bad "--bos started with $first"

expect() {  # expect CODE NEEDLE ARGS...: exit CODE, one stderr line containing NEEDLE
  local code=$1 needle=$2
  shift 2
  local err got
  timeout 60 "$zerodp" tokenizer "$@" >/dev/null 2>"$tmp/err"
  got=$?
  err=$(cat "$tmp/err")
  if [[ $got -ne $code || "$err" != *"$needle"* || $(printf '%s\n' "$err" | wc -l) -ne 1 ]]; then
    bad "zerodp tokenizer $*: exit $got, stderr: $err (wanted exit $code and '$needle')"
  else
    ok "zerodp tokenizer $* -> $code: $err"
  fi
}
expect 2 "$tmp/no-such.txt" train --input "$tmp/no-such.txt" --vocab 1000 --out "$tmp/x.model"
expect 2 "--vocab 0" train --input "$tmp/excerpt.txt" --vocab 0 --out "$tmp/x.model"
expect 2 "--vocab 100000 is too large" train --input "$tmp/excerpt.txt" --vocab 100000 \
  --out "$tmp/x.model"
expect 2 "--type 'wordpiece' is unknown" train --input "$tmp/excerpt.txt" --vocab 1000 \
  --type wordpiece --out "$tmp/x.model"
cp "$tmp/excerpt.txt" "$tmp/keep.txt"
expect 2 "--out" train --input "$tmp/excerpt.txt" --vocab 1000 --out "$tmp/excerpt.txt"
cmp -s "$tmp/excerpt.txt" "$tmp/keep.txt" && ok "the input is untouched" || bad "the input changed"
[[ ! -e $tmp/x.model ]] && ok "no model written by a refused run" || bad "x.model was written"
expect 2 "$tmp/kjv.model" encode --tokenizer "$tmp/kjv.model" "$tmp/excerpt.txt" \
  --out "$tmp/kjv.model"
head -c 300 "$tmp/kjv.model" >"$tmp/damaged.model"
expect 3 "$tmp/damaged.model" encode --tokenizer "$tmp/damaged.model" "$tmp/excerpt.txt"
expect 2 "$tmp/no-such.model" encode --tokenizer "$tmp/no-such.model" "$tmp/excerpt.txt"
printf 'caf\xe9\n' >"$tmp/latin1.txt"
expect 2 "not UTF-8 at byte 3" encode --tokenizer "$tmp/kjv.model" "$tmp/latin1.txt"
printf '5 6\nseven\n' >"$tmp/words.ids"
expect 2 "line 2: 'seven' is not a token id" decode --tokenizer "$tmp/kjv.model" "$tmp/words.ids"
printf '5 1000\n' >"$tmp/range.ids"
expect 2 "id 1000" decode --tokenizer "$tmp/kjv.model" "$tmp/range.ids"

exit $fail
