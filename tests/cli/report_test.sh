#!/usr/bin/env bash
# zerodp report: two short trainings (stage 0; stage 3 with --metrics) become one page, which
# headless Chromium renders; the dumped DOM must hold charts whose drawn elements match the
# reports one for one (not just a file that exists), and the page must reference nothing
# outside itself. A third, over nodes (--node-ranks), adds the bytes crossing them beside its
# comm bars, which runs on one node do not get. Refusals (missing file, not a report, bad JSON) are checked first, so they
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
# Over two nodes of 2 ranks, with stage 3's modes that keep traffic inside a node.
"$zerodp" train --size tiny --data synthetic --steps 3 --ranks 4 --node-ranks 2 --stage 3 \
  --collectives two-level --hpz --report c.json >train_c.log 2>&1 || { cat train_c.log; exit 1; }
# Offloaded, parameters too: the page says what each rank keeps on disk.
"$zerodp" train --size tiny --data synthetic --steps 2 --ranks 2 --stage 3 \
  --offload optimizer,params --offload-dir "$tmp" --offload-piece 2048 --report d.json \
  >train_d.log 2>&1 || { cat train_d.log; exit 1; }
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

# Offline: the page names no network address and loads no file of any kind (url(#id), a
# fragment of the page itself, is how its SVG fills with a pattern).
if grep -qi 'http' report.html; then bad "the page mentions http: $(grep -oi '.\{30\}http.\{30\}' report.html | head -3)"; fi
if grep -Eqi '(src|href)=|<link|@import|url\([^#]' report.html; then
  bad "the page references a resource: $(grep -Eoi '.{20}((src|href)=|<link|@import|url\([^#]).{20}' report.html | head -3)"
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
import json, re, sys
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
# The evaluation after the last step is only in final.val_loss: drawn at the last step.
want_final = sum(r["final"]["val_loss"] is not None and "val_loss" not in r["steps"][-1] for r in reports)
want_vals = sum("val_loss" in s for r in reports for s in r["steps"]) * 2 + want_final  # the log repeats b
check(want_final == 2, f"both runs evaluated once more after their last step ({want_final})")
check(len(vals) == want_vals, f"loss: {want_vals} val_loss points ({len(vals)})")
finals = [a for a in vals if "final" in a.get("class", "").split()]
plot = [float(v) for v in p.svgs.get("loss", {}).get("data-plot", "0 0 0 0").split()]
check(len(finals) == want_final and all(abs(float(a["cx"]) - plot[2]) < 0.01 for a in finals),
      f"loss: the final val_loss is drawn at the last step, x={plot[2]} ({[a.get('cx') for a in finals]})")
texts = [t for t, _ in p.inside.get("loss", []) if t == "text"]
check(len(texts) >= 10, f"loss: axes have tick labels ({len(texts)} texts)")

def bars(sid):
    return [a for t, a in p.inside.get(sid, []) if t == "rect" and "bar" in a.get("class", "")]

# Memory: one rect per rank per non-zero category, carrying exactly the report's bytes.
states = ["params", "grads", "master", "adam_m", "adam_v"]
peaks = ["gathered", "grad_buckets", "grad_accum", "activations", "comm_buffers", "workspace",
         "hpz_params", "offload_staging"]
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

# Runs on one node: nothing about nodes is drawn or said.
crossed = [a for t, a in p.inside.get("comm", []) if t in ("rect", "line") and "cross" in a.get("class", "").split()]
check(not crossed and p.svgs.get("comm", {}).get("data-cross-drawn") == "0",
      f"comm: no bytes crossing nodes drawn for runs on one node ({len(crossed)} elements)")
check(re.search(r'<span id="comm-cross" hidden', dom) is not None,
      "comm: the caption's words on crossing nodes stay hidden")

sys.exit(1 if fail else 0)
EOF

