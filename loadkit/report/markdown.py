"""Markdown tables in the shape of perf_analyzer's and the seed's before/after tables."""

from __future__ import annotations

import statistics
from typing import Any

from loadkit.report import replay as replay_report
from loadkit.report import streaming, units
from loadkit.report import tune as tune_report
from loadkit.report.capacity import capacity_table
from loadkit.report.compare import Comparison, Row, highlights, load_label
from loadkit.report.timeline import error_notes
from loadkit.report.units import LATENCY_COLUMNS, infer_per_s, ms, step_state, template_of
from loadkit.run.accounting import first_message
from loadkit.slo import table as threshold_table
from loadkit.stats import mixed_models
from loadkit.stats import text as change_text


def _pm(step: dict[str, Any], metric: str) -> str:
    """' ±12%': the half-width of the metric's interval, relative (docs/verdicts.md)."""
    i = (step.get("intervals") or {}).get(metric) or {}
    if not i.get("ci") or not i.get("value"):
        return ""
    lo, hi = i["ci"]
    return f" ±{(hi - lo) / 2 / i['value'] * 100:.0f}%"


def noise_note(results: dict[str, Any]) -> list[str]:
    """The run's own noise: how much the same phase at the same load moved between rounds
    (the coefficient of variation of its rounds, median and largest over the steps)."""
    spreads: dict[str, list[tuple[float, str]]] = {"throughput": [], "p99": []}
    for p in results["phases"]:
        for s in p["steps"]:
            rounds = s.get("rounds") or []
            if len(rounds) < 2:
                continue
            where = f"{p['name']} at {load_label(s['load'])}"
            for metric, values in (("throughput", [r["throughput"] for r in rounds]),
                                   ("p99", [r["latency_us"]["p99"] for r in rounds
                                            if r["latency_us"].get("p99") is not None])):
                if len(values) < 2:
                    continue
                mean = statistics.mean(values)
                if mean > 0:
                    spreads[metric].append((statistics.stdev(values) / mean * 100, where))
    if not spreads["throughput"]:
        return []
    parts = []
    for metric, found in spreads.items():
        found.sort()
        median, (top, where) = found[len(found) // 2][0], found[-1]
        parts.append(f"{metric} ±{median:.1f}% (median over steps; most ±{top:.1f}% in "
                     f"{where})")
    order = next((s["rounds"][0].get("order", "interleaved") for p in results["phases"]
                  for s in p["steps"] if s.get("rounds")), "interleaved")
    return [f"Noise: the same phase at the same load moved between its "
            f"{results.get('repeats', 2)} {order} rounds by " + ", ".join(parts) +
            " (coefficient of variation). A change smaller than this is not a finding.", ""]


def rounds_note(results: dict[str, Any]) -> list[str]:
    """`repeats: auto`: how many rounds were taken, why they stopped, and how each look was
    judged (docs/verdicts.md)."""
    seq = results.get("sequential")
    if not seq:
        return []
    return [f"Rounds: `repeats: auto` took {seq['rounds']} interleaved round(s); stopped: "
            f"{seq.get('stopped') or 'before its first look'}. Verdicts: {seq['design']} "
            "(docs/verdicts.md).", ""]


def _errors(step: dict[str, Any]) -> str:
    errs = step.get("errors", {})
    if not errs:
        return "0"
    return ", ".join(f"{code} {n}" for code, n in sorted(errs.items()))


def _server_cell(step: dict[str, Any]) -> str:
    parts = []
    for model, s in step.get("server", {}).items():
        if s.get("success", 0) or s.get("fail", 0):
            cache = (f", cache {s['cache_hits']} hits / {s['cache_misses']} misses"
                     if "cache_hits" in s else "")
            name = f"{model} (in {s['composing_of']})" if "composing_of" in s else model
            parts.append(
                f"{name}: batch {s['avg_batch']:.2f}, queue {s['queue_us']:.0f} us, "
                f"infer {s['compute_infer_us']:.0f} us{cache}"
            )
    return "; ".join(parts) or "-"


def _step_rows(s: dict[str, Any], scenario: dict[str, Any]) -> list[str]:
    """A step's row; where it sent several templates, the row says `all` (their requests
    merged) and each template's own row follows."""
    lat = s["latency_us"]
    state = step_state(s)
    label = load_label(s["load"]) + (f" ({state})" if state != "ok" else "")
    cells = [f"{ms(lat[k])}{_pm(s, k) if k == 'p99' else ''}" for k, _ in LATENCY_COLUMNS]
    templates = s.get("client", {})
    merged = len(templates) > 1
    out = [f"| {label}{' all' if merged else ''} | {s['throughput']:.1f}"
           f"{_pm(s, 'throughput')} | {' | '.join(cells)} | {ms(lat['max'])} | {_errors(s)} | "
           f"{_server_cell(s)} |"]
    if not merged:
        return out
    for name, c in templates.items():
        t = template_of(scenario, name)
        rate = infer_per_s(c, t, s.get("duration_s") or 0)
        lat_t = c["latency_us"]
        out.append(f"| {label} {name} | {rate:.1f} | "
                   + " | ".join(ms(lat_t.get(k)) for k, _ in LATENCY_COLUMNS)
                   + f" | {ms(lat_t.get('max'))} | {c.get('errors', 0)} | "
                     f"{t.get('model', '')} |")
    return out


def summary_table(results: dict[str, Any]) -> str:
    """The per-step table: concurrency | infer/s | p50 | ... | errors, one block per phase."""
    out = [f"# {results['scenario_name']}: {results['status']}", ""]
    if results.get("reason"):
        out += [f"Reason: {results['reason']}", ""]
    out += warnings(results)
    out += [
        f"Target: {results['target']}{' (embedded Triton)' if results['embedded'] else ''}"
        f"{units.door_note(results)}. "
        "Latencies in ms from HDR histograms (us resolution); infer/s counts successful "
        "inferences (requests x batch size); ±: the half-width of its "
        f"{results.get('confidence', 0.95):.0%} confidence interval (docs/verdicts.md).",
        "",
    ]
    if results.get("requests"):
        out += ["Requests sent: " + "; ".join(results["requests"]) + ".", ""]
    out += noise_note(results)
    out += rounds_note(results)
    for phase in results["phases"]:
        title = f"## {phase['name']}"
        if phase["status"] != "ok":
            title += f" ({phase['status']}{': ' + phase['reason'] if phase['reason'] else ''})"
        out += [title, ""]
        if not phase["steps"]:
            out += ["No measured steps.", ""]
            continue
        open_steps = [s for s in phase["steps"] if s.get("open_loop")]
        head = "load" if open_steps else "concurrency"
        out += [
            f"| {head} | infer/s | " + " | ".join(h for _, h in LATENCY_COLUMNS) +
            " | max | errors | server, per model |",
            "|---:|---:|" + "---:|" * (len(LATENCY_COLUMNS) + 1) + "---|---|",
        ]
        for s in phase["steps"]:
            out += _step_rows(s, results.get("scenario", {}))
        out.append("")
        out += _error_notes(phase["steps"])
        out += _generator_note(phase["steps"])
        out += _payload_note(phase["steps"])
        out += streaming.markdown(phase["steps"])
        if open_steps:
            out += _open_loop_notes(open_steps)
    out += replay_report.markdown(results)
    out += _worker_notes(results)
    out += error_notes(results)
    if results.get("capacity"):
        out.append(capacity_table(results["capacity"]))
    if results.get("tune"):
        out.append(tune_report.markdown(results["tune"]))
    if results.get("thresholds"):
        out.append(threshold_table(results["thresholds"]))
    return "\n".join(out)


def warnings(results: dict[str, Any]) -> list[str]:
    """The loud lines at the top: numbers that do not add up, steps that measured nothing or
    had errors (with the server's most frequent message), statistics that could not be read,
    models left on a phase's config."""
    out = []
    for p in results["phases"]:
        for s in p["steps"]:
            where = f"{p['name']} at {load_label(s['load'])}"
            acc = s.get("accounting", {})
            if acc.get("status") == "mismatch":
                out.append(f"- WARNING: accounting mismatch in {where}: {acc['reason']}")
            n_err = sum(s["errors"].values())
            if not s["requests"]:
                why = first_message(s.get("error_messages", {}))
                out.append(f"- WARNING: nothing measured in {where}: 0 successful requests"
                           + (f", {n_err} failed ({why})" if n_err else ""))
            elif n_err:
                total = n_err + s["requests"]
                why = first_message(s.get("error_messages", {}))
                out.append(f"- WARNING: {n_err} of {total} requests failed in {where} "
                           f"({100 * n_err / total:.2f}%)" + (f": {why}" if why else ""))
            for model, why in s.get("server_unavailable", {}).items():
                out.append(f"- Note: {where}: client == server not checked for {model}: {why}")
    for e in results.get("events", []):
        if e["event"] == "restore_failed":
            out.append(f"- WARNING: model {e.get('model', '?')} was not restored: "
                       f"{e['detail']}")
    return [*out, ""] if out else []


def _error_notes(steps: list[dict[str, Any]]) -> list[str]:
    """What the server said, per step and status code: the kept messages with their counts."""
    out = []
    for s in steps:
        for code, kept in sorted(s.get("error_messages", {}).items()):
            for m in kept:
                out.append(f"- {load_label(s['load'])}: {code} x{m['count']}: {m['message']}")
    return ["Errors, as the server gave them:", "", *out, ""] if out else []


WORKER_EVENTS = {
    "worker_lost": "stopped answering (killed or cut off); the run went on without it",
    "worker_report_timeout": "sent no final report in time; its samples are missing",
    "worker_refused": "refused to join",
}


def _worker_notes(results: dict[str, Any]) -> list[str]:
    """Distributed runs: how many workers sent each step, and every worker that went wrong."""
    steps = [s for p in results["phases"] for s in p["steps"] if s.get("workers")]
    if not steps:
        return []
    counts = sorted({s["workers"]["count"] for s in steps})
    out = [f"Load sent by {'/'.join(map(str, counts))} Locust worker(s); histograms merged "
           "on the master.", ""]
    for e in results.get("events", []):
        if e["event"] in WORKER_EVENTS:
            who = e.get("worker") or ", ".join(e.get("workers", []))
            users = f" with {e['users']} users" if "users" in e else ""
            where = f" during step {e['step']}" if e.get("step") else ""
            out.append(f"- WARNING: worker {who}{users} {WORKER_EVENTS[e['event']]}{where} "
                       f"(at {e['at']}). {e.get('detail', '')}".rstrip())
    hit = [f"{s['phase']}/{s['index']}" for s in steps
           if s["workers"]["lost"] or s["workers"]["timed_out"]]
    if hit:
        out.append(f"- Steps missing a worker's samples (client count below the server's): "
                   f"{', '.join(hit)}.")
    return [*out, ""]


def _span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.0f}" if round(lo) == round(hi) else f"{lo:.0f}-{hi:.0f}"


