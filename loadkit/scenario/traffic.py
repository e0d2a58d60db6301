"""Traffic recorded elsewhere, read as arrivals: when each request left (seconds from the
start of the file's window) and which model it was for. The formats are the ones teams already
have, each recognised from the file and refused with file:line when it is not what it claims:

- perf_analyzer's `--request-intervals` file: one gap in µs per line (no model: the mix picks);
- Triton's trace output (`--trace-config triton,file=F,level=TIMESTAMPS`): a JSON array of
  traces, one REQUEST_START each; with `log-frequency=N` Triton writes F.0, F.1, ...: pass F and
  every numbered part is read as one; an ensemble's (or BLS) child traces carry `parent_id` and
  are left out (their parent is the request); each trace stands for `sample_rate` requests
  (Triton's `rate=N` traces one in N), repeated evenly until the next trace;
- a rate profile: CSV `t,template,rate` (t in seconds; each rate holds until the template's
  next row), or the JSON a Prometheus range query returns (`rate(nv_inference_request_success
  [1m])` by model); replayed as Poisson arrivals within each piece, seeded;
- AIPerf's mooncake trace (JSON Lines: `timestamp` ms, input/output lengths, `hash_ids`): each
  arrival carries its line (`entry_of`), so an `llm: {trace: FILE}` template sends that line's
  request (scenario/mooncake.py).
"""

from __future__ import annotations

import csv
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loadkit.errors import DatasetError
from loadkit.scenario import promexport
from loadkit.scenario.mooncake import looks_like, read_rows

FORMATS = ("intervals", "triton_trace", "rate_csv", "prometheus", "profile", "mooncake")
MAX_ARRIVALS = 20_000_000  # ~200 MB of offsets and template indices held by every sender
ANY = ""  # an arrival for no model in particular: the phase's mix picks the template


@dataclass(frozen=True, kw_only=True)
class Traffic:
    """Arrivals from a file: `offsets` (s, sorted, from the window's start) and the model (or
    ANY) of each, plus what the file said before sampling was undone."""

    file: Path
    format: str
    duration_s: float
    models: tuple[str, ...]  # the distinct models, in order of first arrival
    offsets: np.ndarray = field(repr=False, compare=False)  # float64 seconds
    model_of: np.ndarray = field(repr=False, compare=False)  # int32 index into models
    in_file: int = 0  # records in the file's window (traces, intervals, or rate pieces)
    # mooncake: each arrival's line (0-based, of the file's requests): the request it sends
    entry_of: np.ndarray | None = field(default=None, repr=False, compare=False)
    notes: tuple[str, ...] = ()  # what a reader should know of the file (gaps, order)