# Pages a browser must still lay out: losses at the ends of the double range and not finite,
# a validation loss far above the training curve, and strings too long for any column.
render() {  # render PAGE: the DOM of PAGE in PAGE.dom, laid out in a window 1280 px wide
  timeout 120 "$chromium" --headless --no-sandbox --disable-gpu --no-first-run \
    --user-data-dir="$tmp/profile" --window-size=1280,1000 --dump-dom "file://$tmp/$1" \
    >"$1.dom" 2>>chromium.log || bad "chromium could not render $1"
}
long=$(printf 'd%.0s' {1..120})/$(printf 'report-name-without-spaces-%.0s' {1..8})
mkdir -p "$(dirname "$long")"
python3 - a.json "$weird/b.json" "$long.json" <<'EOF' || fail=1
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
a["steps"][1]["loss"] = 1e308   # huge but finite: the axis must still scale
a["steps"][2]["loss"] = -1.7e308
a["steps"][3]["loss"] = None    # what the writer makes of a non-finite loss
json.dump(a, open("extreme.json", "w"))
vals = [s for s in b["steps"] if "val_loss" in s]
vals[0]["val_loss"] = 1.7e308   # far above the training curve
vals[1]["val_loss"] = None
json.dump(b, open("above.json", "w"))
a = json.load(open(sys.argv[1]))
a["data"] = "/" + "data-directory/" * 30 + "corpus.bin"
a["config"]["model"] = "model_" * 40
json.dump(a, open(sys.argv[3], "w"))
# Reports of earlier versions over nodes: before the plan counted the bytes crossing them, and
# before the ledger did (no cross_node_bytes, no config.node_ranks).
c = json.load(open("c.json"))
for p in c["plan"]["comm_bytes_per_step"]:
    del p["cross_node_bytes"]
json.dump(c, open("mid.json", "w"))
del c["config"]["node_ranks"]
for k in c["ranks"]:
    for v in k["comm"].values():
        del v["cross_node_bytes"]
json.dump(c, open("old.json", "w"))
EOF
"$zerodp" report extreme.json --out extreme.html --quiet || bad "report extreme.json failed"
"$zerodp" report above.json --out above.html --quiet || bad "report above.json failed"
"$zerodp" report "$long.json" a.json --out long.html --quiet || bad "report $long.json failed"
# The width the browser laid the page out at, against the window's.
sed 's|</body>|<script>document.body.setAttribute("data-widths", [document.documentElement.scrollWidth, window.innerWidth].join(" "));</script></body>|' \
  long.html >long-measured.html
# A run over nodes beside one without, and the earlier reports.
"$zerodp" report a.json c.json --out nodes.html --quiet || bad "report a.json c.json failed"
"$zerodp" report mid.json --out mid.html --quiet || bad "report mid.json failed"
"$zerodp" report old.json --out old.html --quiet || bad "report old.json failed"
"$zerodp" report d.json a.json --out disk.html --quiet || bad "report d.json a.json failed"
for page in extreme.html above.html long-measured.html nodes.html mid.html old.html disk.html; do
  render "$page"
done

python3 - <<'EOF' || fail=1
import json, re, sys
from collections import Counter
fail = []
def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what)
    if not ok:
        fail.append(what)
def loss_svg(page):
    dom = open(page + ".dom", encoding="utf-8").read()
    svg = re.search(r'<svg[^>]*id="loss".*?</svg>', dom, re.S)
    check(svg is not None and 'data-rendered="ok"' in dom, f"{page}: rendered without errors")
    svg = svg.group(0) if svg else ""
    def attrs(tag):
        return [dict(re.findall(r'([\w-]+)="([^"]*)"', t)) for t in re.findall(r"<%s\b[^>]*>" % tag, svg)]
    head = (attrs("svg") or [{}])[0]
    plot = [float(v) for v in head.get("data-plot", "nan nan nan nan").split()]
    return svg, attrs, head, plot
def inside(plot, x, y):
    return plot[0] - 0.01 <= x <= plot[2] + 0.01 and plot[1] - 0.01 <= y <= plot[3] + 0.01

svg, attrs, head, plot = loss_svg("extreme.html")
lines = [a for a in attrs("polyline") if "series" in a.get("class", "")]
pts = [tuple(map(float, q.split(","))) for a in lines for q in a.get("points", "").split()]
check(head.get("data-drawn") == "1" and len(pts) == 4,
      f"extreme: the curve is drawn with its 4 finite losses ({head.get('data-drawn')}, {len(pts)} points)")
