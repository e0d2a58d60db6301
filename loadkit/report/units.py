"""Units shared by every renderer: one way to print a latency, one set of latency columns, one
way to read a template's inferences per second."""

from typing import Any

# the latency columns of every table (summary.md, comparison.md, report.html, the web UI tab):
# results.json latency_us keys and their headings
LATENCY_COLUMNS = (("mean", "mean"), ("p50", "p50"), ("p90", "p90"), ("p95", "p95"),
                   ("p99", "p99"), ("p999", "p99.9"))


def step_state(step: dict[str, Any]) -> str:
    """What a step's status column says: partial (interrupted, a server or worker lost), not
    stable (until_stable never settled), or ok."""
    if step.get("status") != "ok":
        return str(step.get("status"))
    st = step.get("stability") or {}
    return "not stable" if st and not st.get("stable") else "ok"


def ms(us: float | None) -> str:
    """Microseconds as milliseconds with enough decimals to mean something; `-` for a figure
    nothing measured (an empty histogram's)."""
    if us is None:
        return "-"
    v = us / 1000.0
    if v >= 100:
        return f"{v:.1f}"
    if v >= 10:
        return f"{v:.2f}"
    return f"{v:.3f}"


def template_of(scenario: Any, name: str) -> dict[str, Any]:
    """The template as results.json's scenario wrote it ({} when it is not there)."""
    raw = scenario.get("requests", {}) if isinstance(scenario, dict) else {}
    t = raw.get(name)
    return t if isinstance(t, dict) else {}


def template_batch(template: dict[str, Any]) -> int:
    b = template.get("batch_size", 1)
    return b if isinstance(b, int) else 1


def infer_per_s(client: dict[str, Any], template: dict[str, Any], seconds: float) -> float:
    """A template's successful inferences per second: its requests x its batch size."""
    return client["requests"] * template_batch(template) / seconds if seconds else 0.0


def door_note(results: dict[str, Any]) -> str:
    """How tensors travelled, when not in the requests (docs/doors.md)."""
    target = (results.get("scenario") or {}).get("target") or {}
    shm = target.get("shared_memory", "none") if isinstance(target, dict) else "none"
    return f", tensors through {shm} shared memory" if shm not in ("none", None) else ""
