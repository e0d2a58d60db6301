"""The lane interface: all a load model (loads/) may use of the engine.

A load model's lane runner sends one lane's requests until the gate closes. It needs to know
when it may send (the gate, the loop, which phase and which gate opening it is in), what to
send (a template's payload), how (`send` on a slot), and where an answer goes (`count` into
the step's window). It does not need the connection, the in-flight table, the watchdog or the
thread: those stay the engine's, so a new load model is written against this class alone
(k6's executors see a VU pool and a clock, not the engine; tests/test_layout.py checks that
loads/ reaches the engine only through here).
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Awaitable, Callable

from loadkit.engine.core import Engine
from loadkit.engine.pools import Pools
from loadkit.engine.slots import Done, Lane, Result, Slot
from loadkit.engine.streaming import StreamPolicy
from loadkit.record import Recorder, StepWindow
from loadkit.transport.connection import Connection


class Host:
    """One process's engine as its lane runners see it (made once per drive)."""

    def __init__(self, engine: Engine):
        self._engine = engine
        # what to send and how it is read: fixed for the run
        self.names: list[str] = engine.names
        self.pick: Callable[[random.Random], int] = engine.pick
        self.requests: Pools = engine.requests
        self.streams: StreamPolicy = engine.streams
        self.think_time_s: float = engine.think_time_s
        # sending and counting
        self.send: Callable[[Slot, bytes, Done, int], None] = engine.send
        self.count: Callable[[str, StepWindow | None, int, int | None, Result], None] = \
            engine.count
        self.recorder: Recorder = engine.recorder
        # what a sequence's END, sent by no lane, waits on (loads/sequence.py end_dangling)
        self.lanes: set[Lane] = engine.lanes
        self.drained: threading.Event = engine.drained

    # ---- when: live engine state, read where it is needed ----------------------------------
    @property
    def gate(self) -> asyncio.Event | None:
        return self._engine.gate

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._engine.loop

    @property
    def epoch(self) -> int:
        """Bumped by the drive at a new phase: a sequence of an older epoch ends."""
        return self._engine.epoch

    @property
    def generation(self) -> int:
        """Bumped at each gate opening: a schedule of an older one stops."""
        return self._engine.generation

    # ---- what --------------------------------------------------------------------------------
    def payload(self, i: int, rng: random.Random, window: StepWindow | None) -> bytes:
        """Template i's next request: its only payload, or the next of its pool (data sets,
        validation) with what its reply must be."""
        r = self.requests
        return r.draw(i, rng, window) if r.pooled else r.first[i]

    # ---- slots for requests no lane owns (open loop, a sequence's END) -------------------------
    def slot(self) -> Slot:
        idle = self._engine.idle_slots
        return idle.pop() if idle else Slot()

    def release(self, slot: Slot) -> None:
        self._engine.idle_slots.append(slot)

    # ---- many sends in one write (an open loop's due arrivals) ---------------------------------
    def cork(self) -> Connection | None:
        """Hold the connection's writes until uncork (None: no connection yet)."""
        wire = self._engine.wire
        conn = wire.live() if wire is not None else None
        if conn is not None:
            conn.corked = True
        return conn

    @staticmethod
    def uncork(conn: Connection | None) -> None:
        if conn is not None:
            conn.corked = False
            conn.flush()


# A load model's lane runner (loads/): sends a lane's requests until the gate closes or the
# lane stops; the engine runs it again at the next gate opening.
LaneRunner = Callable[[Host, Lane], Awaitable[None]]
