"""Which asyncio loop the engine thread runs."""

from __future__ import annotations

import asyncio
import selectors

from loadkit.transport.timer import PreciseTimer


def new_event_loop(precise_timers: bool) -> asyncio.AbstractEventLoop:
    """uvloop: its C event loop costs less CPU per request than asyncio's (docs/performance.md).
    Its timers tick in whole milliseconds, though (so does epoll's timeout), which bunched an
    open loop's sends two by two: an open loop wakes on a timerfd instead (transport/timer.py),
    and where there is none it gets the standard loop over select(), whose timeouts are in
    microseconds.
    """
    if precise_timers and not PreciseTimer.available():
        return asyncio.SelectorEventLoop(selectors.SelectSelector())
    try:
        import uvloop
    except ImportError:  # no wheel for this platform; the standard loop works the same
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