def read_traffic(path: Path | list[Path], window: tuple[float, float] | None = None,
                 sample_rate: int = 1, seed: int = 0) -> Traffic:
    """The file's arrivals (within `window`, shifted to start at 0); DatasetError with the
    file and line of what is wrong. A list of files is one trace in parts (Triton's)."""
    if isinstance(path, list):
        missing = [p for p in path if not p.exists()]
        if missing:
            raise DatasetError(f"file not found: {missing[0]}")
        fmt, parts = detect(path[0])
        if fmt != "triton_trace":
            raise DatasetError(f"{path[0].name}: a list of files is for the parts of one "
                               f"Triton trace; this one reads as {fmt}")
        parts, path = path, path[0]
    else:
        fmt, parts = detect(path)
    end: float | None = None  # where the file's traffic ends, where it says so
    notes: list[str] = []
    if fmt == "intervals":
        starts, models, n, end = _intervals(parts[0])
    elif fmt == "triton_trace":
        starts, models, n = _triton(parts, sample_rate)
    elif fmt == "mooncake":
        starts = [r.t_s for r in read_rows(parts[0])]
        models, n = [ANY] * len(starts), len(starts)
    else:
        if fmt == "rate_csv":
            pieces = _rate_csv(parts[0])
        else:
            pieces, notes = promexport.read(parts[0])
        starts, models, n = _poisson(pieces, seed)
        end = max((p[1] for p in pieces), default=None)
    if not starts:
        raise DatasetError(f"{path.name}: no requests in the file")
    order = sorted(range(len(starts)), key=starts.__getitem__)
    t = np.array([starts[i] for i in order], dtype=np.float64)
    names = [models[i] for i in order]
    t -= t[0] if fmt in ("triton_trace", "mooncake") else 0.0
    t = np.round(t, 9)  # whole nanoseconds: sums of gaps must not fall out of a window
    lo, hi = window if window is not None else (0.0, end or float(t[-1]) + _tail(t))
    keep = (t >= lo) & (t < hi)
    if not keep.any():
        raise DatasetError(f"{path.name}: no requests between {lo:g} s and {hi:g} s (the file "
                           f"spans 0 to {float(t[-1]):g} s)")
    t = t[keep] - lo
    kept = [m for m, k in zip(names, keep, strict=True) if k]
    distinct = tuple(dict.fromkeys(kept))
    index = {m: i for i, m in enumerate(distinct)}
    if len(t) > MAX_ARRIVALS:
        raise DatasetError(f"{path.name}: {len(t)} requests in the window; at most "
                           f"{MAX_ARRIVALS} are held (narrow the window)")
    entries = np.array(order, dtype=np.int64)[keep] if fmt == "mooncake" else None
    return Traffic(file=path, format=fmt, duration_s=hi - lo, models=distinct, offsets=t,
                   model_of=np.array([index[m] for m in kept], dtype=np.int32), in_file=n,
                   entry_of=entries, notes=tuple(notes))


def _tail(t: np.ndarray) -> float:
    """The window's end past the last arrival: one mean gap (so looping keeps the rhythm)."""
    return float(t[-1] - t[0]) / max(len(t) - 1, 1) if len(t) > 1 else 1.0


def detect(path: Path) -> tuple[str, list[Path]]:
    """(format, files): Triton's numbered trace parts are gathered as one file."""
    parts = sorted(path.parent.glob(path.name + ".*"), key=_part_number) \
        if not path.exists() else [path]
    parts = [p for p in parts if _part_number(p) >= 0] if not path.exists() else parts
    if not parts:
        raise DatasetError(f"file not found: {path} (nor Triton's numbered parts "
                           f"{path.name}.0, .1, ...)")
    head = parts[0].read_text(encoding="utf-8", errors="replace")[:4096].lstrip()
    _not_traffic(parts[0], head)
    if head.startswith("["):
        return "triton_trace", parts
    if head.startswith("{"):
        first = head.splitlines()[0]
        return ("mooncake" if looks_like(first) else "prometheus"), parts[:1]
    first = head.splitlines()[0] if head else ""
    if "," in first:
        return "rate_csv", parts[:1]
    return "intervals", parts[:1]


def _not_traffic(path: Path, head: str) -> None:
    """A file of another kind loadkit reads, named as what it looks like (a data set given
    where traffic is expected would otherwise read as a malformed trace)."""
    first = head.splitlines()[0].strip() if head else ""
    kind = ""
    if head.startswith("{") and '"data"' in head[:200] and '"resultType"' not in head:
        kind = ("a perf_analyzer data set (--input-data JSON), not traffic: give it as a "
                "template's `dataset:`")
    elif first.startswith('"') or (first.startswith("{") and any(
            f'"{k}"' in first for k in ("prompt", "text", "messages")) and not looks_like(first)):
        kind = ("a prompts file (JSON Lines of text), not traffic: give it as an llm "
                "template's `prompts:` (or a data set)")
    if kind:
        raise DatasetError(f"{path.name}: this looks like {kind}; traffic is a Triton trace, "
                           "request intervals, a rate CSV, a Prometheus export or a mooncake "
                           "trace (docs/replay.md)")


def _part_number(p: Path) -> int:
    suffix = p.suffix.lstrip(".")
    return int(suffix) if suffix.isdigit() else -1


