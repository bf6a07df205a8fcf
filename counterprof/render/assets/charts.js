/* counterprof's charts over uPlot (inlined beside this file by counterprof/render/charts.py):
   timelines (one panel per collector and unit, steps as bands, regions as lanes, cursor and
   drag-to-zoom shared), trends (y from zero, one dot per run) and the roofline (log-log, ops
   as dots, the largest labelled). The data is the JSON in #cp-data; after drawing, the page
   writes what it drew (series, points, tick labels and their boxes, overlaps) as JSON into
   #cp-layout, which the tests read back from the DOM. */
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("cp-data").textContent);
  var FONT = 11, AXFONT = FONT + "px system-ui,-apple-system,Segoe UI,Roboto,sans-serif";
  var YW = 84;                        // every panel's y axis is this wide: their x axes line up
  var charts = [];                    // {u, id, kind, el, points, series, labels: [elements]}
  var measure = document.createElement("canvas").getContext("2d");
  measure.font = AXFONT;

  // ---- numbers into words: counterprof/ground/units.py's rules -----------------------------
  function sig(v, n) { return Number(v.toPrecision(n)).toString(); }
  function secs(v) {
    var a = Math.abs(v);
    if (a >= 1 || v === 0) return sig(v, 4) + " s";
    if (a >= 1e-3) return sig(v * 1e3, 3) + " ms";
    return sig(v * 1e6, 3) + " µs";
  }
  function binary(v, suffix) {
    var a = Math.abs(v), u = [["TiB", 1099511627776], ["GiB", 1073741824], ["MiB", 1048576], ["KiB", 1024]];
    for (var i = 0; i < u.length; i++) if (a >= u[i][1]) return sig(v / u[i][1], 3) + " " + u[i][0] + suffix;
    return sig(v, 3) + " B" + suffix;
  }
  function si(v, unit) {
    var a = Math.abs(v), p = [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
    for (var i = 0; i < p.length; i++) if (a >= p[i][0]) return sig(v / p[i][0], 3) + " " + p[i][1] + unit;
    return (sig(v, 3) + " " + unit).trim();
  }
  function fmt(v, unit) {
    if (v == null || !isFinite(v)) return "—";
    if (unit === "s") return secs(v);
    if (unit === "ns") return secs(v / 1e9);
    if (unit.indexOf("bytes") === 0) return binary(v, unit.slice(5));
    if (unit === "percent") return sig(v, 3) + "%";
    if (unit === "share") return sig(100 * v, 3) + "%";
    if (unit === "CPUs") return sig(v, 3) + " CPUs";
    if (unit === "ratio" || unit === "" || unit === "count") return si(v, "");
    return si(v, unit);
  }
  window.counterprofFormat = fmt;

  // ---- the tooltip: one, following the cursor ---------------------------------------------
  var tip = document.createElement("div");
  tip.className = "cp-tip";
  tip.style.display = "none";
  document.body.appendChild(tip);
  function showTip(u, lines, left, top) {
    if (!lines.length) { tip.style.display = "none"; return; }
    tip.textContent = "";
    lines.forEach(function (l) {
      var d = document.createElement("div");
      if (l.color) {
        var s = document.createElement("span");
        s.className = "cp-swatch"; s.style.background = l.color; d.appendChild(s);
      }
      d.appendChild(document.createTextNode(l.text));
      tip.appendChild(d);
    });
    var r = u.over.getBoundingClientRect();
    tip.style.display = "block";
    var x = r.left + window.scrollX + left + 14, y = r.top + window.scrollY + top + 14;
    if (left + 14 + tip.offsetWidth > r.width) x -= tip.offsetWidth + 28;
    tip.style.left = x + "px"; tip.style.top = y + "px";
  }
  function hideTip() { tip.style.display = "none"; }

  function axis(unit, scale, extra) {
    var a = {
      scale: scale, font: AXFONT, size: YW, gap: 4, stroke: "#444",
      grid: {stroke: "#eee", width: 1}, ticks: {stroke: "#ccc", width: 1, size: 4},
      values: function (u, splits) { return splits.map(function (v) { return fmt(v, unit); }); }
    };
    for (var k in extra) a[k] = extra[k];
    return a;
  }
  function secondsAxis() {
    return {
      font: AXFONT, size: 30, gap: 4, stroke: "#444", grid: {stroke: "#eee", width: 1},
      ticks: {stroke: "#ccc", width: 1, size: 4}, space: 70,
      values: function (u, splits, ax, space, incr) {
        var d = Math.max(0, Math.min(6, -Math.floor(Math.log10(incr) + 1e-9)));
        return splits.map(function (v) { return v.toFixed(d) + " s"; });
      }
    };
  }
  function label(parent, text, cls, left, top, title) {
    var d = document.createElement("div");
    d.className = "cp-label " + (cls || "");
    d.textContent = text;
    d.title = title || text;
    d.style.left = left + "px"; d.style.top = top + "px";
    parent.appendChild(d);
    return d;
  }
  function px(u, v, key) { return u.valToPos(v, key, true); }   // canvas pixels, for drawing

  // ---- timelines --------------------------------------------------------------------------
  var group = [];          // the timeline's charts: zoomed and reset together
  var syncing = false;
  function zoomAll(min, max) {
    if (syncing) return;
    syncing = true;
    group.forEach(function (u) { u.setScale("x", {min: min, max: max}); });
    syncing = false;
  }
  function bands(tl) {     // steps as alternating grey bands behind every panel's lines
    return function (u) {
      var ctx = u.ctx, top = u.bbox.top, h = u.bbox.height;
      ctx.save();
      tl.steps.forEach(function (s, i) {
        var a = px(u, s[0], "x"), b = px(u, s[1], "x");
        ctx.fillStyle = i % 2 ? "rgba(90,90,90,0.10)" : "rgba(90,90,90,0.05)";
        ctx.fillRect(a, top, Math.max(b - a, 1), h);
      });
      ctx.restore();
    };
  }
  function timelinePanel(tl, p, holder) {
    var box = document.getElementById("panel-" + p.id);   // the page's own element for it, if it has one
    if (!box) {
      box = document.createElement("div");
      box.className = "cp-panel";
      holder.appendChild(box);
    }
    box.setAttribute("data-unit", p.unit);
    var h = document.createElement("div");
    h.className = "cp-title"; h.textContent = p.title; h.title = p.title;
    box.appendChild(h);
    var series = [{}].concat(p.series.map(function (s) {
      return {label: s.label, stroke: s.color, width: 1.5, points: {show: false}, spanGaps: false,
              value: function (u, v) { return fmt(v, p.unit); }};
    }));
    var top = p.ymax;
    var opts = {
      width: tl.width, height: p.series.length > 4 ? 150 : 110, class: "cp-chart",
      legend: {show: p.series.length > 1, live: false},
      scales: {x: {time: false, auto: false, range: function (u, a, b) { return [a, b]; }},
               y: {range: function (u, a, b) {
                 var hi = top != null ? Math.max(top, b) : (b > 0 ? b * 1.08 : 1);
                 return [Math.min(0, a), hi];
               }}},
      axes: [secondsAxis(), axis(p.unit, "y", {})],
      series: series,
      cursor: {sync: {key: "cp-tl"}, drag: {x: true, y: false}, bind: {dblclick: function () { return null; }},
               points: {size: 5}},
      select: {show: true},
      hooks: {
        drawClear: [bands(tl)],
        setScale: [function (u, key) { if (key === "x" && !syncing) zoomAll(u.scales.x.min, u.scales.x.max); }],
        setCursor: [function (u) {
          var i = u.cursor.idx;
          if (i == null || u.cursor.left < 0) { hideTip(); return; }
          var lines = [{text: p.title + " at " + u.data[0][i].toFixed(3) + " s"}];
          for (var k = 1; k < u.series.length; k++) {
            lines.push({color: p.series[k - 1].color, text: p.series[k - 1].label + ": " + fmt(u.data[k][i], p.unit)});
          }
          showTip(u, lines, u.cursor.left, u.cursor.top);
        }]
      }
    };
    var data = [p.x].concat(p.series.map(function (s) { return s.values; }));
    var u = new uPlot(opts, data, box);
    u.over.addEventListener("dblclick", function () { zoomAll(0, tl.t_end); });
    u.over.addEventListener("mouseleave", hideTip);
    group.push(u);
    charts.push({u: u, id: p.id, kind: "panel", el: box, series: p.series.length,
                 points: p.x.length * p.series.length, labels: []});
    return u;
  }
  function timelineLanes(tl, holder) {
    var rows = tl.lanes;
    if (!rows.length) return;
    var box = document.createElement("div");
    box.className = "cp-panel cp-lanes";
    var h = document.createElement("div");
    h.className = "cp-title"; h.textContent = "verdict per window, steps and regions"; box.appendChild(h);
    holder.appendChild(box);
    var RH = 16;
    var opts = {
      width: tl.width, height: rows.length * RH + 40, class: "cp-chart", legend: {show: false},
      scales: {x: {time: false, auto: false, range: function (u, a, b) { return [a, b]; }},
               y: {auto: false, range: [0, rows.length]}},
      axes: [secondsAxis(), {scale: "y", size: YW, show: true, values: function () { return []; },
                             grid: {show: false}, ticks: {show: false}, splits: function () { return []; }}],
      series: [{}, {label: "", stroke: "transparent", points: {show: false}}],
      cursor: {sync: {key: "cp-tl"}, drag: {x: true, y: false}, bind: {dblclick: function () { return null; }},
               points: {show: false}, y: false},
      hooks: {
        drawClear: [bands(tl)],
        draw: [function (u) {
          var ctx = u.ctx, pr = u.bbox.height / rows.length;
          ctx.save();
          rows.forEach(function (row, r) {
            var y0 = u.bbox.top + r * pr + pr * 0.2, hh = pr * 0.6;
            row.spans.forEach(function (s) {
              var a = px(u, s[0], "x"), b = px(u, s[1], "x");
              ctx.fillStyle = s[2] || row.color || "#555";
              ctx.fillRect(a, y0, Math.max(b - a, 1), hh);
            });
          });
          ctx.restore();
        }],
        setScale: [function (u, key) { if (key === "x" && !syncing) zoomAll(u.scales.x.min, u.scales.x.max); }],
        setCursor: [function (u) {
          if (u.cursor.left == null || u.cursor.left < 0) { hideTip(); return; }
          var t = u.posToVal(u.cursor.left, "x"), r = Math.floor(u.cursor.top / (u.over.clientHeight / rows.length));
          var row = rows[r];
          if (!row) { hideTip(); return; }
          var hit = row.spans.filter(function (s) { return s[0] <= t && t <= s[1]; })[0];
          var lines = [{text: row.name + " at " + t.toFixed(3) + " s"}];
          if (hit) lines.push({color: hit[2] || row.color, text: (hit[3] || row.name) + ": " + secs(hit[1] - hit[0]) +
                                " (" + hit[0].toFixed(3) + "–" + hit[1].toFixed(3) + " s)"});
          showTip(u, lines, u.cursor.left, u.cursor.top);
        }]
      }
    };
    var u = new uPlot(opts, [[0, tl.t_end], [null, null]], box);
    u.over.addEventListener("dblclick", function () { zoomAll(0, tl.t_end); });
    u.over.addEventListener("mouseleave", hideTip);
    var labels = [];
    function names() {     // names left of their lanes, cut with an ellipsis, whole in the title
      var pr = u.over.clientHeight / rows.length, off = u.over.offsetTop;
      rows.forEach(function (row, r) {
        var l = label(u.over.parentNode, row.name, "cp-lane-name", 0, off + r * pr + pr / 2 - 7, row.title || row.name);
        l.style.width = (YW - 8) + "px";
        labels.push(l);
      });
    }
    u.hooks.ready = [names];
    if (u.status === 1) names();
    group.push(u);
    charts.push({u: u, id: "lanes", kind: "lanes", el: box, series: rows.length,
                 points: rows.reduce(function (n, row) { return n + row.spans.length; }, 0), labels: labels});
  }
  function timeline(tl) {
    var holder = document.getElementById(tl.id);
    tl.panels.forEach(function (p) { timelinePanel(tl, p, holder); });
    timelineLanes(tl, holder);
    zoomAll(0, tl.t_end);
  }

  // ---- trends (history) ---------------------------------------------------------------------
  function trend(t) {
    var box = document.getElementById(t.id);
    var ys = t.y.filter(function (v) { return v != null; });
    var lo = Math.min.apply(null, ys.concat([0])), hi = Math.max.apply(null, ys.concat([0]));
    var opts = {
      width: t.width, height: 170, class: "cp-chart", legend: {show: false},
      scales: {x: {time: false, range: function () { return [-0.5, t.x.length - 0.5]; }},
               y: {range: function () { return [lo < 0 ? lo * 1.08 : 0, hi > 0 ? hi * 1.08 : (lo < 0 ? 0 : 1)]; }}},
      axes: [{font: AXFONT, size: 30, gap: 4, stroke: "#444", grid: {show: false}, space: 46,
              ticks: {stroke: "#ccc", width: 1, size: 4}, incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000],
              values: function (u, splits) {
                return splits.map(function (i) { return t.x[i] == null ? null : "run " + t.x[i]; });
              }},
             axis(t.unit, "y", {})],
      series: [{}, {stroke: "#888", width: 1.2, points: {show: false}, spanGaps: true}],
      cursor: {drag: {x: true, y: false}, points: {show: false},
               dataIdx: function (u, s, i) { return i; }},
      hooks: {
        draw: [function (u) {
          var ctx = u.ctx, pr = window.devicePixelRatio || 1;
          ctx.save();
          t.segments.forEach(function (s) {       // each segment's median between change points
            ctx.strokeStyle = "rgba(214,39,40,0.35)"; ctx.lineWidth = 3 * pr;
            ctx.beginPath(); ctx.moveTo(px(u, s[0], "x"), px(u, s[2], "y"));
            ctx.lineTo(px(u, s[1], "x"), px(u, s[2], "y")); ctx.stroke();
          });
          t.cps.forEach(function (c) {
            var x = px(u, c.i - 0.5, "x");
            ctx.strokeStyle = "#d62728"; ctx.lineWidth = 1.5 * pr; ctx.setLineDash([4 * pr, 3 * pr]);
            ctx.beginPath(); ctx.moveTo(x, u.bbox.top); ctx.lineTo(x, u.bbox.top + u.bbox.height); ctx.stroke();
          });
          ctx.setLineDash([]);
          t.y.forEach(function (v, i) {
            if (v == null) return;
            ctx.fillStyle = t.colors[i];
            ctx.beginPath(); ctx.arc(px(u, i, "x"), px(u, v, "y"), 3.5 * pr, 0, 2 * Math.PI); ctx.fill();
          });
          ctx.restore();
        }],
        setCursor: [function (u) {
          if (u.cursor.left == null || u.cursor.left < 0) { hideTip(); return; }
          var i = Math.round(u.posToVal(u.cursor.left, "x"));
          if (i < 0 || i >= t.y.length || t.y[i] == null) { hideTip(); return; }
          showTip(u, t.tips[i].map(function (s, k) { return {text: s, color: k ? null : t.colors[i]}; }),
                  u.valToPos(i, "x"), u.valToPos(t.y[i], "y"));
        }]
      }
    };
    var u = new uPlot(opts, [t.x.map(function (_, i) { return i; }), t.y], box);
    u.over.addEventListener("mouseleave", hideTip);
    var labels = t.cps.map(function (c) {
      return label(u.over, c.label, "cp", u.valToPos(c.i - 0.5, "x") + 3, 0, c.title);
    });
    charts.push({u: u, id: t.id, kind: "trend", el: box, series: 1, points: ys.length, labels: labels});
  }

  // ---- the roofline -------------------------------------------------------------------------
  function roofline(r) {
    var box = document.getElementById(r.id);
    var decades = function (lo, hi) {
      var out = [];
      for (var e = Math.round(Math.log10(lo)); e <= Math.round(Math.log10(hi)); e++) out.push(Math.pow(10, e));
      return out;
    };
    var opts = {
      width: r.width, height: r.height, class: "cp-chart", legend: {show: false},
      scales: {x: {time: false, distr: 3, auto: false, range: [r.x0, r.x1]},
               y: {distr: 3, auto: false, range: [r.y0, r.y1]}},
      axes: [{font: AXFONT, size: 44, gap: 4, stroke: "#444", grid: {stroke: "#eee", width: 1},
              ticks: {stroke: "#ccc", width: 1, size: 4}, label: r.x_title, labelSize: 16, labelFont: AXFONT,
              splits: function () { return decades(r.x0, r.x1); },
              values: function (u, splits) { return splits.map(function (v) { return fmt(v, "ratio"); }); }},
             axis("FLOP/s", "y", {splits: function () { return decades(r.y0, r.y1); }, label: "FLOP/s",
                                   labelSize: 16, labelFont: AXFONT, size: YW})],
      series: [{}, {stroke: "transparent", points: {show: false}}],
      cursor: {drag: {x: false, y: false}, points: {show: false}},
      hooks: {
        draw: [function (u) {
          var ctx = u.ctx, pr = window.devicePixelRatio || 1;
          ctx.save();
          ctx.beginPath(); ctx.rect(u.bbox.left, u.bbox.top, u.bbox.width, u.bbox.height); ctx.clip();
          r.roofs.forEach(function (f) {
            ctx.strokeStyle = f.color; ctx.lineWidth = 2 * pr;
            ctx.beginPath(); ctx.moveTo(px(u, f.x[0], "x"), px(u, f.y[0], "y"));
            ctx.lineTo(px(u, f.x[1], "x"), px(u, f.y[1], "y")); ctx.stroke();
          });
          r.points.forEach(function (p) {
            ctx.fillStyle = p.color; ctx.globalAlpha = 0.55;
            ctx.beginPath(); ctx.arc(px(u, p.x, "x"), px(u, p.y, "y"), p.r * pr, 0, 2 * Math.PI); ctx.fill();
            ctx.globalAlpha = 1; ctx.strokeStyle = "#333"; ctx.lineWidth = 0.5 * pr; ctx.stroke();
          });
          ctx.restore();
        }],
        setCursor: [function (u) {
          if (u.cursor.left == null || u.cursor.left < 0) { hideTip(); return; }
          var best = null, bd = 1e9;
          r.points.forEach(function (p) {
            var dx = u.valToPos(p.x, "x") - u.cursor.left, dy = u.valToPos(p.y, "y") - u.cursor.top;
            var d = Math.sqrt(dx * dx + dy * dy) - p.r;
            if (d < bd) { bd = d; best = p; }
          });
          if (!best || bd > 8) { hideTip(); return; }
          showTip(u, best.tip.map(function (s, k) { return {text: s, color: k ? null : best.color}; }),
                  u.valToPos(best.x, "x"), u.valToPos(best.y, "y"));
        }]
      }
    };
    var u = new uPlot(opts, [[r.x0, r.x1], [null, null]], box);
    u.over.addEventListener("mouseleave", hideTip);
    var placed = [], labels = [];
    function free(l) {
      var b = l.getBoundingClientRect(), o = u.over.getBoundingClientRect();
      if (b.left < o.left - 2 || b.right > o.right + YW || b.top < o.top - 2 || b.bottom > o.bottom + 2) return false;
      return placed.every(function (q) { return !hit(b, q); });
    }
    function put(text, cls, candidates, title) {   // the first candidate position that overlaps nothing
      for (var k = 0; k < candidates.length; k++) {
        var l = label(u.over, text, cls, candidates[k][0], candidates[k][1], title);
        if (candidates[k][2]) l.style.transform = "translateX(-100%)";
        if (free(l)) { placed.push(l.getBoundingClientRect()); labels.push(l); return l; }
        l.remove();
      }
      return null;
    }
    var entry = {u: u, id: r.id, kind: "roofline", el: box, series: r.roofs.length, points: r.points.length,
                 labels: labels, named: 0};
    function place() {       // once laid out: labels where they cover nothing, the largest ops first
      var o = u.over.getBoundingClientRect();
      r.points.forEach(function (p) {               // dots first: a label does not cover another op
        var x = o.left + u.valToPos(p.x, "x"), y = o.top + u.valToPos(p.y, "y");
        placed.push({left: x - p.r, right: x + p.r, top: y - p.r, bottom: y + p.r});
      });
      r.roof_labels.forEach(function (f) {
        var x = u.valToPos(f.x, "x"), y = u.valToPos(f.y, "y");
        put(f.text, "cp-roof", [[x + 4, y - 16], [x + 4, y + 2], [x - 4, y - 16, true]], f.text);
      });
      r.points.forEach(function (p, i) {
        if (i >= r.labelled) return;
        var x = u.valToPos(p.x, "x"), y = u.valToPos(p.y, "y"), d = p.r + 2;
        if (put(p.label, "cp-op", [[x + d, y - 7], [x - d, y - 7, true], [x - 20, y - d - 15], [x - 20, y + d]],
                p.tip.join("\n"))) entry.named++;
      });
    }
    u.hooks.ready = [place];
    if (u.status === 1) place();
    charts.push(entry);
  }

  // ---- what was drawn, for the tests --------------------------------------------------------
  function hit(a, b) {
    return a.left < b.right - 0.5 && b.left < a.right - 0.5 && a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5;
  }
  function tickBoxes(u) {     // where uPlot drew each axis's tick labels (on its canvas), as page boxes
    var out = [], c = u.root.querySelector("canvas").getBoundingClientRect(), o = u.over.getBoundingClientRect();
    u.axes.forEach(function (a, ai) {
      if (!a.show || !a._values) return;
      var key = a.scale, side = a.side, vertical = side === 1 || side === 3;
      var shift = (a.ticks.show ? a.ticks.size : 0) + a.gap;
      a._values.forEach(function (text, i) {
        if (text == null || text === "") return;
        var w = measure.measureText(String(text)).width, p = u.valToPos(a._splits[i], key);
        var b;
        if (!vertical) {
          var x = o.left + p, y = c.top + a._pos + shift;
          b = {left: x - w / 2, right: x + w / 2, top: y, bottom: y + FONT};
        } else {
          var yy = o.top + p, xx = c.left + a._pos + (side === 3 ? -shift : shift);
          b = side === 3 ? {left: xx - w, right: xx, top: yy - FONT / 2, bottom: yy + FONT / 2}
                         : {left: xx, right: xx + w, top: yy - FONT / 2, bottom: yy + FONT / 2};
        }
        b.text = String(text); b.axis = ai === 0 ? "x" : "y";
        out.push(b);
      });
    });
    return out;
  }
  function boxOf(el) {
    var b = el.getBoundingClientRect();
    return {left: b.left, right: b.right, top: b.top, bottom: b.bottom, text: el.textContent,
            cut: el.scrollWidth > el.clientWidth + 1, title: el.title};
  }
  function check() {
    var out = {charts: [], overlaps: []};
    charts.forEach(function (c) {
      var ticks = tickBoxes(c.u), labels = c.labels.map(boxOf);
      var titles = Array.prototype.map.call(c.el.querySelectorAll(".cp-title, .u-legend th, .u-label"), boxOf);
      var boxes = ticks.concat(labels);
      var overlaps = [];
      for (var i = 0; i < boxes.length; i++)
        for (var j = i + 1; j < boxes.length; j++)
          if (hit(boxes[i], boxes[j])) overlaps.push([boxes[i].text, boxes[j].text]);
      out.charts.push({
        id: c.id, kind: c.kind, series: c.series, points: c.points, named: c.named,
        width: c.u.width, height: c.u.height,
        x_ticks: ticks.filter(function (b) { return b.axis === "x"; }).map(function (b) { return b.text; }),
        y_ticks: ticks.filter(function (b) { return b.axis === "y"; }).map(function (b) { return b.text; }),
        labels: labels.map(function (b) { return {text: b.text, cut: b.cut, title: b.title}; }),
        titles: titles.map(function (b) { return b.text; }),
        overlaps: overlaps
      });
    });
    // DOM text anywhere on the page (headings, table cells, labels): no two boxes of leaves overlap
    var leaves = Array.prototype.filter.call(document.querySelectorAll("body *"), function (e) {
      return e.children.length === 0 && e.textContent.trim() && e.getClientRects().length &&
             !e.closest("script,style,#cp-layout,.cp-tip,.u-legend");
    }).map(boxOf);
    for (var i = 0; i < leaves.length; i++)
      for (var j = i + 1; j < leaves.length; j++)
        if (hit(leaves[i], leaves[j])) out.overlaps.push([leaves[i].text, leaves[j].text]);
    // text cut by its box (an ellipsis) must say all of itself in its title
    out.cut = leaves.filter(function (b) { return b.cut && b.title.indexOf(b.text.trim()) < 0; })
      .map(function (b) { return b.text; });
    out.drawn_ms = drawnAt;
    var el = document.getElementById("cp-layout");
    el.textContent = JSON.stringify(out);
    el.setAttribute("data-ready", "1");
  }

  (D.charts || []).forEach(function (c) {
    if (c.kind === "timeline") timeline(c);
    else if (c.kind === "trend") trend(c);
    else if (c.kind === "roofline") roofline(c);
  });
  var drawnAt = null;     // uPlot draws in a microtask queued as each chart is made: this one runs after them
  Promise.resolve().then(function () { drawnAt = performance.now(); });
  setTimeout(function () { check(); }, 30);
})();
