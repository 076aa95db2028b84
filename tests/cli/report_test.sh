#!/usr/bin/env bash
# zerodp report: two short trainings (stage 0; stage 3 with --metrics) become one page, which
# headless Chromium renders; the dumped DOM must hold charts whose drawn elements match the
# reports one for one (not just a file that exists), and the page must reference nothing
# outside itself. A third, over nodes (--node-ranks), adds the bytes crossing them beside its
# comm bars, which runs on one node do not get. Islands (--islands, 2 of 2 ranks) stack their
# outer state to the peak tick, divide the ZeRO formula by an island's ranks, add the outer
# exchanges to the comm formula, and keep every legend label whole. Four runs that end
# differently (completed, a --stop-after slice, SIGTERM, an elastic restart) are laid out in
# windows 1280 and 1400 px wide: nothing wider than the window, and how each ended in the
# runs table and on the loss chart. Refusals (missing file, not a report, bad JSON) are checked first, so they
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
# DiLoCo's islands: outer steps after steps 2, 4 and 5 (the last), ticked on the loss chart;
# 2 islands of 2 ranks, each a node, sharding stage 3 inside.
"$zerodp" train --size tiny --data synthetic --steps 5 --ranks 4 --node-ranks 2 --islands 2 \
  --outer-every 2 --stage 3 --report e.json >train_e.log 2>&1 || { cat train_e.log; exit 1; }
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
"$zerodp" report e.json a.json --out islands.html --quiet || bad "report e.json a.json failed"
# Measured in the browser: each legend label's text (its <title> aside) and box, and the chart's.
cat >legend_probe.js <<'EOF'
(function () {
  var box = function (e) {
    var r = e.getBoundingClientRect();
    return [r.left, r.top, r.right, r.bottom];
  };
  document.body.setAttribute('data-legends', JSON.stringify([].map.call(
    document.querySelectorAll('svg.chart'), function (svg) {
      return {id: svg.id, box: box(svg), texts: [].map.call(
        svg.querySelectorAll('g.legend text'), function (t) {
          var s = '';
          t.childNodes.forEach(function (n) { if (n.nodeName !== 'title') s += n.textContent; });
          return {text: s, box: box(t)};
        })};
    })));
})();
EOF
python3 -c 'import sys; p = open("islands.html").read(); open("islands.html", "w").write(p.replace("</body>", "<script>" + open("legend_probe.js").read() + "</script></body>"))'
for page in extreme.html above.html long-measured.html nodes.html mid.html old.html disk.html \
  islands.html; do
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

svg, attrs, head, plot = loss_svg("islands.html")
outer = [a for a in attrs("line") if a.get("class") == "outer"]
want = [s["step"] for s in json.load(open("e.json"))["steps"] if s.get("outer")]
check(want == [2, 4, 5] and len(outer) == 3 and all(inside(plot, float(a["x1"]), float(a["y2"])) for a in outer),
      f"islands: a tick on the bottom edge for each outer step {want} ({len(outer)})")
check("outer step (--islands)" in svg, "islands: the legend names the outer-step ticks")

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

# e.json, 2 islands of 2 ranks (nodes of 2) at stage 3, beside a.json: the memory stack holds
# the outer state, so it reaches the peak tick; the ZeRO formula divides by an island's 2
# ranks; the comm formula's ticks add the outer exchanges' bytes per step, so they meet the
# measured bars (control aside) and the part crossing nodes; no legend label is cut.
python3 - <<'EOF' || fail=1
import html, json, re, sys
fail = []
def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what)
    if not ok:
        fail.append(what)
e = json.load(open("e.json"))
dom = open("islands.html.dom", encoding="utf-8").read()
check('data-rendered="ok"' in dom, "islands.html: rendered without errors")
def attrs(s):
    return dict(re.findall(r'([\w-]+)="([^"]*)"', s))
def group(sid, run):  # [(tag, attrs, title)] of run's bars and ticks in chart sid
    svg = re.search(r'<svg[^>]*id="%s".*?</svg>' % sid, dom, re.S)
    g = re.search(r'<g class="group" data-run="%s">(.*?)</g>' % re.escape(run), svg.group(0) if svg else "", re.S)
    return [(t, attrs(a), html.unescape(tt or "")) for t, a, tt in
            re.findall(r"<(rect|line)\b([^>]*)>(?:<title>([^<]*)</title>)?", g.group(1) if g else "")]
