"""PreciseTimer: the open loop's wake-ups on uvloop, whose own timers keep whole milliseconds."""

from __future__ import annotations

import statistics
import time

import pytest

from loadkit.engine.eventloop import new_event_loop
from loadkit.transport.timer import PreciseTimer

pytestmark = pytest.mark.skipif(not PreciseTimer.available(), reason="skipped: no timerfd here")

DELAY_S = 0.00025


pytestmark = pytest.mark.fast


def _delays(use_timerfd: bool, n: int = 40) -> list[float]:
    """Seconds from arming to the callback, for n one-shot wake-ups DELAY_S ahead."""
    loop = new_event_loop(precise_timers=True)
    got: list[float] = []
    armed = [0.0]
    done = loop.create_future()
    timer: PreciseTimer | None = None

    def fired() -> None:
        got.append(time.perf_counter() - armed[0])
        if len(got) == n:
            done.set_result(None)
            return
        arm()

    def arm() -> None:
        armed[0] = time.perf_counter()
        if timer is not None:
            timer.call_later(DELAY_S)
        else:
            loop.call_later(DELAY_S, fired)

    if use_timerfd:
        timer = PreciseTimer.create(loop, fired)
        assert timer is not None
    try:
        loop.call_soon(arm)
        loop.run_until_complete(done)
    finally:
        if timer is not None:
            timer.close()
        loop.close()
    return got


def test_the_open_loop_event_loop_is_uvloop_when_a_timerfd_exists() -> None:
    uvloop = pytest.importorskip("uvloop")
    loop = new_event_loop(precise_timers=True)
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def test_timerfd_wakes_on_time_where_the_loops_own_timer_does_not() -> None:
    precise = _delays(use_timerfd=True)
    coarse = _delays(use_timerfd=False)
    assert len(precise) == len(coarse) == 40
    # uvloop keeps whole milliseconds: 250 µs becomes 0 and fires at once (a schedule that
    # re-arms until its send is due would spin); the timerfd is never early, and sub-ms
    assert statistics.median(coarse) < DELAY_S / 2
    assert min(precise) >= DELAY_S * 0.99
    assert statistics.median(precise) < 0.001


def test_rearming_replaces_the_pending_wake_up_and_close_stops_it() -> None:
    loop = new_event_loop(precise_timers=True)
    calls: list[float] = []
    timer = PreciseTimer.create(loop, lambda: calls.append(time.perf_counter()))
    assert timer is not None
    try:
        t0 = time.perf_counter()
        timer.call_later(0.002)
        timer.call_later(0.02)  # replaces the first
        loop.run_until_complete(_sleep(loop, 0.05))
        assert len(calls) == 1 and calls[0] - t0 >= 0.0195
        timer.call_later(0.005)
        timer.close()
        loop.run_until_complete(_sleep(loop, 0.03))
        assert len(calls) == 1
    finally:
        timer.close()
        loop.close()


async def _sleep(loop: object, seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)