def _intervals(path: Path) -> tuple[list[float], list[str], int, float]:
    """perf_analyzer's request intervals: a gap in µs per line; the first request at 0, the
    file's end after the last gap."""
    starts, t = [], 0.0
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            text = line.strip()
            if not text:
                continue
            try:
                gap = float(text)
            except ValueError:
                raise DatasetError(f"{path.name}:{n}: expected an interval in microseconds "
                                   f"(perf_analyzer's --request-intervals); found {text[:40]!r}"
                                   ) from None
            if gap < 0 or not math.isfinite(gap):
                raise DatasetError(f"{path.name}:{n}: expected an interval >= 0 µs; found "
                                   f"{text!r}")
            starts.append(t)
            t += gap / 1e6
    return starts, [ANY] * len(starts), len(starts), t


def _triton(parts: list[Path], sample_rate: int) -> tuple[list[float], list[str], int]:
    """REQUEST_START of every top-level trace (entries of one id may be split across objects);
    a sampled trace repeated evenly up to the next of its model."""
    traces: dict[Any, dict[str, Any]] = {}
    for part in parts:
        try:
            doc = json.loads(part.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{part.name}:{exc.lineno}:{exc.colno}: not JSON: {exc.msg}"
                               ) from None
        if not isinstance(doc, list):
            raise DatasetError(f"{part.name}: expected Triton's trace output (a JSON array of "
                               "traces); found " + type(doc).__name__)
        for i, entry in enumerate(doc):
            if not isinstance(entry, dict) or "id" not in entry:
                raise DatasetError(f"{part.name}: trace [{i}]: expected an object with an "
                                   "'id' (Triton's trace output)")
            tid, stamps = entry["id"], entry.get("timestamps") or []
            if isinstance(tid, bool) or not isinstance(tid, (int, str)):
                raise DatasetError(f"{part.name}: trace [{i}]: expected an id that is a number "
                                   f"or a string; found {type(tid).__name__} {str(tid)[:40]}")
            if not isinstance(stamps, list) or not all(isinstance(t, dict) for t in stamps):
                raise DatasetError(f"{part.name}: trace [{i}] (id {tid}): expected "
                                   "'timestamps' as a list of {name, ns}; found "
                                   f"{type(stamps).__name__} {str(stamps)[:40]}")
            merged = traces.setdefault((part.name, tid), {"timestamps": []})
            merged.update({k: v for k, v in entry.items() if k != "timestamps"})
            merged["timestamps"] += stamps
    starts, models = [], []
    for (name, tid), tr in traces.items():
        if tr.get("parent_id"):
            continue  # a step of an ensemble (or a BLS call): its parent is the request
        ns = next((t.get("ns") for t in tr["timestamps"] if t.get("name") == "REQUEST_START"),
                  None)
        if ns is None or "model_name" not in tr:
            raise DatasetError(f"{name}: trace id {tid}: expected a model_name and a "
                               "REQUEST_START timestamp (level=TIMESTAMPS)")
        try:
            starts.append(int(ns) / 1e9)
        except (TypeError, ValueError):
            raise DatasetError(f"{name}: trace id {tid}: expected REQUEST_START's ns as a "
                               f"number; found {str(ns)[:40]!r}") from None
        models.append(str(tr["model_name"]))
    n = len(starts)
    if sample_rate > 1 and starts:
        starts, models = _unsample(starts, models, sample_rate)
    return starts, models, n


def _unsample(starts: list[float], models: list[str], rate: int
              ) -> tuple[list[float], list[str]]:
    """One trace in `rate`: each stands for `rate` requests of its model, spread evenly until
    its model's next trace (the last: at its model's mean gap)."""
    out_t: list[float] = []
    out_m: list[str] = []
    by_model: dict[str, list[float]] = {}
    for t, m in sorted(zip(starts, models, strict=True)):
        by_model.setdefault(m, []).append(t)
    for m, ts in by_model.items():
        mean = (ts[-1] - ts[0]) / (len(ts) - 1) if len(ts) > 1 else 1.0
        for i, t in enumerate(ts):
            gap = (ts[i + 1] - t) if i + 1 < len(ts) else mean
            out_t += [t + gap * k / rate for k in range(rate)]
            out_m += [m] * rate
    return out_t, out_m


