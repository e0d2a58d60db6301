"""A replay step in the report: what the file offered beside what was served, per template,
as a table (summary.md) and second by second (replay.png), so a planner sees where the server
fell behind the recorded shape, not only the step's mean."""

from __future__ import annotations

from typing import Any

from loadkit.plan import load_label
from loadkit.report.plots import _png, plt

BEHIND = 0.9  # a second is behind when its backlog leaves more than 10% unserved


def seconds_behind(offered: list[int], served: list[int]) -> int:
    """The seconds by whose end less than 90% of what had been offered before them was served
    (cumulative counts, with a second's slack for the requests in flight across a second's
    edge: a second that served 7 of its 8 and the next 8 of its 7 is not behind)."""
    behind, sent, done = 0, 0, 0
    for i, o in enumerate(offered):
        done += served[i] if i < len(served) else 0
        if sent and done < BEHIND * sent:
            behind += 1
        sent += o
    return behind


def _replays(results: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{p['name']} {load_label(s['load'])}", s["open_loop"]["replay"]["per_second"])
            for p in results.get("phases", []) for s in p.get("steps", [])
            if s.get("open_loop", {}).get("replay", {}).get("per_second")]


def markdown(results: dict[str, Any]) -> list[str]:
    """One row per replay step and template: requests offered and served over the measured
    window, the busiest second of each, and the seconds that served under 90% of their offer."""
    replays = _replays(results)
    if not replays:
        return []
    out = ["Replay: the file's requests per template (offered, at the step's speed) beside the "
           f"successes the server returned; a second is behind when by its end under "
           f"{BEHIND:.0%} of what was offered before it had been served (replay.png draws "
           "them second by second).", "",
           "| step | template | offered | served | busiest second offered | busiest served | "
           "seconds behind |", "|---|---|---:|---:|---:|---:|---:|"]
    for label, per in replays:
        for name in sorted(set(per["offered"]) | set(per["served"])):
            offered, served = per["offered"].get(name, []), per["served"].get(name, [])
            behind = seconds_behind(offered, served)
            out.append(f"| {label} | {name} | {sum(offered)} | {sum(served)} | "
                       f"{max(offered, default=0)} | {max(served, default=0)} | "
                       f"{behind} of {len(offered)} |")
    return [*out, ""]


def plot(results: dict[str, Any]) -> bytes | None:
    """Offered (dashed) and served (solid) per second, per template, one panel per replay
    step (the first six)."""
    replays = _replays(results)[:6]
    if not replays:
        return None
    fig, axes = plt.subplots(len(replays), 1, figsize=(7, 2.4 * len(replays)),
                             layout="constrained", squeeze=False)
    for ax, (label, per) in zip(axes[:, 0], replays, strict=True):
        for i, name in enumerate(sorted(set(per["offered"]) | set(per["served"]))):
            color = f"C{i}"
            if name in per["offered"]:
                ax.plot(range(len(per["offered"][name])), per["offered"][name], color=color,
                        linestyle="--", label=f"{name} offered")
            if name in per["served"]:
                ax.plot(range(len(per["served"][name])), per["served"][name], color=color,
                        label=f"{name} served")
        ax.set_title(label, fontsize="medium")
        ax.set_ylabel("requests/s")
        ax.set_ylim(bottom=0)
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    axes[-1, 0].set_xlabel("second of the measured window")
    return _png(fig)