def of(elems, tag, cls):
    return [(a, t) for tg, a, t in elems if tg == tag and cls == a.get("class")]

# 14: per rank, the bar's bytes by x; outer_state a solid segment of the rank's peak.
mem = group("memory", "e.json")
bars = {}
for a, _ in of(mem, "rect", "bar"):
    bars.setdefault(float(a["x"]), []).append(a)
marks = sorted(float(a["x1"]) for a, _ in of(mem, "line", "mark"))
ranks = e["ranks"]
check(len(bars) == len(ranks) == 4 and len(marks) == 4, f"islands memory: a bar and a peak tick per rank ({len(bars)}, {len(marks)})")
for (x, segs), k in zip(sorted(bars.items()), ranks):
    outer = [a for a in segs if a["data-cat"] == "outer_state"]
    want = k["peak_bytes"]["outer_state"]
    check(want > 0 and len(outer) == 1 and float(outer[0]["data-bytes"]) == want and outer[0].get("fill-opacity") == "1",
          f"islands memory: rank {k['rank']}'s outer_state, {want} B, a solid segment ({[a.get('data-bytes') for a in outer]})")
    total = sum(float(a["data-bytes"]) for a in segs)
    check(total >= k["peak_bytes"]["total"],
          f"islands memory: rank {k['rank']}'s stack, {total:.0f} B, reaches its peak of the sum {k['peak_bytes']['total']}")
memsvg = re.search(r'<svg[^>]*id="memory".*?</svg>', dom, re.S)
check(memsvg is not None and "outer_state (steady, --islands)" in memsvg.group(0), "islands memory: the legend names outer_state")

# 15: the estimate table's rows of e.json.
table = re.search(r'<table id="estimate".*?</table>', dom, re.S)
rows = [re.findall(r"<td[^>]*>(.*?)</td>", r, re.S) for r in re.findall(r"<tr>(.*?)</tr>", table.group(0) if table else "", re.S)]
rows = [c for c in rows if c and "e.json" in c[0]]
check(len(rows) == 4 and all("2 islands of 2" in c[2] for c in rows), f"islands estimate: N says 2 islands of 2 ({[c[2] for c in rows]})")
check(len(rows) == 4 and all(abs(float(c[6]) - 1) < 1e-3 and c[-1] == "exact" for c in rows),
      f"islands estimate: measured \u00f7 formula \u2248 1 and exact against the plan ({[(c[6], c[-1]) for c in rows]})")

# 16: the formula's tick at the top of the measured collectives (control, left out of the
# formula, stacked last), in the bar and in the part crossing nodes.
comm = group("comm", "e.json")
def tops(cls):
    t = {}
    for a, _ in of(comm, "rect", cls):
        if a["data-cat"] != "control":
            x = float(a["x"])
            t[x] = min(t.get(x, 1e9), float(a["y"]))
    return [t[x] for x in sorted(t)]
for cls, tick, what in (("bar", "mark", "the bars"), ("cross", "mark cross", "the part crossing nodes")):
    ys = [float(a["y1"]) for a, _ in of(comm, "line", tick)]
    titles = [t for _, t in of(comm, "line", tick)]
    top = tops(cls)
    check(len(ys) == len(top) == 4 and all(abs(y - t) < 0.05 for y, t in zip(ys, top)),
          f"islands comm: the formula's tick meets {what} ({ys} vs {top})")
    check(len(titles) == 4 and all("outer exchanges" in t for t in titles), f"islands comm: its tooltip has the outer exchanges' share ({titles[:1]})")
inner = of(comm, "line", "mark inner")
plan = e["plan"]["comm_bytes_per_step"]
check(len(inner) == 4 and all(float(a["data-bytes"]) == p["total"] for (a, _), p in zip(inner, plan)),
      "islands comm: a grey tick at the inner step's formula, plan.comm_bytes_per_step")

