"""The "Triton" tab in Locust's web UI, added the documented way (extended_tabs / extended_tables
in the template args, rows in /stats/requests' `extended_stats`, a Flask blueprint for the rest).

Locust's own statistics are whole milliseconds; this tab shows loadkit's HDR percentiles (ms with
decimals) per step, Triton's own queue / compute / batch figures beside them, the phase's config
overlay, the change against the first phase at the same load, and a link to the HTML report;
above the table, charts.js draws throughput and p99 per step with the phases marked.
The rows are built from the same results.json data the report is, so the two always agree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flask import Blueprint, Response, jsonify, make_response, request

from loadkit.plan import load_label
from loadkit.record import latency_summary
from loadkit.report.units import LATENCY_COLUMNS, ms, step_state
from loadkit.run.accounting import first_message
from loadkit.run.streaming import streaming_results
from loadkit.scenario import ConcurrencyLoad
from loadkit.stats import judging, step_changes
from loadkit.stats import text as change_text

TAB_KEY = "triton"
COLUMNS = [
    ("phase", "Phase"), ("step", "Step"), ("load", "Load"), ("status", "Status"),
    ("requests", "Requests"), ("infer_s", "infer/s"), ("mean", "mean ms"), ("p50", "p50 ms"),
    ("p90", "p90 ms"), ("p95", "p95 ms"), ("p99", "p99 ms"), ("p999", "p99.9 ms"),
    ("errors", "Errors"), ("avg_batch", "Avg batch"), ("queue_us", "Queue µs"),
    ("compute_us", "Compute µs"),
    # streaming (decoupled) models only: time to first response, gaps, tokens/s, goodput
    ("first_response", "First resp. p50/p99 ms"), ("inter_response", "Gap p50/p99 ms"),
    ("tokens_s", "Tokens/s"), ("goodput", "Goodput/s"), ("delta", "vs first phase"),
    ("config", "Config overlay"),
]
STREAMING_COLUMNS = ("first_response", "inter_response", "tokens_s", "goodput")
NOTE = (
    "The scenario's phases drive the load (LoadkitShape): they set each step's users; the start "
    "form shows their peak. Latencies: loadkit's HDR histograms, measured windows only; Locust's "
    "Statistics tab also counts the warm-ups and the requests between steps, so its totals are "
    "higher."
)


def peak_users(scenario: Any) -> int:
    """The most users the scenario's phases run at once (an open-loop phase: its cap)."""
    return max((max(ph.load.levels) if isinstance(ph.load, ConcurrencyLoad)
                else ph.load.max_concurrency or 1 for ph in scenario.phases), default=1)


def columns(streaming: bool) -> list[tuple[str, str]]:
    """The tab's columns: the streaming ones only when a template's model streams."""
    return [c for c in COLUMNS if streaming or c[0] not in STREAMING_COLUMNS]


def _server_fields(step: dict[str, Any]) -> dict[str, str]:
    models = [(m, s) for m, s in step.get("server", {}).items() if s.get("success")]
    if not models:
        return {"avg_batch": "-", "queue_us": "-", "compute_us": "-"}
    tag = (lambda m: f"{m} ") if len(models) > 1 else (lambda m: "")
    return {
        "avg_batch": ", ".join(f"{tag(m)}{s['avg_batch']:.2f}" for m, s in models),
        "queue_us": ", ".join(f"{tag(m)}{s['queue_us']:.0f}" for m, s in models),
        "compute_us": ", ".join(
            f"{tag(m)}{s['compute_input_us'] + s['compute_infer_us'] + s['compute_output_us']:.0f}"
            for m, s in models
        ),
    }


def _status(step: dict[str, Any]) -> str:
    acc = step.get("accounting", {})
    if acc.get("status") == "mismatch":
        return f"{step_state(step)}; ACCOUNTING MISMATCH: {acc.get('reason', '')}"
    return step_state(step)


def _errors(step: dict[str, Any]) -> str:
    """The count, and what the server said most often (results.json keeps the rest)."""
    n = sum(step["errors"].values())
    why = first_message(step.get("error_messages", {}))
    return f"{n}: {why}" if n and why else str(n)


def _config(overlay: dict[str, Any]) -> str:
    text = json.dumps(overlay, separators=(", ", ": ")) if overlay else "server's own"
    return text if len(text) <= 160 else text[:157] + "..."


def _latency(lat: dict[str, float]) -> dict[str, str]:
    return {k: ms(lat.get(k)) for k, _ in LATENCY_COLUMNS}


def _streaming(st: dict[str, Any] | None) -> dict[str, str]:
    """A streaming step's TTFT, ITL, tokens/s and goodput ('-' for other models)."""
    if not st:
        return dict.fromkeys(("first_response", "inter_response", "tokens_s", "goodput"), "-")
    first, gap, good = st["first_response_us"], st["inter_response_us"], st.get("goodput")
    return {
        "first_response": f"{ms(first['p50'])} / {ms(first['p99'])}",
        "inter_response": f"{ms(gap['p50'])} / {ms(gap['p99'])}",
        "tokens_s": f"{st['output_tokens_per_s']:.1f}",
        "goodput": f"{good['per_s']:.1f} ({good['ratio']:.0%})" if good else "-",
    }


