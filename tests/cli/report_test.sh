#!/usr/bin/env bash
# zerodp report: two short trainings (stage 0; stage 3 with --metrics) become one page, which
# headless Chromium renders; the dumped DOM must hold charts whose drawn elements match the
# reports one for one (not just a file that exists), and the page must reference nothing
# outside itself. Refusals (missing file, not a report, bad JSON) are checked first, so they
# run even where Chromium is not installed (then the test exits 77: skipped).
set -uo pipefail
zerodp=$(realpath "$1")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
fail=0
bad() {
  echo "FAIL: $*"
  fail=1
}

if ! command -v python3 >/dev/null; then
  echo "SKIP: python3 (which checks the DOM) is not installed"
  exit 77
fi

"$zerodp" train --size tiny --data synthetic --steps 5 --ranks 2 --stage 0 --report a.json \
  >train_a.log 2>&1 || { cat train_a.log; exit 1; }
# A directory name with '</script><!--' in it: the run's label must stay text in the page.
weird='esc</script><!--'
mkdir -p "$weird"
"$zerodp" train --size tiny --data synthetic --steps 5 --ranks 2 --stage 3 --eval-every 2 \
  --report "$weird/b.json" --metrics b.jsonl >train_b.log 2>&1 || { cat train_b.log; exit 1; }
# A metrics log whose last line is still being written (no newline yet): left out.
cp b.jsonl live.jsonl
printf '{"step":6,"lo' >>live.jsonl

# Refusals: exit code and one line naming the file.
refuse() {  # refuse CODE NEEDLE ARGS...
  local want=$1 needle=$2
  shift 2
  local err code
  err=$("$zerodp" report "$@" 2>&1 >/dev/null)
  code=$?
  if [[ $code -ne $want || "$err" != *"$needle"* || $(printf '%s\n' "$err" | wc -l) -ne 1 ]]; then
    bad "zerodp report $*: exit $code, stderr: $err (wanted exit $want and '$needle')"
  else
    echo "ok: zerodp report $* -> $code: $err"
  fi
}
head -c 300 a.json >truncated.json
printf '{"step":1,"loss":2.5}\n{"step":2,"loss":\n' >badline.jsonl
refuse 3 "report 'truncated.json' is not valid JSON" truncated.json --out x.html
refuse 3 "metrics 'badline.jsonl' line 2 is not valid JSON" a.json --metrics badline.jsonl \
  --out x.html
refuse 2 "report 'missing.json': no such file" a.json missing.json --out x.html
refuse 2 "is a --metrics log" b.jsonl --out x.html
refuse 2 "metrics 'a.json' is a run report" a.json --metrics a.json --out x.html
[[ -e x.html ]] && bad "a refused command wrote x.html"

if [[ -n "${CHROMIUM:-}" ]]; then
  chromium=$CHROMIUM
else
  chromium=$(command -v chromium || command -v chromium-browser || true)
fi
if [[ -z "$chromium" ]]; then
  echo "SKIP: chromium is not installed (scripts/install-deps.sh installs Debian's chromium)"
  exit 77
fi
((fail)) && exit 1

"$zerodp" report a.json "$weird/b.json" --metrics live.jsonl --out report.html ||
  { echo "FAIL: zerodp report exited $?"; exit 1; }
echo "page: $(wc -c <report.html) bytes"

# Offline: the page names no network address and loads no file of any kind.
if grep -qi 'http' report.html; then bad "the page mentions http: $(grep -oi '.\{30\}http.\{30\}' report.html | head -3)"; fi
if grep -Eqi '(src|href)=|<link|@import|url\(' report.html; then
  bad "the page references a resource: $(grep -Eoi '.{20}((src|href)=|<link|@import|url\().{20}' report.html | head -3)"
fi

start=$(date +%s%N)
timeout 120 "$chromium" --headless --no-sandbox --disable-gpu --no-first-run \
  --user-data-dir="$tmp/profile" --dump-dom "file://$tmp/report.html" >dom.html 2>chromium.log
