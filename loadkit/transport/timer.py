"""Wake-ups at microsecond times on an event loop whose own timers tick in whole milliseconds.

uvloop (libuv) keeps timers in whole milliseconds: a wake-up 250 µs ahead fires at once, one
1.5 ms ahead at 1 or 2 ms, so an open loop at 2000/s would send two requests at a time every
millisecond (and the server would queue the second behind the first).
A Linux timerfd is armed in nanoseconds and wakes the loop through its ordinary fd polling, so
the open loop keeps uvloop's cheap iterations and still sends on time. Where there is no
timerfd (not Linux), `PreciseTimer.create` returns None and the engine falls back to the
standard loop over select(), whose timeouts are in microseconds.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import sys
from collections.abc import Callable

CLOCK_MONOTONIC = 1
TFD_NONBLOCK = 0o4000
TFD_CLOEXEC = 0o2000000


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.timerfd_create  # noqa: B018 - raises AttributeError where there is none
    except (OSError, AttributeError):
        return None
    return libc


class PreciseTimer:
    """One re-armable one-shot timer: `call_later(delay_s)` runs the callback once, on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, libc: ctypes.CDLL, fd: int,
                 callback: Callable[[], None]):
        self._loop, self._libc, self._fd, self._callback = loop, libc, fd, callback
        self._spec = _Itimerspec()
        self._settime = libc.timerfd_settime
        loop.add_reader(fd, self._fired)

    @classmethod
    def available(cls) -> bool:
        return _libc() is not None

    @classmethod
    def create(cls, loop: asyncio.AbstractEventLoop,
               callback: Callable[[], None]) -> PreciseTimer | None:
        libc = _libc()
        if libc is None:
            return None
        fd = libc.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
        if fd < 0:
            return None
        return cls(loop, libc, fd, callback)

    def call_later(self, delay_s: float) -> None:
        ns = max(1_000, int(delay_s * 1e9))  # 0 would disarm it; 1 µs is "now"
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = divmod(ns, 1_000_000_000)
        if self._settime(self._fd, 0, ctypes.byref(self._spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    def close(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1

    def _fired(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:  # re-armed after it fired, before we read it
            return
        self._callback()
