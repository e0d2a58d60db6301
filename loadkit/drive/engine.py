"""The engine: every inference of a process runs on one native thread, an asyncio loop that
speaks gRPC over one HTTP/2 connection (wire.py).

Why not in the Locust user's greenlet: grpc under gevent (`init_gevent`) cost ~330 µs of client
CPU per inference on the bench, ~3.5x perf_analyzer, and on a shared 2-core box every client
microsecond is taken from the server under test (grpc.aio on this thread still cost 150-330 µs;
wire.py's framing brought it under perf_analyzer's). Here each Locust user owns one *lane*: a
coroutine on the engine's asyncio loop that sends that user's requests back to back. The user's
greenlet only opens and closes its lane, so gevent never touches a request; completions reach
Locust's statistics in batches (`pump`), and latencies go into the HDR window on the engine
thread, where they are measured.

Thread boundaries are explicit: the main thread (gevent hub: Locust, conductor, web UI) talks to
the engine only through `call_soon_threadsafe`, thread-safe deques and `threading.Event`s.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import selectors
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tritonclient.grpc import service_pb2

from loadkit.drive.wire import Call, Connection, InferError, Wire, frame
from loadkit.plan import Arrivals
from loadkit.record import Recorder
from loadkit.scenario import TargetSpec

log = logging.getLogger("loadkit.engine")

MODEL_INFER = b"/inference.GRPCInferenceService/ModelInfer"
MODEL_STREAM_INFER = b"/inference.GRPCInferenceService/ModelStreamInfer"
WATCHDOG_S = 0.05
ERROR_FIELD_TAG = b"\x0a"  # ModelStreamInferResponse field 1 (error_message), serialized first


@dataclass(frozen=True)
class Completion:
    """One finished request, as Locust's statistics need it."""

    template: str
    latency_us: int
    size: int
    error: InferError | None


@dataclass(eq=False)
class Slot:
    """Room for one request in flight: its call (a stream kept open, or one unary call), the
    connection the call is on, and its send time."""

    call: Call | None = None
    conn: Connection | None = None
    sent_ns: int = 0


@dataclass(eq=False)
class Lane:
    """One Locust user on the engine: a closed loop, or in an open-loop step the schedule."""

    rng: random.Random
    stopping: bool = False
    task: asyncio.Task[None] | None = None
    slot: Slot = field(default_factory=Slot)
    scheduling: bool = False