code=$?
end=$(date +%s%N)
echo "chromium: exit $code, $(wc -c <dom.html) bytes of DOM in $(((end - start) / 1000000)) ms"
if [[ $code -ne 0 || ! -s dom.html ]]; then
  tail -20 chromium.log
  exit 1
fi

python3 - a.json "$weird/b.json" live.jsonl dom.html <<'EOF' || fail=1
import json, sys
from collections import Counter
from html.parser import HTMLParser

reports = [json.load(open(p)) for p in sys.argv[1:3]]
labels = sys.argv[1:3]
dom = open(sys.argv[4], encoding="utf-8").read()

class Dom(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.svg = None      # id of the <svg> we are in
        self.table = None    # id of the <table> we are in
        self.svgs = {}       # id -> attrs
        self.inside = {}     # id -> [(tag, attrs)]
        self.rows = {}       # table id -> [[cell text]]
        self.cell = None
        self.scripts = 0
        self.errors_text = None
        self.in_errors = False
        self.body = {}
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        if tag == "script":
            self.scripts += 1
        if tag == "pre" and a.get("id") == "errors":
            self.in_errors, self.errors_text = True, ""
        if tag == "svg":
            self.svg = a.get("id")
            self.svgs[self.svg] = a
            self.inside[self.svg] = []
        elif self.svg is not None:
            self.inside[self.svg].append((tag, a))
        if tag == "table":
            self.table = a.get("id")
            self.rows[self.table] = []
        if self.table and tag == "tr":
            self.rows[self.table].append([])
        if self.table and tag in ("td", "th"):
            self.cell = ""
    def handle_endtag(self, tag):
        if tag == "svg":
            self.svg = None
        if tag == "table":
            self.table = None
        if tag in ("td", "th") and self.cell is not None:
            self.rows[self.table][-1].append(self.cell)
            self.cell = None
        if tag == "pre":
            self.in_errors = False
    def handle_data(self, d):
        if self.cell is not None:
            self.cell += d
        if self.in_errors:
            self.errors_text += d

p = Dom()
p.feed(dom)
fail = []
def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what)
    if not ok:
        fail.append(what)

check(p.body.get("data-rendered") == "ok", f"script ran without errors (body data-rendered={p.body.get('data-rendered')!r})")
check(p.errors_text == "", f"no errors shown on the page ({p.errors_text!r})")
check(p.scripts == 2, f"exactly the two script elements: no input ended one early ({p.scripts})")
for sid in ("loss", "memory", "comm"):
    check(sid in p.svgs and "chart" in p.svgs[sid].get("class", ""), f"<svg class=chart id={sid}> present")

def drawn(sid):
    return int(p.svgs.get(sid, {}).get("data-drawn", "-1"))

# Loss: one polyline per series (2 reports + 1 metrics log), 5 distinct steps each.
lines = [a for t, a in p.inside.get("loss", []) if t == "polyline" and "series" in a.get("class", "")]
check(drawn("loss") == 3 and len(lines) == 3, f"loss: 3 curves drawn (data-drawn={drawn('loss')}, polylines={len(lines)})")
for a in lines:
    pts = [tuple(map(float, q.split(","))) for q in a.get("points", "").split()]
    check(len(pts) == 5 and len({x for x, _ in pts}) == 5 and len({y for _, y in pts}) > 1,
          f"loss: {a.get('data-run')} has 5 points over 5 steps, not flat ({len(pts)})")
vals = [a for t, a in p.inside.get("loss", []) if t == "circle" and "val" in a.get("class", "")]
want_vals = sum("val_loss" in s for r in reports for s in r["steps"]) * 2  # the log repeats b
check(len(vals) == want_vals, f"loss: {want_vals} val_loss points ({len(vals)})")
texts = [t for t, _ in p.inside.get("loss", []) if t == "text"]
check(len(texts) >= 10, f"loss: axes have tick labels ({len(texts)} texts)")

