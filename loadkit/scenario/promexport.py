"""A Prometheus range query's JSON as a rate profile: each series one model's request rate
(its `model` label), each sample a rate that holds until the next one. What the file holds is
said, never bent: several series of one model are refused (summing them silently doubled a
replay once), a gap between samples has no traffic (said, not filled), samples out of order
are put in order (said), and a malformed entry is named by file, series and sample."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from loadkit.errors import DatasetError

Piece = tuple[float, float, str, float]  # start s, end s, model or template, requests/s
GAP_FACTOR = 1.5  # samples further apart than 1.5 steps: a gap in the series


def _labels(metric: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k}={v}" for k, v in sorted(metric.items())) + "}"


def _series(path: Path, i: int, s: Any) -> tuple[str, str, list[tuple[float, float]]]:
    """(model, labels, samples (t, rate)) of result [i]; DatasetError naming what is wrong."""
    where = f"{path.name}: result [{i}]"
    if not isinstance(s, dict) or not isinstance(s.get("values"), list):
        raise DatasetError(f"{where}: expected a series, an object with 'metric' and "
                           f"'values'; found {type(s).__name__} {str(s)[:40]!r}")
    metric = s.get("metric") if isinstance(s.get("metric"), dict) else {}
    model = metric.get("model")
    if not model:
        raise DatasetError(f"{where}: expected a 'model' label (query by model, e.g. sum by "
                           f"(model) (rate(...))); found {_labels(metric)}")
    where = f"{where} {_labels(metric)}"
    out = []
    for k, sample in enumerate(s["values"]):
        try:
            t, v = float(sample[0]), float(sample[1])
        except (TypeError, ValueError, IndexError):
            raise DatasetError(f"{where}, sample [{k}]: expected [unix time, \"rate\"]; found "
                               f"{str(sample)[:40]}") from None
        if not math.isfinite(t):
            raise DatasetError(f"{where}, sample [{k}]: expected a time; found {sample[0]!r}")
        if math.isfinite(v):  # NaN / Inf: Prometheus's "no value" here
            out.append((t, v))
    return str(model), _labels(metric), out


def read(path: Path) -> tuple[list[Piece], list[str]]:
    """(pieces, notes): the file's rate pieces (t from the earliest sample), and what a reader
    should know of it: gaps, order put right."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path.name}:{exc.lineno}:{exc.colno}: not JSON: {exc.msg}") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(
            data.get("result"), list):
        raise DatasetError(f"{path.name}: expected the JSON of a Prometheus range query "
                           '({"status": "success", "data": {"resultType": "matrix", ...}})')
    found = [_series(path, i, s) for i, s in enumerate(data["result"])]
    seen: dict[str, str] = {}
    for model, labels, _ in found:
        if model in seen:
            raise DatasetError(
                f"{path.name}: series {seen[model]} and {labels} are both model {model}: "
                "loadkit does not add series up silently; query one series per model (sum by "
                "(model) (...)) or keep the one you mean (e.g. a version or instance filter)")
        seen[model] = labels
    notes: list[str] = []
    for _, labels, values in found:
        if any(b[0] < a[0] for a, b in zip(values, values[1:], strict=False)):
            values.sort()
            notes.append(f"series {labels}: its samples were out of time order (put in order)")
    t0 = min((v[0][0] for _, _, v in found if v), default=0.0)
    pieces: list[Piece] = []
    for model, labels, values in found:
        steps = sorted(b[0] - a[0] for a, b in zip(values, values[1:], strict=False))
        step = steps[len(steps) // 2] if steps else 0.0
        for (a, r), (b, _) in zip(values, values[1:], strict=False):
            if step and b - a > GAP_FACTOR * step:
                notes.append(f"series {labels}: no samples from {a - t0:g} s to {b - t0:g} s "
                             f"(a gap of {round((b - a) / step) - 1} samples): no traffic "
                             "replayed there")
                continue
            pieces.append((a - t0, b - t0, model, max(r, 0.0)))
    return pieces, notes
