"""The three plots of a comparison, as PNG bytes (matplotlib, Agg backend: no display needed).

- throughput vs load, one line per phase: where each config saturates;
- p99 vs throughput, one line per phase: the knee, i.e. what each extra infer/s costs in tail;
- the HDR percentile spectrum of each phase's heaviest step, on HdrHistogram's usual
  1/(1-q) axis, so p99, p99.9 and the max are as readable as the median.
"""

from __future__ import annotations

import io
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter  # noqa: E402

from loadkit.report.compare import Comparison  # noqa: E402

SPECTRUM_QUANTILES = (0.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99, 99.999)
# PNG metadata without the matplotlib version or a date, so re-rendering gives the same bytes.
_PNG_META = {"Software": None}


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata=_PNG_META)
    plt.close(fig)
    return buf.getvalue()


def _lines(cmp: Comparison, x: Any, y: Any, xlabel: str, ylabel: str, title: str,
           labelled: bool = False) -> bytes:
    """One line per measured phase, points in load order (a point with nothing measured, y
    None, is left out); axes from 0 (a ratio is read off them); `labelled`: each point says
    its load (where x is not the load)."""
    fig, ax = plt.subplots(figsize=(7, 4.2), layout="constrained")
    for e in cmp.measured:
        pts = sorted(e.points, key=lambda p: p.load_key)
        keep = [(i, p) for i, p in enumerate(pts) if y(p) is not None]
        pts = [p for _, p in keep]
        xs, ys = [x(i, p) for i, p in keep], [y(p) for p in pts]
        line = ax.plot(xs, ys, marker="o", label=e.label)[0]
        if labelled:
            for px, py, p in zip(xs, ys, pts, strict=True):
                ax.annotate(p.load, (px, py), textcoords="offset points", xytext=(4, 4),
                            fontsize="x-small", color=line.get_color())
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _png(fig)


def throughput_vs_load(cmp: Comparison) -> bytes:
    return _lines(
        cmp,
        lambda i, p: p.load_key[0] if p.load_key else i,
        lambda p: p.infer_s,
        "load (concurrency)",
        "throughput (infer/s)",
        "Throughput vs load",
    )


def p99_vs_throughput(cmp: Comparison) -> bytes:
    return _lines(
        cmp,
        lambda _, p: p.infer_s,
        lambda p: None if p.latency_us.get("p99") is None else p.latency_us["p99"] / 1000,
        "throughput (infer/s)",
        "p99 latency (ms)",
        "p99 latency vs throughput (the knee; each point's load beside it)",
        labelled=True,
    )