def bars(sid):
    return [a for t, a in p.inside.get(sid, []) if t == "rect" and "bar" in a.get("class", "")]

# Memory: one rect per rank per non-zero category, carrying exactly the report's bytes.
states = ["params", "grads", "master", "adam_m", "adam_v"]
peaks = ["gathered", "grad_buckets", "activations", "comm_buffers", "workspace"]
want = Counter()
for r in reports:
    for k in r["ranks"]:
        for c in states:
            if k["model_state_bytes"][c] > 0: want[(c, float(k["model_state_bytes"][c]))] += 1
        for c in peaks:
            if k["peak_bytes"][c] > 0: want[(c, float(k["peak_bytes"][c]))] += 1
got = bars("memory")
check(drawn("memory") == len(got) == sum(want.values()),
      f"memory: {sum(want.values())} segments (data-drawn={drawn('memory')}, rects={len(got)})")
check(Counter((a["data-cat"], float(a["data-bytes"])) for a in got) == want,
      "memory: each segment is one category of one rank with the report's bytes")
check(all(float(a["height"]) > 0 for a in got), "memory: every segment has a positive height")
marks = [a for t, a in p.inside.get("memory", []) if t == "line" and "mark" in a.get("class", "")]
check(len(marks) == sum(len(r["ranks"]) for r in reports), f"memory: a peak tick per rank ({len(marks)})")
def scaled(rects):  # one scale for every bar: height / bytes the same everywhere
    k = [float(a["height"]) / float(a["data-bytes"]) for a in rects]
    return bool(k) and max(k) - min(k) <= 1e-3 * max(k) + 1e-3 / min(float(a["data-bytes"]) for a in rects)
check(scaled(got), "memory: heights are proportional to bytes (stage 3's params half of stage 0's)")

# Comm: bytes per step per collective per rank.
want = Counter()
for r in reports:
    for k in r["ranks"]:
        for kind, v in k["comm"].items():
            if v["bytes"] > 0: want[(kind, round(v["bytes"] / len(r["steps"]), 3))] += 1
got = bars("comm")
check(drawn("comm") == len(got) == sum(want.values()) and len(got) >= 4,
      f"comm: {sum(want.values())} bars (data-drawn={drawn('comm')}, rects={len(got)})")
check(Counter((a["data-cat"], round(float(a["data-bytes"]), 3)) for a in got) == want,
      "comm: each bar is one collective of one rank, report bytes / steps")
check(all(float(a["height"]) > 0 for a in got), "comm: every bar has a positive height")
check(scaled(got), "comm: heights are proportional to bytes")
cats = {a["data-cat"] for a in got}
check({"all_reduce", "reduce_scatter", "all_gather"} <= cats, f"comm: stage 0's all-reduce and stage 3's reduce-scatter and all-gather ({sorted(cats)})")

# Tables.
runs = p.rows.get("runs", [])[1:]
check(len(runs) == 2, f"runs table: 2 rows ({len(runs)})")
check(any(row and row[0] == labels[1] for row in runs), f"runs table: the label {labels[1]!r} is text")
for row, r in zip(runs, reports):
    check(r["final"]["weights_sha256"][:16] in row and str(r["stage"]) in row and r["precision"] in row,
          f"runs table: stage, precision and weights hash of {row[0] if row else '?'}")
est = p.rows.get("estimate", [])[1:]
nranks = sum(len(r["ranks"]) for r in reports)
check(len(est) == nranks, f"estimate table: {nranks} rows ({len(est)})")
check(all(row[-1] == "exact" and row[6] == "1.0000" for row in est),
      "estimate table: measured = exact plan, ratio 1.0000 to the formula (2 ranks divide evenly)")

sys.exit(1 if fail else 0)
EOF

if ((fail)); then
  echo "FAIL (page and DOM kept in $tmp)"
  trap - EXIT
  exit 1
fi
echo "PASS"
