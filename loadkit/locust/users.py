"""The Locust user: one closed-loop lane of gRPC inferences on the process's engine.

The user's greenlet sends nothing itself (see engine.py for why): on_start opens its lane, then
it waits, so Locust can stop it at any moment; on_stop closes the lane, which finishes and
counts the request it has in flight.
"""

from __future__ import annotations

from locust import User, task

from loadkit.engine.core import Lane
from loadkit.locust.local_drive import LocalDrive

PARK_S = 3600.0


class TritonUser(User):
    def on_start(self) -> None:
        self.ctx: LocalDrive = self.environment.loadkit.drive  # type: ignore[attr-defined]
        self.lane: Lane | None = self.ctx.open_lane()

    def wait_time(self) -> float:
        return PARK_S

    @task
    def lane(self) -> None:
        """Nothing to do per iteration: the lane runs on the engine until the user stops."""

    def on_stop(self) -> None:
        if getattr(self, "lane", None) is not None:
            self.ctx.close_lane(self.lane)
            self.lane = None
