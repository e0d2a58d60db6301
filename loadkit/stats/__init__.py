"""How sure a number is and whether a difference is real: intervals (intervals.py), the
verdict of one step against another (verdict.py), and `repeats: auto`'s sequential design
(sequential.py). docs/verdicts.md has the methods and their references."""

from loadkit.stats.intervals import (
    DEFAULT_CONFIDENCE,
    HIGHER_IS_BETTER,
    METRICS,
    NOISE_THRESHOLD,
    PERCENTILES,
    STREAM_METRICS,
    across_rounds,
    batch_values,
    imprecise,
    mean_step,
    metric_of,
    t_interval,
    within_run,
)
from loadkit.stats.verdict import (
    DECISIVE,
    against_baseline,
    compare,
    comparisons,
    decide_text,
    judging,
    mixed_models,
    step_changes,
    text,
    undecided,
    verdict,
)

__all__ = [
    "DECISIVE", "DEFAULT_CONFIDENCE", "HIGHER_IS_BETTER", "METRICS", "NOISE_THRESHOLD",
    "PERCENTILES", "STREAM_METRICS", "across_rounds", "against_baseline", "batch_values",
    "compare", "comparisons", "decide_text", "imprecise", "judging", "mean_step", "metric_of",
    "mixed_models", "step_changes", "t_interval", "text", "undecided", "verdict", "within_run",
]
