"""Report: results.json, histograms.json and summary.md after every step; comparison.md, PNG plots
and report.html at the end (and on `loadkit report` / `loadkit compare`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loadkit.errors import ReportError
from loadkit.report.writer import read_run, render, render_comparison, write_report
from loadkit.run.results import RunResult


class Files:
    """The reporter a Run writes through (run/run.py's Reporter): the files above, in the run's
    folder."""

    def write(self, out_dir: Path, result: RunResult) -> dict[str, Any]:
        return write_report(out_dir, result)

    def render(self, out_dir: Path) -> None:
        render(out_dir)


__all__ = ["Files", "ReportError", "read_run", "render", "render_comparison", "write_report"]
