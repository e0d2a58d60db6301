"""The phase comparison: what each config bought, as plain data for Markdown, HTML and plots.

An *entry* is one phase of one run ("batching", or "A/batching" when two runs are compared).
The first entry that measured anything is the reference, as the seed's before/after tables
compare every optimization with the baseline. Only saved data is read (results.json and the
encoded HDR histograms), so `loadkit report` regenerates exactly what the run wrote.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from hdrh.histogram import HdrHistogram

from loadkit.plan import load_label
from loadkit.record import decode, latency_summary, new_histogram
from loadkit.report.units import infer_per_s, ms, template_of
from loadkit.stats import judging, step_changes
from loadkit.stats import text as change_text


@dataclass(frozen=True, kw_only=True)
class ServerFigures:
    """One model's statistics over a step: average batch, queue and compute (input + infer +
    output) per request, in µs."""

    model: str
    avg_batch: float | None
    queue_us: float
    compute_us: float

    def text(self) -> str:
        batch = "-" if self.avg_batch is None else f"{self.avg_batch:.2f}"
        return f"{self.model}: batch {batch}, queue {self.queue_us:.0f}, compute " \
               f"{self.compute_us:.0f}"


@dataclass(frozen=True, kw_only=True)
class Point:
    """One measured step of one entry."""

    load: str
    load_key: tuple[float, ...]
    status: str
    infer_s: float
    requests: int
    errors: int
    latency_us: dict[str, float]
    # Triton's own figures per model (never blended: a batching model beside one that does
    # not would read as batching that never happened)
    server: tuple[ServerFigures, ...]
    # per template: (name, model, infer/s, latency_us, errors), when the step sent several
    templates: tuple[tuple[str, str, float, dict[str, float], int], ...] = ()
    histogram: HdrHistogram | None = field(default=None, repr=False, compare=False)
    # a streaming step's first_response_us, inter_response_us, tokens/s, goodput (or {})
    streaming: dict[str, Any] = field(default_factory=dict, compare=False)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)  # the step


@dataclass(frozen=True, kw_only=True)
class Entry:
    label: str
    status: str
    reason: str
    reload_s: dict[str, float]
    points: tuple[Point, ...]

    def at(self, load: str) -> Point | None:
        return next((p for p in self.points if p.load == load), None)

    @property
    def peak(self) -> Point | None:
        return max(self.points, key=lambda p: p.infer_s, default=None)

    @property
    def heaviest(self) -> Point | None:
        return max(self.points, key=lambda p: p.load_key, default=None)


@dataclass(frozen=True, kw_only=True)
class Row:
    load: str
    entry: str
    point: Point
    # per metric, the change vs the reference at the same load, with its interval and verdict
    # (loadkit/stats/): a bare percentage is never shown. A step of several templates has
    # each template's own too; its merged percentiles are left out where they reach
    # different models (stats.mixed_models)
    changes: dict[str, dict[str, Any]] = field(default_factory=dict)
    template_changes: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Comparison:
    title: str
    reference: str
    entries: tuple[Entry, ...]
    loads: tuple[str, ...]  # every load level measured, lightest first
    common: tuple[str, ...]  # the levels every measured entry has
    rows: tuple[Row, ...]
    best_throughput: tuple[str, Point] | None
    best_p99: tuple[str, str, float] | None  # (entry, load, p99 us) at the heaviest common load
    confidence: float = 0.95
    warnings: tuple[str, ...] = ()  # runs compared that differ in target, configs or loads
    sequential: bool = False  # the reference run took `repeats: auto` rounds

    @property
    def measured(self) -> tuple[Entry, ...]:
        return tuple(e for e in self.entries if e.points)

    @property
    def not_measured(self) -> tuple[Entry, ...]:
        return tuple(e for e in self.entries if not e.points)


def highlights(cmp: Comparison) -> list[tuple[str, str, str]]:
    """The verdict lines as (before, phase name, after), for each renderer to emphasize: the
    highest throughput and the lowest p99, each with its change against the reference, and
    said to be within the noise when the interval spans 0."""
    out = []
    if cmp.best_throughput:
        label, p = cmp.best_throughput
        out.append(("Highest throughput: ", label, f", {p.infer_s:.1f} infer/s at load "
                    f"{p.load}{_against(cmp, label, p.load, 'throughput')}."))
    if cmp.best_p99:
        label, load, p99 = cmp.best_p99
        out.append((f"Lowest p99 at the heaviest common load ({load}): ", label,
                    f", {ms(p99)} ms{_against(cmp, label, load, 'p99')}."))
    return out


def _against(cmp: Comparison, label: str, load: str, metric: str) -> str:
    if label == cmp.reference:
        return " (the reference)"
    row = next((r for r in cmp.rows if r.entry == label and r.load == load), None)
    c = row.changes.get(metric) if row else None
    if c is None:
        return ""
    if c["verdict"] == "same":
        return f"; the same as {cmp.reference}: {change_text(c)}"
    if c["verdict"] in ("inconclusive", "unknown"):
        return f"; not told apart from {cmp.reference}: {change_text(c)}"
    return f"; {c['verdict']} than {cmp.reference}: {change_text(c)}"


def _load_key(load: dict[str, Any]) -> tuple[float, ...]:
    return tuple(float(v) for v in load.values() if isinstance(v, (int, float)))


def _server(step: dict[str, Any]) -> tuple[ServerFigures, ...]:
    """Each model the step touched, from Triton's statistics."""
    out = []
    for model, s in step.get("server", {}).items():
        if s.get("success", 0) <= 0:
            continue
        execs = s.get("exec_count", 0)
        out.append(ServerFigures(
            model=model, avg_batch=round(s["inference_count"] / execs, 3) if execs else None,
            queue_us=round(s["queue_us"], 1),
            compute_us=round(s["compute_input_us"] + s["compute_infer_us"]
                             + s["compute_output_us"], 1)))
    return tuple(out)