def latency_spectrum(cmp: Comparison) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 4.2), layout="constrained")
    for e in cmp.measured:
        p = e.heaviest
        if p is None or p.histogram is None:
            continue
        xs = [1.0 / (1.0 - q / 100.0) for q in SPECTRUM_QUANTILES]
        ys = [p.histogram.get_value_at_percentile(q) / 1000 for q in SPECTRUM_QUANTILES]
        ax.plot(xs, ys, marker=".", label=f"{e.label} @ {p.load}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    named = {0.0: "p0", 90.0: "p90", 99.0: "p99", 99.9: "p99.9", 99.99: "p99.99", 99.999: "p99.999"}
    labels = {1.0 / (1.0 - q / 100.0): name for q, name in named.items()}
    ax.xaxis.set_major_locator(FixedLocator(list(labels)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: labels.get(v, "")))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.set_xlabel("percentile")
    ax.set_ylabel("latency (ms)")
    ax.set_title("Latency by percentile, heaviest step of each phase (HDR)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
    return _png(fig)


def streaming_vs_load(cmp: Comparison) -> bytes:
    """Streaming phases: p99 time to first response and output tokens/s against load."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2), layout="constrained")
    for e in cmp.measured:
        pts = sorted((p for p in e.points if p.streaming
                      and p.streaming["first_response_us"].get("p99") is not None),
                     key=lambda p: p.load_key)
        xs = [p.load_key[0] if p.load_key else i for i, p in enumerate(pts)]
        left.plot(xs, [p.streaming["first_response_us"]["p99"] / 1000 for p in pts],
                  marker="o", label=e.label)
        right.plot(xs, [p.streaming["output_tokens_per_s"] for p in pts], marker="o",
                   label=e.label)
    for ax, ylabel, title in ((left, "first response p99 (ms)", "Time to first response"),
                              (right, "output tokens/s", "Tokens/s (one response = one)")):
        ax.set_xlabel("load")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return _png(fig)


PLOTS = {
    "throughput_vs_concurrency.png": throughput_vs_load,
    "p99_vs_throughput.png": p99_vs_throughput,
    "latency_spectrum.png": latency_spectrum,
}


def missing(cmp: Comparison) -> dict[str, str]:
    """{plot: why it is not drawn} for the plots that would have no data (a plot with nothing
    on it reads as if it measured nothing)."""
    out = {}
    if cmp.measured and not any(e.heaviest is not None and e.heaviest.histogram is not None
                                for e in cmp.measured):
        out["latency_spectrum.png"] = ("no HDR histograms to draw it from (histograms.json "
                                       "missing or empty in the report folder)")
    if cmp.measured and not any(p.latency_us.get("p99") is not None
                                for e in cmp.measured for p in e.points):
        out["p99_vs_throughput.png"] = "no step measured a latency"
    return out


def render_plots(cmp: Comparison) -> dict[str, bytes]:
    """{file name: PNG bytes}; empty when nothing was measured; a plot without data is left
    out (`missing` says why)."""
    if not cmp.measured:
        return {}
    gone = missing(cmp)
    out = {name: fn(cmp) for name, fn in PLOTS.items() if name not in gone}
    if any(p.streaming for e in cmp.measured for p in e.points):
        out["streaming_vs_load.png"] = streaming_vs_load(cmp)
    return out


def capacity_search(cap: dict[str, Any]) -> bytes:
    """Every probe of the capacity search: rate vs p99, held (o) or broke (x), per config, with
    the SLO's p99 limit and each config's answer."""
    fig, ax = plt.subplots(figsize=(7, 4.2), layout="constrained")
    for i, phase in enumerate(cap["phases"]):
        color = f"C{i}"
        pts = phase["points"]
        per = phase.get("rate_at_speed_1", 1.0)  # a replay's probes are speeds
        for passed, marker in ((True, "o"), (False, "x")):
            sel = [q for q in pts if q["passed"] is passed
                   and (q["latency_us"] or {}).get("p99") is not None]
            ax.scatter([q["rate"] * per for q in sel],
                       [q["latency_us"]["p99"] / 1000 for q in sel],
                       marker=marker, color=color,
                       label=f"{phase['phase']} {'held' if passed else 'broke'}")
        if phase["max_rate"]:
            ax.axvline(phase["max_rate"], color=color, linestyle="--", alpha=0.6)
    for t in cap["limits"]:
        if t["metric"] == "p99":
            ax.axhline(t["limit"] / 1000, color="grey", linestyle=":", label="p99 limit")
    ax.set_yscale("log")
    ax.set_xlabel("arrival rate (requests/s)")
    ax.set_ylabel("p99 (ms, from the scheduled send)")
    ax.set_title(f"Capacity search at SLO {cap['slo']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _png(fig)


def tune_pareto(tune: dict[str, Any]) -> bytes:
    """One point per measured trial at its operating point (throughput vs p99): the front
    drawn, the baseline and the winner named, trials that broke a constraint as x."""
    fig, ax = plt.subplots(figsize=(7, 4.2), layout="constrained")
    pts = {t["trial"]: t for t in tune["trials"] if t.get("point")
           and t["point"].get("p99_us") is not None}
    for met, marker in ((True, "o"), (False, "x")):
        sel = [t["point"] for t in pts.values() if t["point"]["constraints_met"] is met]
        ax.scatter([p["throughput"] for p in sel], [p["p99_us"] / 1000 for p in sel],
                   marker=marker, color="C0" if met else "C3",
                   label="within constraints" if met else "broke a constraint")
    front = sorted((pts[n]["point"] for n in tune.get("pareto", []) if n in pts),
                   key=lambda p: p["throughput"])
    if front:
        ax.plot([p["throughput"] for p in front], [p["p99_us"] / 1000 for p in front],
                color="C2", linestyle="--", label="Pareto front")
    for n, t in pts.items():
        if t.get("baseline") or n == tune.get("best"):
            p = t["point"]
            ax.annotate("baseline" if t.get("baseline") else f"best (trial {n})",
                        (p["throughput"], p["p99_us"] / 1000), textcoords="offset points",
                        xytext=(5, 5), fontsize="small")
    for c in tune.get("constraints", []):
        if c["metric"] == "p99":
            ax.axhline(c["limit"] / 1000, color="grey", linestyle=":", label="p99 limit")
    ax.set_xlabel("throughput (infer/s)")
    ax.set_ylabel("p99 (ms)")
    ax.set_title(f"Tune: {len(pts)} configs measured ({tune['strategy']})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _png(fig)
