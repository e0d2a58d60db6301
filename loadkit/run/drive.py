"""What the conductor needs of whatever sends the load: the `Drive` protocol, and `Collected`,
what one measured window gathered.

Two drives implement it: locust/local_drive.py (this process's engine sends) and
locust/distributed.py's MasterDrive (Locust workers send; the master merges their windows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from loadkit.plan import Arrivals, Step
from loadkit.record import StepWindow


@dataclass(kw_only=True)
class Collected:
    """What a measured window gathered, from this process or merged from every worker."""

    window: StepWindow
    drained: bool
    cpu_s: float
    rss_bytes: int
    in_flight: int = 0
    workers: dict[str, Any] = field(default_factory=dict)  # distributed runs only


class Drive(Protocol):
    """The conductor's side of sending: open a window, close it and collect what it gathered."""

    def attach(self, environment: Any) -> None:
        """Hook into Locust's Environment (request events, worker messages)."""

    def users_for(self, step: Step) -> int:
        """How many Locust users the step needs (the shape reports it to Locust's runner)."""

    def missing_senders(self) -> str:
        """Why no load could be sent now ('' when it can)."""

    def begin(self, step: Step, record: bool, arrivals: Arrivals | None = None) -> None:
        """Open the gate for a warm-up (record=False) or a measured window."""

    def end(self, timeout_s: float) -> Collected | None:
        """Close the gate, wait for what is in flight (at most timeout_s) and hand over the
        window (None after a warm-up)."""

    def end_sequences(self, timeout_s: float, every: bool) -> int:
        """With the gate closed: END every sequence the server may still hold open for this
        run (with `every`, also those the lanes would go on with), outside any window, and
        wait for the answers. How many ENDs were sent."""

    def live_window(self) -> StepWindow | None:
        """A copy of the window being measured, for progress lines and the web UI."""

    def in_flight(self) -> int | None:
        """Requests in flight now (None: not known here, e.g. on a master)."""

    def stop(self) -> None:
        """The run is over: stop sending for good."""
