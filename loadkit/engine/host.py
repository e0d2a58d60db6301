"""The lane interface: all a load model (loads/) may use of the engine.

A load model's lane runner sends one lane's requests until the gate closes. It needs to know
when it may send (the gate, the loop, which phase and which gate opening it is in), what to
send (a template's payload, a sequence's id and flags from the transport's encoder), how
(`send` on a slot), and what happened (`count` an answer; `sent`, `scheduled`, `dropped`,
`lateness`, `sequence_done`: the verbs the step's counters are written from, by the engine,
never by a load model). It does not need the connection, the in-flight table, the watchdog,
the window's fields or the thread: those stay the engine's, so a new load model is written
against this class alone (k6's executors see a VU pool and a clock, not the engine;
tests/test_layout.py checks that loads/ reaches the engine only through here, and writes
nothing of it).
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
from loadkit.transport.door import Encoder


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
        self._recorder: Recorder = engine.recorder
        # the lanes whose open sequences end_dangling lets go of (loads/sequence.py)
        self.lanes: set[Lane] = engine.lanes
        self._drained: threading.Event = engine.drained
        self._encoder: Encoder = engine.encoder

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

    def sequence_id(self, id_type: str, corr: int) -> bytes:
        """A correlation id in the door's encoding (transport/door.py Encoder)."""
        return self._encoder.sequence_id(id_type, corr)

    def in_sequence(self, payload: bytes, ids: bytes, first: bool, last: bool) -> bytes:
        """A prepared request with a sequence's id and its START / END flags."""
        return self._encoder.in_sequence(payload, ids, first, last)

    # ---- what happened: the step's counters, written here from what the lanes say ------------
    def window(self) -> StepWindow | None:
        """The measured window now open (None: a warm-up, or between steps), to hand back to
        `count` and the verbs below; a load model writes nothing of it."""
        return self._recorder.window

    def sent(self, window: StepWindow | None, i: int = -1, late: bool = False) -> None:
        """A request left (template i, `late`: after its late_tolerance)."""
        if window is not None:
            window.sent += 1
            if late:
                window.late[self.names[i]] += 1

    @staticmethod
    def scheduled(window: StepWindow | None) -> None:
        """An open loop's schedule asked for a send (sent or dropped: scheduled == both)."""
        if window is not None:
            window.scheduled += 1

    def dropped(self, window: StepWindow | None, i: int) -> None:
        """An arrival of template i found every in-flight slot busy and was not sent."""
        if window is not None:
            window.dropped[self.names[i]] += 1

    def lateness(self, window: StepWindow | None, i: int, late_us: int) -> None:
        """How long after its scheduled time template i's send left (the generator's own
        faithfulness, open loop)."""
        if window is not None:
            window.sent_late(self.names[i], late_us)

    def sequence_done(self, window: StepWindow | None, i: int, latency_us: int) -> None:
        """A sequence of template i ended, `latency_us` from its first send to its last
        response."""
        if window is not None:
            window.sequence_done(self.names[i], latency_us)

    def expect_drain(self) -> None:
        """Requests no lane owns are about to leave (a sequence's END): the drive waits for
        them to drain before it goes on."""
        self._drained.clear()

    # ---- slots for requests no lane owns (open loop, a sequence's END) -------------------------
    def slot(self) -> Slot:
        idle = self._engine.idle_slots
        return idle.pop() if idle else Slot()

    def release(self, slot: Slot) -> None:
        self._engine.idle_slots.append(slot)

    # ---- many sends in one write (an open loop's due arrivals) ---------------------------------
    def cork(self) -> object:
        """Hold the door's writes until uncork (what uncork is handed back)."""
        door = self._engine.door
        return door.cork() if door is not None else None

    def uncork(self, token: object) -> None:
        door = self._engine.door
        if door is not None:
            door.uncork(token)


# A load model's lane runner (loads/): sends a lane's requests until the gate closes or the
# lane stops; the engine runs it again at the next gate opening.
LaneRunner = Callable[[Host, Lane], Awaitable[None]]
