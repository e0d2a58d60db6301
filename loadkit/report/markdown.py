"""Markdown tables in the shape of perf_analyzer's and the seed's before/after tables."""

from __future__ import annotations

from typing import Any


def ms(us: float) -> str:
    """Microseconds as milliseconds with enough decimals to mean something."""
    v = us / 1000.0
    if v >= 100:
        return f"{v:.1f}"
    if v >= 10:
        return f"{v:.2f}"
    return f"{v:.3f}"


def _errors(step: dict[str, Any]) -> str:
    errs = step.get("errors", {})
    if not errs:
        return "0"
    return ", ".join(f"{code} {n}" for code, n in sorted(errs.items()))


def _load_label(load: dict[str, Any]) -> str:
    if "concurrency" in load:
        return str(load["concurrency"])
    return ", ".join(f"{k} {v}" for k, v in load.items())


def _server_cell(step: dict[str, Any]) -> str:
    parts = []
    for model, s in step.get("server", {}).items():
        if s.get("success", 0) or s.get("fail", 0):
            parts.append(
                f"{model}: batch {s['avg_batch']:.2f}, queue {s['queue_us']:.0f} us, "
                f"infer {s['compute_infer_us']:.0f} us"
            )
    return "; ".join(parts) or "-"


def summary_table(results: dict[str, Any]) -> str:
    """The per-step table: concurrency | infer/s | p50 | ... | errors, one block per phase."""
    out = [f"# {results['scenario_name']}: {results['status']}", ""]
    if results.get("reason"):
        out += [f"Reason: {results['reason']}", ""]
    out += [
        f"Target: {results['target']}{' (embedded Triton)' if results['embedded'] else ''}. "
        "Latencies in ms from HDR histograms (us resolution); infer/s counts successful "
        "inferences (requests x batch size).",
        "",
    ]
    for phase in results["phases"]:
        title = f"## {phase['name']}"
        if phase["status"] != "ok":
            title += f" ({phase['status']}{': ' + phase['reason'] if phase['reason'] else ''})"
        out += [title, ""]
        if not phase["steps"]:
            out += ["No measured steps.", ""]
            continue
        out += [
            "| concurrency | infer/s | p50 | p90 | p95 | p99 | p99.9 | max | errors | server |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
        ]
        for s in phase["steps"]:
            lat = s["latency_us"]
            label = _load_label(s["load"]) + (" (partial)" if s["status"] != "ok" else "")
            out.append(
                f"| {label} | {s['throughput']:.1f} | {ms(lat['p50'])} | {ms(lat['p90'])} | "
                f"{ms(lat['p95'])} | {ms(lat['p99'])} | {ms(lat['p999'])} | {ms(lat['max'])} | "
                f"{_errors(s)} | {_server_cell(s)} |"
            )
        out.append("")
    return "\n".join(out)
