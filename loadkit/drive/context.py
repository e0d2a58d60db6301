"""The per-process state the users share: templates, mix, gate, in-flight count, transport.

The gate is how the conductor makes step boundaries exact: it closes the gate, waits until no
request is in flight, snapshots the server's counters, then opens the next window. Requests are
attributed to the window that was open when they were *sent*.
"""

from __future__ import annotations

import bisect
import random

import gevent
from gevent.event import Event

from loadkit.drive.transport import Transport, prepare
from loadkit.plan import Plan
from loadkit.record import Recorder
from loadkit.scenario import Scenario


class DriveContext:
    def __init__(self, scenario: Scenario, plan: Plan, address: str, seed: int = 0):
        self.scenario = scenario
        self.plan = plan
        self.address = address
        self.seed = seed
        self.recorder = Recorder()
        self.gate = Event()
        self.inflight = 0
        self._drained = Event()
        self.transport: Transport | None = None
        names = list(scenario.mix)
        self.template_names = names
        self.payloads = [prepare(scenario.requests[n]) for n in names]
        self.batch_sizes = {n: scenario.requests[n].batch_size for n in names}
        total = sum(scenario.mix.values())
        acc = 0.0
        self.cumulative: list[float] = []
        for n in names:
            acc += scenario.mix[n] / total
            self.cumulative.append(acc)
        self.think_time_s = scenario.think_time_s
        self._user_seq = 0

    def user_rng(self) -> random.Random:
        self._user_seq += 1
        return random.Random(self.seed * 1_000_003 + self._user_seq)

    def pick(self, rng: random.Random) -> int:
        i = bisect.bisect_left(self.cumulative, rng.random())
        return min(i, len(self.cumulative) - 1)

    def open_transport(self) -> Transport:
        if self.transport is None:
            self.transport = Transport(self.address, self.scenario.target)
        return self.transport

    def close_transport(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    def request_done(self) -> None:
        self.inflight -= 1
        if self.inflight == 0 and not self.gate.is_set():
            self._drained.set()

    def close_gate(self, timeout_s: float) -> bool:
        """Stop new requests and wait for those in flight; False if the wait timed out."""
        self.gate.clear()
        if self.inflight <= 0:
            return True
        self._drained.clear()
        with gevent.Timeout(timeout_s, False):
            while self.inflight > 0:
                self._drained.wait(0.05)
        return self.inflight <= 0

    def open_gate(self) -> None:
        self.gate.set()
