"""The run second by second: timeline.png (throughput and p99 over time with phase/step
boundaries and config swaps marked, errors below, the server's queue and gauges at the bottom)
and the notes that say when errors and the server's rejections happened."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from loadkit.plan import load_label
from loadkit.run.timeline import run_timeline


def rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    return run_timeline(results["started_at"], results["phases"])


def marks(results: dict[str, Any]) -> tuple[list[tuple[float, str]], list[tuple[float, str]],
                                             list[tuple[float, str]]]:
    """(phase starts with names, step starts with their loads, config swaps with the model) in
    seconds since the run started."""
    t0 = datetime.fromisoformat(results["started_at"])

    def at(stamp: str) -> float:
        return (datetime.fromisoformat(stamp) - t0).total_seconds()

    phases, steps = [], []
    for p in results["phases"]:
        for s in p["steps"]:
            label = load_label(s["load"])
            for r in s.get("rounds") or [{"started_at": s["started_at"], "round": 1}]:
                steps.append((at(r["started_at"]), f"c={label}" if "concurrency" in s["load"]
                              else label))
        if p["steps"]:  # each round of the phase begins with its first step's round
            firsts = p["steps"][0].get("rounds") or [{"started_at": p["steps"][0][
                "started_at"]}]
            phases += [(at(r["started_at"]), p["name"]) for r in firsts]
    swaps = [(at(e["at"]), e["model"]) for e in results.get("events", [])
             if e["event"] == "config_applied"]
    return phases, steps, swaps


def error_notes(results: dict[str, Any]) -> list[str]:
    """When errors and the server's refusals happened: per code, the seconds of the run and
    the phase, with the server's words (the seed's queue guard, visible)."""
    timeline = rows(results)
    spans: dict[str, list[dict[str, Any]]] = {}
    for r in timeline:
        for code, n in r.get("errors", {}).items():
            spans.setdefault(f"client {code}", []).append({**r, "n": n})
        for model, srv in r.get("server", {}).items():
            for reason, n in srv.get("failure", {}).items():
                spans.setdefault(f"server {model} {reason}", []).append({**r, "n": n})
    if not spans:
        return []
    words = {code: kept[0]["message"] for p in results["phases"] for s in p["steps"]
             for code, kept in s.get("error_messages", {}).items() if kept}
    out = ["", "Errors over time (seconds since the run started):", ""]
    for what, hits in spans.items():
        total = sum(h["n"] for h in hits)
        first, last = hits[0], hits[-1]
        where = sorted({h["phase"] for h in hits})
        code = what.split()[-1]
        said = f": \"{words[code]}\"" if what.startswith("client") and code in words else ""
        out.append(f"- {what}: {total} from {first['at']:.0f} s to {last['at']:.0f} s "
                   f"({', '.join(where)}; peak {max(h['n'] for h in hits)}/s){said}")
    return out


def _mid(row: dict[str, Any]) -> float:
    """The middle of a row's second (the last one of a window may be shorter)."""
    return float(row["at"] + row.get("length_s", 1.0) / 2)