Piece = tuple[float, float, str, float]  # start s, end s, model or template, requests/s


def _rate_csv(path: Path) -> list[Piece]:
    """`t,template,rate` rows (a header row is allowed): each rate holds until the next row of
    the same template; the last row of each ends the profile for it."""
    rows: dict[str, list[tuple[float, float]]] = {}
    with path.open(encoding="utf-8", newline="") as f:
        for n, row in enumerate(csv.reader(f), 1):
            if not row or not "".join(row).strip():
                continue
            if n == 1 and not _number(row[0]):
                continue  # a header
            if len(row) != 3 or not _number(row[0]) or not _number(row[2]) or not row[1]:
                raise DatasetError(f"{path.name}:{n}: expected t,template,rate (seconds, a "
                                   f"template or model, requests/s); found {','.join(row)!r}")
            t, rate = float(row[0]), float(row[2])
            if rate < 0 or t < 0:
                raise DatasetError(f"{path.name}:{n}: expected t >= 0 and rate >= 0; found "
                                   f"{','.join(row)!r}")
            series = rows.setdefault(row[1].strip(), [])
            if series and t <= series[-1][0]:
                raise DatasetError(f"{path.name}:{n}: t goes back ({t:g} s after "
                                   f"{series[-1][0]:g} s for {row[1].strip()})")
            series.append((t, rate))
    return [(t0, t1, name, r) for name, series in rows.items()
            for (t0, r), (t1, _) in zip(series, series[1:], strict=False)]


def _poisson(pieces: list[Piece], seed: int) -> tuple[list[float], list[str], int]:
    rng = random.Random(seed)
    starts: list[float] = []
    models: list[str] = []
    for t0, t1, name, rate in sorted(pieces):
        t = t0
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= t1:
                break
            starts.append(t)
            models.append(name)
            if len(starts) > MAX_ARRIVALS:
                raise DatasetError(f"the profile asks for more than {MAX_ARRIVALS} requests")
    return starts, models, len(pieces)


def _number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def profile_traffic(points: list[tuple[float, float]], poisson: bool, seed: int) -> Traffic:
    """A rate shape without a file: `points` (t s, requests/s), the rate linear between them
    (k6's ramping-arrival-rate; a step is two points a moment apart). Arrivals are the
    inverse of the cumulative rate at each whole request (constant) or at the times of a unit
    Poisson process (poisson: the time-rescaling theorem), so both follow the shape exactly."""
    t = np.array([p[0] for p in points], dtype=np.float64)
    r = np.array([p[1] for p in points], dtype=np.float64)
    grid = np.union1d(t, np.arange(0.0, t[-1], 0.001))
    rate = np.interp(grid, t, r)
    total = np.concatenate([[0.0], np.cumsum((rate[1:] + rate[:-1]) / 2 * np.diff(grid))])
    expected = float(total[-1])
    if expected > MAX_ARRIVALS:
        raise DatasetError(f"the profile asks for {expected:.0f} requests; at most "
                           f"{MAX_ARRIVALS} are held")
    if poisson:
        marks = np.cumsum(np.random.default_rng(seed).exponential(1.0, int(expected * 1.2) + 20))
        marks = marks[marks < expected]
    else:
        marks = np.arange(0.5, expected, 1.0)
    offsets = np.round(np.interp(marks, total, grid), 9)
    return Traffic(file=Path("profile"), format="profile", duration_s=float(t[-1]), models=(ANY,),
                   offsets=offsets,
                   model_of=np.zeros(len(offsets), dtype=np.int32), in_file=len(points))
