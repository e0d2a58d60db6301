"""SLO gates: a scenario's thresholds checked against measured steps, for CI.

Percentiles come from the HDR histograms (µs), never from Locust's whole-millisecond stats. A
phase's threshold holds when it holds at *every* measured step of the phase (each load level);
the outcome names the worst step. Pure functions over results.json data, so `loadkit report`
and a CI job can re-check a saved run.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any
from xml.etree import ElementTree as ET

from loadkit.errors import CapacityInputError
from loadkit.plan import Plan, load_label
from loadkit.scenario import AT_LEAST_METRICS, DURATION_METRICS, LATENCY_METRICS, Threshold


@dataclass(frozen=True, kw_only=True)
class Outcome:
    phase: str
    threshold: str  # e.g. "p99" or "p99[dense_b1]"
    limit: float
    value: float | None  # the worst step's value; None when there was nothing to measure
    status: str  # pass | fail | no data | skipped
    step: str = ""  # the worst step's load label
    message: str = ""
    where: str = ""  # file:line of the threshold in the scenario

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def fmt_value(metric: str, v: float | None) -> str:
    if v is None:
        return "-"
    if metric in DURATION_METRICS:
        return f"{v / 1000:.3f} ms"
    if metric in ("error_rate", "max_dropped"):
        return f"{v * 100:.2f}%"
    if metric == "goodput_min":
        return f"{v:.1f} good req/s"
    return f"{v:.1f} infer/s"


def step_value(t: Threshold, step: dict[str, Any]) -> float | None:
    """The step's value of the threshold's metric (None: nothing was measured)."""
    if t.metric in LATENCY_METRICS:
        if t.template is None:
            return step["latency_us"][t.metric] if step["requests"] else None
        c = step["client"].get(t.template)
        return c["latency_us"][t.metric] if c and c["requests"] else None
    if t.metric == "error_rate":
        if t.template is None:
            errors, ok = sum(step["errors"].values()), step["requests"]
        else:
            c = step["client"].get(t.template, {"errors": 0, "requests": 0})
            errors, ok = c["errors"], c["requests"]
        return errors / (errors + ok) if errors + ok else None
    if t.metric == "min_throughput":
        sent = step["requests"] + sum(step["errors"].values())
        return float(step["throughput"]) if sent else None
    if t.metric == "max_dropped":
        ol = step.get("open_loop", {})
        return float(ol["dropped_ratio"]) if ol.get("scheduled") else None
    if t.metric in DURATION_METRICS:  # first_response_p99, inter_response_p50, ...
        kind, pct = t.metric.rsplit("_", 1)
        where = step.get("streaming", {}) if t.template is None else step["client"].get(
            t.template, {})
        summary = where.get(f"{kind}_us")
        return summary[pct] if summary and where.get("responses") else None
    if t.metric == "goodput_min":
        good = step.get("streaming", {}).get("goodput")
        return float(good["per_s"]) if good is not None and step["requests"] else None
    raise ValueError(f"unknown metric {t.metric}")


def applies(t: Threshold, step: dict[str, Any]) -> bool:
    """max_dropped speaks of an open loop's schedule; a closed-loop step has none."""
    return t.metric != "max_dropped" or bool(step.get("open_loop"))


def holds(t: Threshold, value: float | None) -> bool:
    if value is None:
        return False
    return value >= t.limit if t.metric in AT_LEAST_METRICS else value <= t.limit


def check_phase(thresholds: tuple[Threshold, ...], phase: dict[str, Any]) -> list[Outcome]:
    out = []
    for t in thresholds:
        limit_text = fmt_value(t.metric, t.limit)
        if phase["status"] == "skipped" or (phase["status"] != "failed" and not phase["steps"]):
            why = phase["reason"] or "no measured steps"
            out.append(Outcome(phase=phase["name"], threshold=t.name, limit=t.limit, value=None,
                               status="skipped", step="", message=why, where=t.where))
            continue
        if phase["status"] == "failed":
            out.append(
                Outcome(
                    phase=phase["name"], threshold=t.name, limit=t.limit, value=None,
                    status="fail", step="", message=f"phase failed: {phase['reason']}",
                    where=t.where,
                )
            )
            continue
        steps = [s for s in phase["steps"] if applies(t, s)]
        if not steps:
            out.append(Outcome(phase=phase["name"], threshold=t.name, limit=t.limit, value=None,
                               status="skipped", step="",
                               message=f"{t.metric} applies to open-loop steps only",
                               where=t.where))
            continue
        worst: tuple[float | None, str] = (None, "")
        worst_rank = (False, float("-inf"))
        failed, empty = False, ""
        for step in steps:
            v = step_value(t, step)
            if v is None:  # nothing measured: never a pass
                empty = empty or load_label(step["load"])
                continue
            ok = holds(t, v)
            badness = -v if t.metric in AT_LEAST_METRICS else v
            rank = (not ok, badness)
            if rank > worst_rank:
                worst, worst_rank = (v, load_label(step["load"])), rank
            failed = failed or not ok
        value, label = worst
        relation = ">=" if t.metric in AT_LEAST_METRICS else "<="
        if failed or not empty:
            message = (
                f"{fmt_value(t.metric, value)} at {label}; expected {relation} {limit_text}"
            )
            status = "fail" if failed else "pass"
        else:
            label, status = empty, "no data"
            message = f"nothing measured at {empty} (no request sent or none succeeded)"
        out.append(Outcome(phase=phase["name"], threshold=t.name, limit=t.limit, value=value,
                           status=status, step=label, message=message,
                           where=t.where))
    return out


