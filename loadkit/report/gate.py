"""The CI regression gate: a new run's phases against a baseline run's same-named phases at the
same loads, every comparison in the four words (loadkit/stats/verdict.py), and a rule saying
which words fail the job (`--fail-on worse`, `worse:throughput,p99`, `inconclusive`).

`loadkit compare BASE NEW --fail-on ...` and `loadkit run SCENARIO --baseline DIR` both judge
here; the command maps a failed gate to exit 1 (docs/ci.md)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any

from loadkit.errors import ReportError
from loadkit.plan import load_label
from loadkit.report.compare import differences
from loadkit.stats import METRICS, against_baseline, judging
from loadkit.stats import text as change_text

WORDS = ("worse", "inconclusive", "unknown", "better", "same")


@dataclass(frozen=True)
class Rule:
    """Fail on comparisons whose verdict is `word`, for these metrics (all when empty)."""

    word: str
    metrics: tuple[str, ...] = ()

    def hits(self, change: dict[str, Any]) -> bool:
        return change["verdict"] == self.word and (
            not self.metrics or change["metric"] in self.metrics)

    def text(self) -> str:
        return self.word + (":" + ",".join(self.metrics) if self.metrics else "")


def parse_rules(specs: list[str]) -> tuple[Rule, ...]:
    """`--fail-on worse`, `--fail-on worse:throughput,p99`, `--fail-on inconclusive` (the flag
    may repeat); a bad word or metric is refused by name."""
    metrics = (*METRICS,)
    rules = []
    for spec in specs:
        word, colon, names = spec.strip().partition(":")
        if word not in ("worse", "inconclusive", "unknown"):
            raise ReportError(f"--fail-on: expected worse, inconclusive or unknown, optionally "
                              f"with metrics (worse:throughput,p99); found {spec!r}")
        picked = tuple(m.strip() for m in names.split(",") if m.strip()) if names else ()
        bad = [m for m in picked if m not in metrics]
        if bad or (colon and not picked):
            raise ReportError(f"--fail-on {spec}: unknown metric {', '.join(bad) or '(none)'}; "
                              f"expected some of {', '.join(metrics)}")
        rules.append(Rule(word, picked))
    return tuple(rules)


@dataclass(frozen=True, kw_only=True)
class Gate:
    """The gate's verdict: every comparison, those that failed it, and what differed."""

    rules: tuple[Rule, ...]
    changes: tuple[dict[str, Any], ...]
    failed: tuple[dict[str, Any], ...]
    warnings: tuple[str, ...]
    confidence: float

    @property
    def passed(self) -> bool:
        return not self.failed

    def lines(self) -> list[str]:
        """What a CI log shows: the rule, the counts by word, each failing comparison."""
        counts = {w: sum(c["verdict"] == w for c in self.changes) for w in WORDS}
        head = (f"gate ({', '.join(r.text() for r in self.rules)}): "
                f"{'FAILED' if self.failed else 'passed'}: {len(self.changes)} comparisons, "
                + ", ".join(f"{n} {w}" for w, n in counts.items() if n))
        return [head, *(f"  {describe(c)}" for c in self.failed),
                *(f"  WARNING: {w}" for w in self.warnings)]

    def to_json(self) -> dict[str, Any]:
        return {"rules": [r.text() for r in self.rules], "passed": self.passed,
                "confidence": self.confidence, "warnings": list(self.warnings),
                "failed": len(self.failed), "comparisons": list(self.changes)}


def describe(c: dict[str, Any]) -> str:
    """'phase batching at c=8, p99 (template a): worse: +12.0% [+5, +19]'."""
    where = f" (template {c['template']})" if c.get("template") else ""
    return (f"phase {c['phase']} at {load_label(c['load'])}, {c['metric']}{where}: "
            f"{c['verdict']}: {change_text(c)}")


def judge(base: dict[str, Any], new: dict[str, Any], rules: tuple[Rule, ...]) -> Gate:
    """The gate of `new` against `base`; a ReportError when they share no phase and load
    (nothing to gate on is not a pass)."""
    changes = against_baseline(base, new, *judging(new))
    if not changes:
        names = sorted({p["name"] for p in base["phases"]} & {p["name"] for p in new["phases"]})
        raise ReportError(
            "nothing to compare: the baseline and the new run share no phase and load "
            + (f"(phases in common: {', '.join(names)}; their loads differ)" if names else
               f"(baseline phases: {', '.join(p['name'] for p in base['phases']) or 'none'}; "
               f"new: {', '.join(p['name'] for p in new['phases']) or 'none'})"))
    failed = tuple(c for c in changes if any(r.hits(c) for r in rules))
    warn = differences([("baseline", base, {}), ("new", new, {})])
    return Gate(rules=rules, changes=tuple(changes), failed=failed, warnings=tuple(warn),
                confidence=changes[0]["confidence"])


def junit_xml(gate: Gate, suite: str = "loadkit.gate") -> str:
    """One testcase per comparison; a failure where the gate's rule caught it."""
    root = ET.Element("testsuites")
    ts = ET.SubElement(root, "testsuite", name=suite, tests=str(len(gate.changes)),
                       failures=str(len(gate.failed)), skipped="0")
    for c in gate.changes:
        name = f"{c['metric']}" + (f" ({c['template']})" if c.get("template") else "")
        case = ET.SubElement(ts, "testcase", classname=f"{suite}.{c['phase']}."
                             f"{load_label(c['load'])}", name=name)
        if c in gate.failed:
            ET.SubElement(case, "failure", message=f"{c['verdict']}: {change_text(c)}").text = \
                describe(c)
        else:
            ET.SubElement(case, "system-out").text = describe(c)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, "unicode") + "\n"



