"""Units shared by every renderer: one way to print a latency, one set of latency columns."""

# the latency columns of every table (summary.md, comparison.md, report.html, the web UI tab):
# results.json latency_us keys and their headings
LATENCY_COLUMNS = (("mean", "mean"), ("p50", "p50"), ("p90", "p90"), ("p95", "p95"),
                   ("p99", "p99"), ("p999", "p99.9"))


def ms(us: float) -> str:
    """Microseconds as milliseconds with enough decimals to mean something."""
    v = us / 1000.0
    if v >= 100:
        return f"{v:.1f}"
    if v >= 10:
        return f"{v:.2f}"
    return f"{v:.3f}"
