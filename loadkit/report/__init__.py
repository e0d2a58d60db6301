"""Report: results.json, histograms.json and summary.md after every step; comparison.md, PNG plots
and report.html at the end (and on `loadkit report` / `loadkit compare`)."""

from loadkit.report.writer import ReportError, read_run, render, render_comparison, write_report

__all__ = ["ReportError", "read_run", "render", "render_comparison", "write_report"]
