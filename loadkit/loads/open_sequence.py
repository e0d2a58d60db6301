"""Open loop over stateful models: each scheduled arrival starts a sequence, and the
sequence's later requests go one at a time, each as soon as the one before it is answered (a
sequence never has two requests in flight). The number of open sequences is capped by
`max_concurrency` and by the correlation ids: an arrival that finds no room is dropped, as
any open-loop send that finds the cap is.

Accounting keeps `scheduled == sent + dropped`: an arrival is scheduled at its place in the
schedule, a later request of a sequence at the moment it is sent (so its latency is from its
send; the first request's is from its scheduled time, as every open-loop request's is).

A sequence still open when the gate closes (warm-up -> measured window, or the next step of
the same phase) goes on at the next opening instead of being left for the server to time out;
before a new phase the drive ends it with an END (loads/sequence.py end_dangling), and a
failed request makes the sequence's next request its last.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

from loadkit.engine.host import Host
from loadkit.engine.slots import Lane, Result, Slot
from loadkit.loads.sequence import Ids, answered, id_bytes, length, sequence_request
from loadkit.record import StepWindow
from loadkit.scenario import SequenceSpec


@dataclass(eq=False, kw_only=True)
class _Open:
    template: int
    left: int  # requests still to send
    corr: int
    ids: bytes
    started_ns: int
    epoch: int
    slot: Slot = field(default_factory=Slot)
    first: bool = True
    entry: int = -1  # a data set sequence's next entry (-1: the template's own order)
    failed: bool = False  # a request failed: the next one ends the sequence early


class OpenSequences:
    """One lane's open sequences in an open-loop step; kept on `lane.state` between openings."""

    def __init__(self, engine: Host, lane: Lane, specs: list[SequenceSpec | None],
                 ids: list[Ids | None]):
        self.engine = engine
        self.lane = lane
        self.specs = specs
        self.ids = ids
        self.open: set[_Open] = set()
        self.paused: list[_Open] = []  # open when the gate closed, not yet sent on
        self.cap = 1_000_000
        self.generation = 0

    def resume(self, cap: int) -> None:
        """At a gate opening: go on with the sequences the last closing left open."""
        self.cap = cap or 1_000_000
        self.generation = self.engine.generation
        paused, self.paused = self.paused, []
        for seq in paused:
            if seq.epoch != self.engine.epoch:
                self._drop(seq)
            else:
                self._send_next(seq)

    def arrive(self, i: int, scheduled_ns: int, window: StepWindow | None, late: bool) -> bool:
        """A scheduled arrival of template i: start a sequence (False: no room, dropped)."""
        spec, tracker = self.specs[i], self.ids[i]
        if len(self.open) >= self.cap or (tracker is not None and tracker.full):
            return False
        if spec is None or tracker is None:  # a plain template in the mix: one request
            seq = _Open(template=i, left=1, corr=0, ids=b"", started_ns=scheduled_ns,
                        epoch=self.engine.epoch)
        else:
            corr = tracker.take()
            data = self.engine.requests.next_sequence(i, self.lane.rng)
            seq = _Open(template=i, left=data[1] if data else length(spec, self.lane.rng),
                        corr=corr, ids=id_bytes(self.engine, spec, corr),
                        started_ns=scheduled_ns, epoch=self.engine.epoch,
                        entry=data[0] if data else -1)
        self.open.add(seq)
        self.engine.sent(window, i, late=late)
        self._send(seq, window, scheduled_ns)
        return True

    def _send(self, seq: _Open, window: StepWindow | None, scheduled_ns: int) -> None:
        engine = self.engine
        i = seq.template
        payload = sequence_request(engine, i, self.lane.rng, window, seq.entry, seq.ids,
                                   seq.first, seq.left == 1)
        if seq.entry >= 0:
            seq.entry += 1
        seq.first = False
        engine.send(seq.slot, payload, functools.partial(self._finished, seq, window,
                                                         scheduled_ns), engine.streams.streaming[i])

    def _send_next(self, seq: _Open) -> None:
        window = self.engine.window()
        self.engine.scheduled(window)
        self.engine.sent(window)
        self._send(seq, window, time.perf_counter_ns())

    def _finished(self, seq: _Open, window: StepWindow | None, scheduled_ns: int,
                  result: Result) -> None:
        engine = self.engine
        name = engine.names[seq.template]
        engine.count(name, window, (result.end_ns - scheduled_ns) // 1000, result.latency_us,
                     result)
        seq.left -= 1
        if result.error is not None and seq.ids and seq.left > 0:
            seq.left, seq.failed = 1, True  # the server may still hold it: END it next
        elif result.error is not None and seq.ids and not answered(result):
            seq.left, seq.entry = 1, max(seq.entry - 1, -1)
            self._drop(seq)  # its END may not have arrived: end_dangling sends it again
            return
        elif result.error is not None or seq.left == 0:
            if result.error is None and seq.ids and not seq.failed:
                engine.sequence_done(window, seq.template, (result.end_ns - seq.started_ns) // 1000)
            self._close(seq)
            return
        if not self._may_send():
            self.paused.append(seq)
        elif engine.think_time_s > 0:
            assert engine.loop is not None
            engine.loop.call_later(engine.think_time_s, self._send_or_pause, seq)
        else:
            self._send_next(seq)

    def _may_send(self) -> bool:
        """The gate this lane's schedule runs under is still open."""
        gate = self.engine.gate
        return (gate is not None and gate.is_set() and not self.lane.stopping
                and self.generation == self.engine.generation)

    def _send_or_pause(self, seq: _Open) -> None:
        if self._may_send():
            self._send_next(seq)
        else:
            self.paused.append(seq)

    def _close(self, seq: _Open) -> None:
        tracker = self.ids[seq.template]
        if seq.ids and tracker is not None:
            tracker.give_back(seq.corr)
        self.open.discard(seq)

    def _drop(self, seq: _Open) -> None:
        """Let the sequence go without its END (end_dangling sends it)."""
        tracker = self.ids[seq.template]
        if seq.ids and tracker is not None:
            tracker.drop(seq.corr, seq.entry)
        self.open.discard(seq)

    def drop(self) -> None:
        """Let every open sequence go (the lane ends, a phase or the run ends): the drive's
        end_dangling sends their ENDs."""
        for seq in (*self.open, *self.paused):
            self._drop(seq)
        self.paused = []

    release = drop


def open_sequences(engine: Host, lane: Lane,
                   specs: list[SequenceSpec | None] | None,
                   ids: list[Ids | None] | None) -> OpenSequences | None:
    """The lane's open sequences (made on first use), or None for a mix without sequences."""
    if specs is None or ids is None:
        return None
    if not isinstance(lane.state, OpenSequences):
        release = getattr(lane.state, "release", None)
        if release is not None:
            release()  # a closed-loop sequence left open by the last phase
        lane.state = OpenSequences(engine, lane, specs, ids)
    return lane.state