check(all(inside(plot, x, y) for x, y in pts), f"extreme: every point lies in the plot {plot}: {pts}")
check(len({y for _, y in pts}) == 3, "extreme: 1e308, -1.7e308 and the ordinary losses at three heights")
ticks = re.findall(r'<text x="[\d.]+" y="[\d.]+" text-anchor="end">([^<]*)</text>', svg)
check(len(ticks) >= 3 and "1e+308" in ticks, f"extreme: the loss axis has ticks up to 1e+308 ({ticks})")
marks = [a for a in attrs("line") if a.get("class") == "nonfinite"]
check(len(marks) == 1, f"extreme: the step whose loss is not finite is marked ({len(marks)})")
check(re.search(r'<text class="note"[^>]*>1 step with a non-finite loss', svg) is not None,
      "extreme: a note says that a non-finite loss is not drawn")

svg, attrs, head, plot = loss_svg("above.html")
vals = [a for a in attrs("circle") if "val" in a.get("class", "").split()]
check(len(vals) == 2, f"above: the finite val_loss and the final one are drawn ({len(vals)})")
check(all(inside(plot, float(a["cx"]), float(a["cy"])) for a in vals),
      f"above: every validation point lies in the plot {plot}: {[(a['cx'], a['cy']) for a in vals]}")
check(any(float(a["cy"]) < plot[1] + 0.1 * (plot[3] - plot[1]) for a in vals),
      "above: the val_loss of 1.7e308 is at the top of the plot")
check(re.search(r'<text class="note"[^>]*>1 non-finite val_loss', svg) is not None,
      "above: a note says that a non-finite val_loss is not drawn")

dom = open("long-measured.html.dom", encoding="utf-8").read()
w = re.search(r'data-widths="(\d+) (\d+)"', dom)
check(w is not None and int(w.group(2)) >= 1000 and int(w.group(1)) <= int(w.group(2)),
      f"long strings: the page is no wider than the window (page, window: {w.groups() if w else None})")

# The bytes crossing nodes: per rank a second bar of c.json's cross_node_bytes per step by
# collective, on the comm chart's scale, with the plan's figure as a dashed tick; a.json, on
# one node, keeps its bars alone.
def comm(page):
    dom = open(page + ".dom", encoding="utf-8").read()
    check('data-rendered="ok"' in dom, f"{page}: rendered without errors")
    svg = re.search(r'<svg[^>]*id="comm".*?</svg>', dom, re.S)
    svg = svg.group(0) if svg else ""
    head = dict(re.findall(r'([\w-]+)="([^"]*)"', (re.findall(r"<svg\b[^>]*>", svg) or [""])[0]))
    groups = {}
    for run, body in re.findall(r'<g class="group" data-run="([^"]*)">(.*?)</g>', svg, re.S):
        groups[run] = [(t, dict(re.findall(r'([\w-]+)="([^"]*)"', a)))
                       for t, a in re.findall(r"<(rect|line)\b([^>]*)>", body)]
    return dom, svg, head, groups
def of(elems, tag, cls):
    return [a for t, a in elems if t == tag and cls in a.get("class", "").split()]

c = json.load(open("c.json"))
steps = len(c["steps"])
total = sum(v["bytes"] for k in c["ranks"] for v in k["comm"].values())
cross_total = sum(v["cross_node_bytes"] for k in c["ranks"] for v in k["comm"].values())
check(0 < cross_total < total, f"c.json: some bytes crossed nodes, not all ({cross_total} of {total})")
want = Counter((kind, round(v["cross_node_bytes"] / steps, 3))
               for k in c["ranks"] for kind, v in k["comm"].items() if v["cross_node_bytes"] > 0)
dom, svg, head, groups = comm("nodes.html")
cross = of(groups.get("c.json", []), "rect", "cross")
check(Counter((a["data-cat"], round(float(a["data-bytes"]), 3)) for a in cross) == want,
      f"nodes: each hatched bar is one collective of one rank, cross_node_bytes / steps ({len(cross)} of {sum(want.values())})")