def triton_rows(results: dict[str, Any], live: dict[str, Any] | None,
                overlays: dict[str, dict[str, Any]], stage: str = "") -> list[dict[str, Any]]:
    """One row per measured step, plus the step in progress and a first row that says what
    the run is doing (what drives the load is said above the table: NOTE)."""
    rows: list[dict[str, Any]] = [
        {"phase": "(run)", "status": f"{results['status']}: {stage}" if stage else
         results["status"]}
    ]
    first: dict[str, dict[str, Any]] = {}
    for phase in results["phases"]:
        if not phase["steps"]:
            rows.append({"phase": phase["name"], "status": phase["status"],
                         "config": phase.get("reason", "")})
        for s in phase["steps"]:
            label = load_label(s["load"])
            base = first.setdefault(label, s)
            delta = "reference"
            if base is not s:  # each change with its interval and word (loadkit/stats/)
                changes = {c["metric"]: c for c in step_changes(base, s, *judging(results))
                           if "template" not in c}
                t, p = changes.get("throughput"), changes.get("p99")
                delta = (f"infer/s {change_text(t) if t else '-'}, "
                         f"p99 {change_text(p) if p else '-'}")
            rows.append({
                "phase": phase["name"], "step": s["index"] + 1, "load": label,
                "status": _status(s), "requests": s["requests"],
                "infer_s": f"{s['throughput']:.1f}", **_latency(s["latency_us"]),
                "errors": _errors(s), **_server_fields(s), **_streaming(s.get("streaming")),
                "delta": delta,
                "config": _config(overlays.get(phase["name"], {})),
            })
    if live is not None:
        rows.append({**live, "config": _config(overlays.get(live["phase"], {}))})
    return rows


def live_row(status: dict[str, Any], batch_sizes: dict[str, int]) -> dict[str, Any] | None:
    """The step being measured, from the live HDR window (this process or merged workers)."""
    window = status.get("window")
    if window is None or not status.get("phase"):
        return None
    merged = window.merged()
    elapsed = max(status["elapsed_s"], 1e-9)
    inferences = sum(window.successes(n) * b for n, b in batch_sizes.items())
    return {
        "phase": status["phase"], "step": (status["step"] or 0) + 1, "load": status["load"],
        "status": f"{status['stage']} {status['elapsed_s']:.0f}s / "
                  f"{status['elapsed_s'] + status['remaining_s']:.0f}s",
        "requests": merged.get_total_count(), "infer_s": f"{inferences / elapsed:.1f}",
        **_latency(latency_summary(merged)), "errors": window.error_count(),
        "avg_batch": "", "queue_us": "", "compute_us": "", "delta": "live",
        **_streaming(streaming_results(window, elapsed, False, {})[1]),
    }


def install(environment: Any) -> None:
    """Add the tab to this Locust process's web UI (master or single process)."""
    web_ui = environment.web_ui
    if web_ui is None:
        return
    blueprint = Blueprint("loadkit", __name__, url_prefix="/loadkit")

    def current() -> Any:
        return environment.loadkit

    def rows() -> list[dict[str, Any]]:
        run = current()
        overlays = {p.name: p.config for p in run.plan.phases}
        live = live_row(run.conductor.status(), run.batch_sizes)
        return triton_rows(run.result.to_json(), live, overlays, run.conductor.stage)

    @blueprint.route("/status")
    def status() -> Response:
        run = current()
        return jsonify({"out_dir": str(run.out_dir), "stage": run.conductor.stage,
                        "status": run.result.status, "rows": rows(), "note": NOTE,
                        "peak_users": peak_users(run.scenario)})

    @blueprint.route("/charts.js")
    def charts() -> Response:
        script = (Path(__file__).parent / "charts.js").read_text()
        return make_response(script, 200, {"Content-Type": "text/javascript"})

    @blueprint.route("/report")
    def report() -> Response:
        page = Path(current().out_dir) / "report.html"
        if not page.exists():
            return make_response("the HTML report is written when the run ends", 404)
        return make_response(page.read_text(), 200, {"Content-Type": "text/html"})

    @web_ui.app.before_request
    def one_target() -> Response | None:
        """The start form's Host shows the run's target; it cannot change it (the controller,
        the accounting and the report are all bound to that server): a start asking for
        another host is refused with the reason, never silently sent elsewhere."""
        if request.path != "/swarm" or request.method != "POST":
            return None
        asked = (request.form.get("host") or "").strip()
        shown = (environment.host or "").strip()
        if asked and asked != shown:
            message = (f"this run's target is {shown} (from --target, the scenario's target, "
                       f"or the embedded Triton); the Host field cannot change it: start "
                       f"`loadkit ui SCENARIO --target HOST:PORT` for {asked}")
            return make_response(jsonify({"success": False, "message": message}), 400)
        return None

    @web_ui.app.after_request
    def add_rows(response: Response) -> Response:
        if request.path.endswith("/stats/requests") and response.is_json:
            extended = [{"key": TAB_KEY, "data": rows()}]
            stats = response.json
            # Locust's page polls only while it reads spawning or running: a poll that lands
            # in the runner's brief `cleanup` would leave the page there (STOP lit) until a
            # reload; it reads running a moment longer and then the stopped that follows
            if stats.get("state") == "cleanup":
                stats["state"] = "running"
            response.set_data(json.dumps({**stats, "extended_stats": extended}))
        elif request.path == "/" and response.mimetype == "text/html" \
                and not response.direct_passthrough:
            # Locust's extended tabs are tables only: the charts come with a script of ours
            page = response.get_data(as_text=True)
            tag = '<script defer src="./loadkit/charts.js"></script>'
            if "</body>" in page and tag not in page:
                response.set_data(page.replace("</body>", tag + "</body>", 1))
        return response

    web_ui.app.register_blueprint(blueprint)
    web_ui.template_args["extended_tabs"] = [{"title": "Triton", "key": TAB_KEY}]
    streams = any(t.decoupled for t in current().scenario.requests.values())
    web_ui.template_args["extended_tables"] = [
        {"key": TAB_KEY, "structure": [{"key": k, "title": t} for k, t in columns(streams)]}
    ]
    web_ui.template_args["extended_csv_files"] = [
        {"href": "/loadkit/report", "title": "loadkit HTML report (after the run)"}
    ]
