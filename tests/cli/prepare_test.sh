#!/usr/bin/env bash
# zerodp prepare: text files, a directory (recursive, byte order, hidden names skipped) and
# JSONL files tokenized into llm.c shards. Checks the manifest (format, tokenizer sha256,
# text_bytes, dropped counts), that the shards' llm.c headers are right, that each split's
# tokens are exactly the documented blocks (every N-th to validation, a bos before each run of
# a document's blocks) and decode to the inputs' bytes, that block-wise encoding is the
# whole-text encoding, that --threads 1 and 2 write the same bytes, that the KJV by default
# gets a validation shard, and the refusals with their exit codes. Skipped (77) without the
# bible program (Debian's bible-kjv).
set -uo pipefail
zerodp=$1
here=$(cd "$(dirname "$0")" && pwd)
command -v bible >/dev/null || { echo "skip: bible (bible-kjv) is not installed"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }

run() {  # run ARGS...: zerodp ARGS, must succeed
  timeout 120 "$zerodp" "$@" 2>"$tmp/err"
  local rc=$?
  if [[ $rc -ne 0 ]]; then
    bad "zerodp $*: exit $rc, stderr: $(cat "$tmp/err")"
    return 1
  fi
}

run tokenizer train --input kjv --cache-dir "$tmp/cache" --sample-lines 3000 --vocab 1000 \
  --out "$tmp/tok.model" --quiet || exit 1
kjv=$(ls "$tmp"/cache/kjv-*.txt)

# The inputs: a text file, a directory (text, a nested file, JSONL, hidden names), a JSONL file
# (escapes, non-ASCII, an empty text, a blank line), hostile text without a final newline.
in=$tmp/in
mkdir -p "$in/dir/b" "$in/dir/.git"
sed -n 1,300p "$kjv" >"$in/a.txt"
sed -n 301,700p "$kjv" >"$in/dir/b/two.txt"
sed -n 701,900p "$kjv" >"$in/dir/a.txt"
echo "skipped" >"$in/dir/.hidden.txt"
echo "skipped" >"$in/dir/.git/config"
python3 - "$kjv" "$in" <<'EOF'
import json, sys
lines = open(sys.argv[1], encoding="utf-8").read().split("\n")
with open(sys.argv[2] + "/dir/c.jsonl", "w", encoding="utf-8") as f:
    for i in range(901, 1000, 3):
        f.write(json.dumps({"id": i, "text": "\n".join(lines[i:i + 3]) + "\n"}) + "\n")
with open(sys.argv[2] + "/docs.jsonl", "w", encoding="utf-8") as f:
    f.write(json.dumps({"text": "café ▁ 😀\ttab\r\nline", "meta": {"text": 1}}, ensure_ascii=False) + "\n")
    f.write(json.dumps({"text": ""}) + "\n")
    f.write("   \n")
    for i in range(1000, 1300, 2):
        f.write(json.dumps({"title": str(i), "text": lines[i] + "\n" + lines[i + 1]}) + "\n")
EOF
printf '  Ge1:1\tIn the\r\nbeginning   God ▁ created 😀 日本 the heaven.\n\n\n\t end' >"$in/hostile.txt"
inputs=("$in/a.txt" "$in/dir" "$in/docs.jsonl" "$in/hostile.txt")

common=(--tokenizer "$tmp/tok.model" --block-size 1KiB --val-every 7 --tokens-per-shard 20000)
run prepare "${common[@]}" --threads 1 --out "$tmp/s1" "${inputs[@]}" || exit 1
cat "$tmp/err"
grep -q "wrote $tmp/s1: manifest.json" "$tmp/err" && ok "summary: $(head -n 1 "$tmp/err")" ||
  bad "no summary"
grep -q "dropped: 1 blank_lines, 1 empty_documents" "$tmp/err" && ok "dropped in the summary" ||
  bad "the summary does not count the blank line and the empty document"