def evaluate(plan: Plan, results: dict[str, Any]) -> list[Outcome]:
    by_name = {p.name: p for p in plan.phases}
    out: list[Outcome] = []
    for phase in results["phases"]:
        pp = by_name.get(phase["name"])
        if pp is not None and pp.thresholds.items:
            out += check_phase(pp.thresholds.items, phase)
    return out


FAILING = ("fail", "no data")  # a gate checked over nothing does not pass


def failed(outcomes: list[Outcome]) -> list[Outcome]:
    return [o for o in outcomes if o.status in FAILING]


def table(outcomes: list[dict[str, Any]]) -> str:
    """The pass/fail table `loadkit run` prints and summary.md ends with."""
    if not outcomes:
        return ""
    n_fail = sum(o["status"] in FAILING for o in outcomes)
    lines = [
        f"## Thresholds: {'FAILED' if n_fail else 'passed'} "
        f"({len(outcomes) - n_fail} of {len(outcomes)} hold)",
        "",
        "| phase | threshold | limit | worst | at | result |",
        "|---|---|---:|---:|---|---|",
    ]
    for o in outcomes:
        metric = o["threshold"].split("[")[0]
        result = o["status"].upper() if o["status"] != "pass" else "pass"
        if o["status"] != "pass" and o["message"]:
            result += f": {o['message']}"
        lines.append(
            f"| {o['phase']} | {o['threshold']} | {fmt_value(metric, o['limit'])} | "
            f"{fmt_value(metric, o['value'])} | {o['step'] or '-'} | {result} |"
        )
    return "\n".join(lines) + "\n"


def junit_xml(suite: str, outcomes: list[dict[str, Any]]) -> str:
    """One testcase per threshold per phase, as CI systems read JUnit XML."""
    root = ET.Element("testsuites")
    ts = ET.SubElement(
        root, "testsuite", name=suite, tests=str(len(outcomes)),
        failures=str(sum(o["status"] in FAILING for o in outcomes)),
        skipped=str(sum(o["status"] == "skipped" for o in outcomes)),
    )
    for o in outcomes:
        case = ET.SubElement(
            ts, "testcase", classname=f"{suite}.{o['phase']}", name=o["threshold"],
            file=o["where"].rsplit(":", 1)[0] if o["where"] else "",
        )
        if o["status"] in FAILING:
            ET.SubElement(case, "failure", message=o["message"]).text = (
                f"{o['where']}: {o['threshold']} {o['message']}"
            )
        elif o["status"] == "skipped":
            ET.SubElement(case, "skipped", message=o["message"])
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, "unicode") + "\n"


DEFAULT_ERROR_RATE = 0.01
DEFAULT_DROPPED = 0.01
_TERM = re.compile(
    r"^\s*(?P<metric>(?:first_response_|inter_response_)?(?:p50|p90|p95|p99|p999|p99\.9)|"
    r"error_rate|max_dropped|dropped|goodput_min)\s*"
    r"(?P<op><=|<|>=|>)\s*(?P<value>[0-9]*\.?[0-9]+)\s*(?P<unit>us|µs|ms|s|%|/s)?\s*$"
)