# 17: every legend label whole, inside its chart, none over another.
m = re.search(r'data-legends="([^"]*)"', dom)
charts = json.loads(html.unescape(m.group(1))) if m else []
check(len(charts) == 3, f"islands legends: three charts measured ({len(charts)})")
for c in charts:
    l, t, r, b = c["box"]
    texts = c["texts"]
    check(texts and not any("\u2026" in x["text"] for x in texts), f"islands legends: no {c['id']} label is cut ({[x['text'] for x in texts if chr(0x2026) in x['text']]})")
    check(all(l - 0.5 <= x["box"][0] and x["box"][2] <= r + 0.5 and t - 0.5 <= x["box"][1] and x["box"][3] <= b + 0.5 for x in texts),
          f"islands legends: every {c['id']} label lies inside its chart")
    over = [(p["text"], q["text"]) for i, p in enumerate(texts) for q in texts[i + 1:]
            if p["box"][0] < q["box"][2] and q["box"][0] < p["box"][2] and p["box"][1] < q["box"][3] and q["box"][1] < p["box"][3]]
    check(not over, f"islands legends: no two {c['id']} labels overlap ({over[:2]})")
said = [x["text"] for c in charts for x in c["texts"]]
check("outer step (--islands), on the bottom edge" in said, "islands legends: the outer-step label whole")
check("formula (plan): inner step + outer exchanges \u00f7 steps" in said, "islands legends: the comm formula says it adds the outer exchanges")
sys.exit(1 if fail else 0)
EOF

# Four runs as they end: one completed, a --stop-after slice, one stopped by SIGTERM (--inject
# term, as a signal to one rank), and one that lost a rank at step 5 and went on with the other
# from the checkpoint of step 4 (--max-restarts). Their labels are paths as long as real ones.
# In windows 1280 and 1400 px wide, no chart, legend or table may pass the window's right
# edge (the page lays its charts out at its own width), and the runs table and the loss chart
# say how each run ended, the markers at the steps where the curves have them.
runs=(runs/stage0-completed-six-steps.json runs/stage3-stop-after-three-steps.json
      runs/stage1-sigterm-after-step-three.json runs/stage2-rank1-failed-at-step5.json)
mkdir -p runs
t0=$(date +%s%N)
six=(train --size tiny --data synthetic --ranks 2 --steps 6 --no-progress)
"$zerodp" "${six[@]}" --stage 0 --report "${runs[0]}" >train_e.log 2>&1 || bad "train ${runs[0]}"
"$zerodp" "${six[@]}" --stage 3 --eval-every 2 --stop-after 3 --report "${runs[1]}" \
  >train_f.log 2>&1 || bad "train ${runs[1]}"
"$zerodp" "${six[@]}" --stage 1 --inject term@3 --report "${runs[2]}" >train_g.log 2>&1
[[ $? == 143 ]] || bad "train ${runs[2]}: stopped by SIGTERM should exit 143: $(tail -2 train_g.log)"
"$zerodp" "${six[@]}" --stage 2 --checkpoint-dir ck --checkpoint-every 2 --max-restarts 1 \
  --inject throw@5:1 --report "${runs[3]}" >train_h.log 2>&1 || bad "train ${runs[3]}"
"$zerodp" report "${runs[@]}" --out four.html --quiet || bad "report of the four runs failed"
# Measured in the browser after the page drew: the page's width against the window's, and
# each chart's box, its legend's, and how many of its drawn elements lie outside it.
cat >probe.js <<'EOF'
(function () {
  var de = document.documentElement;
  var box = function (e) {
    var r = e.getBoundingClientRect();
    return [r.left, r.top, r.right, r.bottom];
  };
  var charts = [].map.call(document.querySelectorAll('svg.chart'), function (svg) {
    var b = box(svg), legend = svg.querySelector('g.legend'), outside = 0;
    svg.querySelectorAll('text, rect, line, polyline, circle').forEach(function (e) {
      var r = box(e);
      if (r[2] - r[0] === 0 && r[3] - r[1] === 0) return;
      if (r[0] < b[0] - 0.5 || r[2] > b[2] + 0.5 || r[1] < b[1] - 0.5 || r[3] > b[3] + 0.5) ++outside;
    });
    return {id: svg.id, box: b, legend: legend ? box(legend) : null, outside: outside};
  });
  var tables = [].map.call(document.querySelectorAll('table'), function (t) {
    return {id: t.id, box: box(t)};
  });
  document.body.setAttribute('data-layout', JSON.stringify({
    scrollWidth: de.scrollWidth, clientWidth: de.clientWidth, innerWidth: window.innerWidth,
    charts: charts, tables: tables}));
})();
EOF
python3 -c 'import sys; p = open("four.html").read(); open("four-probed.html", "w").write(p.replace("</body>", "<script>" + open("probe.js").read() + "</script></body>"))'
for w in 1280 1400; do
  timeout 120 "$chromium" --headless --no-sandbox --disable-gpu --no-first-run \
    --user-data-dir="$tmp/profile" --window-size=$w,1000 --dump-dom "file://$tmp/four-probed.html" \
    >four.$w.dom 2>>chromium.log || bad "chromium could not render four.html at $w px"
