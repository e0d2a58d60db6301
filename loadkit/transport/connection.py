"""One HTTP/2 connection carrying gRPC calls (the h2 library), as a protocol on the engine's loop.

Why hand-framed and not grpc.aio: see wire.py's docstring. This module keeps the HTTP/2 rules to h2
(settings, flow control, HPACK, pings) and maps gRPC onto it:
- `ModelStreamInfer`: one stream per slot, kept open, one message out and one message back;
- `ModelInfer`: one stream per request, `grpc-status` read from the trailers.
Errors carry grpc's status names, as the report counts them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
import urllib.parse
from collections.abc import Callable
from typing import Any, cast

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from loadkit.scenario import TargetSpec
from loadkit.transport.call import (
    HTTP_STATUS,
    STATUS_NAMES,
    Call,
    InferError,
    StreamsFull,
    _reset_status,
)

WINDOW = 1 << 24  # receive window per stream and for the connection: responses never wait for us
BACKOFF_S = (0.2, 2.0)  # first and longest wait between connection attempts (as grpc's channel)
# HTTP/2 stream ids are odd 31-bit numbers: a connection has 2^30 of them. Long before the last,
# the Wire moves new calls to a fresh connection and lets the old one finish what it carries.
STREAMS_PER_CONNECTION = (1 << 30) - (1 << 16)


class _TolerantH2(h2.connection.H2Connection):
    """Triton 2.51 sends a DEADLINE_EXCEEDED trailers frame again on a stream that has already
    ended; grpc's own client ignores it, while h2 (by RFC 9113) would end the whole connection
    and with it every request in flight. A stray frame on any closed stream is treated as one on
    a reset stream: answered with RST_STREAM and dropped."""

    def _stream_is_closed_by_reset(self, stream_id: int) -> bool:
        return self._stream_closed_by(stream_id) is not None

    def _receive_goaway_frame(self, frame: Any) -> tuple[list[Any], list[Any]]:
        """h2 closes the whole connection on a GOAWAY; grpc (RFC 9113, 6.8) lets the streams
        up to its last_stream_id finish. The connection stays open here for them; the Connection
        opens nothing new on it, fails the streams above the id and closes when the rest end."""
        event = h2.events.ConnectionTerminated()
        event.error_code = h2.errors._error_code_from_int(frame.error_code)
        event.last_stream_id = frame.last_stream_id
        event.additional_data = frame.additional_data or None
        return [], [event]


class Connection(asyncio.Protocol):
    """One HTTP/2 connection to the target: its h2 state, its streams, coalesced writes."""

    def __init__(self, authority: str, target: TargetSpec):
        config = h2.config.H2Configuration(
            client_side=True, header_encoding=None, validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )
        self.h2 = _TolerantH2(config)
        self.h2.local_settings = h2.settings.Settings(
            client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW}
        )
        base = [
            (b":method", b"POST"), (b":scheme", b"https" if target.tls else b"http"),
            (b":authority", authority.encode()),
            (b"content-type", b"application/grpc"), (b"te", b"trailers"),
            (b"user-agent", b"loadkit"),
            *[(k.encode(), v.encode()) for k, v in target.headers],
        ]
        self.base_headers = base
        self.unary_extra = [(b"grpc-timeout", f"{max(1, int(target.timeout_s * 1000))}m".encode())]
        self.calls: dict[int, Call] = {}
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.max_message = target.max_message_bytes
        self.goaway = ""  # the server said it will close this connection (why); nothing new here
        self.waiting: collections.deque[Callable[[], None]] = collections.deque()  # for a stream
        self._loop = asyncio.get_running_loop()
        # the server's first SETTINGS (its stream limit among them): calls start after it
        self.settled: asyncio.Future[None] = self._loop.create_future()
        self.opened = 0
        self.retiring = False
        self.corked = False  # set while a caller makes several sends it will flush() itself
        self._flush_soon = False
        self.rx_ns = 0  # when the bytes being handled now came off the socket
        self._rx_tail = b""  # the start of a frame the next read completes
        self._unacked = 0  # connection-level bytes taken on the fast path, not yet handed back
        self._raw_out: list[bytes] = []  # WINDOW_UPDATE frames for the fast path's bytes
        self._unstamped: list[Call] = []  # calls whose message waits for the next write

    # ---- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(WINDOW)
        self.flush()

    def data_received(self, data: bytes) -> None:
        """Split the bytes into whole frames: a plain DATA frame on a live call (every response
        message) goes straight to its call, the rest through h2, in order: h2's own handling of
        every response's DATA frame was the largest cost per request (docs/performance.md)."""
        self.rx_ns = time.perf_counter_ns()
        buf = self._rx_tail + data if self._rx_tail else data
        calls, end, pos, slow = self.calls, len(buf), 0, 0
        while pos + 9 <= end:
            length = int.from_bytes(buf[pos : pos + 3], "big")
            nxt = pos + 9 + length
            if nxt > end:
                break
            # type DATA, no END_STREAM (0x1) or PADDED (0x8) flag: gRPC's messages
            if buf[pos + 3] == 0 and not buf[pos + 4] & 0x9 and length:
                call = calls.get(int.from_bytes(buf[pos + 5 : pos + 9], "big") & 0x7FFFFFFF)
                if call is not None and not call.ended:
                    if slow < pos and not self._h2_receive(buf[slow:pos]):
                        return
                    slow = nxt
                    self._taken(call, length)
                    error = call.feed(buf[pos + 9 : nxt])
                    if error is not None:
                        self.cancel(call, error)
                        if self.closed:
                            return
            pos = nxt
        self._rx_tail = buf[pos:]
        if slow < pos and not self._h2_receive(buf[slow:pos]):
            return
        self.flush()  # now, not one loop iteration (a select() call) later
        if self.retiring and not self.calls:
            self.close()

    def _taken(self, call: Call, n: int) -> None:
        """Flow control for the fast path (h2 never saw these bytes): hand the window back
        once half of it is used, as h2 does."""
        self._unacked += n
        call.unacked += n
        if self._unacked >= WINDOW // 2:
            self._raw_out.append(_window_update(0, self._unacked))
            self._unacked = 0
        if call.unacked >= WINDOW // 2:
            self._raw_out.append(_window_update(call.stream_id, call.unacked))
            call.unacked = 0

    def _h2_receive(self, data: bytes) -> bool:
        """Whole frames through h2; False once the connection is gone."""
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self._lose(f"HTTP/2 protocol error: {exc}")
            return False
        calls = self.calls
        for ev in events:
            if isinstance(ev, h2.events.DataReceived):
                self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                call = calls.get(ev.stream_id)
                if call is not None and ev.data:
                    error = call.feed(ev.data)
                    if error is not None:
                        self.cancel(call, error)
            elif isinstance(ev, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                call = calls.get(ev.stream_id)
                if call is not None:
                    self._status(call, ev.headers)
            elif isinstance(ev, h2.events.StreamEnded):
                call = calls.pop(ev.stream_id, None)
                if call is not None:
                    call.end()
                    self.release_waiting()
            elif isinstance(ev, h2.events.StreamReset):
                call = calls.pop(ev.stream_id, None)
                if call is not None:
                    code = ev.error_code
                    call.end(InferError(_reset_status(code), f"stream reset by the server "
                                        f"({getattr(code, 'name', code)})",
                                        refused=code == h2.errors.ErrorCodes.REFUSED_STREAM))
                    self.release_waiting()
            elif isinstance(ev, h2.events.WindowUpdated):
                self._send_pending()
            elif isinstance(ev, h2.events.RemoteSettingsChanged):
                if not self.settled.done():
                    self.settled.set_result(None)
                self.release_waiting()  # MAX_CONCURRENT_STREAMS may have grown
            elif isinstance(ev, h2.events.ConnectionTerminated):
                self._goaway(ev)
        if self.goaway and not self.calls:
            self.close()
        return not self.closed

    def _goaway(self, ev: h2.events.ConnectionTerminated) -> None:
        """The server will close: streams above its last_stream_id were never handled and fail
        (UNAVAILABLE, as grpc retries them elsewhere); the rest run to their end; new calls
        (and those waiting for a stream) go to a new connection."""
        code = getattr(ev.error_code, "name", str(ev.error_code))
        self.goaway = f"the server sent GOAWAY ({code})"
        last = ev.last_stream_id if ev.last_stream_id is not None else 0
        for stream_id in [i for i in self.calls if i > last]:
            call = self.calls.pop(stream_id)
            call.end(InferError("UNAVAILABLE", f"{self.goaway} before handling this call"))
        self.release_waiting(every=True)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lose("connection lost" + (f": {exc}" if exc else ""))

    # ---- used by the engine ----------------------------------------------------------------
    def open(self, path: bytes, unary: bool = False) -> Call:
        """A new stream; StreamsFull when the server's MAX_CONCURRENT_STREAMS are in use (the
        caller waits for one with wait_stream, as a grpc call waits)."""
        if self.closed or self.goaway:
            raise InferError("UNAVAILABLE", self.goaway or "the connection is closed")
        stream_id = self.h2.get_next_available_stream_id()
        headers = [(b":path", path), *self.base_headers]
        if unary:
            headers += self.unary_extra
        try:
            self.h2.send_headers(stream_id, headers)
        except h2.exceptions.TooManyStreamsError:
            raise StreamsFull() from None
        self.opened += 1
        call = self.calls[stream_id] = Call(stream_id, unary, self.max_message)
        return call

    @property
    def stream_limit(self) -> int:
        return int(self.h2.remote_settings.max_concurrent_streams)

    def wait_stream(self, retry: Callable[[], None]) -> None:
        """`retry` runs (on the loop) once a stream here is free, or the connection is going
        away (it then finds the live connection itself)."""
        self.waiting.append(retry)

    def release_waiting(self, every: bool = False) -> None:
        waiting = self.waiting
        if not waiting:
            return
        n = len(waiting) if every or self.closed or self.goaway else max(
            0, self.stream_limit - self.h2.open_outbound_streams)
        for _ in range(min(n, len(waiting))):
            self._loop.call_soon(waiting.popleft())

    def send(self, call: Call, data: bytes, end_stream: bool = False) -> None:
        if call.ended:
            return
        if call.pending:
            call.pending += data
            call.end_after = end_stream
        else:
            self._send_now(call, data, end_stream)
        self._unstamped.append(call)
        self.flush_soon()

    def cancel(self, call: Call, error: InferError) -> None:
        """Abandon a call (a deadline passed): reset its stream and fail its waiter."""
        if self.calls.pop(call.stream_id, None) is not None and not self.closed:
            with contextlib.suppress(h2.exceptions.StreamClosedError):
                self.h2.reset_stream(call.stream_id, h2.errors.ErrorCodes.CANCEL)
            self.flush_soon()
        call.end(error)
        self.release_waiting()
        if (self.retiring or self.goaway) and not self.calls:
            self.close()

    def retire(self) -> None:
        """No new calls here; close once the calls still on it have ended."""
        self.retiring = True
        if not self.calls:
            self.close()

    def flush_soon(self) -> None:
        """Writes made in one loop iteration leave in one write, at its end."""
        if not self._flush_soon and not self.corked:
            self._flush_soon = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        self._flush_soon = False
        data = self.h2.data_to_send()
        if self._raw_out:
            data += b"".join(self._raw_out)
            self._raw_out.clear()
        if data and self.transport is not None and not self.closed:
            if self._unstamped:  # stamped before the write: loopback TCP delivers inside it
                now = time.perf_counter_ns()
                for call in self._unstamped:
                    call.tx_ns = now
                self._unstamped.clear()
            self.transport.write(data)

    def close(self) -> None:
        self.retiring = False  # cancel() below must not close again
        if not self.closed:
            for call in list(self.calls.values()):
                self.cancel(call, InferError("CANCELLED", "loadkit stopped"))
            self.h2.close_connection()
            self.flush()
        self._lose("closed by loadkit")

    # ---- internals ---------------------------------------------------------------------------
    def _send_now(self, call: Call, data: bytes, end_stream: bool) -> None:
        h2c = self.h2
        while data:
            room = min(h2c.local_flow_control_window(call.stream_id), h2c.max_outbound_frame_size)
            if room <= 0:
                call.pending, call.end_after = data, end_stream
                return
            chunk, data = data[:room], data[room:]
            h2c.send_data(call.stream_id, chunk, end_stream=end_stream and not data)

    def _send_pending(self) -> None:
        for call in list(self.calls.values()):
            if call.pending:
                data, call.pending = call.pending, b""
                self._send_now(call, data, call.end_after)

    def _status(self, call: Call, headers: list[tuple[bytes, bytes]]) -> None:
        fields = dict(headers)
        status = fields.get(b"grpc-status")
        if status is None:
            http = fields.get(b":status", b"200")
            if http != b"200" and call.error is None:  # not a gRPC server (a proxy's page)
                call.error = InferError(HTTP_STATUS.get(http, "UNKNOWN"),
                                        f"HTTP status {http.decode()} without a grpc-status")
            return
        call.status_seen = True
        code = int(status)
        if code != 0:
            message = urllib.parse.unquote(fields.get(b"grpc-message", b"").decode())
            call.error = InferError(STATUS_NAMES.get(code, "UNKNOWN"), message)

    def _lose(self, why: str) -> None:
        was_open = not self.closed
        self.closed = True
        calls, self.calls = self.calls, {}
        for call in calls.values():
            call.end(InferError("UNAVAILABLE", why))
        self.release_waiting(every=True)
        if not self.settled.done():
            self.settled.set_result(None)
        if was_open and self.transport is not None:
            self.transport.close()


def _window_update(stream_id: int, increment: int) -> bytes:
    return b"\x00\x00\x04\x08\x00" + stream_id.to_bytes(4, "big") + increment.to_bytes(4, "big")
