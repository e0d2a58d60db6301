"""Open loop at a fixed arrival rate: requests leave on a schedule fixed in advance (constant
gaps or Poisson), whether or not earlier ones have ended, so a slow server does not slow the
load down (no coordinated omission). One lane per process runs the schedule; latency counts
from the scheduled send time."""

from __future__ import annotations

import asyncio
import functools
import random
import time

from loadkit.engine.core import Engine, LaneRunner
from loadkit.engine.slots import Lane, Result, Slot
from loadkit.loads.open_sequence import open_sequences
from loadkit.loads.sequence import Ids
from loadkit.plan import Arrivals
from loadkit.record import StepWindow
from loadkit.scenario import SequenceSpec
from loadkit.transport.timer import PreciseTimer


def schedule(arrivals: Arrivals, specs: list[SequenceSpec | None] | None = None,
             ids: list[Ids | None] | None = None) -> LaneRunner:
    """The lane runner for one step's arrivals (each starting a sequence where the mix has
    sequence templates: loads/open_sequence.py)."""
    return functools.partial(run_schedule, arrivals=arrivals, specs=specs, ids=ids)


async def run_schedule(engine: Engine, lane: Lane, arrivals: Arrivals,
                       specs: list[SequenceSpec | None] | None = None,
                       ids: list[Ids | None] | None = None) -> None:
    """Send on a schedule fixed in advance until the gate closes or reopens.

    The schedule restarts at every gate opening (warm-up, then the measured window) and is
    seeded, so two runs send the same sequence. A send that finds `max_concurrency` requests
    in flight is dropped, one later than the tolerance is late; both are counted. Sends are
    timer callbacks, not a task per request: all that are due go out in one wake-up.
    """
    gate, loop = engine.gate, engine.loop
    assert gate is not None and loop is not None
    generation = engine.generation
    rng = random.Random(arrivals.seed * 7_919 + generation)
    poisson = arrivals.arrival == "poisson"
    mean_ns = 1e9 / arrivals.rate
    cap = arrivals.max_concurrency or 1_000_000
    tolerance_ns = arrivals.late_tolerance_s * 1e9
    names, payloads, pick, recorder = engine.names, engine.payloads, engine.pick, engine.recorder
    draw = engine.draw if engine.pooled else None
    idle, wire, streams = engine.idle_slots, engine.wire, engine.streams
    assert wire is not None
    seqs = open_sequences(engine, lane, specs, ids)
    if seqs is not None:
        seqs.resume(arrivals.max_concurrency)
    in_flight = 0
    next_ns = float(time.perf_counter_ns())
    over: asyncio.Future[None] = loop.create_future()
    handle: asyncio.TimerHandle | None = None

    def tick() -> None:
        nonlocal next_ns, in_flight, handle
        if not gate.is_set() or generation != engine.generation or lane.stopping:
            if not over.done():
                over.set_result(None)
            return
        now = time.perf_counter_ns()
        conn = wire.live()
        if conn is not None:
            conn.corked = True  # the sends below leave in one write, in this iteration
        while next_ns <= now:
            i = pick(lane.rng)
            window = recorder.window
            scheduled_ns = int(next_ns)
            next_ns += rng.expovariate(1.0) * mean_ns if poisson else mean_ns
            if window is not None:
                window.scheduled += 1
            if seqs is not None:
                late = now - scheduled_ns > tolerance_ns
                if not seqs.arrive(i, scheduled_ns, window, late) and window is not None:
                    window.dropped[names[i]] += 1
                continue
            if in_flight >= cap:
                if window is not None:
                    window.dropped[names[i]] += 1
                continue
            if window is not None:
                window.sent += 1
                if now - scheduled_ns > tolerance_ns:
                    window.late[names[i]] += 1
            slot = idle.pop() if idle else Slot()
            in_flight += 1
            payload = payloads[i] if draw is None else draw(i, lane.rng, window)
            engine.send(slot, payload, functools.partial(
                finished, slot, names[i], scheduled_ns, window),
                streams.streaming[i] and streams.mode(i, lane.rng))
        if conn is not None:
            conn.corked = False
            conn.flush()
        delay = (next_ns - time.perf_counter_ns()) / 1e9
        if precise is not None:
            precise.call_later(delay)
        else:
            handle = loop.call_later(delay, tick)

    def finished(slot: Slot, name: str, scheduled_ns: int, window: StepWindow | None,
                 result: Result) -> None:
        nonlocal in_flight
        in_flight -= 1
        idle.append(slot)
        from_schedule_us = (result.end_ns - scheduled_ns) // 1000
        engine.count(name, window, from_schedule_us, result.latency_us, result)

    precise = PreciseTimer.create(loop, tick)
    lane.scheduling = True
    tick()
    try:
        await over
    finally:
        lane.scheduling = False
        if precise is not None:
            precise.close()
        if handle is not None:
            handle.cancel()
