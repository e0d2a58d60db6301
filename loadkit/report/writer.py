"""Write the report folder. Every file is written to a temp name and renamed, so a crash (even a
SIGKILL of loadkit) leaves the last complete version on disk, never a torn one."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from loadkit.report.markdown import summary_table
from loadkit.results import RunResult


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def histograms_of(result: RunResult) -> dict[str, Any]:
    """{phase: {step index: {template: encoded HDR}}}, the data `loadkit report` re-reads."""
    return {p.name: {str(s.index): s.histograms for s in p.steps} for p in result.phases}


def write_report(out_dir: Path, result: RunResult) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    data = result.to_json()
    atomic_write(out_dir / "results.json", json.dumps(data, indent=2) + "\n")
    atomic_write(out_dir / "histograms.json", json.dumps(histograms_of(result)) + "\n")
    atomic_write(out_dir / "summary.md", summary_table(data) + "\n")
    return data