def parse_slo(text: str) -> tuple[Threshold, ...]:
    """`p99<50ms`, `p99<50ms,p50<10ms,error_rate<0.5%`; error rate and dropped ratio default to
    1% when not given, since a rate that only holds by failing or dropping requests is no rate."""
    items: list[Threshold] = []
    for term in filter(None, (t.strip() for t in text.split(","))):
        m = _TERM.match(term)
        if m is None:
            raise CapacityInputError(
                f"--slo: cannot read {term!r}; expected e.g. 'p99<50ms', 'p50<=8ms', "
                "'error_rate<1%', 'first_response_p99<200ms', 'goodput_min>5/s' (metrics: p50 "
                "p90 p95 p99 p999, the same after first_response_ or inter_response_, "
                "error_rate max_dropped goodput_min)"
            )
        metric = m["metric"].replace("p99.9", "p999")
        metric = {"dropped": "max_dropped"}.get(metric, metric)
        value, unit = float(m["value"]), m["unit"]
        if (metric == "goodput_min") != (m["op"] in (">", ">=")):
            raise CapacityInputError(f"--slo: {term!r}: goodput_min takes '>' (a floor), every "
                                     "other metric '<' (a ceiling)")
        if metric == "goodput_min":
            if unit not in (None, "/s") or value <= 0:
                raise CapacityInputError(f"--slo: {term!r}: expected good requests/s above 0")
            limit = value
        elif metric in DURATION_METRICS:
            if unit not in ("us", "µs", "ms", "s"):
                raise CapacityInputError(f"--slo: {term!r} needs a unit: us, ms or s")
            limit = value * {"us": 1, "µs": 1, "ms": 1e3, "s": 1e6}[unit]
        else:
            limit = value / 100 if unit == "%" else value
            if unit not in (None, "%") or not 0 <= limit <= 1:
                raise CapacityInputError(f"--slo: {term!r}: expected a fraction or a percentage")
        if limit <= 0 and metric in DURATION_METRICS:
            raise CapacityInputError(f"--slo: {term!r}: the limit must be above 0")
        items.append(Threshold(metric=metric, limit=limit, template=None, where="--slo"))
    if not any(t.metric in DURATION_METRICS for t in items):
        raise CapacityInputError(f"--slo: {text!r} names no latency percentile (e.g. p99<50ms)")
    metrics = {t.metric for t in items}
    if "error_rate" not in metrics:
        items.append(Threshold(metric="error_rate", limit=DEFAULT_ERROR_RATE, template=None,
                               where="default"))
    if "max_dropped" not in metrics:
        items.append(Threshold(metric="max_dropped", limit=DEFAULT_DROPPED, template=None,
                               where="default"))
    return tuple(items)


def judge_step(slo: tuple[Threshold, ...], step: dict[str, Any]) -> tuple[bool, list[str]]:
    """Whether a measured step holds every term of an SLO (capacity's --slo, tune's
    constraints), and which terms broke."""
    broken = []
    for t in slo:
        v = step_value(t, step)
        if not holds(t, v):
            shown = "nothing measured" if v is None else fmt_value(t.metric, v)
            broken.append(f"{t.name} {shown}")
    if step.get("status") != "ok":
        broken.append(f"step {step.get('status')}")
    return not broken, broken


def slo_confidence(slo: tuple[Threshold, ...], intervals: dict[str, Any],
                   confidence: float) -> list[dict[str, Any]]:
    """Whether a step held each latency term of an SLO with confidence: the upper end of its
    interval below the limit (`held`), the value below but the interval reaching it
    (`inconclusive`: another run may break it), or the value above (`broken`). Terms without an
    interval (error rate, a step too short) say so."""
    out = []
    for t in slo:
        i = intervals.get(t.metric) or {}
        value, ci = i.get("value"), i.get("ci")
        if t.metric not in LATENCY_METRICS or value is None:
            continue
        if value > t.limit:
            verdict = "broken"
        elif ci is None:
            verdict = "no interval"
        else:
            verdict = "held" if ci[1] <= t.limit else "inconclusive"
        out.append({"metric": t.metric, "limit_us": t.limit, "value_us": value,
                    "ci_us": ci, "confidence": confidence, "verdict": verdict,
                    "method": i.get("method", "")})
    return out


def probe_outcome(slo: tuple[Threshold, ...], step: dict[str, Any],
                  intervals: dict[str, Any]) -> str:
    """A capacity probe against an SLO, judged with its intervals: `broken` when a limit broke
    with confidence (a latency interval wholly above its limit, or a count such as the error
    rate over its limit), `held` when every latency interval lies below its limit and every
    count held, `inconclusive` when an interval straddles a limit, `no interval` when a
    latency term has none (a replay probe of one round)."""
    words = []
    for t in slo:
        if t.metric not in LATENCY_METRICS:
            words.append("held" if holds(t, step_value(t, step)) else "broken")
            continue
        ci = (intervals.get(t.metric) or {}).get("ci")
        if ci is None:
            words.append("no interval")
        else:
            words.append("held" if ci[1] <= t.limit else "broken" if ci[0] > t.limit else
                         "inconclusive")
    if step.get("status") != "ok":
        words.append("inconclusive")
    for word in ("broken", "inconclusive", "no interval"):
        if word in words:
            return word
    return "held"