def _segments(timeline: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The timeline cut where the step or its round changes: one line each, so a reload or
    another phase's round between them is a gap, never a line drawn across it."""
    out: list[list[dict[str, Any]]] = []
    for r in timeline:
        key = (r["phase"], r["step"], r.get("round"))
        if not out or (out[-1][0]["phase"], out[-1][0]["step"], out[-1][0].get("round")) != key:
            out.append([])
        out[-1].append(r)
    return out


def _draw_marks(results: dict[str, Any], top: Any, mid: Any, low: Any) -> None:
    """Phase and step starts on every panel, each step's load and the config swaps on top."""
    phases, steps, swaps = marks(results)
    for ax in (top, mid, low):
        for s, _ in steps:
            ax.axvline(s, color="grey", lw=0.8, ls=":")
        for s, _ in phases:
            ax.axvline(s, color="black", lw=1.2, alpha=0.7)
    for s, name in phases:
        top.annotate(name, (s, 1.0), xycoords=("data", "axes fraction"), fontsize="small",
                     rotation=90, va="top", ha="right")
    for s, load in steps:  # each step's load, where it starts
        top.annotate(load, (s, 0.03), xycoords=("data", "axes fraction"), fontsize="x-small",
                     color="dimgrey", rotation=90, va="bottom", ha="left")
    for s, model in swaps:
        top.axvline(s, color="C2", lw=1, ls="--")
        top.annotate(f"config {model}", (s, 0.02), xycoords=("data", "axes fraction"),
                     fontsize="x-small", color="C2", rotation=90, va="bottom", ha="right")


def plot(results: dict[str, Any]) -> bytes | None:
    """timeline.png, or None when nothing was measured."""
    from loadkit.report.plots import _png, plt

    timeline = rows(results)
    if not timeline:
        return None
    fig, (top, mid, low) = plt.subplots(3, 1, figsize=(9, 7), sharex=True,
                                        layout="constrained",
                                        gridspec_kw={"height_ratios": [3, 1.2, 1.6]})
    at = [r["at"] for r in timeline]
    p99 = top.twinx()
    colour = {p["name"]: f"C{i % 10}" for i, p in enumerate(results["phases"])}
    named: set[str] = set()
    for seg in _segments(timeline):  # one line per step and round: warm-ups are not measured
        whole = [r for r in seg if r.get("length_s", 1.0) >= 0.5]  # not a sliver of a second
        dot = "." if len(whole) < 3 else None  # a step of a second or two: still seen
        phase = seg[0]["phase"]
        top.plot([_mid(r) for r in whole], [r["infer_s"] for r in whole], color=colour[phase],
                 lw=1.2, marker=dot, label=None if phase in named else phase)
        named.add(phase)
        pts = [(_mid(r), r["p99_us"] / 1000) for r in whole if r.get("p99_us") is not None]
        p99.plot([a for a, _ in pts], [v for _, v in pts], color=colour[phase], lw=0.8,
                 ls="--", marker=dot)
    top.set_ylabel("infer/s (solid, one colour per phase)")
    if len(named) > 1:
        top.legend(fontsize="x-small", loc="upper right")
    top.set_ylim(bottom=0)
    p99.set_ylabel("p99 (ms, dashed)")
    tails = [r["p99_us"] for r in timeline if r.get("p99_us")]
    if tails and max(tails) > 20 * min(tails):  # a stall among normal seconds: both readable
        p99.set_yscale("log")
        p99.set_ylabel("p99 (ms, dashed, log)")
    else:
        p99.set_ylim(bottom=0)
    _draw_marks(results, top, mid, low)
    top.set_title("Throughput and p99 per second (phase and step starts marked, config swaps "
                  "dashed)", fontsize="medium")
    codes = sorted({c for r in timeline for c in r.get("errors", {})})
    for i, code in enumerate(codes):
        mid.bar(at, [r.get("errors", {}).get(code, 0) for r in timeline],
                width=[r.get("length_s", 1.0) for r in timeline], align="edge",
                color=f"C{(i + 3) % 10}", label=code, alpha=0.8)
    rejected = [(_mid(r), sum(s.get("failure", {}).get("REJECTED", 0)
                              for s in r.get("server", {}).values())) for r in timeline]
    if any(n for _, n in rejected):
        mid.plot([a for a, _ in rejected], [n for _, n in rejected], color="black", lw=1,
                 label="server REJECTED")
    mid.set_ylabel("errors/s")
    if codes or any(n for _, n in rejected):
        mid.legend(fontsize="x-small", loc="upper left")
    models = sorted({m for r in timeline for m in r.get("server", {})})
    for i, model in enumerate(models):
        for j, seg in enumerate(_segments(timeline)):
            q = [(_mid(r), r["server"][model]["queue_us"] / 1000) for r in seg
                 if "queue_us" in r.get("server", {}).get(model, {})]
            low.plot([a for a, _ in q], [v for _, v in q], color=f"C{i}", lw=1,
                     label=f"{model} queue ms" if j == 0 else None)
    low.set_ylabel("server queue (ms)")
    gauge = "gpu_util" if any("gpu_util" in r.get("gauges", {}) for r in timeline) \
        else "cpu_util"
    if any(gauge in r.get("gauges", {}) for r in timeline):
        util = low.twinx()
        for seg in _segments(timeline):
            g = [(_mid(r), r["gauges"][gauge] * 100) for r in seg
                 if gauge in r.get("gauges", {})]
            util.plot([a for a, _ in g], [v for _, v in g], color="grey", lw=1, ls=":")
        util.set_ylabel(f"server {gauge.split('_')[0].upper()} % (dotted)")
        util.set_ylim(bottom=0)
    if models:
        low.legend(fontsize="x-small", loc="upper left")
    low.set_xlabel("seconds since the run started")
    for ax in (top, mid, low):
        ax.grid(alpha=0.3)
    return _png(fig)
