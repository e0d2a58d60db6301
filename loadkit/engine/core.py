"""The engine: every inference of a process runs on one native thread, an asyncio loop that
sends through one door into Triton (transport/door.py: gRPC over one HTTP/2 connection, or
HTTP/REST over keep-alive connections).

Why not in the Locust user's greenlet: grpc under gevent cost several times perf_analyzer's
client CPU per inference (docs/performance.md). Each Locust user owns one *lane*: a coroutine on
the engine's loop that waits at the gate and runs the load model's lane runner (loads/, over
engine/host.py), a chain of callbacks over `send` and `count`; gevent never touches a
request. Latencies go into the HDR window on the engine thread, where they are measured;
completions reach Locust in batches.

The main thread (gevent hub: Locust, conductor, web UI) talks to the engine only through
`call_soon_threadsafe` (`on_loop` waits for an answer), thread-safe deques and
`threading.Event`s. The HDR window is read only on the engine thread, or after the gate drained.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from loadkit.engine.eventloop import new_event_loop
from loadkit.engine.pools import Pools
from loadkit.engine.slots import Completion, Done, Lane, Responses, Result, Slot
from loadkit.engine.streaming import CANCELLED_HERE, Read, StreamPolicy
from loadkit.record import Recorder, StepWindow
from loadkit.scenario import TargetSpec
from loadkit.transport.call import InferError
from loadkit.transport.door import Door
from loadkit.transport.doors import encoder_for, open_door

log = logging.getLogger("loadkit.engine")

WATCHDOG_S = 0.05
T = TypeVar("T")
# What a gate opening runs on each lane: the load model's runner bound to the lane interface
# (engine/host.py), until the gate closes or the lane stops
LaneTask = Callable[[Lane], Awaitable[None]]


class Engine:
    """Owns the thread, the loop, the door (its connections) and the lanes of one process."""

    def __init__(
        self,
        *,
        address: str,
        target: TargetSpec,
        pools: Sequence[Sequence[bytes]],
        names: Sequence[str],
        pick: Callable[[random.Random], int],
        recorder: Recorder,
        think_time_s: float = 0.0,
        method: str = "stream",  # target.transport: stream (ModelStreamInfer) or unary
        precise_timers: bool = False,
        streams: StreamPolicy | None = None,  # decoupled templates: how each is read
        random_order: Sequence[bool] | None = None,  # per template: `order: random`
    ):
        self.address = address
        self.target = target
        # the drive then gives it the expected outputs and a data set's sequences
        self.requests = Pools(pools, names, random_order)
        self.epoch = 0  # the drive bumps it at a new phase: open sequences end there
        self.streams = streams or StreamPolicy(list(names))
        self.names = list(names)
        self.pick = pick if len(pools) > 1 else (lambda _rng: 0)
        self.recorder = recorder
        self.think_time_s = think_time_s
        self.unary = method == "unary"
        self.precise_timers = precise_timers
        self.timeout_s = target.timeout_s
        self.timeout_ns = int(target.timeout_s * 1e9)
        self.inflight = 0
        self.completions: collections.deque[Completion] = collections.deque()
        self.drained = threading.Event()
        self._gate_open = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.gate: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self.lanes: set[Lane] = set()
        self._busy: set[Slot] = set()
        self.idle_slots: list[Slot] = []  # for requests no lane owns (engine/host.py)
        self.runner: LaneTask | None = None
        self.generation = 0
        self.door: Door | None = None  # opened on the engine's thread
        self.encoder = encoder_for(address, target)  # a sequence's flags (engine/host.py)
        self._stopped = False

    # ---- main-thread side ---------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._thread_main, name="loadkit-engine",
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the loadkit engine thread did not start")

    def _post(self, fn: Callable[..., Any], *args: Any) -> None:
        if self.loop is not None and not self._stopped:
            with contextlib.suppress(RuntimeError):  # the loop closed at shutdown
                self.loop.call_soon_threadsafe(fn, *args)

    def add_lane(self, rng: random.Random) -> Lane:
        self.start()
        lane = Lane(rng=rng)
        self._post(self._start_lane, lane)
        return lane

    def remove_lane(self, lane: Lane) -> None:
        """The lane finishes the request it has in flight (it is counted) and stops."""
        lane.stopping = True
        self._post(self._wake_lane, lane)

    def set_runner(self, runner: LaneTask) -> None:
        """The next gate opening runs every lane with this load model's runner."""
        self.runner = runner

    def on_loop(self, fn: Callable[[], T], timeout_s: float = 5.0) -> T | None:
        """`fn()` run on the engine thread, between two callbacks, and its result: the way to
        read what only that thread writes (the HDR window) while requests are in flight. None
        when the engine is stopped or did not answer within timeout_s. Before the thread has
        started nothing else runs, so fn runs here."""
        if self.loop is None:
            return fn()
        if self._stopped:
            return None
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller, raised there
                future.set_exception(exc)

        self._post(run)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            return None

    def live_copy(self) -> StepWindow | None:
        """A copy of the open window, made on the engine thread (None between windows)."""
        return self.on_loop(lambda: self.recorder.window and self.recorder.window.copy())

    def open_gate(self) -> None:
        self._gate_open = True
        self._post(self._set_gate, True)

    def close_gate(self) -> None:
        """Stop new sends; `drained` is set once nothing is in flight."""
        self._gate_open = False
        self.drained.clear()
        self._post(self._set_gate, False)
        if self.loop is None:
            self.drained.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Cancel every lane, close the channel, end the thread; never hangs past timeout_s."""
        if self._thread is None or self.loop is None or self._stopped:
            return
        done = threading.Event()
        self.loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._shutdown(done)))
        if not done.wait(timeout_s):
            log.warning("engine shutdown took over %.0f s; leaving its daemon thread", timeout_s)
        self._stopped = True
        self._thread.join(timeout_s)

    # ---- engine-thread side -------------------------------------------------------------
    def _thread_main(self) -> None:
        loop = new_event_loop(self.precise_timers)
        asyncio.set_event_loop(loop)
        self.loop = loop
        self.gate = asyncio.Event()
        if self._gate_open:
            self.gate.set()
        self.door = open_door(self.address, target=self.target, loop=loop, unary=self.unary)
        watchdog = loop.create_task(self._watchdog())
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            watchdog.cancel()
            loop.run_until_complete(asyncio.sleep(0))
            loop.close()

    async def _shutdown(self, done: threading.Event) -> None:
        try:
            for lane in list(self.lanes):
                lane.stopping = True
                if lane.task is not None:
                    lane.task.cancel()
            tasks = [lane.task for lane in self.lanes if lane.task is not None]
            if tasks:
                await asyncio.wait(tasks, timeout=5)
            assert self.door is not None
            self.door.close()
            await asyncio.sleep(0)  # the close frames leave
        finally:
            done.set()
            assert self.loop is not None
            self.loop.stop()

    def _set_gate(self, is_open: bool) -> None:
        assert self.gate is not None
        if is_open:
            self.generation += 1
            self.gate.set()
        else:
            self.gate.clear()
            if self.inflight == 0:
                self.drained.set()

    def _start_lane(self, lane: Lane) -> None:
        assert self.loop is not None
        self.lanes.add(lane)
        lane.task = self.loop.create_task(self._run_lane(lane))

    def _wake_lane(self, lane: Lane) -> None:
        """A stopping lane parked at the gate, in think time or between scheduled sends leaves
        at once (scheduled requests already sent run on as their own tasks and are counted)."""
        if lane.task is not None and (lane.slot.sent_ns == 0 or lane.scheduling):
            lane.task.cancel()

    async def _run_lane(self, lane: Lane) -> None:
        assert self.gate is not None
        gate = self.gate
        try:
            while not lane.stopping:
                if not gate.is_set():
                    await gate.wait()
                elif self.runner is None:
                    raise RuntimeError("the gate opened before a load model was set")
                else:
                    await self.runner(lane)
        except asyncio.CancelledError:
            pass
        finally:
            self.lanes.discard(lane)
            release = getattr(lane.state, "release", None)
            if release is not None:
                release()
            lane.slot.done = None  # a request cut off here is not counted (the user stopped)
            self._abandon(lane.slot, "CANCELLED", "the user stopped")

    def send(self, slot: Slot, payload: bytes, done: Done, streaming: int = Read.PLAIN) -> None:
        """(Engine thread.) Start one request on the slot through the door. `done(Result)` runs
        on the loop when it ends, however it ends (`streaming`: a decoupled model's request
        ends at its final response). Keeps `inflight`."""
        if slot.reply is None:
            slot.reply = functools.partial(self._reply, slot)
        if streaming:
            if slot.stream is None:
                slot.stream = Responses()
            slot.stream.reset(max(streaming, 0), streaming == Read.KEEP)
        else:
            slot.stream = None
        slot.decoupled = bool(streaming)
        self.inflight += 1
        self._busy.add(slot)
        slot.seq += 1
        slot.done = done
        slot.payload = payload
        slot.check = self.requests.take_check()
        slot.sent_ns = time.perf_counter_ns()
        assert self.door is not None
        self.door.put(slot, payload)

    def _reply(self, slot: Slot, message: bytes | None, error: InferError | None) -> None:
        """The slot's request ended: account for it, then tell whoever sent it.

        Latency runs from the send call to now, as perf_analyzer's runs from its client call to
        its callback, so both include the client's own framing. How much of it was loadkit's
        (h2's pure-Python framing before the socket write and after the socket read) is
        `own_us`, reported per step so a reader sees what the generator added."""
        door = self.door
        assert door is not None
        if error is not None and error.refused and slot.sent_ns:
            # the server did not take the request (over its limit as it counts): send again,
            # within the same deadline
            door.retry(slot)
            return
        end_ns = time.perf_counter_ns()
        stream = slot.stream
        if stream is not None and message is not None and not stream.take(message, end_ns,
                                                                      door.response_kind):
            if stream.cancel_after and stream.count >= stream.cancel_after and slot.call:
                error = CANCELLED_HERE  # the client's cancel: its stream is reset below
            elif slot.call is not None:  # more responses to come for this request
                door.more(slot)
                return
        sent_ns = slot.sent_ns
        latency_us = (end_ns - sent_ns) // 1000
        own_us = door.own_us(slot, latency_us, end_ns) if message is not None else 0
        slot.sent_ns = 0
        self._busy.discard(slot)
        self.inflight -= 1
        if self.inflight == 0 and self.gate is not None and not self.gate.is_set():
            self.drained.set()
        size = 0
        if message is not None:
            size = len(message)
            text = door.error_in(message)
            if text:
                error = InferError("INFER_ERROR", text)
            if error is None and slot.check is not None:
                error = self.requests.validate(door.outputs(slot, message), slot.check)
        done, slot.done = slot.done, None
        if stream is not None and error is not None:
            # responses may still come for the failed request: never on the next one's stream
            door.cancel(slot, InferError("CANCELLED", "dropped after a failed request"))
        if done is not None:
            done(Result(latency_us, size, error, end_ns, own_us) if stream is None
                 else stream.result(latency_us, size, error, end_ns, own_us, sent_ns))

    def count(self, name: str, window: StepWindow | None, latency_us: int,
              service_us: int | None, result: Result) -> None:
        """(Engine thread.) One finished request into the step's window (if one is open) and
        Locust's queue;
        `latency_us` is what is reported (from the scheduled send in an open loop),
        `service_us` the latency from the actual send where the two differ."""
        error = result.error
        if window is not None:
            if error is CANCELLED_HERE:
                window.cancelled[name] += 1  # asked for: counted apart, not an error
            elif error is None:
                window.record(name, latency_us, service_us)
                window.own_us += result.own_us
                if result.gaps is not None:  # a decoupled model's: first response as latency
                    window.streamed(name, result.first_us + latency_us - (service_us or
                                    latency_us), result.gaps, result.responses, latency_us,
                                    self.streams.goodput, self.streams.tokens(name, result,
                                                                               self._text_of))
            else:
                window.error(name, error.code, error.details)
        self.completions.append(Completion(template=name, latency_us=latency_us, size=result.size,
                                           error=error))

    def _text_of(self, message: bytes) -> bytes:
        assert self.door is not None
        return self.door.text_output(message)

    async def _watchdog(self) -> None:
        """Per-request deadlines: a late call is reset and fails as DEADLINE_EXCEEDED."""
        while True:
            await asyncio.sleep(WATCHDOG_S)
            now = time.perf_counter_ns()
            for slot in list(self._busy):
                if slot.sent_ns and now - slot.sent_ns > self.timeout_ns:
                    self._abandon(
                        slot, "DEADLINE_EXCEEDED", f"no response within {self.timeout_s:g} s"
                    )

    def _abandon(self, slot: Slot, code: str, details: str) -> None:
        """Reset the slot's call, if it has one (the stream is opened again on the next send);
        a request still waiting for its connection ends here."""
        seq = slot.seq
        if slot.stream_wait:
            details += (f" (it waited for a free HTTP/2 stream: the server allows "
                        f"{slot.stream_wait} at once on a connection)")
            slot.stream_wait = 0
        if self.door is not None:
            self.door.cancel(slot, InferError(code, details))
        # no call yet (connecting), or its waiter already cleared; not a request the cancel's
        # completion went on to send
        if slot.sent_ns and slot.seq == seq:
            self._reply(slot, None, InferError(code, details))