done

python3 - "${runs[@]}" <<'EOF' || fail=1
import html, json, re, sys
from html.parser import HTMLParser
labels = sys.argv[1:5]
reports = [json.load(open(p)) for p in labels]
fail = []
def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what)
    if not ok:
        fail.append(what)

for w in (1280, 1400):
    dom = open(f"four.{w}.dom", encoding="utf-8").read()
    check('data-rendered="ok"' in dom, f"{w} px: rendered without errors")
    m = re.search(r'data-layout="([^"]*)"', dom)
    lay = json.loads(html.unescape(m.group(1))) if m else {}
    vw = lay.get("clientWidth", 0)
    check(lay.get("innerWidth") == w, f"{w} px: the window is {w} px wide ({lay.get('innerWidth')})")
    check(0 < lay.get("scrollWidth", 1e9) <= vw <= lay.get("innerWidth", 0),
          f"{w} px: no horizontal scroll, the page is no wider than the window "
          f"(scrollWidth {lay.get('scrollWidth')}, clientWidth {vw}, innerWidth {lay.get('innerWidth')})")
    charts = {c["id"]: c for c in lay.get("charts", [])}
    check(sorted(charts) == ["comm", "loss", "memory"], f"{w} px: three charts measured ({sorted(charts)})")
    for c in charts.values():
        l, t, r, b = c["box"]
        check(0 <= l and r <= vw + 0.5, f"{w} px: chart {c['id']} lies inside the window ({l:.1f}..{r:.1f} of {vw})")
        lg = c["legend"]
        check(lg is not None and l - 0.5 <= lg[0] and lg[2] <= r + 0.5 and t - 0.5 <= lg[1] and lg[3] <= b + 0.5,
              f"{w} px: chart {c['id']}'s legend lies inside it, not cut ({lg} in {c['box']})")
        check(c["outside"] == 0, f"{w} px: nothing of chart {c['id']} drawn outside it ({c['outside']} elements)")
    for t in lay.get("tables", []):
        check(t["box"][2] <= vw + 0.5, f"{w} px: table {t['id']} lies inside the window ({t['box'][2]:.1f} of {vw})")