run prepare "${common[@]}" --threads 2 --out "$tmp/s2" "${inputs[@]}" --quiet || exit 1
[[ ! -s $tmp/err ]] && ok "--quiet prints nothing" || bad "--quiet printed: $(cat "$tmp/err")"
n1=$(ls "$tmp/s1" | wc -l)
if [[ $n1 -ge 4 ]] && diff -r "$tmp/s1" "$tmp/s2" >/dev/null; then
  ok "--threads 1 and 2: the same $n1 files, byte for byte"
else
  bad "--threads 1 and 2 differ ($n1 files): $(diff -r "$tmp/s1" "$tmp/s2" | head -n 3)"
fi

# The NUL byte's id marks the bos positions for one decode call per split.
nul=$(printf '\0' | "$zerodp" tokenizer encode --tokenizer "$tmp/tok.model" --quiet)
python3 "$here/prepare_check.py" "$tmp/s1" "$tmp/tok.model" 1 7 1024 "$nul" "$tmp/check" \
  "${inputs[@]}" || bad "prepare_check.py: the shards are not the inputs' documented blocks"
for split in train val; do
  run tokenizer decode --tokenizer "$tmp/tok.model" "$tmp/check/$split.ids" \
    --out "$tmp/check/$split.decoded" --quiet || continue
  if cmp -s "$tmp/check/$split.decoded" "$tmp/check/$split.expected"; then
    ok "$split: decodes to exactly the inputs' blocks ($(wc -c <"$tmp/check/$split.expected") bytes)"
  else
    bad "$split: the decoded tokens are not the inputs' blocks"
  fi
done
# Block by block is the same as whole: the first run of a.txt spans 6 blocks.
run tokenizer encode --tokenizer "$tmp/tok.model" "$tmp/check/first_run.txt" --quiet \
  --out "$tmp/check/first_run.encoded"
if [[ $(tr -s ' \n' '\n\n' <"$tmp/check/first_run.encoded") == "$(cat "$tmp/check/first_run.ids")" ]]; then
  ok "a run of 6 blocks has the ids of its text encoded whole"
else
  bad "block-wise ids differ from encoding the text whole"
fi

# The KJV by default: a validation shard of about 2% of the text.
run prepare --tokenizer "$tmp/tok.model" --out "$tmp/kjv" kjv --cache-dir "$tmp/cache" || exit 1
tail -n 4 "$tmp/err"
python3 - "$tmp/kjv/manifest.json" <<'EOF' && ok "kjv by default: a usable validation split" || bad "kjv by default"
import json, sys
m = json.load(open(sys.argv[1]))
v, t = m["validation"], m["train"]
assert v["text_bytes"] + t["text_bytes"] == 4404412, (v["text_bytes"], t["text_bytes"])
share = v["text_bytes"] / 4404412
assert 0.015 < share < 0.025, share
assert v["tokens"] > 20000, v["tokens"]
print(f"  validation {v['tokens']} tokens, {share:.2%} of the text")
EOF

expect() {  # expect CODE NEEDLE ARGS...: exit CODE, one stderr line containing NEEDLE
  local code=$1 needle=$2
  shift 2
  local err got
  timeout 60 "$zerodp" prepare "$@" >/dev/null 2>"$tmp/err"
  got=$?
  err=$(cat "$tmp/err")
  if [[ $got -ne $code || "$err" != *"$needle"* || $(printf '%s\n' "$err" | wc -l) -ne 1 ]]; then
    bad "zerodp prepare $*: exit $got, stderr: $err (wanted exit $code and '$needle')"
  else
    ok "-> $code: $err"
  fi
}
tk=(--tokenizer "$tmp/tok.model")
printf 'In the beginning\nGod created\ncaf\xe9 and more\n' >"$tmp/latin1.txt"
expect 2 "latin1.txt': line 3 is not UTF-8 at byte 3 of the line (0xE9" "${tk[@]}" \
  --out "$tmp/o" "$tmp/latin1.txt"
