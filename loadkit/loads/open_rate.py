"""Open loop at a fixed arrival rate: requests leave on a schedule fixed in advance (constant
gaps or Poisson), whether or not earlier ones have ended, so a slow server does not slow the
load down (no coordinated omission). One lane per process runs the schedule; latency counts
from the scheduled send time."""

from __future__ import annotations

import asyncio
import functools
import random
import time

from loadkit.engine.host import Host
from loadkit.engine.slots import Lane, Result, Slot
from loadkit.loads.open_sequence import open_sequences
from loadkit.loads.sequence import Ids
from loadkit.plan import Arrivals
from loadkit.record import StepWindow
from loadkit.scenario import SequenceSpec
from loadkit.transport.timer import PreciseTimer


async def run_replay(engine: Host, lane: Lane, arrivals: Arrivals) -> None:
    """Send each recorded request at its offset (at the step's speed) from the gate's opening,
    for its template (or the mix's pick), until the gate closes; dropped and late as a rate."""
    await _Replay(engine, lane, arrivals, None, None).run()


async def run_schedule(engine: Host, lane: Lane, arrivals: Arrivals,
                       specs: list[SequenceSpec | None] | None = None,
                       ids: list[Ids | None] | None = None) -> None:
    """Send on a schedule fixed in advance until the gate closes or reopens.

    The schedule restarts at every gate opening (warm-up, then the measured window) and is
    seeded, so two runs send the same sequence. A send that finds `max_concurrency` requests
    in flight is dropped, one later than the tolerance is late; both are counted. Sends are
    timer callbacks, not a task per request: all that are due go out in one wake-up.
    """
    await _Schedule(engine, lane, arrivals, specs, ids).run()


