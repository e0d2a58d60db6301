// loadkit: charts in Locust's "Triton" tab. Locust's extended tabs are tables only, so this
// script (served at /loadkit/charts.js, added to Locust's page by webui.py) puts an SVG above
// the tab's table: throughput and HDR p99 (ms with decimals) per step, phases marked. It reads
// /loadkit/status, the rows the table shows, every 2 s; React may re-render the tab, so the
// chart is put back when it goes missing.
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var W = 760, H = 260, L = 56, R = 60, T = 24, B = 40;

  function el(name, attrs, text) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function points(rows) {
    var out = [];
    rows.forEach(function (r) {
      if (!r.step || r.phase === "(run)") return;
      var thr = parseFloat(r.infer_s), p99 = parseFloat(r.p99);
      if (isNaN(thr) || isNaN(p99)) return;
      // p99Text: the table's own cell, so the chart's title never rounds it a second time
      out.push({phase: r.phase, step: r.step, load: r.load, thr: thr, p99: p99,
                p99Text: r.p99, live: r.delta === "live"});
    });
    return out;
  }

  function draw(rows) {
    var pts = points(rows);
    var svg = el("svg", {id: "loadkit-chart", width: W, height: H, "data-points": pts.length,
                         style: "background:#fff;border:1px solid #ddd;margin:8px 0"});
    svg.appendChild(el("text", {x: L, y: 16, "font-size": 13},
                       "loadkit: infer/s (blue) and p99 ms (red, HDR) per step"));
    if (!pts.length) return svg;
    var maxT = Math.max.apply(null, pts.map(function (p) { return p.thr; })) * 1.1 || 1;
    var maxP = Math.max.apply(null, pts.map(function (p) { return p.p99; })) * 1.1 || 1;
    var n = pts.length, dx = (W - L - R) / Math.max(1, n);
    function x(i) { return L + dx * (i + 0.5); }
    function yT(v) { return H - B - (H - T - B) * v / maxT; }
    function yP(v) { return H - B - (H - T - B) * v / maxP; }
    svg.appendChild(el("line", {x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#999"}));
    [0, 0.5, 1].forEach(function (f) {
      svg.appendChild(el("text", {x: L - 4, y: yT(maxT * f) + 4, "font-size": 10,
                                  "text-anchor": "end", fill: "#1f77b4"},
                         (maxT * f).toFixed(0)));
      svg.appendChild(el("text", {x: W - R + 4, y: yP(maxP * f) + 4, "font-size": 10,
                                  fill: "#d62728"}, (maxP * f).toFixed(3)));
    });
    var last = null;
    pts.forEach(function (p, i) {
      if (p.phase !== last) {  // a phase boundary
        svg.appendChild(el("line", {x1: x(i) - dx / 2, y1: T, x2: x(i) - dx / 2, y2: H - B,
                                    stroke: "#333", "stroke-dasharray": "3,3",
                                    "class": "loadkit-phase"}));
        svg.appendChild(el("text", {x: x(i) - dx / 2 + 3, y: T + 10, "font-size": 10},
                           p.phase));
        last = p.phase;
      }
      svg.appendChild(el("text", {x: x(i), y: H - B + 14, "font-size": 9,
                                  "text-anchor": "middle"}, p.load || ""));
    });
    ["thr", "p99"].forEach(function (key) {
      var y = key === "thr" ? yT : yP, color = key === "thr" ? "#1f77b4" : "#d62728";
      var d = pts.map(function (p, i) { return (i ? "L" : "M") + x(i) + "," + y(p[key]); });
      svg.appendChild(el("path", {d: d.join(" "), fill: "none", stroke: color}));
      pts.forEach(function (p, i) {
        var c = el("circle", {cx: x(i), cy: y(p[key]), r: p.live ? 5 : 3, fill: color,
                              "class": "loadkit-" + key});
        c.appendChild(el("title", {}, p.phase + " step " + p.step + ": " +
                         (key === "thr" ? p.thr.toFixed(1) + " infer/s"
                                        : "p99 " + p.p99Text + " ms") +
                         (p.live ? " (live)" : "")));
        svg.appendChild(c);
      });
    });
    return svg;
  }

  function onTritonTab() {
    return /[?&]tab=triton\b/.test(window.location.search);
  }

  function refresh() {
    if (!onTritonTab()) return;
    var table = document.querySelector("table");
    if (!table) return;
    fetch("./loadkit/status").then(function (r) { return r.json(); }).then(function (data) {
      var box = document.getElementById("loadkit-charts");
      var holder = table.parentElement;
      if (!box || !holder.parentElement.contains(box)) {
        box = document.createElement("div");
        box.id = "loadkit-charts";
        holder.parentElement.insertBefore(box, holder);
      }
      var note = document.createElement("p");
      note.id = "loadkit-note";
      note.style.cssText = "margin:4px 0;font-size:13px;color:#777;max-width:1100px";
      note.textContent = data.note || "";
      box.replaceChildren(note, draw(data.rows));
    }).catch(function () { /* the run may be between steps or over: try again */ });
  }

  function fillForm() {
    // Locust disables the user count and spawn rate for a load shape and shows 0: show the
    // most users the scenario's phases run instead (still disabled: the phases drive the load)
    var shown = document.querySelector("input[name=userCount]");
    if (!shown || !shown.disabled || shown.value !== "0") return;  // no form, or filled
    fetch("./loadkit/status").then(function (r) { return r.json(); }).then(function (data) {
      ["userCount", "spawnRate"].forEach(function (name) {
        var input = document.querySelector("input[name=" + name + "]");
        if (input && input.disabled) {
          input.value = String(data.peak_users);
          input.title = "set by the scenario's phases: at most " + data.peak_users + " users";
        }
      });
    }).catch(function () { /* the form is Locust's own then */ });
  }

  // the Host field shows the run's target and cannot change it (the server refuses a start
  // that asks for another): read-only, saying where the target comes from
  function lockHost() {
    var host = document.querySelector("input[name=host]");
    if (host && !host.readOnly) {
      host.readOnly = true;
      host.title = "the run's target, from --target, the scenario's target or the embedded " +
        "Triton; restart `loadkit ui --target HOST:PORT` to load another server";
    }
  }

  setInterval(lockHost, 1000);
  setInterval(fillForm, 1000);
  setInterval(refresh, 2000);
  document.addEventListener("click", function () { setTimeout(refresh, 300); });
})();
