"""report.html: one self-contained file (inline CSS, plots as data: URIs) that opens from disk,
can be mailed or attached to a CI run, and needs no server or network."""

from __future__ import annotations

import base64
import json
from html import escape
from typing import Any

from loadkit.report import streaming
from loadkit.report import tune as tune_report
from loadkit.report.compare import Comparison, Row, highlights, load_label
from loadkit.report.markdown import mixed_note, undecided_note, verdict_note, warnings
from loadkit.report.plots import missing
from loadkit.report.timeline import rows as timeline_rows
from loadkit.report.units import LATENCY_COLUMNS, ms, step_state
from loadkit.stats import text as change_text

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
table{border-collapse:collapse;margin:.6em 0 1.4em}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3} td.l,th.l{text-align:left}
.up{color:#17803d}.down{color:#b3261e} .muted{color:#777}
img{max-width:100%;border:1px solid #eee;margin:.4em 0}
pre{background:#f7f7f7;padding:.6em;overflow:auto;font-size:12px}
ul.warnings{color:#b3261e}
tr.sub td{color:#555;font-size:13px}
.status-failed,.status-aborted{color:#b3261e}.status-skipped,.status-partial{color:#946200}
"""


def _delta(r: Row, metric: str, template: str | None = None) -> str:
    """The change with its interval, coloured only when it is a verdict (better / worse)."""
    c = (r.changes if template is None else r.template_changes.get(template, {})).get(metric)
    if c is None:
        return '<td class="muted">-</td>'
    cls = {"better": "up", "worse": "down"}.get(c["verdict"], "muted")
    return f'<td class="{cls}">{escape(change_text(c))}</td>'


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _comparison(cmp: Comparison) -> list[str]:
    out = [
        "<h2>Phase comparison</h2>",
        f"<p>Reference: <b>{escape(cmp.reference)}</b>. Latencies in ms from HDR histograms; "
        "avg batch, queue and compute per request from Triton's statistics. "
        f"{escape(verdict_note(cmp))}</p>",
        *[f"<p>{escape(line)}</p>" for line in [*undecided_note(cmp), *mixed_note(cmp)]
          if line],
        *[f"<p class=warn>WARNING: {escape(w)}.</p>" for w in cmp.warnings],
        "<table><tr><th>load</th><th class=l>phase</th><th>infer/s</th><th>Δ infer/s</th>"
        + "".join(f"<th>{h}</th>" for _, h in LATENCY_COLUMNS)
        + "<th>Δ p99</th><th>errors</th><th class=l>server, per model (batch, queue µs, "
        "compute µs)</th></tr>",
    ]
    for r in cmp.rows:
        p, lat = r.point, r.point.latency_us
        partial = " (partial)" if p.status != "ok" else ""
        server = "<br>".join(escape(f.text()) for f in p.server) or "-"
        out.append(
            f"<tr><td>{escape(r.load)}</td><td class=l>{escape(r.entry)}{partial}"
            f"{' (all templates)' if p.templates else ''}</td>"
            f"<td>{p.infer_s:.1f}</td>{_delta(r, 'throughput')}"
            + "".join(f"<td>{ms(lat.get(k))}</td>" for k, _ in LATENCY_COLUMNS)
            + f"{_delta(r, 'p99')}<td>{p.errors}</td><td class=l>{server}</td></tr>"
        )
        for name, model, rate, lat_t, errors in p.templates:
            out.append(
                f"<tr class=sub><td></td><td class=l>↳ {escape(name)} ({escape(model)})</td>"
                f"<td>{rate:.1f}</td>{_delta(r, 'throughput', name)}"
                + "".join(f"<td>{ms(lat_t.get(k))}</td>" for k, _ in LATENCY_COLUMNS)
                + f"{_delta(r, 'p99', name)}<td>{errors}</td><td></td></tr>")
    out.append("</table><ul>")
    out += [
        f"<li>{escape(pre)}<b>{escape(label)}</b>{escape(post)}</li>"
        for pre, label, post in highlights(cmp)
    ]
    out.append("</ul>")
    if cmp.not_measured:
        out.append("<h3>Not measured</h3><ul>")
        for e in cmp.not_measured:
            out.append(
                f'<li>{escape(e.label)}: <span class="status-{escape(e.status)}">'
                f"{escape(e.status)}</span>: {escape(e.reason or 'no steps')}</li>"
            )
        out.append("</ul>")
    return out


def _steps(results: dict[str, Any], prefix: str) -> list[str]:
    out = []
    for phase in results["phases"]:
        status = phase["status"]
        out.append(
            f"<h3>{escape(prefix + phase['name'])} "
            f'<span class="status-{escape(status)}">({escape(status)})</span></h3>'
        )
        if phase["reason"]:
            out.append(f"<p>{escape(phase['reason'])}</p>")
        if phase["steps"]:
            out.append(
                "<table><tr><th>load</th><th>requests</th><th>infer/s</th><th>p50</th>"
                "<th>p90</th><th>p95</th><th>p99</th><th>p99.9</th><th>max</th>"
                "<th class=l>errors</th><th class=l>status</th><th class=l>accounting</th>"
                "<th class=l>batch sizes executed (server)</th></tr>"
            )
            for s in phase["steps"]:
                lat = s["latency_us"]
                errs = ", ".join(f"{k} {v}" for k, v in sorted(s["errors"].items())) or "0"
                batches = "; ".join(
                    f"{m}: " + ", ".join(f"{b}×{n}" for b, n in v["batch_executions"].items())
                    for m, v in s["server"].items()
                    if v.get("batch_executions")
                )
                load = ", ".join(f"{k} {v}" for k, v in s["load"].items())
                out.append(
                    f"<tr><td>{escape(load)}</td><td>{s['requests']}</td>"
                    f"<td>{s['throughput']:.1f}</td>"
                    + "".join(
                        f"<td>{ms(lat[k])}</td>" for k in ("p50", "p90", "p95", "p99", "p999")
                    )
                    + f"<td>{ms(lat['max'])}</td><td class=l>{escape(errs)}</td>"
                    f"<td class=l>{escape(step_state(s))}</td>"
                    f"<td class=l>{escape(_accounting(s))}</td>"
                    f"<td class=l>{escape(batches or '-')}</td></tr>"
                )
            out.append("</table>")
            out += streaming.html(phase["steps"])
            kept = [f"<li>{escape(load_label(s['load']))}: {escape(code)} ×{m['count']}: "
                    f"{escape(m['message'])}</li>"
                    for s in phase["steps"]
                    for code, ms_ in sorted(s.get("error_messages", {}).items()) for m in ms_]
            if kept:
                out.append("<p>Errors, as the server gave them:</p><ul>" + "".join(kept) + "</ul>")
        if phase.get("config"):
            out.append(
                "<details><summary>model config measured (read back from the server)"
                f"</summary><pre>{escape(json.dumps(phase['config'], indent=2))}</pre></details>"
            )
    return out


def _accounting(step: dict[str, Any]) -> str:
    acc = step.get("accounting", {})
    status = acc.get("status", "-")
    if status == "mismatch":
        return f"MISMATCH: {acc.get('reason', '')}"
    if status == "unchecked":
        return "unchecked: " + "; ".join(acc.get("unchecked", []))
    return status


def _capacity(cap: dict[str, Any]) -> list[str]:
    peak, speed = cap.get("peak"), cap.get("peak_speed")
    sized = f" for {peak:g}/s" if peak else f" for {speed:g}x" if speed else ""
    out = [
        f"<h2>Capacity at SLO {escape(cap['slo'])}</h2>",
        "<table><tr><th class=l>config</th><th>max rate /s</th><th>infer/s</th><th>p50 ms</th>"
        "<th>p99 ms</th><th>p99.9 ms</th><th>bracket (/s, or xspeed)</th><th>probes</th>"
        f"<th>replicas{sized}</th>"
        "<th class=l>result</th></tr>",
    ]
    for p in cap["phases"]:
        lat = p["latency_us"]
        lo, hi = p["bracket"]
        x = "x" if p.get("search") == "speed" else ""
        top = _num(p["max_rate"], "g") + (f" (x{p['max_speed']:g})" if p.get("max_speed")
                                          else "")
        cells = [top, _num(p["max_infer_s"], "g")] + [
            ms(lat[k]) if lat else "-" for k in ("p50", "p99", "p999")
        ]
        out.append(
            f"<tr><td class=l>{escape(p['phase'])}</td>"
            + "".join(f"<td>{c}</td>" for c in cells)
            + f"<td>{x}{_num(lo, 'g')} .. {x}{_num(hi, 'g')}</td><td>{len(p['points'])}</td>"
            f"<td>{p.get('replicas', '-')}</td>"
            f"<td class=l>{escape(p['status'] + (': ' + p['reason'] if p['reason'] else ''))}"
            "</td></tr>"
        )
    out.append("</table>")
    if cap.get("cheapest"):
        out.append(f"<p>Cheapest config: <b>{escape(cap['cheapest'])}</b>.</p>")
    return out


def render_html(
    cmp: Comparison, runs: list[tuple[str, dict[str, Any]]], plots: dict[str, bytes]
) -> str:
    out = [
        "<!doctype html><html><head><meta charset=utf-8>",
        f"<title>loadkit: {escape(cmp.title)}</title><style>{CSS}</style></head><body>",
        f"<h1>loadkit: {escape(cmp.title)}</h1>",
    ]
    for label, results in runs:
        status = results["status"]
        who = f"{escape(label)}: " if label else ""
        out.append(
            f"<p>{who}target {escape(results['target'])}"
            f"{' (embedded Triton)' if results['embedded'] else ''}, "
            f"{escape(results['started_at'])} to {escape(results['finished_at'] or '-')}, "
            f'<span class="status-{escape(status)}">{escape(status)}</span>'
            f"{': ' + escape(results['reason']) if results['reason'] else ''}</p>"
        )
        lines = warnings(results)
        if lines:
            out.append('<ul class="warnings">' + "".join(
                f"<li>{escape(line.removeprefix('- '))}</li>" for line in lines if line)
                + "</ul>")
    out += _comparison(cmp)
    for _, results in runs:
        if results.get("capacity"):
            out += _capacity(results["capacity"])
        if results.get("tune"):
            out += tune_report.html(results["tune"])
    gone = missing(cmp)
    if plots or gone:
        out.append("<h2>Plots</h2>")
        for name, png in plots.items():
            data = base64.b64encode(png).decode("ascii")
            out.append(f'<img alt="{escape(name)}" src="data:image/png;base64,{data}">')
        out += [f"<p class=muted>{escape(name)} is not drawn: {escape(why)}.</p>"
                for name, why in gone.items()]
    if len(runs) == 1:  # the data timeline.png is drawn from, for a reader or a test to read
        rows = [{k: r.get(k) for k in ("at", "phase", "step", "round", "infer_s", "length_s")}
                for r in timeline_rows(runs[0][1])]
        out.append('<script type="application/json" id="loadkit-timeline">'
                   + json.dumps(rows).replace("</", "<\\/") + "</script>")
    out.append("<h2>Steps</h2>")
    for label, results in runs:
        out += _steps(results, f"{label}/" if label else "")
    events = [e for _, r in runs for e in r.get("events", [])]
    if events:
        out.append("<h2>Events</h2><table><tr><th class=l>at</th><th class=l>event</th>"
                   "<th class=l>detail</th></tr>")
        for e in events:
            rest = {k: v for k, v in e.items() if k not in ("at", "event")}
            out.append(
                f"<tr><td class=l>{escape(str(e.get('at', '')))}</td>"
                f"<td class=l>{escape(str(e.get('event', '')))}</td>"
                f"<td class=l>{escape(json.dumps(rest))}</td></tr>"
            )
        out.append("</table>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
