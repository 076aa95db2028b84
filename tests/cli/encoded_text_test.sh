#!/usr/bin/env bash
# Training on text encoded as the run starts (--data FILE --tokenizer tok.model):
#   1. the vocabulary is the tokenizer's; the report names the tokenizer's sha256 and gives
#      the validation loss in bits per byte;
#   2. a stop and a resume on another rank count at another stage continue the run that never
#      stopped bit for bit (weights hash and the chain of the samples read);
#   3. a resume with another tokenizer is refused, naming both;
#   4. export --format hf --tokenizer writes tokenizer.model and config.json's bos and eos, and
#      sample reads the directory's tokenizer;
#   5. refused, naming what would do: --tokenizer with data that is not text, a tokenizer
#      larger than --vocab, a file that is not UTF-8.
# The text is the repository's docs; the tokenizers are trained on it (vocabulary 600).
#   encoded_text_test.sh ZERODP
set -uo pipefail
zerodp=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
cd "$tmp" || exit 1
check() {  # check NAME CONDITION-EXIT-STATUS DETAIL
  if [[ $2 == 0 ]]; then echo "ok: $1"; else echo "FAIL: $1: $3"; fail=1; fi
}

cat "$repo"/docs/*.md | head -c 400000 >docs.txt
tail -c 200000 docs.txt >half.txt
for t in "docs.txt tok600.model" "half.txt other600.model"; do
  read -r input model <<<"$t"
  "$zerodp" tokenizer train --input "$input" --vocab 600 --out "$model" >/dev/null 2>&1 ||
    { echo "FAIL: tokenizer train --input $input"; exit 1; }
done

common=(--size tiny --model llama --data docs.txt --tokenizer tok600.model --steps 10
  --schedule constant --warmup 0 --no-progress --micro-batch 4)
"$zerodp" train "${common[@]}" --ranks 2 --grad-accum 2 --stage 3 --report full.json \
  >full.out 2>&1 || { echo "FAIL: the uninterrupted run"; cat full.out; fail=1; }
sha=$(sha256sum tok600.model | cut -d' ' -f1)
/usr/bin/python3 - "$sha" <<'EOF' >report.check 2>&1
import json, sys
r = json.load(open("full.json"))
assert r["data_tokenizer_sha256"] == sys.argv[1], r["data_tokenizer_sha256"]
assert r["config"]["vocab"] == 600, r["config"]["vocab"]
bpb = r["final"]["val_bits_per_byte"]
assert bpb is not None and 0 < bpb < 8, bpb
print(f"vocab 600, tokenizer {sys.argv[1][:12]}, val bits per byte {bpb:.3f}")
EOF
check "the report: $(cat report.check)" $? "$(cat report.check)"

field() { sed -n "s/.*$1 \([0-9a-f]*\).*/\1/p" "$2" | head -1; }
"$zerodp" train "${common[@]}" --ranks 2 --grad-accum 2 --stage 3 --checkpoint-dir ck \
  --checkpoint-every 4 --stop-after 4 >part.out 2>&1 ||
  { echo "FAIL: the first part"; cat part.out; fail=1; }
"$zerodp" train "${common[@]}" --ranks 4 --stage 1 --resume latest --checkpoint-dir ck \
  >rest.out 2>&1 || { echo "FAIL: the resume"; cat rest.out; fail=1; }
w_full=$(field "weights sha256" full.out) w_rest=$(field "weights sha256" rest.out)
c_full=$(field "chained: sha256" full.out) c_rest=$(field "chained: sha256" rest.out)
[[ -n $w_full && $w_full == "$w_rest" && -n $c_full && $c_full == "$c_rest" ]]
check "stopped after step 4 on 2 ranks (stage 3), resumed on 4 (stage 1): weights $w_full, samples chain $c_full as the run that never stopped" $? \
  "weights $w_full / $w_rest, chain $c_full / $c_rest"

err=$("$zerodp" train "${common[@]}" --tokenizer other600.model --ranks 4 \
  --resume ck/step_00000004 2>&1 >/dev/null)
other=$(sha256sum other600.model | cut -d' ' -f1)
[[ $err == *"trained on text encoded by the tokenizer of sha256 $sha; this run's --data docs.txt is text encoded by the tokenizer of sha256 $other; use the data"* ]]
check "a resume with another tokenizer: $err" $? "$err"

# The export carries the tokenizer: tokenizer.model as given, its ids in config.json, and
# sample finds it there.
"$zerodp" export ck --format hf --out hf --tokenizer tok600.model --quiet ||
  { echo "FAIL: export --tokenizer"; fail=1; }
ids=$(/usr/bin/python3 -c 'import json; c = json.load(open("hf/config.json")); print(c["bos_token_id"], c["eos_token_id"], c["vocab_size"])')
cmp -s hf/tokenizer.model tok600.model && [[ $ids == "1 2 600" ]]
check "export --format hf --tokenizer: tokenizer.model as given, config.json bos, eos, vocab: $ids" $? "ids $ids"
a=$("$zerodp" sample hf --prompt "The tokenizer" --max-tokens 12 2>&1)
b=$("$zerodp" sample ck --tokenizer tok600.model --prompt "The tokenizer" --max-tokens 12 2>&1)
[[ -n $a && $a == "$b" ]]
check "sample of the export, tokenizer found beside it: '$a'" $? "'$a' vs '$b'"
err=$("$zerodp" export ck --out w.safetensors --tokenizer tok600.model 2>&1 >/dev/null)
[[ $err == *"--tokenizer: --format zerodp writes the weights alone"* ]]
check "export --format zerodp --tokenizer: $err" $? "$err"

err=$("$zerodp" train --size tiny --data synthetic --tokenizer tok600.model --steps 1 2>&1 >/dev/null)
[[ $err == *"--tokenizer encodes text, and --data synthetic is synthetic bytes"* ]]
check "--tokenizer with synthetic data: $err" $? "$err"
err=$("$zerodp" train --size tiny --model llama --data docs.txt --tokenizer tok600.model \
  --vocab 512 --steps 1 2>&1 >/dev/null)
[[ $err == *"has 600 ids, more than the model's vocabulary of 512; use --vocab 600"* ]]
check "a tokenizer larger than --vocab: $err" $? "$err"
{ printf 'line one\nline two \xff here\n'; head -c 20000 docs.txt; } >latin.txt
err=$("$zerodp" train --size tiny --model llama --data latin.txt --tokenizer tok600.model \
  --steps 1 2>&1 >/dev/null)
[[ $err == *"latin.txt: not UTF-8 at line 2, byte 18 (0xFF)"* ]]
check "a file that is not UTF-8: $err" $? "$err"
exit $fail
