"""Report: results.json, histograms.json and summary.md, written atomically after every step."""

from loadkit.report.writer import write_report

__all__ = ["write_report"]
