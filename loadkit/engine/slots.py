"""What the engine hands around on its thread: a slot per request in flight, a lane per Locust
user, and how a request ended (Result), as plain typed records."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from loadkit.transport.call import InferError
from loadkit.transport.door import Ticket

# a door's reading of one streamed message: (it ends its request, it is a response with outputs)
Kind = Callable[[bytes], tuple[bool, bool]]


class Result(NamedTuple):
    """How one request ended, given to whoever sent it."""

    latency_us: int
    size: int  # response bytes
    error: InferError | None
    end_ns: int  # perf_counter_ns at the end
    own_us: int  # of latency_us, the part spent in loadkit's own framing
    # a decoupled model's request (engine/streaming.py): responses with outputs, the first's
    # latency, the µs between consecutive ones
    responses: int = 0
    first_us: int = 0
    gaps: list[int] | None = None
    kept: list[bytes] | None = None  # the responses themselves, when a tokenizer counts them


Done = Callable[[Result], None]


class Responses:
    """One slot's streamed responses for the request in flight (engine/streaming.py)."""

    __slots__ = ("count", "first_ns", "last_ns", "gaps", "cancel_after", "kept")

    def __init__(self) -> None:
        self.cancel_after = 0  # cancel the request after this many responses (0: never)
        self.kept: list[bytes] | None = None  # the responses, for a tokenizer to count
        self.count = 0
        self.first_ns = 0
        self.last_ns = 0
        self.gaps: list[int] = []  # µs between consecutive responses

    def reset(self, cancel_after: int = 0, keep: bool = False) -> None:
        self.count = 0
        self.gaps = []
        self.cancel_after = cancel_after
        self.kept = [] if keep else None

    def take(self, message: bytes, now_ns: int, kind: Kind) -> bool:
        """Note one message of the request's stream (`kind`: the door's reading of it); True
        when it ends the request."""
        ends, counts = kind(message)
        if counts:
            if self.kept is not None:
                self.kept.append(message)
            if self.count:
                self.gaps.append((now_ns - self.last_ns) // 1000)
            else:
                self.first_ns = now_ns
            self.last_ns = now_ns
            self.count += 1
        return ends

    def result(self, latency_us: int, size: int, error: InferError | None, end_ns: int,
               own_us: int, sent_ns: int) -> Result:
        first_us = (self.first_ns - sent_ns) // 1000 if self.count else 0
        return Result(latency_us, size, error, end_ns, own_us, self.count, first_us, self.gaps,
                      self.kept)


@dataclass(frozen=True, kw_only=True)
class Completion:
    """One finished request, as Locust's statistics need it."""

    template: str
    latency_us: int
    size: int
    error: InferError | None


@dataclass(eq=False, kw_only=True)
class Slot(Ticket):
    """Room for one request in flight: what the door keeps for it (door.py's Ticket: its call,
    connection, send time, reply), and who hears how it ended."""

    done: Done | None = None
    check: tuple[int, int] | None = None  # (template, pool entry) whose outputs to validate
    stream: Responses | None = None  # a decoupled model's request: its streamed responses


@dataclass(eq=False, kw_only=True)
class Lane:
    """One Locust user on the engine: a closed loop, or in an open-loop step the schedule."""

    rng: random.Random
    stopping: bool = False
    task: asyncio.Task[None] | None = None
    slot: Slot = field(default_factory=Slot)
    scheduling: bool = False
    # what a load model keeps per lane across gate openings (loads/); its release(), if any,
    # runs when the lane ends (open sequences give their correlation ids back)
    state: Any = None