# What the page says of each run's end: the runs table's "ended" cell, and a marker on the
# loss chart at the step, where the run's own curve has that step.
class Page(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.where = []    # open elements that matter: ("runs", None), ("td", i), ("loss", None)...
        self.rows = []     # runs table rows: [cell text]
        self.loss = []     # (tag, attrs, text) in svg#loss
        self.text = None
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and a.get("id") == "runs":
            self.where.append("runs")
        elif tag == "svg" and a.get("id") == "loss":
            self.where.append("loss")
            self.loss.append((tag, a, ""))
        elif "runs" in self.where and tag == "tr":
            self.rows.append([])
        elif "runs" in self.where and tag in ("td", "th"):
            self.text = ""
        elif "loss" in self.where:
            self.loss.append((tag, a, ""))
        if "runs" in self.where and tag == "div" and self.text is not None:
            self.text += "\n"
    def handle_endtag(self, tag):
        if tag in ("table", "svg") and self.where and self.where[-1] in ("runs", "loss"):
            if (tag == "table") == (self.where[-1] == "runs"):
                self.where.pop()
        if tag in ("td", "th") and self.text is not None and self.rows:
            self.rows[-1].append(self.text.strip())
            self.text = None
    def handle_data(self, d):
        if self.text is not None:
            self.text += d
        elif "loss" in self.where and self.loss:
            t, a, x = self.loss[-1]
            self.loss[-1] = (t, a, x + d)

p = Page()
p.feed(open("four.1280.dom", encoding="utf-8").read())
head = p.rows[0] if p.rows else []
col = head.index("ended") if "ended" in head else -1
check(col >= 0, f"runs table: an 'ended' column ({head})")
rows = {r[0]: r for r in p.rows[1:] if r}
check(sorted(rows) == sorted(labels), f"runs table: a row per run ({sorted(rows)})")
ended = {k: r[col] if 0 <= col < len(r) else "" for k, r in rows.items()}
done, slice_, stopped, restarted = reports
check(all(r["stopped"] is None for r in (done, slice_, restarted)) and stopped["stopped"] is not None,
      "the SIGTERM run alone has a stop in its report (--stop-after is a slice, not a stop)")
check(len(restarted["restarts"]) == 1 and not any(r["restarts"] for r in (done, slice_, stopped)),
      "the run with --max-restarts alone has a restart in its report")
s, x = stopped["stopped"], restarted["restarts"][0] if restarted["restarts"] else {}
check(ended.get(labels[0]) == "completed (6 steps)", f"runs table: {labels[0]} completed ({ended.get(labels[0])!r})")
check(ended.get(labels[1]) == "paused after step 3 of 6 (--stop-after)",
      f"runs table: {labels[1]} paused after its slice ({ended.get(labels[1])!r})")
want = f"stopped by {s['signal']} after step {s['after_step']}"
check(s["signal"] == "SIGTERM" and s["after_step"] == 3 and ended.get(labels[2]) == want,
      f"runs table: {labels[2]} {want!r} ({ended.get(labels[2])!r})")
want = (f"completed (6 steps)\nrestart at step {x.get('failed_step')}: rank {x.get('failed_rank')} failed; "
        f"{x.get('ranks_before')} \u2192 {x.get('ranks_after')} ranks from step {x.get('resumed_step')}")
check(x.get("failed_step") == 5 and x.get("ranks_after") == 1 and ended.get(labels[3]) == want,
      f"runs table: {labels[3]} says its restart ({ended.get(labels[3])!r})")

svg = p.loss[0][1] if p.loss else {}
events = [(a, t) for t, a, _ in p.loss if t == "line" and "event" in a.get("class", "").split()]
check(svg.get("data-events-drawn") == "3" and len(events) == 3,
      f"loss: 3 markers, the slice's, the stop's and the restart's ({svg.get('data-events-drawn')}, {len(events)})")
curves = {a.get("data-run"): a.get("points", "").split() for t, a, _ in p.loss if t == "polyline"}
def step_x(run, step):  # where the run's curve has the step: its steps are history then steps
    r = reports[labels.index(run)]
    steps = [q["step"] for q in r["history"] + r["steps"]]
    pts = curves.get(run, [])
    return float(pts[steps.index(step)].split(",")[0]) if step in steps and len(pts) == len(steps) else None
for run, kind, step, words in ((labels[1], "stop", 3, "--stop-after 3"),
                               (labels[2], "stop", s["after_step"], f"stopped: {s['signal']}"),
                               (labels[3], "restart", x.get("failed_step"),
                                f"rank {x.get('failed_rank')} failed: {x.get('ranks_before')}\u2192{x.get('ranks_after')} ranks")):
    mine = [a for a, _ in events if a.get("data-run") == run]
    want_x = step_x(run, step)
    check(len(mine) == 1 and kind in mine[0]["class"].split() and mine[0].get("data-step") == str(step)
          and want_x is not None and abs(float(mine[0]["x1"]) - want_x) < 0.1
          and mine[0]["x1"] == mine[0]["x2"] and float(mine[0]["y1"]) < float(mine[0]["y2"]),
          f"loss: a vertical {kind} marker for {run} at step {step}, x={want_x} ({mine})")
    said = [txt for t, a, txt in p.loss if t == "text" and a.get("data-run") == run and "event-label" in a.get("class", "")]
    check(said == [words], f"loss: the marker of {run} is labelled {words!r} ({said})")
titles = " ".join(txt for t, _, txt in p.loss if t == "title")
check(s["message"] in titles and x.get("cause", "?") in titles,
      "loss: the markers' tooltips hold the report's stop message and the restart's cause")
legend = " ".join(txt for t, _, txt in p.loss if t == "text")
check("stopped before --steps" in legend and "a rank failed (restart)" in legend,
      "loss: the legend names both kinds of marker")
sys.exit(1 if fail else 0)
EOF
echo "four runs: trained, drawn and measured at 2 widths in $((($(date +%s%N) - t0) / 1000000)) ms"

if ((fail)); then
  echo "FAIL (page and DOM kept in $tmp)"
  trap - EXIT
  exit 1
fi
echo "PASS"
