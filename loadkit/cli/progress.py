"""The progress line `loadkit run` prints every 2 s: phase, step, stage, rate, p99, errors."""

from __future__ import annotations

import sys
import time
from typing import Any

PROGRESS_S = 2.0


def progress_line(run: Any, last: dict[str, Any]) -> str:
    st = run.conductor.status()
    now = time.monotonic()
    window = st["window"]
    rate = ""
    if window is not None:
        count = sum(window.successes(n) * b for n, b in run.batch_sizes.items())
        if last.get("step") is window.step:  # each call gets a new copy
            dt = now - last["t"]
            rate = f"  {(count - last['count']) / dt:8.1f} infer/s" if dt > 0 else ""
        merged = window.merged()
        if merged.get_total_count():
            rate += f"  p99 {merged.get_value_at_percentile(99) / 1000:.2f} ms"
        errors = window.error_count()
        if errors:  # visible while it happens, with what the server said most often
            kept = max(((c, m, n) for c, ms in window.messages.items()
                        for m, n in ms.items()), key=lambda x: x[2], default=None)
            rate += f"  errors {errors}" + (f" ({kept[0]}: {kept[1][:80]})" if kept else "")
        last.update(step=window.step, t=now, count=count)
    if not st["phase"]:
        return f"[{st['stage']}]"
    count = (f"probe {st['step'] + 1}" if st["steps"] is None
             else f"step {st['step'] + 1}/{st['steps']}")
    return (
        f"[{st['title']} {count} {st['load']}] "
        f"{st['stage']} {st['elapsed_s']:.0f}s, {st['remaining_s']:.0f}s left{rate}"
    )


def report_progress(run: Any) -> None:
    """Print progress lines until the conductor finishes (a greenlet of `loadkit run`)."""
    last: dict[str, Any] = {}
    while not run.conductor.finished.is_set():
        print(progress_line(run, last), file=sys.stderr, flush=True)
        run.conductor.finished.wait(PROGRESS_S)