def _templates(step: dict[str, Any], scenario: dict[str, Any]
               ) -> tuple[tuple[str, str, float, dict[str, float], int], ...]:
    """Each template's own numbers, when the step sent more than one."""
    client = step.get("client", {})
    if len(client) < 2:
        return ()
    seconds = step.get("duration_s") or 0
    out = []
    for name, c in client.items():
        t = template_of(scenario, name)
        rate = infer_per_s(c, t, seconds)
        out.append((name, str(t.get("model", "")), round(rate, 1), c["latency_us"],
                    int(c.get("errors", 0) or 0)))
    return tuple(out)


def merge_encoded(histograms: dict[str, str]) -> HdrHistogram:
    total = new_histogram()
    for text in histograms.values():
        total.add(decode(text))
    return total


def _entry(label: str, phase: dict[str, Any], hists: dict[str, dict[str, str]],
           run: str = "", scenario: dict[str, Any] | None = None) -> Entry:
    points = []
    for s in phase["steps"]:
        encoded = hists.get(str(s["index"]), {})
        h = merge_encoded(encoded)
        # The percentiles are recomputed from the saved HDR data, so a report can only ever
        # show what the histograms hold.
        lat = latency_summary(h) if h.get_total_count() else s["latency_us"]
        points.append(
            Point(
                load=load_label(s["load"]),
                load_key=_load_key(s["load"]),
                status=s["status"],
                infer_s=float(s["throughput"]),
                requests=int(s["requests"]),
                errors=int(sum(s.get("errors", {}).values())),
                latency_us=lat,
                server=_server(s),
                templates=_templates(s, scenario or {}),
                histogram=h if h.get_total_count() else None,
                streaming=s.get("streaming", {}),
                raw={**s, "run": run},
            )
        )
    return Entry(label=label, status=phase["status"], reason=phase["reason"],
                 reload_s=phase.get("reload_s", {}), points=tuple(points))


def pct_change(new: float, old: float) -> float | None:
    """The change from old to new in percent (one decimal), None where old is 0."""
    return round((new - old) / old * 100.0, 1) if old else None


