"""`loadkit capacity` in the report: per config, the highest rate (or a replay's speed) within
the SLO, the bracket that is its error bar, and the replicas a peak needs."""

from __future__ import annotations

from typing import Any

from loadkit.report.units import ms
from loadkit.slo import fmt_value


def _rate(v: float | None) -> str:
    return "-" if v is None else f"{v:g}/s"


def _speed(v: float | None) -> str:
    return "-" if v is None else f"x{v:g}"


def capacity_table(cap: dict[str, Any]) -> str:
    """`loadkit capacity`: per config, the highest rate within the SLO and replicas for a peak."""
    peak, speed = cap.get("peak"), cap.get("peak_speed")
    replayed = any(p.get("search") == "speed" for p in cap["phases"])
    lines = [
        f"## Capacity at SLO {cap['slo']}",
        "",
        "Each config's highest arrival rate (requests/s) whose measured step held every limit ("
        + ", ".join(f"{t['metric']} <= {fmt_value(t['metric'], t['limit'])}"
                    for t in cap["limits"])
        + "), found by bracketing and bisection and confirmed by a repeat. The interval is the "
        "answer's error bar across runs: from the highest rate whose probe held the SLO with "
        "confidence (every latency interval below its limit) to the lowest that broke it with "
        "confidence; between them probes were inconclusive, and another run may answer "
        "anywhere there (? : no probe reached that end with confidence). The bracket is only "
        "the bisection's last step. The result says whether the confirmation held each latency "
        "limit with confidence or was inconclusive (docs/capacity.md)."
        + (" A replay phase searched the speed of its file (x2: the recorded traffic twice as "
           "fast); its max rate is the file's mean rate at the highest speed that held."
           if replayed else ""),
        "",
        "| config | max rate | interval | infer/s | p50 | p99 | p99.9 | bracket | probes | "
        "replicas"
        + (f" for {peak:g}/s" if peak else f" for {speed:g}x" if speed else "") + " | result |",
        "|---|---:|---|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    for p in cap["phases"]:
        lat = p["latency_us"]
        lo, hi = p["bracket"]
        result = p["status"] + (f" ({p['reason']})" if p["reason"] else "")
        for c in p.get("slo_confidence", []):
            ci = c["ci_us"]
            result += (f"; {c['metric']} {c['verdict']} at {c['confidence']:.0%}"
                       + (f" ({ms(ci[0])}-{ms(ci[1])} ms against {ms(c['limit_us'])})"
                          if ci else ""))
        if p.get("generator_limited"):
            result += "; WARNING: the generator fell behind in a failing probe"
        if "server" in p.get("limited_by", []):
            result += "; failing probes filled every in-flight slot (the server's queue)"
        at = _speed if p.get("search") == "speed" else _rate
        top = _rate(p["max_rate"]) + (f" (x{p['max_speed']:g})" if p.get("max_speed") else "")
        low, high = p.get("interval_speed") or p.get("interval") or [None, None]
        span = f"{at(low) if low else '?'} .. {at(high) if high else '?'}" \
            if p.get("interval") else "-"
        lines.append(
            f"| {p['phase']} | {top} | {span} | "
            f"{p['max_infer_s'] if p['max_infer_s'] is not None else '-'} | "
            f"{ms(lat['p50']) if lat else '-'} | {ms(lat['p99']) if lat else '-'} | "
            f"{ms(lat['p999']) if lat else '-'} | {at(lo)} .. {at(hi)} | "
            f"{len(p['points'])} | {p.get('replicas', '-')} | {result} |"
        )
    lines.append("")
    if cap.get("cheapest"):
        best = next(p for p in cap["phases"] if p["phase"] == cap["cheapest"])
        if (peak or speed) and "replicas" in best:
            what = f"{peak:g}/s" if peak else f"{speed:g}x the replayed traffic"
            lines.append(
                f"Cheapest config for a peak of {what} with {cap['headroom']:.0%} headroom: "
                f"**{best['phase']}**, {best['replicas']} replica(s) of {best['max_rate']:g}/s"
                + (f" (x{best['max_speed']:g})." if best.get("max_speed") else ".")
            )
        else:
            lines.append(f"Most capacity per replica: **{best['phase']}** "
                         f"({best['max_rate']:g}/s).")
        lines.append("")
    return "\n".join(lines)