[[ ! -e $tmp/o ]] && ok "a failed run leaves no directory" || bad "$tmp/o was left behind"
printf '{"text": "a"}\n{"text": "caf\xe9"}\n' >"$tmp/latin1.jsonl"
expect 2 "latin1.jsonl': line 2 is not UTF-8 at byte 13" "${tk[@]}" --out "$tmp/o" \
  "$tmp/latin1.jsonl"
printf '{"text": "a"}\n[1, 2]\n' >"$tmp/array.jsonl"
expect 2 "array.jsonl': line 2 is an array, not a JSON object" "${tk[@]}" --out "$tmp/o" \
  "$tmp/array.jsonl"
printf '{"text": "a"}\n{"text": "b"\n' >"$tmp/cut.jsonl"
expect 2 "cut.jsonl': line 2 is not JSON" "${tk[@]}" --out "$tmp/o" "$tmp/cut.jsonl"
printf '{"text": "a"}\n{"body": "b"}\n{"text": 3}\n' >"$tmp/field.jsonl"
expect 2 "field.jsonl': line 2 has no field \"text\"" "${tk[@]}" --out "$tmp/o" "$tmp/field.jsonl"
expect 2 "field.jsonl': line 1 has no field \"body\"" "${tk[@]}" --out "$tmp/o" \
  --text-field body "$tmp/field.jsonl"
mkdir -p "$tmp/full" && echo x >"$tmp/full/old.bin"
expect 2 "holds files" "${tk[@]}" --out "$tmp/full" "$in/a.txt"
[[ -e $tmp/full/old.bin ]] && ok "a non-empty --out is untouched" || bad "old.bin was removed"
expect 2 "lies inside it" "${tk[@]}" --out "$in/dir/shards" "$in/dir"
expect 2 "the same file" "${tk[@]}" --out "$in/a.txt" "$in/a.txt"
mkfifo "$tmp/fifo"
expect 2 "fifo' is a FIFO" "${tk[@]}" --out "$tmp/o" "$tmp/fifo"
expect 2 "more than once" "${tk[@]}" --out "$tmp/o" "$in/dir" "$in/dir/a.txt"
expect 2 "lower --val-every" "${tk[@]}" --out "$tmp/o" "$tmp/array.jsonl" --skip-bad
expect 2 "--val-every 1 is invalid" "${tk[@]}" --out "$tmp/o" "$in/a.txt" --val-every 1
expect 2 "--tokens-per-shard 0" "${tk[@]}" --out "$tmp/o" "$in/a.txt" --tokens-per-shard 0
head -c 300 "$tmp/tok.model" >"$tmp/damaged.model"
expect 3 "damaged.model" --tokenizer "$tmp/damaged.model" --out "$tmp/o" "$in/a.txt"

# --skip-bad: the bad lines dropped and counted, the rest kept.
cat "$tmp/latin1.jsonl" "$tmp/array.jsonl" "$tmp/field.jsonl" "$tmp/cut.jsonl" >"$tmp/mixed.jsonl"
for i in $(seq 20); do echo "{\"text\": \"line $i\"}"; done >>"$tmp/mixed.jsonl"
run prepare "${tk[@]}" --out "$tmp/skip" --val-every 4 --skip-bad "$tmp/mixed.jsonl" \
  "$tmp/latin1.txt" || exit 1
python3 - "$tmp/skip/manifest.json" <<'EOF' && ok "--skip-bad: $(grep dropped "$tmp/err")" || bad "--skip-bad counts"
import json, sys
m = json.load(open(sys.argv[1]))
want = {"invalid_utf8_lines": 2, "non_object_lines": 1, "missing_field_lines": 1,
        "non_string_field_lines": 1, "invalid_json_lines": 1}
assert m["dropped"] == want, m["dropped"]
# kept: "a" from each of the four files, the 20 lines, and latin1.txt but its line 3
text = 1 + 1 + 1 + 1 + sum(len(f"line {i}") for i in range(1, 21)) + len("In the beginning\nGod created\n")
assert m["train"]["text_bytes"] + m["validation"]["text_bytes"] == text, (m, text)
EOF

exit $fail