class _Schedule:
    """One lane's schedule for one gate opening."""

    IDLE_S = 0.05  # nothing more to send (a replay's end): how often the gate is looked at

    def __init__(self, engine: Host, lane: Lane, arrivals: Arrivals,
                 specs: list[SequenceSpec | None] | None,
                 ids: list[Ids | None] | None):
        assert engine.gate is not None and engine.loop is not None
        self.engine, self.lane, self.loop = engine, lane, engine.loop
        self.generation = engine.generation
        self.rng = random.Random(arrivals.seed * 7_919 + self.generation)
        self.poisson = arrivals.arrival == "poisson"
        self.mean_ns = 1e9 / arrivals.rate
        self.cap = arrivals.max_concurrency or 1_000_000
        self.tolerance_ns = arrivals.late_tolerance_s * 1e9
        self.seqs = open_sequences(engine, lane, specs, ids)
        if self.seqs is not None:
            self.seqs.resume(arrivals.max_concurrency)
        self.in_flight = 0
        self.next_ns = float(time.perf_counter_ns())
        self.over: asyncio.Future[None] = self.loop.create_future()
        self.handle: asyncio.TimerHandle | None = None
        self.precise = PreciseTimer.create(self.loop, self.tick)

    async def run(self) -> None:
        lane = self.lane
        lane.scheduling = True
        self.tick()
        try:
            await self.over
        finally:
            lane.scheduling = False
            if self.precise is not None:
                self.precise.close()
            if self.handle is not None:
                self.handle.cancel()

    def tick(self) -> None:
        """Send what is due (in one write), then sleep until the next is."""
        engine, lane = self.engine, self.lane
        gate = engine.gate
        assert gate is not None
        if not gate.is_set() or self.generation != engine.generation or lane.stopping:
            if not self.over.done():
                self.over.set_result(None)
            return
        conn = engine.cork()  # the sends below leave in one write, in this iteration
        due = self.send_due(time.perf_counter_ns())
        engine.uncork(conn)
        delay = self.IDLE_S if due is None else (due - time.perf_counter_ns()) / 1e9
        if self.precise is not None:
            self.precise.call_later(delay)
        else:
            self.handle = self.loop.call_later(delay, self.tick)

    def send_due(self, now: int) -> float | None:
        """Every arrival due by `now`; when the next one is due (ns)."""
        engine, lane = self.engine, self.lane
        pick, rng = engine.pick, self.rng
        while self.next_ns <= now:
            i = pick(lane.rng)
            window = engine.window()
            scheduled_ns = int(self.next_ns)
            self.next_ns += rng.expovariate(1.0) * self.mean_ns if self.poisson else self.mean_ns
            engine.scheduled(window)
            self.arrive(i, scheduled_ns, now, window)
        return self.next_ns

    def arrive(self, i: int, scheduled_ns: int, now: int, window: StepWindow | None,
               entry: int = -1) -> None:
        """One scheduled arrival of template i: sent, late or dropped (a sequence's start,
        where the mix has sequences); `entry`: the pool entry a mooncake line sends."""
        engine = self.engine
        late_ns = now - scheduled_ns
        late = late_ns > self.tolerance_ns
        if self.seqs is not None:
            if self.seqs.arrive(i, scheduled_ns, window, late):
                engine.lateness(window, i, late_ns // 1000)
            else:
                engine.dropped(window, i)
            return
        if self.in_flight >= self.cap:
            engine.dropped(window, i)
            return
        engine.sent(window, i, late=late)
        engine.lateness(window, i, late_ns // 1000)
        slot = engine.slot()
        self.in_flight += 1
        rng = self.lane.rng
        if entry >= 0:
            pool = engine.requests.pools[i]
            payload = engine.requests.draw_at(i, entry % len(pool), window)
        else:
            payload = engine.payload(i, rng, window)
        engine.send(slot, payload, functools.partial(
            self.finished, slot, engine.names[i], scheduled_ns, window),
            engine.streams.streaming[i] and engine.streams.mode(i, rng))

    def finished(self, slot: Slot, name: str, scheduled_ns: int, window: StepWindow | None,
                 result: Result) -> None:
        self.in_flight -= 1
        self.engine.release(slot)
        from_schedule_us = (result.end_ns - scheduled_ns) // 1000
        self.engine.count(name, window, from_schedule_us, result.latency_us, result)


class _Replay(_Schedule):
    """A replay's schedule: the file's offsets instead of a rate's gaps."""

    def __init__(self, engine: Host, lane: Lane, arrivals: Arrivals,
                 specs: list[SequenceSpec | None] | None, ids: list[Ids | None] | None):
        super().__init__(engine, lane, arrivals, specs, ids)
        replay = arrivals.replay
        assert replay is not None
        self.offsets_ns = (replay.offsets * 1e9).astype("int64").tolist()
        index = {n: i for i, n in enumerate(engine.names)}
        chosen = [index.get(t, -1) for t in replay.templates]
        self.template_of = [chosen[m] for m in replay.model_of.tolist()]
        self.entry_of = (replay.entry_of.tolist() if replay.entry_of is not None
                         else None)
        self.period_ns = int(replay.period_s * 1e9)
        self.looped = replay.loop
        self.times, self.passes = replay.times, 1
        self.k = 0
        self.base_ns = self.next_ns

    def send_due(self, now: int) -> float | None:
        """Every recorded arrival due by `now`; when the next is due (None: the file is done,
        and the gate is only looked at every IDLE_S)."""
        pick, offsets = self.engine.pick, self.offsets_ns
        n, rng = len(offsets), self.lane.rng
        while True:
            if self.k == n:
                if not self.looped or (self.times and self.passes >= self.times):
                    return None
                self.k, self.base_ns = 0, self.base_ns + self.period_ns
                self.passes += 1
            due = self.base_ns + offsets[self.k]
            if due > now:
                return due
            j = self.template_of[self.k]
            entry = self.entry_of[self.k] if self.entry_of is not None else -1
            self.k += 1
            window = self.engine.window()
            self.engine.scheduled(window)
            self.arrive(pick(rng) if j < 0 else j, int(due), now, window, entry)
