"""Write the report folder. Every file is written to a temp name and renamed, so a crash (even a
SIGKILL of loadkit) leaves the last complete version on disk, never a torn one.

After every step: results.json, histograms.json, summary.md (cheap). At the end of the run, and
on `loadkit report`: comparison.md, the PNG plots and report.html, rendered only from what is on
disk, so a re-render shows exactly what the run saved.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from loadkit.errors import ReportError
from loadkit.report.capacity import capacity_table
from loadkit.report.compare import build, change_list
from loadkit.report.export import steps_csv
from loadkit.report.html import render_html
from loadkit.report.markdown import comparison_table, summary_table
from loadkit.report.plots import capacity_search, render_plots, tune_pareto
from loadkit.report.replay import plot as replay_plot
from loadkit.report.timeline import plot as timeline_plot
from loadkit.report.tune import write_best
from loadkit.run.results import RESULTS_FORMAT, RunResult
from loadkit.slo import junit_xml


def atomic_write(path: Path, data: str | bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def histograms_of(result: RunResult) -> dict[str, Any]:
    """{phase: {step index: {template: encoded HDR}}}, the data `loadkit report` re-reads."""
    return {**result.carried_histograms,
            **{p.name: {str(s.index): s.histograms for s in p.steps} for p in result.phases}}


def service_histograms_of(result: RunResult) -> dict[str, Any]:
    """Open-loop steps only: latency from the actual send, same layout as histograms_of."""
    out: dict[str, Any] = {}
    for p in result.phases:
        steps = {str(s.index): s.service_histograms for s in p.steps if s.service_histograms}
        if steps:
            out[p.name] = steps
    return out


def write_report(out_dir: Path, result: RunResult) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    data = result.to_json()
    atomic_write(out_dir / "results.json", json.dumps(data, indent=2) + "\n")
    atomic_write(out_dir / "histograms.json", json.dumps(histograms_of(result)) + "\n")
    if data["thresholds"]:
        atomic_write(
            out_dir / "junit.xml", junit_xml(f"loadkit.{result.scenario_name}", data["thresholds"])
        )
    service = service_histograms_of(result)
    if service:
        atomic_write(out_dir / "service_histograms.json", json.dumps(service) + "\n")
    atomic_write(out_dir / "summary.md", summary_table(data) + "\n")
    atomic_write(out_dir / "steps.csv", steps_csv(data))
    write_best(out_dir, data, atomic_write)
    return data


def read_run(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(results.json, histograms.json) of a report folder, or one clear ReportError."""
    path = run_dir / "results.json"
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReportError(f"{path}: not found (is {run_dir} a loadkit report folder?)") from None
    except (OSError, ValueError) as exc:
        raise ReportError(f"{path}: not readable as JSON: {exc}") from None
    if not isinstance(results, dict) or results.get("format") != RESULTS_FORMAT:
        found = results.get("format") if isinstance(results, dict) else type(results).__name__
        raise ReportError(f"{path}: expected format {RESULTS_FORMAT!r}; found {found!r}")
    try:
        hists = json.loads((run_dir / "histograms.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        hists = {}  # percentiles then come from results.json alone
    except (OSError, ValueError) as exc:
        raise ReportError(f"{run_dir / 'histograms.json'}: not readable as JSON: {exc}") from None
    return results, hists


def render_comparison(
    runs: list[tuple[str, dict[str, Any], dict[str, Any]]], out_dir: Path | None, title: str = ""
) -> str:
    """Write comparison.md, comparison.json (the changes with their intervals and verdicts,
    and what differs between the runs), the plots and report.html into out_dir; return the
    Markdown."""
    cmp = build(runs, title)
    md = comparison_table(cmp) + "\n"
    capacity = [r["capacity"] for _, r, _ in runs if r.get("capacity")]
    for cap in capacity:
        md += capacity_table(cap) + "\n"
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        plots = render_plots(cmp)
        for i, cap in enumerate(capacity):
            plots[f"capacity_search{i or ''}.png"] = capacity_search(cap)
        for i, tune in enumerate(r["tune"] for _, r, _ in runs if r.get("tune")):
            plots[f"tune_pareto{i or ''}.png"] = tune_pareto(tune)
        if len(runs) == 1:  # a run's own report: the run second by second
            png = timeline_plot(runs[0][1])
            if png is not None:
                plots["timeline.png"] = png
            png = replay_plot(runs[0][1])
            if png is not None:
                plots["replay.png"] = png
        for name, png in plots.items():
            atomic_write(out_dir / name, png)
        atomic_write(out_dir / "comparison.md", md)
        atomic_write(out_dir / "comparison.json", json.dumps(
            {"reference": cmp.reference, "confidence": cmp.confidence,
             "warnings": list(cmp.warnings), "comparisons": change_list(cmp)}, indent=1) + "\n")
        html = render_html(cmp, [(label, r) for label, r, _ in runs], plots)
        atomic_write(out_dir / "report.html", html)
    return md


def render(run_dir: Path) -> str:
    """Re-render a run's folder from results.json and histograms.json."""
    results, hists = read_run(run_dir)
    atomic_write(run_dir / "summary.md", summary_table(results) + "\n")
    atomic_write(run_dir / "steps.csv", steps_csv(results))
    return render_comparison([("", results, hists)], run_dir)
