"""`loadkit tune --resume DIR`: the trials an earlier search saved, checked against this
scenario's `tune:` section (the same dimensions and values), with the phases and histograms
that back them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loadkit.errors import TuneInputError
from loadkit.scenario import TuneSpec


def read_search(run_dir: Path, spec: TuneSpec) -> tuple[list[dict[str, Any]],
                                                         list[dict[str, Any]], dict[str, Any],
                                                         float]:
    """(trials, phases JSON, histograms, seconds the search had run) of the search saved in
    run_dir. A trial interrupted half-way is dropped (it is measured again); the rest are
    never measured twice."""
    path = run_dir / "results.json"
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TuneInputError(f"--resume: {path} not found (is {run_dir} a loadkit tune "
                             "report folder?)") from None
    except (OSError, ValueError) as exc:
        raise TuneInputError(f"--resume: {path}: not readable as JSON: {exc}") from None
    tune = results.get("tune") if isinstance(results, dict) else None
    if not tune:
        raise TuneInputError(f"--resume: {path} holds no search (written by `loadkit run`?)")
    theirs = [(d["model"], d["path"], d["values"]) for d in tune["dimensions"]]
    ours = [(d.model, d.path, list(d.values)) for d in spec.dimensions]
    if theirs != ours:
        raise TuneInputError(
            f"--resume: the search in {run_dir} has other dimensions than this scenario's tune "
            f"section: expected {_dims(ours)}; found {_dims(theirs)}")
    kept = [t for t in tune["trials"] if t["status"] != "partial"]
    names = {t["phase"] for t in kept}
    phases = [p for p in results["phases"] if p["name"] in names]
    try:
        hists = json.loads((run_dir / "histograms.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        hists = {}
    return (kept, phases, {k: v for k, v in hists.items() if k in names},
            float(tune.get("elapsed_s") or 0.0))


def _dims(dims: list[tuple[str, str, list[Any]]]) -> str:
    return "; ".join(f"{m}.{p} {v}" for m, p, v in dims)
