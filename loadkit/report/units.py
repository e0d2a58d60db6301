"""Units shared by every renderer: one way to print a latency."""


def ms(us: float) -> str:
    """Microseconds as milliseconds with enough decimals to mean something."""
    v = us / 1000.0
    if v >= 100:
        return f"{v:.1f}"
    if v >= 10:
        return f"{v:.2f}"
    return f"{v:.3f}"
