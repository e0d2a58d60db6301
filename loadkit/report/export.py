"""steps.csv: one row per measured step and template, under perf_analyzer's `-f` column names
where a column means the same, so a sheet built on perf_analyzer's CSV reads loadkit's. Times in
µs as there; the server columns are the template's model's (Triton's statistics over the step).
perf_analyzer's Client Send, Network+Server Send/Recv and Client Recv are not measured apart by
loadkit and are left out; loadkit's own columns come after perf_analyzer's."""

from __future__ import annotations

import csv
import io
from typing import Any

from loadkit.report.units import infer_per_s, step_state, template_batch, template_of

COLUMNS = (
    "Concurrency", "Request Rate", "Inferences/Second", "Server Queue", "Server Compute Input",
    "Server Compute Infer", "Server Compute Output", "p50 latency", "p90 latency",
    "p95 latency", "p99 latency", "Avg latency",
    # loadkit's own
    "Phase", "Step", "Template", "Model", "Batch Size", "Requests", "Errors", "p99.9 latency",
    "Max latency", "Duration (s)", "Status",
)


def steps_csv(results: dict[str, Any]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, COLUMNS, lineterminator="\n")
    writer.writeheader()
    scenario = results.get("scenario", {})
    for phase in results.get("phases", []):
        for step in phase["steps"]:
            for name, client in step.get("client", {}).items():
                writer.writerow(_row(phase["name"], step, name, client,
                                     template_of(scenario, name)))
    return out.getvalue()


def _row(phase: str, step: dict[str, Any], name: str, client: dict[str, Any],
         template: dict[str, Any]) -> dict[str, Any]:
    load = step["load"]
    batch = template_batch(template)
    model = str(template.get("model", ""))
    seconds = step.get("duration_s") or 0
    lat = client.get("latency_us", {})
    server = step.get("server", {}).get(model, {})
    return {
        "Concurrency": load.get("concurrency", ""),
        "Request Rate": load.get("rate", ""),
        "Inferences/Second": round(infer_per_s(client, template, seconds), 2),
        "Server Queue": _us(server.get("queue_us")),
        "Server Compute Input": _us(server.get("compute_input_us")),
        "Server Compute Infer": _us(server.get("compute_infer_us")),
        "Server Compute Output": _us(server.get("compute_output_us")),
        "p50 latency": _us(lat.get("p50")), "p90 latency": _us(lat.get("p90")),
        "p95 latency": _us(lat.get("p95")), "p99 latency": _us(lat.get("p99")),
        "Avg latency": _us(lat.get("mean")),
        "Phase": phase, "Step": step["index"] + 1, "Template": name, "Model": model,
        "Batch Size": batch, "Requests": client["requests"], "Errors": client.get("errors", 0),
        "p99.9 latency": _us(lat.get("p999")), "Max latency": _us(lat.get("max")),
        "Duration (s)": round(seconds, 3), "Status": step_state(step),
    }


def _us(value: float | None) -> int | str:
    return "-" if value is None else round(value)