def build(
    runs: list[tuple[str, dict[str, Any], dict[str, Any]]], title: str = ""
) -> Comparison:
    """runs: (label, results.json, histograms.json); a single run is labelled ''."""
    entries: list[Entry] = []
    for label, results, hists in runs:
        for phase in results["phases"]:
            name = f"{label}/{phase['name']}" if label else phase["name"]
            entries.append(_entry(name, phase, hists.get(phase["name"], {}), label,
                                  results.get("scenario")))
    measured = [e for e in entries if e.points]
    keys: dict[str, tuple[float, ...]] = {}
    for e in measured:
        for p in e.points:
            keys.setdefault(p.load, p.load_key)
    loads = tuple(sorted(keys, key=lambda k: keys[k]))
    common = tuple(ld for ld in loads if all(e.at(ld) for e in measured))
    ref = measured[0] if measured else None
    stated = float(runs[0][1].get("confidence", 0.95)) if runs else 0.95
    confidence, noise, most = judging(runs[0][1]) if runs else (0.95, 0.05, 50)
    rows = []
    for ld in loads:
        base = ref.at(ld) if ref else None
        for e in measured:
            p = e.at(ld)
            if p is None:
                continue
            found = step_changes(base.raw, p.raw, confidence, noise, most) \
                if base and e is not ref else []
            per: dict[str, dict[str, dict[str, Any]]] = {}
            for c in found:
                if "template" in c:
                    per.setdefault(c["template"], {})[c["metric"]] = c
            rows.append(Row(load=ld, entry=e.label, point=p,
                            changes={c["metric"]: c for c in found if "template" not in c},
                            template_changes=per))
    best_t = None
    # the highest throughput at a load every measured phase has: a higher load's number is
    # not a better config's
    peaks = [(e.label, p) for e in measured for ld in common if (p := e.at(ld)) is not None]
    if peaks:
        label, point = max(peaks, key=lambda lp: lp[1].infer_s)
        best_t = (label, point)
    best_p = None
    if common:
        heavy = common[-1]
        tails = [(e.label, p) for e in measured
                 if (p := e.at(heavy)) is not None and p.latency_us.get("p99") is not None]
        if tails:
            label, p = min(tails, key=lambda lp: lp[1].latency_us["p99"])
            best_p = (label, heavy, p.latency_us["p99"])
    names = [r[1].get("scenario_name", "") for r in runs]
    return Comparison(
        title=title or " vs ".join(dict.fromkeys(names)),
        reference=ref.label if ref else "",
        entries=tuple(entries),
        loads=loads,
        common=common,
        rows=tuple(rows),
        best_throughput=best_t,
        best_p99=best_p,
        confidence=stated,
        warnings=tuple(differences(runs)),
        sequential=bool(runs and runs[0][1].get("sequential")),
    )


def differences(runs: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> list[str]:
    """What differs between compared runs besides what was meant to: the target, a phase's
    config, the loads measured. A difference there is not the config's doing."""
    if len(runs) < 2:
        return []
    (ref_label, ref, _), out = runs[0], []
    for label, other, _ in runs[1:]:
        if other.get("target") != ref.get("target") or other.get("embedded") != ref.get(
                "embedded"):
            out.append(f"{label} ran against {_target(other)}, {ref_label} against "
                       f"{_target(ref)}: a difference may be the server's, not the config's")
        mine = {p["name"]: p for p in ref["phases"]}
        shared = [p["name"] for p in other["phases"] if p["name"] in mine and
                  {json.dumps(s["load"], sort_keys=True) for s in p["steps"]} &
                  {json.dumps(s["load"], sort_keys=True) for s in mine[p["name"]]["steps"]}]
        if not shared:
            out.append(f"{label} and {ref_label} share no phase measured at the same load: each "
                       f"phase is compared with {ref_label}'s first, whatever its config")
        for p in other["phases"]:
            q = mine.get(p["name"])
            if q is None:
                continue
            if p.get("config") != q.get("config"):
                fields = config_fields(q.get("config") or {}, p.get("config") or {})
                out.append(f"phase {p['name']}: the models' configs differ between {ref_label} "
                           f"and {label}: " + "; ".join(fields[:6])
                           + (f"; and {len(fields) - 6} more" if len(fields) > 6 else ""))
            if [s["load"] for s in p["steps"]] != [s["load"] for s in q["steps"]]:
                out.append(f"phase {p['name']}: the loads measured differ between {ref_label} "
                           f"and {label}")
    return out


def config_fields(a: Any, b: Any, path: str = "") -> list[str]:
    """The fields two configs differ in, as 'dense.dynamic_batching.max_queue_delay_
    microseconds: 100 -> 500' (absent: '-')."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted({*a, *b}, key=str):
            out += config_fields(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))
        return out
    if a == b:
        return []
    def shown(v: Any) -> str:
        return "-" if v is None else json.dumps(v) if not isinstance(v, str) else v
    return [f"{path}: {shown(a)} -> {shown(b)}"]


def _target(results: dict[str, Any]) -> str:
    return "the embedded Triton" if results.get("embedded") else str(results.get("target"))


def change_list(cmp: Comparison) -> list[dict[str, Any]]:
    """The comparisons as results.json has them (`loadkit compare --out`: comparison.json)."""
    out = []
    for r in cmp.rows:
        head = {"phase": r.entry, "reference": cmp.reference, "load": r.point.raw.get("load")}
        out += [{**head, **c, "confidence": cmp.confidence} for c in r.changes.values()]
        out += [{**head, **c, "confidence": cmp.confidence}
                for per in r.template_changes.values() for c in per.values()]
    return out
