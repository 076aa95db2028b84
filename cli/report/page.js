(function () {
  'use strict';
  var errors = document.getElementById('errors');
  function fail(where, e) {
    errors.textContent += where + ': ' + (e && e.message ? e.message : String(e)) + '\n';
  }
  var data;
  try {
    data = JSON.parse(document.getElementById('zerodp-data').textContent);
  } catch (e) {
    fail('embedded data', e);
    return;
  }
  // The SVG namespace, taken from an inline <svg> so the page never spells out an address.
  var NS = document.getElementById('loss').namespaceURI;
  var RUN_COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b',
                    '#e377c2', '#17becf', '#bcbd22', '#7f7f7f'];
  var STATE_CATS = ['params', 'grads', 'master', 'adam_m', 'adam_v'];
  // peak_bytes categories held from the start to the end like the model states, which
  // model_state_bytes does not list: DiLoCo's outer state (--islands).
  var STEADY_PEAKS = ['outer_state'];
  var PEAK_CATS = ['gathered', 'grad_buckets', 'grad_accum', 'activations', 'comm_buffers',
    'workspace', 'hpz_params', 'offload_staging', 'checkpoint_staging'];
  var COMM_CATS = ['all_reduce', 'reduce_scatter', 'all_gather', 'broadcast', 'control'];
  var CAT_COLORS = {
    params: '#4e79a7', grads: '#f28e2b', master: '#e15759', adam_m: '#59a14f',
    adam_v: '#76b7b2', gathered: '#edc948', grad_buckets: '#b07aa1', grad_accum: '#d37295',
    activations: '#ff9da7',
    comm_buffers: '#9c755f', workspace: '#bab0ac', hpz_params: '#8cd17d',
    offload_staging: '#a0cbe8', outer_state: '#499894', checkpoint_staging: '#79706e',
    all_reduce: '#4e79a7',
    reduce_scatter: '#e15759', all_gather: '#59a14f', broadcast: '#f28e2b', control: '#bab0ac'
  };
  var CAT_NOTES = {
    outer_state: ' (--islands: the global weights, the outer momentum and the exchange buffer)'
  };
  var EXTRA_COLORS = ['#8cd17d', '#a0cbe8', '#ffbe7d', '#d4a6c8', '#86bcb6'];
  function catColor(cat, i) { return CAT_COLORS[cat] || EXTRA_COLORS[i % EXTRA_COLORS.length]; }
  function runColor(i) { return RUN_COLORS[i % RUN_COLORS.length]; }

  function svgEl(parent, name, attrs, text) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) if (attrs[k] !== undefined) e.setAttribute(k, String(attrs[k]));
    if (text !== undefined) e.textContent = text;
    parent.appendChild(e);
    return e;
  }
  function tip(e, text) { svgEl(e, 'title', {}, text); }
  function htmlEl(parent, name, text, cls) {
    var e = document.createElement(name);
    if (text !== undefined && text !== null) e.textContent = text;
    if (cls) e.className = cls;
    parent.appendChild(e);
    return e;
  }
  function finite(v) { return typeof v === 'number' && isFinite(v); }

  var UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  function fmtBytes(b) {  // as zerodp's terminal tables write them (core/units.h)
    var i = 0, v = b;
    while (Math.abs(v) >= 1024 && i < 5) { v /= 1024; ++i; }
    return i === 0 ? v.toFixed(0) + ' B' : v.toFixed(2) + ' ' + UNITS[i];
  }
  function fmtNum(v, digits) {
    if (!finite(v)) return '—';
    return v.toLocaleString('en-US', {maximumFractionDigits: digits});
  }
  function decimalsFor(step) { return Math.max(0, Math.min(8, -Math.floor(Math.log10(step) + 1e-9))); }
  function niceStep(span, n) {
    var raw = span / n, p = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 2.5 ? 2.5 : m <= 5 ? 5 : 10) * p;
  }
  function ticks(lo, hi, n, step) {
    var s = step || niceStep(hi - lo, n), out = [];
    // Bounded: where the step is below the values' precision, k * s would stop moving.
    for (var k = Math.ceil(lo / s - 1e-9); k * s <= hi + s * 1e-9 && out.length < 50; ++k) {
      out.push(k * s);
    }
    return {step: s, values: out};
  }
  // Byte axes tick in whole units of the largest binary unit the maximum reaches.
  function byteTicks(max) {
    var i = 0, u = 1;
    while (max / u >= 1024 && i < 5) { u *= 1024; ++i; }
    var t = ticks(0, max / u, 5);
    var d = decimalsFor(t.step);
    return t.values.map(function (v) {
      return {value: v * u, label: v.toFixed(d) + ' ' + UNITS[i]};
    });
  }

  function frame(svg, w, h, m) {
    svg.setAttribute('width', w);
    svg.setAttribute('height', h);
    svg.setAttribute('viewBox', '0 0 ' + w + ' ' + h);
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    return {l: m.l, r: w - m.r, t: m.t, b: h - m.b, w: w, h: h};
  }
  function yAxis(svg, f, list, y, label) {
    var g = svgEl(svg, 'g', {'class': 'axis y'});
    list.forEach(function (t) {
      var yy = y(t.value);
      svgEl(g, 'line', {'class': 'grid', x1: f.l, x2: f.r, y1: yy, y2: yy});
      svgEl(g, 'line', {x1: f.l - 4, x2: f.l, y1: yy, y2: yy});
      svgEl(g, 'text', {x: f.l - 7, y: yy + 4, 'text-anchor': 'end'}, t.label);
    });
    svgEl(g, 'line', {x1: f.l, x2: f.l, y1: f.t, y2: f.b});
    svgEl(g, 'text', {'class': 'title', 'text-anchor': 'middle',
                      transform: 'translate(14,' + (f.t + f.b) / 2 + ') rotate(-90)'}, label);
  }
  // Charts take their figure's width, so none is wider than the page at any window width
  // (laid out at a fixed width, one with four runs spilled past a 1400 px window). Below
  // MIN_WIDTH a chart keeps that layout and the stylesheet scales it down to fit.
  var MIN_WIDTH = 560, LEGEND_W = 250, LEGEND_ROW = 18, LEGEND_TEXT = LEGEND_W - 14 - 28 - 4;
  // About 200 px of legend text a line: 36 characters at 11 px; a second line 13 px lower.
  var LEGEND_CHARS = 36, LEGEND_LINE = 13;
  function chartWidth(svg) {
    var w = svg.parentNode ? Math.floor(svg.parentNode.clientWidth) : 0;
    return w > 0 ? Math.max(MIN_WIDTH, w) : 960;  // 0: not laid out (a hidden figure)
  }
  // A label longer than a line wraps at its last space that fits onto a second line, rather
  // than lose its middle; only what has no space to wrap at (a path) or needs more than two
  // lines is cut, whole in its tooltip. The first line keeps the space, so the text element
  // reads as the label.
  function legendLines(label) {
    label = String(label);
    if (label.length <= LEGEND_CHARS) return [label];
    var cut = label.lastIndexOf(' ', LEGEND_CHARS);
    if (cut <= 0) return [clip(label, LEGEND_CHARS)];
    return [label.slice(0, cut + 1), clip(label.slice(cut + 1), LEGEND_CHARS)];
  }
  // Where each legend item goes, cols to a row: a row is as tall as its tallest label.
  function legendRows(items, cols) {
    var ys = [], height = 0;
    for (var i = 0; i < items.length; i += cols) {
      var rowH = LEGEND_ROW;
      for (var j = i; j < Math.min(items.length, i + cols); ++j) {
        ys[j] = height;
        rowH = Math.max(rowH, LEGEND_ROW + (legendLines(items[j].label).length - 1) * LEGEND_LINE);
      }
      height += rowH;
    }
    return {ys: ys, height: height};
  }
  // Where a legend goes: a column right of the plot while the plot keeps plotMin beside it,
  // else rows under the plot, as many columns a row as fit, wrapping like text. height: its
  // rows' in pixels.
  function legendPlace(items, w, left, plotMin) {
    if (w - left - LEGEND_W >= plotMin) {
      return {right: true, cols: 1, height: legendRows(items, 1).height};
    }
    var cols = Math.max(1, Math.floor((w - left) / LEGEND_W));
    return {right: false, cols: cols, height: legendRows(items, cols).height};
  }
  // A font that draws a line wider than the column has it squeezed in rather than cut at
  // the chart's edge.
  function squeeze(t) {
    if (t.getComputedTextLength() > LEGEND_TEXT) {
      t.setAttribute('textLength', LEGEND_TEXT);
      t.setAttribute('lengthAdjust', 'spacingAndGlyphs');
    }
  }

  function legend(svg, x0, y, items, cols) {
    var g = svgEl(svg, 'g', {'class': 'legend'});
    cols = cols || 1;
    var rows = legendRows(items, cols);
    items.forEach(function (it, i) {
      var yy = y + rows.ys[i];
      var x = x0 + (i % cols) * LEGEND_W;
      if (it.kind === 'line') {
        svgEl(g, 'line', {'class': 'swatch', x1: x, x2: x + 22, y1: yy, y2: yy,
                          stroke: it.color, 'stroke-width': 2.5,
                          'stroke-dasharray': it.dash});
      } else if (it.kind === 'dot') {
        svgEl(g, 'circle', {'class': 'swatch', cx: x + 11, cy: yy, r: 3.5,
                            fill: it.fill || '#fff', stroke: it.color, 'stroke-width': 1.5});
      } else if (it.kind === 'event') {
        svgEl(g, 'line', {'class': 'swatch', x1: x + 11, x2: x + 11, y1: yy - 7, y2: yy + 7,
                          stroke: '#555', 'stroke-width': 2, 'stroke-dasharray': it.dash});
      } else if (it.kind === 'tick') {
        svgEl(g, 'line', {'class': 'swatch', x1: x + 2, x2: x + 20, y1: yy, y2: yy,
                          stroke: it.color || '#111', 'stroke-width': it.width || (it.dash ? 2 : 2.5),
                          'stroke-dasharray': it.dash});
      } else if (it.kind === 'hatch') {
        var box = {x: x + 4, y: yy - 6, width: 14, height: 12};
        svgEl(g, 'rect', Object.assign({'class': 'swatch', fill: it.color, 'fill-opacity': 0.45,
                                        stroke: it.color}, box));
        svgEl(g, 'rect', Object.assign({fill: 'url(#' + it.pattern + ')'}, box));
      } else {
        svgEl(g, 'rect', {'class': 'swatch', x: x + 4, y: yy - 6, width: 14, height: 12,
                          fill: it.color, 'fill-opacity': it.opacity,
                          stroke: it.color});
      }
      var lines = legendLines(it.label);
      var t = svgEl(g, 'text', {x: x + 28, y: yy + 4}, lines.length === 1 ? lines[0] : undefined);
      if (lines.length === 1) {
        squeeze(t);
      } else {
        lines.forEach(function (line, li) {
          squeeze(svgEl(t, 'tspan', {x: x + 28, dy: li === 0 ? undefined : LEGEND_LINE}, line));
        });
      }
      if (lines.join('') !== String(it.label)) tip(t, it.label);
    });
  }
  function empty(svg, f, text) {
    svgEl(svg, 'text', {'class': 'empty', x: (f.l + f.r) / 2, y: (f.t + f.b) / 2,
                        'text-anchor': 'middle'}, text);
  }

  // Where the report wrote null for a val_loss (not finite), the data holds this string.
  var NON_FINITE = 'non-finite';

  // Losses may be anything a double holds, up to +-1.8e308, where a span or its padding
  // would overflow to infinity: huge ones are laid out scaled down by a power of ten (which
  // keeps the ticks round). lo and hi are finite; returns the ticks and v -> pixel.
  function lossAxis(lo, hi, top, bottom) {
    var k = Math.max(Math.abs(lo), Math.abs(hi)) > 1e300 ? 1e-8 : 1;
    var y0 = lo * k, y1 = hi * k;
    // At least a billionth of the magnitude, so the ticks of nearly equal huge losses still
    // step (an index past 2^53 would not).
    var pad = Math.max((y1 - y0) * 0.06, Math.max(Math.abs(y0), Math.abs(y1)) * 1e-9) || 1;
    y0 = Math.max(y0 - pad, -Number.MAX_VALUE * k);
    y1 = Math.min(y1 + pad, Number.MAX_VALUE * k);
    var t = ticks(y0, y1, 6), step = t.step / k, d = decimalsFor(step);
    var label = function (v) {
      if (v === 0) return '0';
      if (Math.abs(v) < 1e6) return v.toFixed(d);
      var digits = Math.ceil(Math.log10(Math.abs(v) / step)) + 1;
      return Number(v.toPrecision(Math.min(17, Math.max(1, digits)))).toExponential();
    };
    return {
      y: function (v) { return bottom - (v * k - y0) / (y1 - y0) * (bottom - top); },
      ticks: t.values.filter(function (v) { return isFinite(v / k); })
                     .map(function (v) { return {value: v / k, label: label(v / k)}; })
    };
  }

  // A chart's room for a name is fixed, so a long one is cut in the middle; the tooltip has
  // it whole.
  function clip(s, n) {
    s = String(s);
    if (s.length <= n) return s;
    var head = Math.ceil((n - 1) / 2);
    return s.slice(0, head) + '\u2026' + s.slice(s.length - (n - 1 - head));
  }

  // How a run ended, for its row and its marker on the loss chart: text (the row's),
  // short (the marker's label), step (where the marker goes; null: it ran to --steps) and
  // title (the report's own words). A --stop-after slice short of --steps is no stop to the
  // report (stopped is null), yet the run did not reach its last step either.
  var STOP_WHY = {max_skips: 'too many skipped steps (--max-skips)',
                  checkpoint_failed: 'a checkpoint could not be committed'};
  function runEnd(r) {
    var s = r.stopped;
    if (s) {
      var sig = s.reason === 'signal';
      var why = sig ? (s.signal || 'a signal') : STOP_WHY[s.reason] || s.reason;
      return {kind: 'stopped', step: s.after_step, title: s.message,
              text: sig ? 'stopped by ' + why + ' after step ' + s.after_step
                        : 'stopped after step ' + s.after_step + ': ' + why,
              short: 'stopped: ' + (sig ? why : s.reason)};
    }
    if (finite(r.stop_after) && finite(r.planned_steps) && r.stop_after < r.planned_steps) {
      return {kind: 'slice', step: r.stop_after,
              title: 'a time slice (--stop-after): the run goes on with --resume',
              text: 'paused after step ' + r.stop_after + ' of ' + r.planned_steps +
                    ' (--stop-after)',
              short: '--stop-after ' + r.stop_after};
    }
    return {kind: 'completed', step: null, title: '',
            text: 'completed' + (finite(r.planned_steps) ? ' (' + r.planned_steps + ' steps)' : '')};
  }
  function restartText(x) {
    var who = x.failed_rank === null ? 'a rank' : 'rank ' + x.failed_rank;
    return {
      text: 'step ' + x.failed_step + ': ' + who + ' failed; ' + x.ranks_before + ' \u2192 ' +
            x.ranks_after + ' ranks from step ' + x.resumed_step,
      short: who + ' failed: ' + x.ranks_before + '\u2192' + x.ranks_after + ' ranks',
      title: who + ' failed at step ' + x.failed_step + ' (' + x.cause + '); the run went on with ' +
             x.ranks_after + ' of ' + x.ranks_before + ' ranks from the checkpoint of step ' +
             x.resumed_step + (x.order_note ? '; ' + x.order_note : '')
    };
  }

  function drawLoss() {
    var svg = document.getElementById('loss');
    var series = [];
    data.runs.forEach(function (r, i) {
      series.push({label: r.label, color: runColor(i), steps: r.steps,
                   finalVal: r.final_val_loss, outer: r.outer_steps || []});
    });
    data.metrics.forEach(function (m, j) {
      series.push({label: m.label + ' (metrics)', color: runColor(data.runs.length + j),
                   steps: m.steps, dash: '7 4'});
    });
    // Everything to draw, gathered first so the axes cover all of it: train losses, the
    // validation points, and the steps whose loss is not finite (marked, not drawn).
    var x0 = Infinity, x1 = -Infinity, lo = Infinity, hi = -Infinity;
    var badLoss = 0, badVal = 0;
    var seeX = function (v) { x0 = Math.min(x0, v); x1 = Math.max(x1, v); };
    var seeY = function (v) { lo = Math.min(lo, v); hi = Math.max(hi, v); };
    series.forEach(function (s) {
      s.pts = [];
      s.vals = [];
      s.bad = [];
      var last = null;
      s.steps.forEach(function (p) {
        seeX(p[0]);
        if (last === null || p[0] > last[0]) last = p;
        if (finite(p[1])) {
          s.pts.push(p);
          seeY(p[1]);
        } else {
          s.bad.push({step: p[0], what: 'loss'});
          ++badLoss;
        }
        if (finite(p[2])) {
          s.vals.push({step: p[0], loss: p[2]});
          seeY(p[2]);
        } else if (p[2] === NON_FINITE) {
          s.bad.push({step: p[0], what: 'val_loss'});
          ++badVal;
        }
      });
      // The evaluation after the last step is only in the report's final.val_loss: it
      // belongs at the last step, unless that step already holds it.
      if (finite(s.finalVal) && last !== null && last[2] !== s.finalVal) {
        s.vals.push({step: last[0], loss: s.finalVal, final: true});
        seeY(s.finalVal);
      }
    });
    var notes = [];
    if (badLoss > 0) notes.push(badLoss + (badLoss === 1 ? ' step' : ' steps') +
                                ' with a non-finite loss');
    if (badVal > 0) notes.push(badVal + ' non-finite val_loss' + (badVal === 1 ? '' : 'es'));
    // Stages and rank counts promise the same losses, so curves often coincide: earlier
    // series are drawn wider, and the legend says which ones are identical.
    var key = function (s) {
      return JSON.stringify(s.steps.map(function (p) { return [p[0], p[1]]; }));
    };
    var items = [], anyFinal = false;
    series.forEach(function (s, si) {
      var same = null;
      for (var j = 0; j < si && s.pts.length > 0; ++j) {
        if (key(series[j]) === key(s)) { same = series[j].label; break; }
      }
      items.push({kind: 'line', color: s.color, dash: s.dash,
                  label: s.label + (s.pts.length === 0 ? ' (no steps)'
                                    : same ? ' (= ' + same + ')' : '')});
      s.vals.forEach(function (v) { if (v.final) anyFinal = true; });
    });
    items.push({kind: 'dot', color: '#555', label: 'val_loss'});
    if (anyFinal) items.push({kind: 'dot', color: '#555', fill: '#555', label: 'final val_loss'});
    // Where a run stopped early and where a rank failed and the run went on with fewer.
    var events = [];
    data.runs.forEach(function (r, i) {
      var end = runEnd(r);
      if (end.step !== null) {
        events.push({kind: 'stop', step: end.step, run: r.label, color: runColor(i),
                     label: end.short, title: r.label + ': ' + end.text + ' (' + end.title + ')'});
      }
      r.restarts.forEach(function (x) {
        var t = restartText(x);
        events.push({kind: 'restart', step: x.failed_step, run: r.label, color: runColor(i),
                     label: t.short, title: r.label + ': ' + t.title});
      });
    });
    if (series.some(function (s) { return s.outer && s.outer.length > 0; })) {
      items.push({kind: 'tick', label: 'outer step (--islands), on the bottom edge'});
    }
    var EVENT_DASH = {stop: '6 3', restart: '2 3'};
    if (events.some(function (e) { return e.kind === 'stop'; })) {
      items.push({kind: 'event', dash: EVENT_DASH.stop, label: 'stopped before --steps'});
    }
    if (events.some(function (e) { return e.kind === 'restart'; })) {
      items.push({kind: 'event', dash: EVENT_DASH.restart, label: 'a rank failed (restart)'});
    }

    var w = chartWidth(svg), noteH = notes.length ? 18 : 0;
    var place = legendPlace(items, w, 66, 420);
    var f = place.right
      ? frame(svg, w, 380 + Math.max(0, place.height - 16 * LEGEND_ROW) + noteH,
              {l: 66, r: LEGEND_W, t: 14, b: 46 + noteH})
      : frame(svg, w, 380 + place.height + 8 + noteH,
              {l: 66, r: 24, t: 14, b: 46 + noteH + place.height + 8});
    svg.setAttribute('data-plot', [f.l, f.t, f.r, f.b].join(' '));
    svg.setAttribute('data-events-drawn', 0);
    if (notes.length) {
      svgEl(svg, 'text', {'class': 'note', x: f.l, y: f.b + 56, fill: '#b42318'},
            notes.join(' and ') + ': not drawn; red ticks on the top edge mark the steps');
    }
    var drawLegend = function () {
      if (place.right) legend(svg, f.r + 14, f.t + 8, items);
      else legend(svg, f.l, f.b + 46 + noteH + 14, items, place.cols);
    };
    var drawn = 0;
    if (!(x1 >= x0) || !(hi >= lo)) {
      empty(svg, f, 'no finite losses to draw');
      svg.setAttribute('data-drawn', 0);
      drawLegend();
      return;
    }
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    var x = function (v) { return f.l + (v - x0) / (x1 - x0) * (f.r - f.l); };
    var ax = lossAxis(lo, hi, f.t, f.b), y = ax.y;
    yAxis(svg, f, ax.ticks, y, 'loss');
    var xt = ticks(x0, x1, 8, Math.max(1, Math.round(niceStep(x1 - x0, 8))));
    var gx = svgEl(svg, 'g', {'class': 'axis x'});
    svgEl(gx, 'line', {x1: f.l, x2: f.r, y1: f.b, y2: f.b});
    xt.values.forEach(function (v) {
      svgEl(gx, 'line', {x1: x(v), x2: x(v), y1: f.b, y2: f.b + 4});
      svgEl(gx, 'text', {x: x(v), y: f.b + 16, 'text-anchor': 'middle'}, String(v));
    });
    svgEl(gx, 'text', {'class': 'title', x: (f.l + f.r) / 2, y: f.b + 36,
                       'text-anchor': 'middle'}, 'optimizer step');
    series.forEach(function (s, si) {
      var pts = s.pts;
      var g = svgEl(svg, 'g', {'class': 'run'});
      if (pts.length > 0) {
        var line = svgEl(g, 'polyline', {
          'class': 'series', fill: 'none', stroke: s.color,
          'stroke-width': 2 + 2.5 * Math.min(3, series.length - 1 - si),
          'stroke-linejoin': 'round', 'stroke-dasharray': s.dash, 'data-run': s.label,
          points: pts.map(function (p) { return x(p[0]).toFixed(1) + ',' + y(p[1]).toFixed(1); })
                     .join(' ')
        });
        tip(line, s.label + ': ' + pts.length + ' steps, last loss ' +
                  pts[pts.length - 1][1].toFixed(4));
        if (pts.length === 1) {
          svgEl(g, 'circle', {cx: x(pts[0][0]), cy: y(pts[0][1]), r: 3, fill: s.color});
        }
        ++drawn;
      }
      s.vals.forEach(function (v) {
        var c = svgEl(g, 'circle', {'class': v.final ? 'val final' : 'val', cx: x(v.step),
                                    cy: y(v.loss), r: 3.5, fill: v.final ? s.color : '#fff',
                                    stroke: s.color, 'stroke-width': 1.5});
        tip(c, s.label + ': ' + (v.final ? 'final val_loss ' : 'val_loss ') +
               v.loss.toFixed(4) + (v.final ? ', after step ' : ' at step ') + v.step);
      });
      (s.outer || []).forEach(function (step) {
        var o = svgEl(g, 'line', {'class': 'outer', x1: x(step), x2: x(step), y1: f.b - 8,
                                  y2: f.b, stroke: s.color, 'stroke-width': 1.5});
        tip(o, s.label + ': outer step after step ' + step);
      });
      s.bad.forEach(function (b) {
        var m = svgEl(g, 'line', {'class': 'nonfinite', x1: x(b.step), x2: x(b.step), y1: f.t,
                                  y2: f.t + 8, stroke: '#b42318', 'stroke-width': 2});
        tip(m, s.label + ': ' + b.what + ' at step ' + b.step + ' is not finite');
      });
    });
    // A vertical line across the plot at each event's step, its label at the top: on the
    // first row where it overlaps no earlier label (about 6 px a character), turned to the
    // line's left where it would pass the plot's right edge.
    var eg = svgEl(svg, 'g', {'class': 'events'}), rows = [], shown = 0;
    events.filter(function (e) { return finite(e.step) && e.step >= x0 && e.step <= x1; })
      .sort(function (a, b) { return a.step - b.step; })
      .forEach(function (e) {
        var xx = x(e.step), tw = 6 * e.label.length;
        var right = xx + 4 + tw <= f.r;
        var span = right ? [xx, xx + 4 + tw] : [xx - 4 - tw, xx];
        var row = 0;
        while (rows[row] !== undefined && rows[row] > span[0] - 6) ++row;
        rows[row] = span[1];
        var ln = svgEl(eg, 'line', {'class': 'event ' + e.kind, 'data-run': e.run,
                                    'data-step': e.step, x1: xx, x2: xx, y1: f.t, y2: f.b,
                                    stroke: e.color, 'stroke-width': 1.8,
                                    'stroke-dasharray': EVENT_DASH[e.kind]});
        tip(ln, e.title);
        var t = svgEl(eg, 'text', {'class': 'event-label ' + e.kind, 'data-run': e.run,
                                   x: right ? xx + 4 : xx - 4, y: f.t + 20 + row * 14,
                                   'text-anchor': right ? 'start' : 'end',
                                   style: 'fill: ' + e.color},
                      e.label);
        tip(t, e.title);
        ++shown;
      });
    svg.setAttribute('data-events-drawn', shown);
    drawLegend();
    svg.setAttribute('data-drawn', drawn);
  }

  // Stacked bars per rank, grouped per run, on one scale. groups: [{label, sub, color, bars:
  // [{label, segs: [{cat, value, pale}], marks: [{value, title}], twin}]}]. Zero segments are
  // not drawn, so every rect.bar has a positive height; data-drawn counts them. A bar's twin
  // ({segs, marks, what}, or null), drawn narrower at its right, shows a part of it on the
  // same scale: pale, hatched segments (rect.cross, counted by data-cross-drawn) and dashed
  // marks.
  function stackedBars(svg, groups, cats, opts) {
    var nbars = 0, max = 0, weight = 0, TWIN = 0.5;
    var sumOf = function (segs) {
      var sum = 0;
      segs.forEach(function (s) { sum += s.value; });
      return sum;
    };
    groups.forEach(function (g) {
      nbars += g.bars.length;
      g.twins = g.bars.some(function (b) { return !!b.twin; });
      weight += g.bars.length * (g.twins ? 1 + TWIN : 1);
      g.bars.forEach(function (b) {
        [b].concat(b.twin ? [b.twin] : []).forEach(function (part) {
          max = Math.max(max, sumOf(part.segs));
          part.marks.forEach(function (m) { max = Math.max(max, m.value); });
        });
      });
    });
    var used = {};
    groups.forEach(function (g) {
      g.bars.forEach(function (b) {
        b.segs.forEach(function (s) { if (s.value > 0) used[s.cat] = s.pale ? 'pale' : 'solid'; });
      });
    });
    var anyCross = groups.some(function (g) {
      return g.bars.some(function (b) {
        return !!b.twin && b.twin.segs.some(function (s) { return s.value > 0; });
      });
    });
    var items = [];
    cats.forEach(function (c, i) {
      if (!used[c]) return;
      items.push({kind: 'rect', color: catColor(c, i), opacity: used[c] === 'pale' ? 0.45 : 1,
                  label: c + (opts.suffix ? opts.suffix(c) : '')});
    });
    opts.marks.forEach(function (m) {
      items.push(typeof m === 'string' ? {kind: 'tick', label: m}
                                       : Object.assign({kind: 'tick'}, m));
    });
    var hatch = svg.id + '-hatch';
    if (anyCross) items.push({kind: 'hatch', color: '#777', pattern: hatch, label: opts.twin.label});
    if (opts.twin && opts.twin.mark) items.push({kind: 'tick', dash: '3 2', label: opts.twin.mark});

    // A group is as wide as its bars or its labels (about 6.5 px a character), bars centred.
    // The legend stays right of the bars while they fit beside it, else it goes under them;
    // where they still do not fit, the labels are cut shorter, then the bars drawn narrower.
    var gap = 30, inner = 4, left = 76, w = chartWidth(svg), plotW = 0, bw = 0, tw = 0;
    var layout = function (avail, chars) {
      bw = Math.max(5, Math.min(38, (Math.min(660, avail) - groups.length * gap) /
                                        Math.max(1, weight) - inner));
      tw = Math.max(3, Math.round(bw * TWIN));
      plotW = 0;
      groups.forEach(function (g) {
        g.slot = bw + (g.twins ? tw + 1 : 0) + inner;
        g.barsW = g.bars.length * g.slot - inner;
        g.shown = clip(g.label, Math.min(40, chars));
        g.subShown = clip(g.sub, chars);
        g.width = Math.max(g.barsW, 6.5 * Math.max(g.shown.length, g.subShown.length));
        plotW += g.width + gap;
      });
      return plotW <= avail;
    };
    var place = legendPlace(items, w, left, 0);
    if (!layout(w - left - LEGEND_W, 60)) {
      place = legendPlace(items, w, left, Infinity);  // under the bars
      var chars = 60;
      while (!layout(w - left - 16, chars) && chars > 12) chars -= 4;
    }
    // Wider than the figure only where even that could not fit: the stylesheet scales it.
    w = Math.max(w, left + plotW + (place.right ? LEGEND_W : 16));
    var below = place.right ? 0 : place.height + 8;
    var f = frame(svg, w, opts.height + below,
                  {l: left, r: place.right ? LEGEND_W : 16, t: 14, b: 64 + below});
    svg.setAttribute('data-cross-drawn', 0);
    if (nbars === 0 || !(max > 0)) {
      empty(svg, f, opts.empty);
      svg.setAttribute('data-drawn', 0);
      return;
    }
    var anyTwin = groups.some(function (g) { return g.twins; });
    if (anyTwin) {
      // Diagonal strokes over the twin's pale colours: a fragment of this page, nothing loaded.
      var pat = svgEl(svgEl(svg, 'defs', {}), 'pattern', {
        id: hatch, width: 5, height: 5, patternUnits: 'userSpaceOnUse',
        patternTransform: 'rotate(45)'
      });
      svgEl(pat, 'line', {x1: 0, y1: 0, x2: 0, y2: 5, stroke: '#333', 'stroke-width': 1.6,
                          'stroke-opacity': 0.6});
    }
    var yl = byteTicks(max * 1.04);
    var top = yl[yl.length - 1].value;
    if (top < max) top = max;
    var y = function (v) { return f.b - v / top * (f.b - f.t); };
    yAxis(svg, f, yl, y, opts.ylabel);
    var drawn = 0, crossDrawn = 0, gstart = f.l + gap / 2;
    var gx = svgEl(svg, 'g', {'class': 'axis x'});
    svgEl(gx, 'line', {x1: f.l, x2: f.r, y1: f.b, y2: f.b});
    groups.forEach(function (g) {
      var every = Math.ceil(14 / g.slot);
      var xx = gstart + (g.width - g.barsW) / 2;
      var gg = svgEl(svg, 'g', {'class': 'group', 'data-run': g.label});
      g.bars.forEach(function (b, bi) {
        var acc = 0;
        b.segs.forEach(function (s) {
          if (!(s.value > 0)) return;
          var r = svgEl(gg, 'rect', {
            'class': 'bar', 'data-cat': s.cat, 'data-bytes': s.value, x: xx.toFixed(1),
            y: y(acc + s.value).toFixed(3), width: bw.toFixed(1),
            height: (y(acc) - y(acc + s.value)).toFixed(3),
            fill: catColor(s.cat, cats.indexOf(s.cat)), 'fill-opacity': s.pale ? 0.45 : 1,
            stroke: s.pale ? catColor(s.cat, cats.indexOf(s.cat)) : 'none',
            'stroke-width': s.pale ? 0.8 : undefined
          });
          tip(r, g.label + ' rank ' + b.label + ' · ' + s.cat + ': ' + fmtBytes(s.value) +
                 (s.pale ? ' (peak)' : '') + (CAT_NOTES[s.cat] || ''));
          acc += s.value;
          ++drawn;
        });
        b.marks.forEach(function (m) {
          var ml = svgEl(gg, 'line', {'class': 'mark' + (m.cls ? ' ' + m.cls : ''),
                                      'data-bytes': m.value, x1: xx - 3, x2: xx + bw + 3,
                                      y1: y(m.value), y2: y(m.value), stroke: m.color || '#111',
                                      'stroke-width': m.width || 2.5,
                                      'stroke-dasharray': m.dash});
          tip(ml, g.label + ' rank ' + b.label + ' · ' + m.title + ': ' + fmtBytes(m.value));
        });
        if (b.twin) {
          var tx = xx + bw + 1, tacc = 0;
          b.twin.segs.forEach(function (s) {
            if (!(s.value > 0)) return;
            var color = catColor(s.cat, cats.indexOf(s.cat));
            var attrs = {x: tx.toFixed(1), y: y(tacc + s.value).toFixed(3), width: tw.toFixed(1),
                         height: (y(tacc) - y(tacc + s.value)).toFixed(3)};
            var r = svgEl(gg, 'rect', Object.assign({
              'class': 'cross', 'data-cat': s.cat, 'data-bytes': s.value, fill: color,
              'fill-opacity': 0.45, stroke: color, 'stroke-width': 0.8
            }, attrs));
            svgEl(gg, 'rect', Object.assign({'class': 'hatch', fill: 'url(#' + hatch + ')',
                                             'pointer-events': 'none'}, attrs));
            tip(r, g.label + ' rank ' + b.label + ' · ' + s.cat + ', ' + b.twin.what + ': ' +
                   fmtBytes(s.value) + ' of ' + fmtBytes(s.of));
            tacc += s.value;
            ++crossDrawn;
          });
          b.twin.marks.forEach(function (m) {
            var ml = svgEl(gg, 'line', {'class': 'mark cross', 'data-bytes': m.value,
                                        x1: tx - 2, x2: tx + tw + 2,
                                        y1: y(m.value), y2: y(m.value), stroke: '#111',
                                        'stroke-width': 2, 'stroke-dasharray': '3 2'});
            tip(ml, g.label + ' rank ' + b.label + ' · ' + m.title + ': ' + fmtBytes(m.value));
          });
        }
        if (bi % every === 0 || bi === g.bars.length - 1) {
          svgEl(gx, 'text', {x: xx + (g.slot - inner) / 2, y: f.b + 14, 'text-anchor': 'middle'},
                'r' + b.label);
        }
        xx += g.slot;
      });
      var mid = gstart + g.width / 2;
      var gt = svgEl(gx, 'text', {'class': 'title', x: mid, y: f.b + 32,
                                  'text-anchor': 'middle', fill: g.color}, g.shown);
      if (g.shown !== g.label) tip(gt, g.label);
      var st = svgEl(gx, 'text', {x: mid, y: f.b + 47, 'text-anchor': 'middle'}, g.subShown);
      if (g.subShown !== g.sub) tip(st, g.sub);
      gstart += g.width + gap;
    });
    if (place.right) legend(svg, f.r + 14, f.t + 8, items);
    else legend(svg, f.l, f.b + 64 + 14, items, place.cols);
    svg.setAttribute('data-drawn', drawn);
    svg.setAttribute('data-cross-drawn', crossDrawn);
  }

  function runSub(r) {
    return 'stage ' + r.stage + ' · N=' + r.world_size +
           (r.islands > 1 ? ' (' + r.islands + ' islands)' : '') + ' · ' + r.precision;
  }
  // What an offloaded run keeps on disk: not memory, so beside the bars, not in them.
  function diskSub(r) {
    var most = 0;
    r.ranks.forEach(function (k) { most = Math.max(most, k.nvme || 0); });
    return most > 0 ? ' · ' + fmtBytes(most) + ' on disk' : '';
  }

  function drawMemory() {
    // Categories a later writer adds are stacked too, pale, so the stack still reaches the
    // peak tick.
    var pale = PEAK_CATS.slice();
    data.runs.forEach(function (r) {
      r.ranks.forEach(function (k) {
        Object.keys(k.peaks).forEach(function (c) {
          if (STEADY_PEAKS.indexOf(c) < 0 && pale.indexOf(c) < 0) pale.push(c);
        });
      });
    });
    var groups = data.runs.map(function (r, i) {
      return {label: r.label, sub: runSub(r) + diskSub(r), color: runColor(i), bars: r.ranks.map(function (k) {
        var segs = STATE_CATS.map(function (c) { return {cat: c, value: k.states[c]}; })
          .concat(STEADY_PEAKS.map(function (c) { return {cat: c, value: k.peaks[c] || 0}; }))
          .concat(pale.map(function (c) { return {cat: c, value: k.peaks[c] || 0, pale: true}; }));
        return {label: String(k.rank), segs: segs,
                marks: [{value: k.peak_total, title: 'peak of the sum (peak_bytes.total)'}]};
      })};
    });
    stackedBars(document.getElementById('memory'), groups, STATE_CATS.concat(STEADY_PEAKS, pale), {
      height: 420, ylabel: 'bytes per rank', empty: 'no ranks to draw',
      marks: ['peak of the sum (peak_bytes.total)'],
      suffix: function (c) {
        return STATE_CATS.indexOf(c) >= 0 ? ' (steady)'
          : c === 'outer_state' ? ' (steady, --islands)' : ' (peak)';
      }
    });
  }

  function drawComm() {
    var cats = COMM_CATS.slice();
    data.runs.forEach(function (r) {
      r.ranks.forEach(function (k) {
        if (!k.comm_per_step) return;
        Object.keys(k.comm_per_step).forEach(function (c) { if (cats.indexOf(c) < 0) cats.push(c); });
      });
    });
    var anyPlan = false, anyPlanCross = false, anyCross = false, anyOuter = false;
    // With --islands the measured bars hold the outer exchanges too, spread over the steps
    // as the ledger counted them: the formula's tick adds them alike, so it meets the bars,
    // and a grey tick keeps the inner step's formula alone in view.
    var planned = function (step, outer, steps, what) {
      var title = 'formula' + what + ' (plan)';
      if (!finite(outer)) return {value: step, title: title};
      return {value: step + outer,
              title: title + ', ' + fmtBytes(step) + ' an inner step + ' + fmtBytes(outer) +
                     ' a step of outer exchanges (plan.comm_bytes_outer_steps \u00f7 ' + steps +
                     ' steps)'};
    };
    var groups = data.runs.map(function (r, i) {
      var sub = runSub(r) + ' · ' + r.step_count + ' steps' +
                (finite(r.node_ranks) ? ' · nodes of ' + r.node_ranks : '');
      return {label: r.label, sub: sub, color: runColor(i),
              bars: r.ranks.map(function (k) {
                var per = k.comm_per_step || {};
                var marks = [];
                if (finite(k.plan_comm_per_step)) {
                  anyPlan = true;
                  marks.push(planned(k.plan_comm_per_step, k.plan_outer_per_step, r.step_count, ''));
                  if (finite(k.plan_outer_per_step)) {
                    anyOuter = true;
                    marks.push({value: k.plan_comm_per_step, cls: 'inner', color: '#888',
                                width: 1.5, title: 'formula, the inner step alone ' +
                                                   '(plan.comm_bytes_per_step)'});
                  }
                }
                // Only a run over nodes has a cross_per_step: the part of each collective's
                // bytes that came from peers on other nodes, beside the bar it is part of.
                var twin = null;
                if (k.cross_per_step) {
                  anyCross = true;
                  var cross = k.cross_per_step, tmarks = [];
                  if (finite(k.plan_cross_per_step)) {
                    anyPlanCross = true;
                    tmarks.push(planned(k.plan_cross_per_step, k.plan_outer_cross_per_step,
                                        r.step_count, ' crossing nodes'));
                  }
                  twin = {what: 'crossing nodes', marks: tmarks, segs: cats.map(function (c) {
                    return {cat: c, value: cross[c] || 0, of: per[c] || 0};
                  })};
                }
                return {label: String(k.rank), marks: marks, twin: twin,
                        segs: cats.map(function (c) { return {cat: c, value: per[c] || 0}; })};
              })};
    });
    var marks = [];
    if (anyPlan) {
      marks.push(anyOuter ? 'formula (plan): inner step + outer exchanges ÷ steps'
                          : 'formula (plan.comm_bytes_per_step)');
    }
    if (anyOuter) {
      marks.push({color: '#888', width: 1.5, label: 'formula, the inner step alone (--islands)'});
    }
    stackedBars(document.getElementById('comm'), groups, cats, {
      height: 400, ylabel: 'bytes received per step', empty: 'no communication to draw',
      marks: marks,
      twin: {label: 'crossing nodes (cross_node_bytes)',
             mark: !anyPlanCross ? null
               : anyOuter ? 'formula, crossing nodes (plan): inner step + outer exchanges ÷ steps'
               : 'formula, crossing nodes (plan)'}
    });
    // The caption's words on the hatched bars and on the islands, only where a run has them.
    document.getElementById('comm-cross').hidden = !anyCross;
    document.getElementById('comm-outer').hidden = !anyOuter;
  }

  function keyCell(tr, label, color) {
    var td = htmlEl(tr, 'td', null, 'l run');
    var k = htmlEl(td, 'span', null, 'key');
    k.style.background = color;
    td.appendChild(document.createTextNode(label));
    return td;
  }

  function drawRuns() {
    var t = document.getElementById('runs'), body = t.tBodies[0];
    data.runs.forEach(function (r, i) {
      var tr = htmlEl(body, 'tr');
      keyCell(tr, r.label, runColor(i)).title = r.data || '';
      htmlEl(tr, 'td', String(r.stage));
      htmlEl(tr, 'td', String(r.world_size));
      htmlEl(tr, 'td', r.precision);
      htmlEl(tr, 'td', fmtNum(r.params, 0));
      htmlEl(tr, 'td', String(r.step_count) + (r.resumed_from ? ' (resumed)' : ''));
      // How the run ended, then a line per restart on its way there.
      var end = runEnd(r), td = htmlEl(tr, 'td', null, 'l ended');
      var how = htmlEl(td, 'div', end.text, 'end ' + end.kind);
      if (end.title) how.title = end.title;
      r.restarts.forEach(function (x) {
        var t = restartText(x);
        htmlEl(td, 'div', 'restart at ' + t.text, 'restart').title = t.title;
      });
      htmlEl(tr, 'td', fmtNum(r.tokens_per_second, 0));
      htmlEl(tr, 'td', finite(r.mfu) ? (100 * r.mfu).toFixed(1) + ' %' : '—');
      htmlEl(tr, 'td', finite(r.final_loss) ? r.final_loss.toFixed(4) : '—');
      htmlEl(tr, 'td', finite(r.final_val_loss) ? r.final_val_loss.toFixed(4) : '—');
      var sha = htmlEl(tr, 'td', r.weights_sha256.slice(0, 16), 'l sha');
      sha.title = r.weights_sha256;
      htmlEl(tr, 'td', r.backend, 'l');
      htmlEl(tr, 'td', r.model || '', 'l');
    });
    t.setAttribute('data-drawn', data.runs.length);
  }

  function breakdown(o) {
    return STATE_CATS.map(function (c) { return c + ' ' + fmtBytes(o[c]); }).join(', ');
  }

  // The ranks the formula divides by where they are not N: ZeRO shards inside an island
  // (--islands), or inside a node (--shard-within-node).
  function shardNote(r) {
    if (!(r.shard_ranks > 0) || r.shard_ranks === r.world_size) return null;
    return r.islands > 1 ? {cell: r.world_size + ' (' + r.islands + ' islands of ' + r.shard_ranks + ')',
                            why: 'an island\'s ' + r.shard_ranks + ' ranks: ZeRO shards within an island'}
                         : {cell: r.world_size + ' (shards of ' + r.shard_ranks + ')',
                            why: 'a node\'s ' + r.shard_ranks + ' ranks: --shard-within-node'};
  }

  function drawEstimate() {
    var t = document.getElementById('estimate'), body = t.tBodies[0], rows = 0;
    data.runs.forEach(function (r, i) {
      var shard = shardNote(r);
      r.ranks.forEach(function (k) {
        var tr = htmlEl(body, 'tr');
        keyCell(tr, r.label, runColor(i));
        htmlEl(tr, 'td', String(r.stage));
        htmlEl(tr, 'td', shard ? shard.cell : String(r.world_size));
        htmlEl(tr, 'td', String(k.rank));
        htmlEl(tr, 'td', fmtBytes(k.states_total)).title = breakdown(k.states);
        htmlEl(tr, 'td', fmtBytes(r.formula.total)).title =
          breakdown(r.formula) + (shard ? '; divided by ' + shard.why : '');
        htmlEl(tr, 'td', r.formula.total > 0 ? (k.states_total / r.formula.total).toFixed(4) : '—');
        htmlEl(tr, 'td', k.nvme > 0 ? fmtBytes(k.nvme) : '—', 'nvme');
        if (k.plan_states) {
          htmlEl(tr, 'td', fmtBytes(k.plan_states.total)).title = breakdown(k.plan_states);
          var same = k.plan_states.total === k.states_total;
          var d = k.states_total - k.plan_states.total;
          htmlEl(tr, 'td', same ? 'exact' : 'differs by ' + (d > 0 ? '+' : '') + d + ' B',
                 same ? 'l exact' : 'l diff');
        } else {
          htmlEl(tr, 'td', '—');
          htmlEl(tr, 'td', 'report has no plan', 'l');
        }
        ++rows;
      });
    });
    t.setAttribute('data-drawn', rows);
  }

  var src = data.runs.map(function (r) { return r.label; })
    .concat(data.metrics.map(function (m) { return m.label; }));
  document.getElementById('sources').textContent = src.join(', ');
  var charts = [['loss chart', drawLoss], ['memory chart', drawMemory], ['comm chart', drawComm]];
  var draw = function (d) {
    try { d[1](); } catch (e) { fail(d[0], e); }
  };
  [['runs table', drawRuns]].concat(charts, [['estimate table', drawEstimate]]).forEach(draw);
  document.body.setAttribute('data-rendered', errors.textContent ? 'with-errors' : 'ok');
  // The charts follow the window: drawn again when their figures' width changes.
  var drawnAt = chartWidth(document.getElementById('loss'));
  window.addEventListener('resize', function () {
    var now = chartWidth(document.getElementById('loss'));
    if (now === drawnAt) return;
    drawnAt = now;
    charts.forEach(draw);
  });
})();