check(head.get("data-cross-drawn") == str(len(cross)), f"nodes: data-cross-drawn counts them ({head.get('data-cross-drawn')})")
check(len(of(groups.get("c.json", []), "rect", "hatch")) == len(cross) and
      re.search(r'<pattern id="comm-hatch"', svg) is not None, "nodes: each is hatched by the page's own pattern")
bars = of(groups.get("c.json", []), "rect", "bar") + of(groups.get("a.json", []), "rect", "bar")
k = [float(a["height"]) / float(a["data-bytes"]) for a in bars + cross]
check(bool(cross) and max(k) - min(k) <= 1e-3 * max(k) + 1e-3 / min(float(a["data-bytes"]) for a in bars + cross),
      "nodes: hatched bars on the comm bars' scale")
marks = sorted(float(a["data-bytes"]) for a in of(groups.get("c.json", []), "line", "cross"))
plan = sorted(float(p["cross_node_bytes"]) for p in c["plan"]["comm_bytes_per_step"])
check(marks == plan and len(marks) == 4, f"nodes: the plan's cross_node_bytes as a tick per rank ({marks} vs {plan})")
a_cross = [x for x in groups.get("a.json", []) if "cross" in x[1].get("class", "").split()]
check("a.json" in groups and not a_cross, f"nodes: a.json, on one node, has no bytes crossing nodes ({len(a_cross)})")
check(re.search(r'<span id="comm-cross"(?! hidden)', dom) is not None, "nodes: the caption says what the hatched bars are")
check("crossing nodes (cross_node_bytes)" in svg and "formula, crossing nodes (plan)" in svg,
      "nodes: the legend names the hatched bars and the plan's tick")
check("nodes of 2" in svg, "nodes: the run's label says its nodes")

dom, svg, head, groups = comm("mid.html")
cross = of(groups.get("mid.json", []), "rect", "cross")
check(len(cross) == sum(want.values()) and not of(groups.get("mid.json", []), "line", "cross") and
      "formula, crossing nodes" not in svg,
      f"mid: a plan without cross_node_bytes: the hatched bars ({len(cross)}), no tick")
dom, svg, head, groups = comm("old.html")
check(head.get("data-cross-drawn") == "0" and not of(groups.get("old.json", []), "line", "cross") and
      len(of(groups.get("old.json", []), "rect", "bar")) > 0,
      "old: a report without cross_node_bytes draws its comm bars alone")

# The offloaded run's file, per rank in the estimate table and the largest under its bars;
# the run without offload says nothing of a disk.
def fmt_bytes(b):  # as the page writes bytes
    units, i, v = ["B", "KiB", "MiB", "GiB", "TiB"], 0, float(b)
    while abs(v) >= 1024 and i < 4:
        v /= 1024; i += 1
    return f"{v:.0f} B" if i == 0 else f"{v:.2f} {units[i]}"
dom = open("disk.html.dom", encoding="utf-8").read()
d = json.load(open("d.json"))
rows = re.findall(r"<tr>(.*?)</tr>", re.search(r'<table id="estimate".*?</table>', dom, re.S).group(0), re.S)
cells = [re.findall(r"<td[^>]*>(.*?)</td>", r, re.S) for r in rows]
disk = [c[7] for c in cells if c and c[0].find("d.json") >= 0]
plain = [c[7] for c in cells if c and c[0].find("a.json") >= 0]
want = [fmt_bytes(k["nvme_bytes"]) for k in d["ranks"]]
check(disk == want and all(k["nvme_bytes"] > 0 for k in d["ranks"]), f"disk: the estimate table's on-disk bytes per rank ({disk} vs {want})")
check(plain == ["—"] * len(plain) and len(plain) == 2, f"disk: a run without offload has none ({plain})")
memory = re.search(r'<svg[^>]*id="memory".*?</svg>', dom, re.S).group(0)
most = fmt_bytes(max(k["nvme_bytes"] for k in d["ranks"]))
check(f"{most} on disk" in memory and memory.count("on disk") == 1, f"disk: the memory chart labels the offloaded run with {most} on disk")
sys.exit(1 if fail else 0)
EOF

if ((fail)); then
  echo "FAIL (page and DOM kept in $tmp)"
  trap - EXIT
  exit 1
fi
echo "PASS"