def new_event_loop(precise_timers: bool) -> asyncio.AbstractEventLoop:
    """uvloop for closed loops: its C event loop cut the CPU per request at one request in
    flight by ~15% on the bench. Its timers tick in whole milliseconds, though (so does epoll's
    timeout), which bunched an open loop's sends two by two at 2000/s and doubled the server's
    p50; an open loop gets the standard loop over select(), whose timeouts are in microseconds.
    """
    if precise_timers:
        return asyncio.SelectorEventLoop(selectors.SelectSelector())
    try:
        import uvloop
    except ImportError:  # no wheel for this platform; the standard loop works the same
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class Engine:
    """Owns the thread, the loop, the connection (Wire) and the lanes of one process."""

    def __init__(
        self,
        address: str,
        target: TargetSpec,
        payloads: Sequence[bytes],
        names: Sequence[str],
        pick: Callable[[random.Random], int],
        recorder: Recorder,
        think_time_s: float = 0.0,
        transport: str = "stream",
        precise_timers: bool = False,
    ):
        self.address = address
        self.target = target
        self.payloads = [frame(p) for p in payloads]
        self.names = list(names)
        self.pick = pick if len(self.payloads) > 1 else (lambda _rng: 0)
        self.recorder = recorder
        self.think_time_s = think_time_s
        self.transport = transport
        self.precise_timers = precise_timers
        self.timeout_s = target.timeout_s
        self.timeout_ns = int(target.timeout_s * 1e9)
        self.inflight = 0
        self.completions: collections.deque[Completion] = collections.deque()
        self.drained = threading.Event()
        self._gate_open = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._gate: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._lanes: set[Lane] = set()
        self._busy: set[Slot] = set()
        self._idle_slots: list[Slot] = []
        self.arrivals: Arrivals | None = None
        self._generation = 0
        self._wire: Wire | None = None
        self._stopped = False

    # ---- main-thread side ---------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._thread_main, name="loadkit-engine", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the loadkit engine thread did not start")

    def _post(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._loop is None or self._stopped:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed at shutdown
            self._loop.call_soon_threadsafe(fn, *args)

    def add_lane(self, rng: random.Random) -> Lane:
        self.start()
        lane = Lane(rng)
        self._post(self._start_lane, lane)
        return lane

    def remove_lane(self, lane: Lane) -> None:
        """The lane finishes the request it has in flight (it is counted) and stops."""
        lane.stopping = True
        self._post(self._wake_lane, lane)

    def set_arrivals(self, arrivals: Arrivals | None) -> None:
        """The next gate opening runs this schedule or, with None, closed loops."""
        self.arrivals = arrivals

    def open_gate(self) -> None:
        self._gate_open = True
        self._post(self._set_gate, True)

    def close_gate(self) -> None:
        """Stop new sends; `drained` is set once nothing is in flight."""
        self._gate_open = False
        self.drained.clear()
        self._post(self._set_gate, False)
        if self._loop is None:
            self.drained.set()

    def pump(self, fire: Callable[..., Any], limit: int = 100_000) -> int:
        """Hand finished requests to Locust's request event (main thread); returns how many."""
        q = self.completions
        n = 0
        while q and n < limit:
            c = q.popleft()
            n += 1
            fire(
                request_type="grpc",
                name=c.template,
                response_time=c.latency_us / 1000.0,
                response_length=c.size,
                exception=c.error,
                context=None,
            )
        return n

    def stop(self, timeout_s: float = 10.0) -> None:
        """Cancel every lane, close the channel, end the thread; never hangs past timeout_s."""
        if self._thread is None or self._loop is None or self._stopped:
            return
        done = threading.Event()
        self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._shutdown(done)))
        if not done.wait(timeout_s):
            log.warning("engine shutdown took over %.0f s; leaving its daemon thread", timeout_s)
        self._stopped = True
        self._thread.join(timeout_s)

    # ---- engine-thread side -------------------------------------------------------------
    def _thread_main(self) -> None:
        loop = new_event_loop(self.precise_timers)
        asyncio.set_event_loop(loop)
        self._loop = loop
        self._gate = asyncio.Event()
        if self._gate_open:
            self._gate.set()
        self._wire = Wire(self.address, self.target)
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
            for lane in list(self._lanes):
                lane.stopping = True
                if lane.task is not None:
                    lane.task.cancel()
            tasks = [lane.task for lane in self._lanes if lane.task is not None]
            if tasks:
                await asyncio.wait(tasks, timeout=5)
            assert self._wire is not None
            self._wire.close()
            await asyncio.sleep(0)  # the close frames leave
        finally:
            done.set()
            assert self._loop is not None
            self._loop.stop()

    def _set_gate(self, is_open: bool) -> None:
        assert self._gate is not None
        if is_open:
            self._generation += 1
            self._gate.set()
        else:
            self._gate.clear()
            if self.inflight == 0:
                self.drained.set()

    def _start_lane(self, lane: Lane) -> None:
        assert self._loop is not None
        self._lanes.add(lane)
        lane.task = self._loop.create_task(self._run_lane(lane))

    def _wake_lane(self, lane: Lane) -> None:
        """A stopping lane parked at the gate, in think time or between scheduled sends leaves
        at once (scheduled requests already sent run on as their own tasks and are counted)."""
        if lane.task is not None and (lane.slot.sent_ns == 0 or lane.scheduling):
            lane.task.cancel()

    async def _run_lane(self, lane: Lane) -> None:
        assert self._gate is not None
        gate = self._gate
        names, payloads, pick, rng = self.names, self.payloads, self.pick, lane.rng
        think = self.think_time_s
        recorder = self.recorder
        try:
            while not lane.stopping:
                if not gate.is_set():
                    await gate.wait()
                    continue
                if self.arrivals is not None:
                    await self._run_schedule(lane, self.arrivals)
                    continue
                i = pick(rng)
                window = recorder.window
                latency_us, size, error = await self._send(lane.slot, payloads[i])
                name = names[i]
                if window is not None:
                    if error is None:
                        window.record(name, latency_us)
                    else:
                        window.error(name, error.code)
                self.completions.append(Completion(name, latency_us, size, error))
                if think > 0 and not lane.stopping:
                    await asyncio.sleep(think)
        except asyncio.CancelledError:
            pass
        finally:
            self._lanes.discard(lane)
            _abandon(lane.slot, "CANCELLED", "the user stopped")

    async def _send(self, slot: Slot, payload: bytes) -> tuple[int, int, InferError | None]:
        """One request; (latency µs from the send, response bytes, error). Keeps `inflight`."""
        gate = self._gate
        assert gate is not None
        self.inflight += 1
        self._busy.add(slot)
        error: InferError | None = None
        size = 0
        slot.sent_ns = t0 = time.perf_counter_ns()
        try:
            size = await self._infer(slot, payload)
        except InferError as exc:
            error = exc
        finally:
            latency_us = (time.perf_counter_ns() - t0) // 1000
            slot.sent_ns = 0
            self._busy.discard(slot)
            self.inflight -= 1
            if self.inflight == 0 and not gate.is_set():
                self.drained.set()
        return latency_us, size, error

    async def _run_schedule(self, lane: Lane, arrivals: Arrivals) -> None:
        """Send on a schedule fixed in advance until the gate closes or reopens.

        The schedule restarts at every gate opening (warm-up, then the measured window) and is
        seeded, so two runs send the same sequence. A send that finds `max_concurrency` requests
        in flight is dropped, one later than the tolerance is late; both are counted.
        """
        gate = self._gate
        assert gate is not None
        generation = self._generation
        rng = random.Random(arrivals.seed * 7_919 + generation)
        poisson = arrivals.arrival == "poisson"
        mean_ns = 1e9 / arrivals.rate
        cap = arrivals.max_concurrency or 1_000_000
        tolerance_ns = arrivals.late_tolerance_s * 1e9
        names, payloads, pick = self.names, self.payloads, self.pick
        recorder = self.recorder
        in_flight: set[asyncio.Task[None]] = set()
        next_ns = float(time.perf_counter_ns())
        lane.scheduling = True
        try:
            while gate.is_set() and generation == self._generation and not lane.stopping:
                delay = (next_ns - time.perf_counter_ns()) / 1e9
                if delay > 0:
                    await asyncio.sleep(delay)
                    if not gate.is_set() or generation != self._generation or lane.stopping:
                        break
                i = pick(lane.rng)
                window = recorder.window
                scheduled_ns = int(next_ns)
                next_ns += rng.expovariate(1.0) * mean_ns if poisson else mean_ns
                if len(in_flight) >= cap:
                    if window is not None:
                        window.dropped[names[i]] += 1
                    continue
                if window is not None and time.perf_counter_ns() - scheduled_ns > tolerance_ns:
                    window.late[names[i]] += 1
                task = asyncio.get_running_loop().create_task(
                    self._scheduled(i, payloads[i], scheduled_ns, window)
                )
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
        finally:
            lane.scheduling = False

    async def _scheduled(self, i: int, payload: bytes, scheduled_ns: int, window: Any) -> None:
        slot = self._idle_slots.pop() if self._idle_slots else Slot()
        latency_us, size, error = await self._send(slot, payload)
        self._idle_slots.append(slot)
        from_schedule_us = (time.perf_counter_ns() - scheduled_ns) // 1000
        name = self.names[i]
        if window is not None:
            if error is None:
                window.record(name, from_schedule_us, latency_us)
            else:
                window.error(name, error.code)
        self.completions.append(Completion(name, from_schedule_us, size, error))

    async def _infer(self, slot: Slot, payload: bytes) -> int:
        """One request: on the slot's own bidirectional stream (opened on first use, and again
        after a deadline, a reset or a lost connection), or with `unary` as one ModelInfer call."""
        unary = self.transport == "unary"
        call, conn = slot.call, slot.conn
        if unary or call is None or conn is None or call.ended:
            assert self._wire is not None
            conn = slot.conn = await self._wire.connection()
            call = slot.call = conn.open(MODEL_INFER if unary else MODEL_STREAM_INFER, unary)
        try:
            conn.send(call, payload, end_stream=unary)
            response = await call.next_message()
        except asyncio.CancelledError:
            _abandon(slot, "CANCELLED", "the user stopped")
            raise
        if unary:
            slot.call = None
        elif response[:1] == ERROR_FIELD_TAG:
            message = service_pb2.ModelStreamInferResponse.FromString(response).error_message
            if message:
                raise InferError("INFER_ERROR", message)
        return len(response)

    async def _watchdog(self) -> None:
        """Per-request deadlines: a late call is reset and fails as DEADLINE_EXCEEDED."""
        while True:
            await asyncio.sleep(WATCHDOG_S)
            now = time.perf_counter_ns()
            for slot in list(self._busy):
                if slot.sent_ns and now - slot.sent_ns > self.timeout_ns:
                    _abandon(slot, "DEADLINE_EXCEEDED", f"no response within {self.timeout_s:g} s")


def _abandon(slot: Slot, code: str, details: str) -> None:
    """Reset the slot's call, if it has one; the stream is opened again on the next send."""
    if slot.call is not None and slot.conn is not None:
        slot.conn.cancel(slot.call, InferError(code, details))
    slot.call = None
