"""Closed loop: each lane (one Locust user) sends its next request when the last one ended,
after the scenario's think time. A step's load is its number of lanes (concurrency)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

from loadkit.engine.host import Host
from loadkit.engine.slots import Lane, Result
from loadkit.record import StepWindow


def go_on(loop: asyncio.AbstractEventLoop, think_s: float, result: Result,
          send_next: Callable[[], None]) -> asyncio.TimerHandle | None:
    """After a request ended, the lane's next: after the think time; else at once, inside the
    read that brought the reply; after a failure one iteration later (failures end inside a
    cancel, a reset, a lost connection or the send itself, whose callers still hold the
    slot). The timer to cancel when the lane stops, if any. (Closed loops and sequences.)"""
    if think_s > 0:
        return loop.call_later(think_s, send_next)
    if result.error is None:
        send_next()
    else:
        loop.call_soon(send_next)
    return None


async def run_closed(engine: Host, lane: Lane) -> None:
    """Send the lane's requests back to back until the gate closes or the lane stops.

    A chain of callbacks, not a coroutine step per request: the next request leaves from the
    completion of the last one, inside the read that brought the reply, and so in the write
    that ends that read (the connection flushes there). A task and a future per request would
    cost two event-loop iterations between a reply and the next send, a share of the time per
    request that shows at one in flight. After a failure the next request waits one iteration:
    a deadline's cancel must finish with the slot first."""
    gate, loop = engine.gate, engine.loop
    assert gate is not None and loop is not None
    names, payload, pick, rng = engine.names, engine.payload, engine.pick, lane.rng
    think, streams, sent, current = (engine.think_time_s, engine.streams, engine.sent,
                                     engine.window)
    slot = lane.slot
    over: asyncio.Future[None] = loop.create_future()
    pause: asyncio.TimerHandle | None = None

    def send_next() -> None:
        if lane.stopping or not gate.is_set():
            if not over.done():
                over.set_result(None)
            return
        i = pick(rng)
        window = current()
        sent(window)
        engine.send(slot, payload(i, rng, window), functools.partial(finished, i, window),
                    streams.streaming[i] and streams.mode(i, rng))

    def finished(i: int, window: StepWindow | None, result: Result) -> None:
        nonlocal pause
        engine.count(names[i], window, result.latency_us, None, result)
        pause = go_on(loop, think, result, send_next)

    send_next()
    try:
        await over
    finally:
        if pause is not None:
            pause.cancel()
