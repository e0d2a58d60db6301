"""Closed loop over stateful models: each lane runs sequences back to back, one request in
flight, START on a sequence's first request and END on its last, under a correlation id no
other open sequence has. Concurrency is the number of sequences in flight. Templates without a
`sequence` in the same mix are sequences of one request.

The flags and the id are KServe request parameters, added to the template's prepared request
by the transport's encoder (Host.in_sequence, transport/door.py Encoder): nothing is re-serialized
per request, and no framing happens here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import random
import time
from dataclasses import dataclass

from loadkit.engine.host import Host, LaneRunner
from loadkit.engine.slots import Lane, Result, Slot
from loadkit.loads.closed import go_on
from loadkit.record import StepWindow
from loadkit.scenario import ConcurrencyLoad, Scenario, SequenceSpec

log = logging.getLogger("loadkit.sequence")


def id_bytes(engine: Host, spec: SequenceSpec, corr: int) -> bytes:
    return engine.sequence_id(spec.id_type, corr)


def length(spec: SequenceSpec, rng: random.Random) -> int:
    if not spec.variation:
        return spec.length
    spread = spec.length * spec.variation / 100
    return max(1, round(spec.length + rng.uniform(-spread, spread)))


class Ids:
    """Correlation ids of one template, handed out in turn, never one still open.

    A sequence its sender let go of before its END (the lane stopped, the phase ended, its
    END failed) is `dangling`: Triton still holds a slot for it until its idle timeout, so its
    id is not handed out again until `end_dangling` has sent the END (docs/scenarios.md)."""

    def __init__(self, spec: SequenceSpec, template: int = 0):
        self.spec = spec
        self.template = template
        self.first, self.last = spec.ids
        self.next = self.first
        self.open: set[int] = set()
        self.dangling: dict[int, int] = {}  # id -> a data set sequence's next entry (or -1)

    @property
    def full(self) -> bool:
        return len(self.open) + len(self.dangling) > self.last - self.first

    def take(self) -> int:
        if self.full:  # the scenario check sizes the range; a leak must not spin forever
            raise RuntimeError(f"all correlation ids {self.first}..{self.last} are open")
        while self.next in self.open or self.next in self.dangling:
            self.next = self.first if self.next >= self.last else self.next + 1
        corr = self.next
        self.next = self.first if self.next >= self.last else self.next + 1
        self.open.add(corr)
        return corr

    def give_back(self, corr: int) -> None:
        """The sequence ended on the server (its END was answered)."""
        self.open.discard(corr)
        self.dangling.pop(corr, None)

    def drop(self, corr: int, entry: int = -1) -> None:
        """The sender let the sequence go without its END: it waits for end_dangling, which
        sends the data set sequence's next step (`entry`) or the template's first request."""
        if corr in self.open:
            self.open.discard(corr)
            self.dangling[corr] = entry


@dataclass(kw_only=True)
class _State:
    template: int = 0
    left: int = 0  # requests still to send in the open sequence (0: none open)
    corr: int = 0
    ids: bytes = b""
    first: bool = False
    started_ns: int = 0
    epoch: int = 0
    tracker: Ids | None = None
    failed: bool = False  # a request failed: the next one ends the sequence early
    entry: int = -1  # a data set sequence's next entry (-1: the template's own order)

    def close(self) -> None:
        """The open sequence ended on the server: its id goes back to the pool."""
        if self.ids and self.tracker is not None:
            self.tracker.give_back(self.corr)
        self.left = 0

    def drop(self) -> None:
        """Let the open sequence go without its END (end_dangling sends it)."""
        if self.left and self.ids and self.tracker is not None:
            self.tracker.drop(self.corr, self.entry)
        self.left = 0

    release = drop  # the engine calls it when the lane ends


def sequence_request(engine: Host, i: int, rng: random.Random, window: StepWindow | None,
                     entry: int, ids: bytes, first: bool, last: bool) -> bytes:
    """Template i's next request in a sequence (a data set sequence's step `entry` when >= 0,
    else the template's own order), framed with its id and START / END flags (none without
    `ids`: a plain template in a sequence mix)."""
    if entry >= 0:
        payload = engine.requests.draw_at(i, entry, window)
    else:
        payload = engine.payload(i, rng, window)
    return engine.in_sequence(payload, ids, first, last) if ids else payload


def answered(result: Result) -> bool:
    """Whether the server surely processed the request (a success, or a reply loadkit judged
    wrong): a failed END of another kind may have left the sequence open there."""
    return result.error is None or result.error.code == "MISMATCH"


async def run_sequences(engine: Host, lane: Lane, specs: list[SequenceSpec | None],
                        ids: list[Ids | None]) -> None:
    """Send the lane's sequences until the gate closes or the lane stops; an open sequence
    goes on at the next gate opening (warm-up -> measured window, the next step). The drive
    ends every open sequence with an END before a new phase (end_dangling), and a failed
    request makes the sequence's next request its last (END), so the server never holds a
    slot for a sequence loadkit let go of."""
    if not isinstance(lane.state, _State):
        release = getattr(lane.state, "release", None)
        if release is not None:
            release()  # open-loop sequences the last phase left open
        lane.state = _State()
    await _SequenceLane(engine, lane, specs, ids).run()


class _SequenceLane:
    """One lane's closed loop of sequences for one gate opening: a chain of callbacks, as
    loads/closed.py's, with the open sequence kept on `lane.state` between openings."""

    def __init__(self, engine: Host, lane: Lane, specs: list[SequenceSpec | None],
                 ids: list[Ids | None]):
        assert engine.gate is not None and engine.loop is not None
        assert isinstance(lane.state, _State)
        self.engine, self.lane, self.specs, self.ids = engine, lane, specs, ids
        self.state: _State = lane.state
        self.loop = engine.loop
        self.over: asyncio.Future[None] = self.loop.create_future()
        self.pause: asyncio.TimerHandle | None = None

    async def run(self) -> None:
        self.send_next()
        try:
            await self.over
        finally:
            if self.pause is not None:
                self.pause.cancel()

    def _start(self, state: _State) -> None:
        """A new sequence (or, for a template without `sequence`, one plain request)."""
        engine, rng = self.engine, self.lane.rng
        i = engine.pick(rng)
        spec, tracker = self.specs[i], self.ids[i]
        state.template, state.epoch, state.first = i, engine.epoch, True
        state.started_ns, state.failed, state.entry = time.perf_counter_ns(), False, -1
        if spec is None or tracker is None:
            state.left, state.ids = 1, b""
            return
        data = engine.requests.next_sequence(i, rng)
        if data is not None:
            state.entry, state.left = data
        else:
            state.left = length(spec, rng)
        state.corr = tracker.take()
        state.tracker = tracker
        state.ids = id_bytes(self.engine, spec, state.corr)

    def send_next(self) -> None:
        engine, lane, state = self.engine, self.lane, self.state
        gate = engine.gate
        assert gate is not None
        if lane.stopping or not gate.is_set():
            if not self.over.done():
                self.over.set_result(None)
            return
        if state.left and state.epoch != engine.epoch:
            state.drop()  # a new phase the drive did not close for: end_dangling ends it
        if not state.left:
            self._start(state)
        i = state.template
        window = engine.window()
        engine.sent(window)
        payload = sequence_request(engine, i, lane.rng, window, state.entry, state.ids,
                                   state.first, state.left == 1)
        if state.entry >= 0:
            state.entry += 1
        state.first = False
        engine.send(lane.slot, payload, functools.partial(self.finished, i, window),
                    engine.streams.streaming[i])

    def finished(self, i: int, window: StepWindow | None, result: Result) -> None:
        engine, state = self.engine, self.state
        engine.count(engine.names[i], window, result.latency_us, None, result)
        state.left -= 1
        if state.ids and result.error is not None:
            if state.left > 0:  # the server may still hold the sequence: END it next
                state.left, state.failed = 1, True
            elif answered(result):
                state.close()
            else:  # its END may not have arrived: end_dangling sends it again
                state.left, state.entry = 1, max(state.entry - 1, -1)
                state.drop()
        elif state.left == 0 and state.ids:
            state.close()
            if not state.failed:
                engine.sequence_done(window, i, (result.end_ns - state.started_ns) // 1000)
        self.pause = go_on(self.loop, engine.think_time_s, result, self.send_next)


def end_dangling(engine: Host, ids: list[Ids | None], lanes: bool) -> int:
    """(Engine thread, gate closed.) Send an END for every sequence the server may still hold
    open (with `lanes`, first let go of the lanes' open sequences: a phase or the run ends),
    outside any window; each id goes back when its END is answered, however. The number
    sent; the caller waits for the engine to drain them (Host.expect_drain)."""
    if lanes:
        for lane in list(engine.lanes):
            drop = getattr(lane.state, "drop", None)
            if drop is not None:
                drop()
    sent = 0
    for tracker in ids:
        if tracker is None:
            continue
        for corr, entry in sorted(tracker.dangling.items()):
            i = tracker.template
            payload = engine.requests.pools[i][entry] if entry >= 0 else engine.requests.first[i]
            payload = engine.in_sequence(payload, id_bytes(engine, tracker.spec, corr), False,
                                         True)
            slot = engine.slot()
            if not sent:
                engine.expect_drain()
            sent += 1
            engine.send(slot, payload, functools.partial(_ended, engine, tracker, corr, slot),
                        engine.streams.streaming[tracker.template])
    return sent


def _ended(engine: Host, tracker: Ids, corr: int, slot: Slot, result: Result) -> None:
    if result.error is not None:  # e.g. the server had already ended it: nothing left open
        log.info("END of sequence %d: %s %s", corr, result.error.code, result.error.details)
    tracker.give_back(corr)
    engine.release(slot)


def new_ids(specs: list[SequenceSpec | None]) -> list[Ids | None]:
    """One id pool per sequence template, shared by the process's lanes and load models."""
    return [Ids(s, i) if s is not None else None for i, s in enumerate(specs)]


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
