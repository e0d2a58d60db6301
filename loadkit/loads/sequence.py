"""Closed loop over stateful models: each lane runs sequences back to back, one request in
flight, START on a sequence's first request and END on its last, under a correlation id no
other open sequence has. Concurrency is the number of sequences in flight. Templates without a
`sequence` in the same mix are sequences of one request.

The flags and the id are KServe request parameters (`sequence_id`, `sequence_start`,
`sequence_end`), appended to the template's prepared request as serialized map entries
(protobuf merges repeated fields on concatenation), so nothing is re-serialized per request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import random
import time
from dataclasses import dataclass

from tritonclient.grpc import service_pb2

from loadkit.engine.core import Engine, LaneRunner
from loadkit.engine.slots import Lane, Result
from loadkit.record import StepWindow
from loadkit.scenario import ConcurrencyLoad, Scenario, SequenceSpec
from loadkit.transport.call import frame


def _param(key: str, **value: object) -> bytes:
    req = service_pb2.ModelInferRequest()
    req.parameters[key].CopyFrom(service_pb2.InferParameter(**value))
    return req.SerializeToString()


START = _param("sequence_start", bool_param=True)
END = _param("sequence_end", bool_param=True)


def id_bytes(spec: SequenceSpec, corr: int) -> bytes:
    if spec.id_type == "string":
        return _param("sequence_id", string_param=str(corr))
    return _param("sequence_id", int64_param=corr)


def length(spec: SequenceSpec, rng: random.Random) -> int:
    if not spec.variation:
        return spec.length
    spread = spec.length * spec.variation / 100
    return max(1, round(spec.length + rng.uniform(-spread, spread)))


class Ids:
    """Correlation ids of one template, handed out in turn, never one still open."""

    def __init__(self, spec: SequenceSpec):
        self.first, self.last = spec.ids
        self.next = self.first
        self.open: set[int] = set()

    @property
    def full(self) -> bool:
        return len(self.open) > self.last - self.first

    def take(self) -> int:
        if self.full:  # the scenario check sizes the range; a leak must not spin forever
            raise RuntimeError(f"all correlation ids {self.first}..{self.last} are open")
        while self.next in self.open:
            self.next = self.first if self.next >= self.last else self.next + 1
        corr = self.next
        self.next = self.first if self.next >= self.last else self.next + 1
        self.open.add(corr)
        return corr

    def give_back(self, corr: int) -> None:
        self.open.discard(corr)


@dataclass
class _State:
    template: int = 0
    left: int = 0  # requests still to send in the open sequence (0: none open)
    corr: int = 0
    ids: bytes = b""
    first: bool = False
    started_ns: int = 0
    epoch: int = 0
    tracker: Ids | None = None

    def close(self) -> None:
        """End the open sequence here: its id goes back to the pool."""
        if self.ids and self.tracker is not None:
            self.tracker.give_back(self.corr)
        self.left = 0

    release = close  # the engine calls it when the lane ends


async def run_sequences(engine: Engine, lane: Lane, specs: list[SequenceSpec | None],
                        ids: list[Ids | None]) -> None:
    """Send the lane's sequences until the gate closes or the lane stops; an open sequence
    goes on at the next gate opening (warm-up -> measured window), unless the drive started
    a new phase (`engine.epoch`: the model may have been reloaded) or a request failed."""
    gate, loop = engine.gate, engine.loop
    assert gate is not None and loop is not None
    names, pick, rng = engine.names, engine.pick, lane.rng
    think, recorder = engine.think_time_s, engine.recorder
    slot = lane.slot
    if not isinstance(lane.state, _State):
        release = getattr(lane.state, "release", None)
        if release is not None:
            release()  # open-loop sequences the last phase left open
        lane.state = _State()
    state = lane.state
    over: asyncio.Future[None] = loop.create_future()
    pause: asyncio.TimerHandle | None = None

    def send_next() -> None:
        if lane.stopping or not gate.is_set():
            if not over.done():
                over.set_result(None)
            return
        if state.left and state.epoch != engine.epoch:
            state.close()  # a new phase: the server may not know this sequence any more
        if not state.left:
            i = pick(rng)
            spec, tracker = specs[i], ids[i]
            state.template, state.epoch, state.first = i, engine.epoch, True
            state.started_ns = time.perf_counter_ns()
            if spec is None or tracker is None:
                state.left, state.ids = 1, b""
            else:
                state.left = length(spec, rng)
                state.corr = tracker.take()
                state.tracker = tracker
                state.ids = id_bytes(spec, state.corr)
        i = state.template
        window = recorder.window
        if window is not None:
            window.sent += 1
        payload = engine.draw(i, rng, window) if engine.pooled else engine.payloads[i]
        if state.ids:
            payload = frame(payload[5:] + state.ids + (START if state.first else b"") +
                            (END if state.left == 1 else b""))
        state.first = False
        engine.send(slot, payload, functools.partial(finished, i, window),
                    engine.streams.streaming[i])

    def finished(i: int, window: StepWindow | None, result: Result) -> None:
        nonlocal pause
        engine.count(names[i], window, result.latency_us, None, result)
        state.left -= 1
        if result.error is not None and state.ids:
            state.close()  # the server may have dropped it: the next request starts a new one
        elif state.left == 0 and state.ids:
            state.close()
            if window is not None:
                window.sequence_done(names[i], (result.end_ns - state.started_ns) // 1000)
        if think > 0:
            pause = loop.call_later(think, send_next)
        elif result.error is None:
            send_next()
        else:
            loop.call_soon(send_next)

    send_next()
    try:
        await over
    finally:
        if pause is not None:
            pause.cancel()


def new_ids(specs: list[SequenceSpec | None]) -> list[Ids | None]:
    """One id pool per sequence template, shared by the process's lanes and load models."""
    return [Ids(s) if s is not None else None for s in specs]


def sequences(specs: list[SequenceSpec | None],
              ids: list[Ids | None]) -> LaneRunner:
    """The closed-loop lane runner for a mix with sequence templates."""
    return functools.partial(run_sequences, specs=specs, ids=ids)


def most_open(scenario: Scenario) -> int:
    """The most sequences one process may hold open: the most users of a closed-loop phase,
    or an open-loop phase's `max_concurrency` (0 where an open-loop phase has no cap)."""
    most = 1
    for ph in scenario.phases:
        if isinstance(ph.load, ConcurrencyLoad):
            most = max(most, max(ph.load.levels))
        elif not ph.load.max_concurrency:
            return 0
        else:
            most = max(most, ph.load.max_concurrency)
    return most


def slice_ids(scenario: Scenario, index: int, size: int) -> Scenario | str:
    """Worker `index`'s own correlation ids: the index-th run of `size` ids in each sequence
    template's range, so two workers never open the same sequence; a str says why the range
    has no room for this worker."""
    requests = dict(scenario.requests)
    for name, t in scenario.requests.items():
        if t.sequence is None:
            continue
        first, last = t.sequence.ids
        lo = first + index * size
        if lo + size - 1 > last:
            return (f"requests.{name}.sequence.ids [{first}, {last}] has room for "
                    f"{(last - first + 1) // size} workers of {size} sequences each; this is "
                    f"worker {index + 1}: widen the range or run fewer workers")
        requests[name] = dataclasses.replace(
            t, sequence=dataclasses.replace(t.sequence, ids=(lo, lo + size - 1)))
    return dataclasses.replace(scenario, requests=requests)
