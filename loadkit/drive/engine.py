"""The engine: every inference of a process runs on one native thread, an asyncio loop that
speaks gRPC over one HTTP/2 connection (wire.py).

Why not in the Locust user's greenlet: grpc under gevent (`init_gevent`) cost ~330 µs of client
CPU per inference on the bench, ~3.5x perf_analyzer, and on a shared 2-core box every client
microsecond is taken from the server under test (grpc.aio on this thread still cost 150-330 µs;
wire.py's framing brought it under perf_analyzer's). Here each Locust user owns one *lane*: a
coroutine on the engine's asyncio loop that waits at the gate and runs the user's requests as a
chain of callbacks (closed loop: back to back; open loop: on a schedule). The user's
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
import functools
import logging
import random
import selectors
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tritonclient.grpc import service_pb2

from loadkit.drive.timer import PreciseTimer
from loadkit.drive.wire import Call, Connection, InferError, Reply, StreamsFull, Wire, frame
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


# (latency µs, response bytes, error, end ns, of the latency µs spent in loadkit's framing)
Result = tuple[int, int, InferError | None, int, int]
Done = Callable[[Result], None]


@dataclass(eq=False)
class Slot:
    """Room for one request in flight: its call (a stream kept open, or one unary call), the
    connection the call is on, its send time, and who hears how it ended."""

    call: Call | None = None
    conn: Connection | None = None
    sent_ns: int = 0
    seq: int = 0  # which request the slot carries, so a late connect never sends a stale one
    done: Done | None = None
    reply: Reply | None = None  # the Call waiter for this slot, bound once (Engine._reply)
    stream_wait: int = 0  # waiting for a free HTTP/2 stream: the server's limit, else 0
    payload: bytes = b""  # the request in flight, sent again if the server refuses its stream


@dataclass(eq=False)
class Lane:
    """One Locust user on the engine: a closed loop, or in an open-loop step the schedule."""

    rng: random.Random
    stopping: bool = False
    task: asyncio.Task[None] | None = None
    slot: Slot = field(default_factory=Slot)
    scheduling: bool = False


def new_event_loop(precise_timers: bool) -> asyncio.AbstractEventLoop:
    """uvloop: its C event loop cut the CPU per request at one request in flight by ~15% on
    the bench. Its timers tick in whole milliseconds, though (so does epoll's timeout), which
    bunched an open loop's sends two by two at 2000/s and doubled the server's p50: an open
    loop wakes on a timerfd instead (drive/timer.py), and where there is none it gets the
    standard loop over select(), whose timeouts are in microseconds.
    """
    if precise_timers and not PreciseTimer.available():
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
        try:
            while not lane.stopping:
                if not gate.is_set():
                    await gate.wait()
                elif self.arrivals is not None:
                    await self._run_schedule(lane, self.arrivals)
                else:
                    await self._run_closed(lane)
        except asyncio.CancelledError:
            pass
        finally:
            self._lanes.discard(lane)
            lane.slot.done = None  # a request cut off here is not counted (the user stopped)
            self._abandon(lane.slot, "CANCELLED", "the user stopped")

    async def _run_closed(self, lane: Lane) -> None:
        """Send the lane's requests back to back until the gate closes or the lane stops.

        A chain of callbacks, not a coroutine step per request: the next request leaves from
        the completion of the last one, inside the read that brought the reply, and so in the
        write that ends that read (wire.py flushes there). A task and a future per request
        cost two event-loop iterations between a reply and the next send (~15 µs at one in
        flight, 10% of loadkit's time per request there). After a failure the next request
        waits one iteration: a deadline's cancel must finish with the slot first."""
        gate, loop = self._gate, self._loop
        assert gate is not None and loop is not None
        names, payloads, pick, rng = self.names, self.payloads, self.pick, lane.rng
        think, recorder = self.think_time_s, self.recorder
        slot = lane.slot
        over: asyncio.Future[None] = loop.create_future()
        pause: asyncio.TimerHandle | None = None

        def send_next() -> None:
            if lane.stopping or not gate.is_set():
                if not over.done():
                    over.set_result(None)
                return
            i = pick(rng)
            window = recorder.window
            if window is not None:
                window.sent += 1
            self._send(slot, payloads[i], functools.partial(finished, i, window))

        def finished(i: int, window: Any, result: Result) -> None:
            nonlocal pause
            error = result[2]
            self._count(names[i], window, result[0], None, result)
            if think > 0:
                pause = loop.call_later(think, send_next)
            elif error is None:
                send_next()
            else:
                # Failures end inside a cancel, a reset, a lost connection or the send itself,
                # whose callers still hold the slot: the next request waits one iteration.
                loop.call_soon(send_next)

        send_next()
        try:
            await over
        finally:
            if pause is not None:
                pause.cancel()

    def _send(self, slot: Slot, payload: bytes, done: Done) -> None:
        """Start one request on the slot: on its own bidirectional stream (opened on first use,
        and again after a deadline, a reset or a lost connection), or with `unary` as one
        ModelInfer call. `done(Result)` runs on the loop when it ends, however it ends. Keeps
        `inflight`."""
        if slot.reply is None:
            slot.reply = functools.partial(self._reply, slot)
        self.inflight += 1
        self._busy.add(slot)
        slot.seq += 1
        slot.done = done
        slot.payload = payload
        slot.sent_ns = time.perf_counter_ns()
        assert self._wire is not None and self._loop is not None
        conn = self._wire.live()
        if conn is None:
            self._loop.create_task(self._connect_and_put(slot, slot.seq, payload))
        else:
            self._put(slot, conn, payload)

    async def _connect_and_put(self, slot: Slot, seq: int, payload: bytes) -> None:
        assert self._wire is not None
        try:
            conn = await self._wire.connection()
        except InferError as exc:
            if slot.seq == seq and slot.sent_ns:
                self._reply(slot, None, exc)
            return
        except asyncio.CancelledError:
            if slot.seq == seq and slot.sent_ns:
                self._reply(slot, None, InferError("CANCELLED", "loadkit stopped"))
            raise
        if slot.seq == seq and slot.sent_ns:  # not abandoned while connecting
            self._put(slot, conn, payload)

    def _put(self, slot: Slot, conn: Connection, payload: bytes) -> None:
        unary = self.transport == "unary"
        call = slot.call
        if unary or call is None or call.ended or slot.conn is not conn:
            if call is not None and slot.conn is not None and not call.ended:
                slot.conn.cancel(call, InferError("CANCELLED", "moved to a new connection"))
            try:
                call = conn.open(MODEL_INFER if unary else MODEL_STREAM_INFER, unary)
            except StreamsFull:  # as a grpc call does, wait for a stream the server frees
                slot.call, slot.stream_wait = None, conn.stream_limit
                conn.wait_stream(functools.partial(self._retry_put, slot, slot.seq))
                return
            except InferError as exc:
                slot.call = None
                self._reply(slot, None, exc)
                return
            slot.call, slot.conn, slot.stream_wait = call, conn, 0
        conn.send(call, payload, end_stream=unary)
        call.wait(slot.reply)

    def _retry_put(self, slot: Slot, seq: int) -> None:
        """A stream was freed (or the connection is going away): send the waiting request on
        the live connection, unless its deadline abandoned it meanwhile."""
        assert self._wire is not None and self._loop is not None
        conn = self._wire.live()
        if slot.seq != seq or not slot.sent_ns:
            if conn is not None:
                conn.release_waiting()  # the stream it was woken for goes to the next one
            return
        if conn is None:
            self._loop.create_task(self._connect_and_put(slot, seq, slot.payload))
        else:
            self._put(slot, conn, slot.payload)

    def _reply(self, slot: Slot, message: bytes | None, error: InferError | None) -> None:
        """The slot's request ended: account for it, then tell whoever sent it.

        Latency runs from the send call to now, as perf_analyzer's runs from its client call to
        its callback, so both include the client's own framing. How much of it was loadkit's
        (h2's pure-Python framing before the socket write and after the socket read) is
        `own_us`, reported per step so a reader sees what the generator added."""
        if error is not None and error.refused and slot.sent_ns:
            # the server did not take the stream (over its limit as it counts): send again on
            # a new stream, within the same deadline
            slot.call = None
            assert self._loop is not None
            self._loop.call_soon(self._retry_put, slot, slot.seq)
            return
        end_ns = time.perf_counter_ns()
        latency_us = (end_ns - slot.sent_ns) // 1000
        own_us = 0
        call, conn = slot.call, slot.conn
        if message is not None and call is not None and call.tx_ns >= slot.sent_ns:
            rx_ns = conn.rx_ns if conn is not None and conn.rx_ns > call.tx_ns else end_ns
            own_us = latency_us - (rx_ns - call.tx_ns) // 1000
        slot.sent_ns = 0
        self._busy.discard(slot)
        self.inflight -= 1
        if self.inflight == 0 and self._gate is not None and not self._gate.is_set():
            self.drained.set()
        size = 0
        if message is not None:
            size = len(message)
            if message[:1] == ERROR_FIELD_TAG and self.transport != "unary":
                text = service_pb2.ModelStreamInferResponse.FromString(message).error_message
                if text:
                    error = InferError("INFER_ERROR", text)
        done, slot.done = slot.done, None
        if done is not None:
            done((latency_us, size, error, end_ns, own_us))

    async def _run_schedule(self, lane: Lane, arrivals: Arrivals) -> None:
        """Send on a schedule fixed in advance until the gate closes or reopens.

        The schedule restarts at every gate opening (warm-up, then the measured window) and is
        seeded, so two runs send the same sequence. A send that finds `max_concurrency` requests
        in flight is dropped, one later than the tolerance is late; both are counted. Sends are
        timer callbacks, not a task per request: all that are due go out in one wake-up.
        """
        gate, loop = self._gate, self._loop
        assert gate is not None and loop is not None
        generation = self._generation
        rng = random.Random(arrivals.seed * 7_919 + generation)
        poisson = arrivals.arrival == "poisson"
        mean_ns = 1e9 / arrivals.rate
        cap = arrivals.max_concurrency or 1_000_000
        tolerance_ns = arrivals.late_tolerance_s * 1e9
        names, payloads, pick, recorder = self.names, self.payloads, self.pick, self.recorder
        idle, wire = self._idle_slots, self._wire
        assert wire is not None
        in_flight = 0
        next_ns = float(time.perf_counter_ns())
        over: asyncio.Future[None] = loop.create_future()
        handle: asyncio.TimerHandle | None = None

        def tick() -> None:
            nonlocal next_ns, in_flight, handle
            if not gate.is_set() or generation != self._generation or lane.stopping:
                if not over.done():
                    over.set_result(None)
                return
            now = time.perf_counter_ns()
            conn = wire.live()
            if conn is not None:
                conn.corked = True  # the sends below leave in one write, in this iteration
            while next_ns <= now:
                i = pick(lane.rng)
                window = recorder.window
                scheduled_ns = int(next_ns)
                next_ns += rng.expovariate(1.0) * mean_ns if poisson else mean_ns
                if window is not None:
                    window.scheduled += 1
                if in_flight >= cap:
                    if window is not None:
                        window.dropped[names[i]] += 1
                    continue
                if window is not None:
                    window.sent += 1
                    if now - scheduled_ns > tolerance_ns:
                        window.late[names[i]] += 1
                slot = idle.pop() if idle else Slot()
                in_flight += 1
                self._send(slot, payloads[i], functools.partial(
                    finished, slot, names[i], scheduled_ns, window))
            if conn is not None:
                conn.corked = False
                conn.flush()
            delay = (next_ns - time.perf_counter_ns()) / 1e9
            if precise is not None:
                precise.call_later(delay)
            else:
                handle = loop.call_later(delay, tick)

        def finished(slot: Slot, name: str, scheduled_ns: int, window: Any,
                     result: Result) -> None:
            nonlocal in_flight
            in_flight -= 1
            idle.append(slot)
            from_schedule_us = (result[3] - scheduled_ns) // 1000
            self._count(name, window, from_schedule_us, result[0], result)

        precise = PreciseTimer.create(loop, tick)
        lane.scheduling = True
        tick()
        try:
            await over
        finally:
            lane.scheduling = False
            if precise is not None:
                precise.close()
            if handle is not None:
                handle.cancel()

    def _count(self, name: str, window: Any, latency_us: int, service_us: int | None,
               result: Result) -> None:
        """One finished request into the step's window (if one is open) and Locust's queue;
        `latency_us` is what is reported (from the scheduled send in an open loop),
        `service_us` the latency from the actual send where the two differ."""
        error = result[2]
        if window is not None:
            if error is None:
                window.record(name, latency_us, service_us)
                window.own_us += result[4]
            else:
                window.error(name, error.code, error.details)
        self.completions.append(Completion(name, latency_us, result[1], error))

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
        call, conn, slot.call = slot.call, slot.conn, None
        seq = slot.seq
        if slot.stream_wait:
            details += (f" (it waited for a free HTTP/2 stream: the server allows "
                        f"{slot.stream_wait} at once on a connection)")
            slot.stream_wait = 0
        if call is not None and conn is not None:
            conn.cancel(call, InferError(code, details))
        # no call yet (connecting), or its waiter already cleared; not a request the cancel's
        # completion went on to send
        if slot.sent_ns and slot.seq == seq:
            self._reply(slot, None, InferError(code, details))