def _generator_note(steps: list[dict[str, Any]]) -> list[str]:
    """What loadkit itself cost per request, so a reader can tell it did not distort the run."""
    gens = [s["generator"] for s in steps if s.get("generator") and s.get("requests")]
    if not gens:
        return []
    cpu = _span([g["cpu_us_per_request"] for g in gens])
    line = f"Generator, per request: {cpu} us of loadkit's CPU"
    if all("own_us_per_request" in g for g in gens):
        own = _span([g["own_us_per_request"] for g in gens])
        line += f"; {own} us of each latency was loadkit's own framing (mean)"
    return [line + ".", ""]


def _payload_note(steps: list[dict[str, Any]]) -> list[str]:
    """How many distinct requests each template with a pool sent, per step: one payload
    repeated measures a cache, not the model (scenarios/response-cache.yaml)."""
    used: dict[str, list[int]] = {}
    for s in steps:
        for name, c in s.get("client", {}).items():
            if "distinct_payloads" in c:
                used.setdefault(name, []).append(c["distinct_payloads"])
    if not used:
        return []
    parts = [f"{n} {_span([float(v) for v in vs])}" for n, vs in used.items()]
    return [f"Distinct requests sent per step: {', '.join(parts)}.", ""]


def _open_loop_notes(steps: list[dict[str, Any]]) -> list[str]:
    """Open-loop steps: what the latencies count from, and whether the generator kept up."""
    out = [
        "Open loop: latencies above count from each request's *scheduled* send time (free of "
        "coordinated omission); from the actual send:",
        "",
        "| load | scheduled | sent | achieved/s | dropped | late | send lateness p50 / p99 | "
        "p50 from send | p99 from send |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    warn = []
    for s in steps:
        o = s["open_loop"]
        lat, late = o["service_latency_us"], o.get("lateness_us")
        label = load_label(s["load"])
        out.append(
            f"| {label} | {o['scheduled']} | {o['sent']} | {o['achieved_rate']:.1f} | "
            f"{o['dropped']} | {o['late']} | "
            + (f"{ms(late['p50'])} / {ms(late['p99'])}" if late else "-")
            + f" | {ms(lat['p50'])} | {ms(lat['p99'])} |"
        )
        if o.get("dropped"):
            warn.append(
                f"WARNING: at {label} the server did not keep up: {o['dropped']} arrivals found "
                f"all {o['max_concurrency']} in-flight slots waiting on the server "
                "(max_concurrency) and were dropped, not sent.")
        if o.get("generator_limited"):
            warn.append(
                f"WARNING: at {label} the generator fell behind its schedule: {o['late']} "
                f"requests left later than {o['late_tolerance_ms']:g} ms after their scheduled "
                "time (loadkit's own CPU: fewer in flight, or --workers).")
    return [*out, "", *([*warn, ""] if warn else [])]


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _delta(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1f}%"


def change(r: Row, metric: str) -> str:
    """A row's change in `metric` with its interval: '+105% [+96, +114]', 'same (±4%)'."""
    c = r.changes.get(metric)
    return "-" if c is None else change_text(c)


def verdict_note(cmp: Comparison) -> str:
    return (f"Δ is the change versus the reference at the same load with its "
            f"{cmp.confidence:.0%} confidence interval and its word: better / worse (the "
            "interval excludes 0 and the change reaches the noise threshold), same (the whole "
            "interval inside ±threshold), inconclusive (neither: with the rounds that would "
            "likely decide it), unknown (no interval) (docs/verdicts.md). Intervals come from "
            "interleaved rounds (`repeats`) where the run had them, else from within-run batch "
            "means, which cannot see the machine's drift between minutes.")


def undecided_note(cmp: Comparison) -> list[str]:
    """How many comparisons could not be decided, and what would decide them."""
    found = [c for r in cmp.rows for c in [*r.changes.values(),
                                           *(x for t in r.template_changes.values()
                                             for x in t.values())]]
    open_ = [c for c in found if c["verdict"] == "inconclusive"]
    if not open_:
        return []
    auto = any(r.point.raw.get("rounds") for r in cmp.rows) and cmp.sequential
    return [f"{len(open_)} of {len(found)} comparisons are inconclusive: "
            + ("the rounds ran out before they were decided (`max_repeats`, `max_time`)."
               if auto else "`repeats: auto` (`--repeats auto`) adds interleaved rounds until "
               "every comparison is better, worse or same (docs/verdicts.md)."), ""]


def mixed_note(cmp: Comparison) -> list[str]:
    """Why a step's merged percentiles have no Δ: its templates reach different models."""
    if not any(r.point.raw and mixed_models(r.point.raw) for r in cmp.rows):
        return []
    return ["Steps whose templates reach different models are compared per template (below) "
            "and by their whole throughput; their merged percentiles are not compared: one "
            "mode per model, and a percentile between modes jumps from round to round.", ""]


def _streaming_comparison(cmp: Comparison) -> list[str]:
    """Streaming phases: TTFT, ITL and tokens/s beside the reference's at the same load."""
    rows = [r for r in cmp.rows if r.point.streaming]
    if not rows:
        return []
    out = ["Streaming: time to first response and gaps between responses (p99, ms), output "
           "tokens/s (one response = one token), goodput; Δ versus the reference at the same "
           "load, with its interval.", "",
           "| load | phase | first resp. p99 | Δ | gap p99 | Δ | tokens/s | goodput/s |",
           "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        st = r.point.streaming
        first, gap = st["first_response_us"]["p99"], st["inter_response_us"]["p99"]
        tokens = st["output_tokens_per_s"]
        good = st.get("goodput")
        d = [change(r, "first_response_p99"), change(r, "inter_response_p99")]
        out.append(
            f"| {r.load} | {r.entry} | {ms(first)} | {d[0]} | {ms(gap)} | {d[1]} | "
            f"{tokens:.1f} | {_num(good['per_s'] if good else None, '.1f')} |")
    return [*out, ""]


def latency_cells(lat: dict[str, float]) -> str:
    """The latency columns every table shows, in ms."""
    return " | ".join(ms(lat.get(k)) for k, _ in LATENCY_COLUMNS)


def _template_rows(cmp: Comparison) -> list[str]:
    """Each template's own numbers where a step sent several (the rows above merge them),
    with its own changes against the reference's same template."""
    rows = [(r, t) for r in cmp.rows for t in r.point.templates]
    if not rows:
        return []
    out = ["Per template (the rows above merge every template's requests):", "",
           "| load | phase | template (model) | infer/s | Δ infer/s | " + " | ".join(
               h for _, h in LATENCY_COLUMNS) + " | Δ p99 | errors |",
           "|---:|---|---|---:|---:|" + "---:|" * len(LATENCY_COLUMNS) + "---:|---:|"]
    for r, (name, model, rate, lat, errors) in rows:
        own = r.template_changes.get(name, {})
        d = ["-" if own.get(m) is None else change_text(own[m]) for m in ("throughput", "p99")]
        out.append(f"| {r.load} | {r.entry} | {name} ({model}) | {rate:.1f} | {d[0]} | "
                   f"{latency_cells(lat)} | {d[1]} | {errors} |")
    return [*out, ""]


def comparison_table(cmp: Comparison) -> str:
    """comparison.md: one row per phase at each load level, with the change vs the reference."""
    out = [f"# Comparison: {cmp.title}", ""]
    if not cmp.measured:
        out += ["No phase measured anything.", ""]
    else:
        out += [
            f"Reference: **{cmp.reference}**. Latencies in ms from HDR histograms (us "
            "resolution); infer/s counts successful inferences; each model's avg batch, queue "
            "and compute (input + infer + output, per request) come from Triton's own "
            "statistics. "
            + verdict_note(cmp),
            "",
            *[f"WARNING: {w}." for w in cmp.warnings],
            *([""] if cmp.warnings else []),
            "| load | phase | infer/s | Δ infer/s | " + " | ".join(
                h for _, h in LATENCY_COLUMNS) + " | Δ p99 | errors | server, per model "
            "(batch, queue us, compute us) |",
            "|---:|---|---:|---:|" + "---:|" * len(LATENCY_COLUMNS) + "---:|---:|---|",
        ]
        for r in cmp.rows:
            p = r.point
            phase = r.entry + (" (partial)" if p.status != "ok" else "")
            out.append(
                f"| {r.load} | {phase} | {p.infer_s:.1f} | {change(r, 'throughput')} | "
                f"{latency_cells(p.latency_us)} | {change(r, 'p99')} | {p.errors} | "
                f"{'; '.join(f.text() for f in p.server) or '-'} |"
            )
        out.append("")
        out += undecided_note(cmp)
        out += mixed_note(cmp)
        out += _template_rows(cmp)
        out += _streaming_comparison(cmp)
        out += [f"- {pre}**{label}**{post}" for pre, label, post in highlights(cmp)]
        reloads = [
            f"{e.label} {', '.join(f'{m} {s:.2f} s' for m, s in e.reload_s.items())}"
            for e in cmp.entries
            if e.reload_s
        ]
        if reloads:
            out.append(f"- Config reload time: {'; '.join(reloads)}.")
        out.append("")
    if cmp.not_measured:
        out += ["## Not measured", ""]
        out += [f"- {e.label}: {e.status}: {e.reason or 'no steps'}" for e in cmp.not_measured]
        out.append("")
    return "\n".join(out)
