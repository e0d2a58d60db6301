"""The Locust load shape: reports the conductor's target user count to the runner.

Locust calls tick() about once a second; the first call starts the conductor, and None (the
plan is done) tells Locust to stop. The shape never decides step boundaries itself: those are
drained by the conductor, so they stay exact whatever the tick interval.
"""

from __future__ import annotations

from locust import LoadTestShape


class LoadkitShape(LoadTestShape):
    def tick(self) -> tuple[int, float] | None:
        assert self.runner is not None
        run = self.runner.environment.loadkit
        run.conductor.start()
        return run.conductor.target

    def reset_time(self) -> None:
        """Locust calls this when a run starts (again, in the web UI): a finished run is
        replaced by a fresh one, with its own report folder."""
        super().reset_time()
        runner = self.runner
        run = getattr(runner.environment, "loadkit", None) if runner is not None else None
        if run is not None and run.conductor.finished.is_set() and run.renew is not None:
            run.renew()
